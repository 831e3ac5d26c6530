"""``GET /metrics`` (CONTRACT §5a): after requests on each protocol the counters and
histograms move as the usage records say (requests, tokens, cost; the server's durations and
first tokens; each upstream attempt's own duration and first chunk, failed ones too), under
the OpenTelemetry GenAI names where a convention exists; requests refused before a key was
known, and paths the gateway does not serve, are counted too (with bounded labels); a cooling
channel shows its state, and nothing of a key, a prompt or an address is in it; a token, when
configured, guards it; with two worker processes every family is the sum over the workers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from bench.fake_upstream import FakeUpstream
from gateway.config import parse_settings
from gateway.observe.metrics import DIR_ENV, Exposition, Metrics
from gateway.store import MICRO, UsageRecord
from tests.plugins.processes import Gateway, free_port, write_config
from tests.plugins.servers import KEYS, ServedGateway, make_config, serve_app

ALICE = {"Authorization": f"Bearer {KEYS['alice']}", "anthropic-version": "2023-06-01"}
PROMPT = "a prompt that must never reach the metrics"
CLIENT_IP = "203.0.113.77"  # as X-Forwarded-For from the trusted loopback
HI = [{"role": "user", "content": PROMPT}]
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"model": "chat-small", "messages": HI}),
    ("/v1/chat/completions", {"model": "claude-small", "messages": HI, "stream": True}),
    ("/v1/messages", {"model": "gemini-small", "max_tokens": 32, "messages": HI}),
    ("/v1/responses", {"model": "chat-small", "input": PROMPT, "stream": True}),
    (
        "/v1beta/models/gemini-small:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": PROMPT}]}]},
    ),
]
BAD_KEY = "sk-not-a-key-that-may-show-anywhere"
SECRET_PATH = "/v1/a-path-that-must-not-become-a-label"


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(found: Samples, name: str, **labels: str) -> float:
    return sum(
        v for (n, ls), v in found.items() if n == name and labels.items() <= dict(ls).items()
    )


async def call_all(url: str) -> None:
    async with aiohttp.ClientSession() as s:
        for path, body in CALLS:
            async with s.post(url + path, json=body, headers=ALICE) as r:
                assert r.status == 200, await r.text()
                await r.read()
        # an unknown model: counted as "other", never by the name the client chose
        bad = {"model": "secret-model-name", "messages": HI}
        async with s.post(url + "/v1/chat/completions", json=bad, headers=ALICE) as r:
            assert r.status == 404


async def scrape(url: str, headers: dict[str, str] | None = None) -> str:
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/metrics", headers=headers or {}) as r:
            assert r.status == 200, await r.text()
            assert r.headers["content-type"].startswith("text/plain")
            return await r.text()


async def test_the_counters_follow_the_usage_records(gateway: ServedGateway) -> None:
    await call_all(gateway.url)
    text = await scrape(gateway.url)
    for secret in (KEYS["alice"], PROMPT, "secret-model-name", "127.0.0.1"):
        assert secret not in text
    found = samples(text)
    await gateway.state.writer.flush()
    records = await gateway.state.store.usage("alice", 100)
    requests = total(found, "gateway_requests_total", endpoint="chat")
    assert requests == len(records) == len(CALLS) + 1
    assert total(found, "gateway_requests_total", model="other", status="404") == 1
    assert total(found, "gateway_requests_total", protocol="responses", channel="oa") == 1
    tokens = "gen_ai_client_token_usage_sum"
    assert total(found, tokens, gen_ai_token_type="input") == sum(r.prompt_tokens for r in records)
    assert total(found, tokens, gen_ai_token_type="output") == sum(
        r.completion_tokens for r in records
    )
    assert total(found, "gen_ai_client_token_usage_count", gen_ai_token_type="input") == len(CALLS)
    assert total(found, "gateway_cost_total") == pytest.approx(sum(r.cost for r in records) / MICRO)
    # the server's side: every request timed; first tokens of the two streams and of the
    # three whole replies (sent all at once)
    server = "gen_ai_server_request_duration_seconds_count"
    assert total(found, server) == len(records)
    assert total(found, server, error_type="404", gen_ai_request_model="other") == 1
    first = "gen_ai_server_time_to_first_token_seconds_count"
    assert total(found, first, stream="true") == 2
    assert total(found, first, stream="false") == 3
    # the upstreams' side: each attempt, by channel and provider
    attempts = "gen_ai_client_operation_duration_seconds_count"
    assert total(found, attempts) == len(CALLS)
    for channel, provider, n in (
        ("oa", "openai", 2),
        ("an", "anthropic", 1),
        ("gm", "gcp.gemini", 2),
    ):
        assert total(found, attempts, channel=channel, gen_ai_provider_name=provider) == n
    assert total(found, attempts, gen_ai_operation_name="chat", error_type="") == len(CALLS)
    assert total(found, "gen_ai_client_operation_time_to_first_chunk_seconds_count") == 2
    # the upstream's own time is within the request's
    assert total(found, "gen_ai_client_operation_duration_seconds_sum") <= total(
        found, "gen_ai_server_request_duration_seconds_sum"
    )
    assert found[("gateway_open_streams", ())] == 0
    for channel in ("oa", "an", "gm"):
        assert found[("gateway_channel_state", (("channel", channel), ("state", "healthy")))] == 1


async def test_refused_requests_and_unknown_paths_are_counted_and_logged(
    gateway: ServedGateway, capfd: pytest.CaptureFixture[str]
) -> None:
    """One line and one count per request the app handles: no key, a bad key, a path the
    gateway does not serve, the probes; never the key given, never the path as a label."""
    body = {"model": "chat-small", "messages": HI}
    async with aiohttp.ClientSession() as s:
        for headers in ({}, {"Authorization": f"Bearer {BAD_KEY}"}):
            async with s.post(gateway.v1 + "/chat/completions", json=body, headers=headers) as r:
                assert r.status == 401
        async with s.post(gateway.url + SECRET_PATH, json=body) as r:
            assert r.status == 404
        async with s.get(gateway.url + "/healthz") as r:
            assert r.status == 200
    text = await scrape(gateway.url)
    assert BAD_KEY not in text and SECRET_PATH not in text
    found = samples(text)
    refused = {"endpoint": "chat", "model": "", "status": "401", "protocol": "openai"}
    assert total(found, "gateway_requests_total", **refused) == 2
    assert total(found, "gateway_requests_total", endpoint="unknown", status="404") == 1
    # (and the probe that saw the gateway up)
    assert total(found, "gateway_requests_total", endpoint="healthz", protocol="gateway") >= 1
    # the refused requests are GenAI requests that failed; the others are not timed as such
    assert total(found, "gen_ai_server_request_duration_seconds_count", error_type="401") == 2
    assert total(found, "gen_ai_server_request_duration_seconds_count") == 2
    access = gateway.state.observers.access
    assert access is not None
    access.flush()
    err = capfd.readouterr().err
    assert BAD_KEY not in err and SECRET_PATH not in err
    lines = [orjson.loads(x) for x in err.splitlines() if x.startswith("{") and '"status"' in x]
    statuses = sorted((x["endpoint"], x["status"]) for x in lines if x["endpoint"] != "healthz")
    assert statuses == [("chat", 401), ("chat", 401), ("metrics", 200), ("unknown", 404)]
    assert ("healthz", 200) in {(x["endpoint"], x["status"]) for x in lines}
    assert all(x["request_id"] and x["key_id"] == "" for x in lines)


async def test_a_failed_attempt_is_timed_and_counted(gateway: ServedGateway) -> None:
    failing = [{"role": "user", "content": "[[fake status=500]] no"}]
    async with aiohttp.ClientSession() as s:
        body = {"model": "chat-small", "messages": failing}
        async with s.post(gateway.v1 + "/chat/completions", json=body, headers=ALICE) as r:
            assert r.status >= 500
            status = r.status
    found = samples(await scrape(gateway.url))
    attempts = "gen_ai_client_operation_duration_seconds_count"
    (failed,) = [
        dict(ls) for (n, ls), v in found.items() if n == attempts and v and dict(ls)["error_type"]
    ]
    assert failed["channel"] == "oa" and failed["gen_ai_provider_name"] == "openai"
    assert found[("gateway_channel_failures_total", (("channel", "oa"),))] == 1
    assert total(found, "gateway_requests_total", status=str(status), channel="oa") == 1
    assert total(found, "gen_ai_client_token_usage_count") == 0  # nothing answered


async def test_a_cooling_channel_shows_its_state(gateway: ServedGateway) -> None:
    gateway.state.health.cooling["an"] = time.monotonic() + 60
    found = samples(await scrape(gateway.url))
    assert found[("gateway_channel_state", (("channel", "an"), ("state", "cooling")))] == 1
    assert found[("gateway_channel_state", (("channel", "an"), ("state", "healthy")))] == 0


async def test_the_writer_backlog_and_parked_records_show(
    gateway: ServedGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that refuses every batch while answering reads: the records wait (backlog),
    then are parked one by one; both gauges say so, and fall back once the store takes them."""
    import gateway.store.writer as writer_module

    store = gateway.state.store
    settle = store.settle

    async def refuse(batch: Any) -> None:
        raise RuntimeError("refused")

    monkeypatch.setattr(writer_module, "RETRY_FIRST", 0.01)
    monkeypatch.setattr(writer_module, "PARK_RETRY", 0.2)
    monkeypatch.setattr(store, "settle", refuse)
    async with aiohttp.ClientSession() as s:
        body = {"model": "chat-small", "messages": HI}
        for _ in range(2):
            async with s.post(gateway.v1 + "/chat/completions", json=body, headers=ALICE) as r:
                assert r.status == 200
    deadline = time.monotonic() + 20
    while True:
        found = samples(await scrape(gateway.url))
        if found[("gateway_usage_parked_records", ())] == 2 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert found[("gateway_usage_parked_records", ())] == 2
    assert found[("gateway_usage_writer_backlog", ())] >= 2
    monkeypatch.setattr(store, "settle", settle)
    while True:
        found = samples(await scrape(gateway.url))
        if found[("gateway_usage_writer_backlog", ())] == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert found[("gateway_usage_writer_backlog", ())] == 0
    assert found[("gateway_usage_parked_records", ())] == 0


def test_every_family_is_summed_across_workers(tmp_path: Path) -> None:
    """This worker's rows, another live worker's snapshot and a dead worker's, each with every
    kind of row: each counter and histogram is the sum of the three; gauges come from live
    workers only (open streams summed, a channel's worst state)."""
    metrics = Metrics(["chat-small"])
    metrics.providers = lambda: {"oa": "openai"}
    metrics.open_streams = 1
    metrics.channels = lambda: ({"oa": "healthy"}, {"oa": 2})
    metrics.observe(_record(model="chat-small", channel="oa"), 1.5, 0.2, 1.4, 0.1)
    metrics.observe(_record(model="chat-small", channel="oa"), 0.04, None, 0.03)
    metrics.observe(_record(model="nope", channel="oa", status=502), 0.01, None)
    metrics.observe(_record(status=401), 0.001, None)
    metrics.observe_other("gateway", "healthz", 200)
    metrics.attempt_failed("chat-small", "chat", "oa", 502, 0.5)
    alone = samples("".join(_exposed(f) for f in Exposition(metrics, None).collect()))

    with subprocess.Popen(["true"]) as gone:
        gone.wait()
    for pid, state in ((os.getppid(), "cooling"), (gone.pid, "disabled")):
        snap = {**metrics.snapshot(), "pid": pid, "channels": {"oa": state}}
        (tmp_path / f"{pid}.json").write_bytes(orjson.dumps(snap))
    found = samples("".join(_exposed(f) for f in Exposition(metrics, str(tmp_path)).collect()))
    counted = ("gateway_requests", "gateway_cost", "gateway_channel_failures", "gen_ai_")
    summed = [key for key in alone if key[0].startswith(counted)]
    assert len(summed) > 50  # every family, with buckets
    for key in summed:
        assert found[key] == pytest.approx(3 * alone[key]), key
    assert {name for name, _ in summed} >= {
        "gateway_requests_total",
        "gateway_cost_total",
        "gateway_channel_failures_total",
        "gen_ai_server_request_duration_seconds_count",
        "gen_ai_server_time_to_first_token_seconds_count",
        "gen_ai_client_operation_duration_seconds_count",
        "gen_ai_client_operation_time_to_first_chunk_seconds_count",
        "gen_ai_client_token_usage_count",
    }
    assert found[("gateway_open_streams", ())] == 2  # the dead worker's is gone
    cooling = ("gateway_channel_state", (("channel", "oa"), ("state", "cooling")))
    assert alone[cooling] == 0 and found[cooling] == 1  # the worst a live worker sees


def _record(model: str = "", channel: str | None = None, status: int = 200) -> UsageRecord:
    at = datetime(2026, 11, 25, tzinfo=UTC)
    return UsageRecord(
        at, "r", "a", "k", model, channel, "openai", "chat", 12, 30, 42, status, 9, ""
    )


def _exposed(family: Metric) -> str:
    class One(Collector):
        def collect(self) -> Iterator[Metric]:
            yield family

    registry = CollectorRegistry(auto_describe=False)
    registry.register(One())
    return generate_latest(registry).decode()


async def test_a_token_guards_it(fake: FakeUpstream, store_url: str) -> None:
    cfg = make_config(fake.url, store_url, metrics={"token": "scrape-me"})
    async with serve_app(parse_settings(cfg)) as gw, aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/metrics") as r:
            assert r.status == 401
        async with s.get(gw.url + "/metrics", headers={"Authorization": "Bearer nope"}) as r:
            assert r.status == 401
        await scrape(gw.url, {"Authorization": "Bearer scrape-me"})
    cfg = make_config(fake.url, store_url, metrics={"enabled": False})
    async with serve_app(parse_settings(cfg)) as gw, aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/metrics") as r:
            assert r.status == 404


STABLE = (
    ("gateway_requests_total", {"endpoint": "chat"}),
    ("gateway_channel_failures_total", {}),
    ("gen_ai_server_request_duration_seconds_count", {}),
    ("gen_ai_server_request_duration_seconds_bucket", {"le": "+Inf"}),
    ("gen_ai_server_time_to_first_token_seconds_count", {}),
    ("gen_ai_client_operation_duration_seconds_count", {}),
    ("gen_ai_client_token_usage_count", {}),
    ("gen_ai_client_token_usage_sum", {}),
    ("gateway_cost_total", {}),
)


async def test_two_workers_count_together(fake: FakeUpstream, tmp_path: Path) -> None:
    """Every family is the sum of both workers' (requests, histograms, failed attempts), the
    same whichever worker answers the scrape; open streams of either worker show; nothing of
    a prompt, a key or an address is in it."""
    snapshots = tmp_path / "metrics"
    snapshots.mkdir()
    config = write_config(tmp_path, fake.url, f"sqlite:///{tmp_path / 'gw.db'}")
    # no cooldowns: every failing request is one failed attempt, whichever worker takes it
    config.write_text(config.read_text() + "upstream: {cooldown_seconds: 0}\n")
    gw = Gateway(config, free_port(), tmp_path / "gw.log", workers=2, env={DIR_ENV: str(snapshots)})
    await gw.start()

    def by_worker(field: str) -> list[int]:
        counts = []
        for path in snapshots.glob("*.json"):
            with contextlib.suppress(ValueError):
                snap = orjson.loads(path.read_bytes())
                if field == "failures":
                    counts.append(sum(snap["failures"].values()))
                else:
                    counts.append(sum(row[5] for row in snap["rows"] if row[2] == "chat"))
        return counts

    statuses: dict[int, int] = {}
    headers = {**ALICE, "X-Forwarded-For": CLIENT_IP}
    try:
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:

            async def one(content: str = PROMPT) -> None:
                body = {"model": "chat-small", "messages": [{"role": "user", "content": content}]}
                async with s.post(gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
                    await r.read()
                    statuses[r.status] = statuses.get(r.status, 0) + 1

            # new connections, a few at once, until both workers have served some, and a
            # failing upstream until both have seen a failed attempt
            while sum(1 for c in by_worker("requests") if c) < 2:
                assert time.monotonic() < deadline, by_worker("requests")
                await asyncio.gather(*(one() for _ in range(8)))
                await asyncio.sleep(0.3)
            while sum(1 for c in by_worker("failures") if c) < 2:
                assert time.monotonic() < deadline, by_worker("failures")
                await one("[[fake status=500]] fail")
                await asyncio.gather(*(one() for _ in range(4)))
                await asyncio.sleep(1.2)  # each worker's snapshot
            # one stream held open: the worker relaying it, whichever, shows it
            slow = {
                "model": "chat-small",
                "stream": True,
                "messages": [{"role": "user", "content": "[[fake chunks=3 delay_ms=1500]] a b c"}],
            }
            async with s.post(gw.url + "/v1/chat/completions", json=slow, headers=ALICE) as r:
                assert r.status == 200
                await r.content.readline()
                while True:
                    found = samples(await scrape(gw.url))
                    if found[("gateway_open_streams", ())] == 1:
                        break
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
                await r.read()
            statuses[200] += 1
        ok, failed = statuses.pop(200), sum(statuses.values())
        assert failed and set(statuses) == {502}, statuses
        sent = ok + failed
        while True:  # each worker writes its snapshot about once a second
            text = await scrape(gw.url)
            found = samples(text)
            done = total(found, "gateway_requests_total", endpoint="chat") == sent
            if (done and found[("gateway_open_streams", ())] == 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert total(found, "gateway_requests_total", endpoint="chat") == sent
        assert total(found, "gateway_requests_total", endpoint="chat", status="200") == ok
        assert found[("gateway_open_streams", ())] == 0
        assert total(found, "gateway_channel_failures_total") == failed
        assert total(found, "gen_ai_server_request_duration_seconds_count") == sent
        attempts = "gen_ai_client_operation_duration_seconds_count"
        assert total(found, attempts, error_type="") == ok
        assert total(found, attempts) == sent
        assert total(found, "gen_ai_client_token_usage_count", gen_ai_token_type="input") == ok
        assert total(found, "gen_ai_server_time_to_first_token_seconds_count", stream="true") == 1
        for secret in (PROMPT, CLIENT_IP, KEYS["alice"]):
            assert secret not in text
        # the same sums, whichever worker answers (new connections: both do)
        first = [total(found, name, **labels) for name, labels in STABLE]
        for _ in range(6):
            again = samples(await scrape(gw.url))
            assert [total(again, name, **labels) for name, labels in STABLE] == first
    finally:
        gw.kill(signal.SIGTERM)
        assert await gw.exit_code() == 0
