"""``GET /metrics`` (CONTRACT §5a): after requests on each protocol the counters and
histograms move as the usage records say (requests, tokens, cost; durations; first chunks of
streams), a cooling channel shows its state, and nothing of a key, a prompt or an address is
in it; a token, when configured, guards it; with two worker processes every worker's
requests are counted."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.fake_upstream import FakeUpstream
from gateway.config import parse_settings
from gateway.metrics import DIR_ENV
from gateway.store import MICRO
from tests.plugins.processes import Gateway, free_port, write_config
from tests.plugins.servers import KEYS, ServedGateway, make_config, serve_app

ALICE = {"Authorization": f"Bearer {KEYS['alice']}", "anthropic-version": "2023-06-01"}
PROMPT = "a prompt that must never reach the metrics"
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


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
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
    assert total(found, "gateway_requests_total") == len(records) == len(CALLS) + 1
    assert total(found, "gateway_requests_total", model="other", status="404") == 1
    assert total(found, "gateway_requests_total", protocol="responses", channel="oa") == 1
    assert total(found, "gateway_tokens_total", type="input") == sum(
        r.prompt_tokens for r in records
    )
    assert total(found, "gateway_tokens_total", type="output") == sum(
        r.completion_tokens for r in records
    )
    assert total(found, "gateway_cost_total") == pytest.approx(sum(r.cost for r in records) / MICRO)
    assert total(found, "gateway_request_duration_seconds_count") == len(records)
    assert total(found, "gateway_time_to_first_chunk_seconds_count") == 2  # the two streams
    assert found[("gateway_open_streams", ())] == 0
    for channel in ("oa", "an", "gm"):
        assert found[("gateway_channel_state", (("channel", channel), ("state", "healthy")))] == 1


async def test_a_cooling_channel_shows_its_state(gateway: ServedGateway) -> None:
    gateway.state.relay.health.cooling["an"] = time.monotonic() + 60
    found = samples(await scrape(gateway.url))
    assert found[("gateway_channel_state", (("channel", "an"), ("state", "cooling")))] == 1
    assert found[("gateway_channel_state", (("channel", "an"), ("state", "healthy")))] == 0


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


async def test_two_workers_count_together(fake: FakeUpstream, tmp_path: Path) -> None:
    snapshots = tmp_path / "metrics"
    snapshots.mkdir()
    config = write_config(tmp_path, fake.url, f"sqlite:///{tmp_path / 'gw.db'}")
    gw = Gateway(config, free_port(), tmp_path / "gw.log", workers=2, env={DIR_ENV: str(snapshots)})
    await gw.start()

    def served_by_each() -> list[int]:
        counts = []
        for path in snapshots.glob("*.json"):
            with contextlib.suppress(ValueError):
                counts.append(sum(row[5] for row in orjson.loads(path.read_bytes())["requests"]))
        return counts

    try:
        sent = 0
        body = {"model": "chat-small", "messages": HI}
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:

            async def one() -> None:
                async with s.post(gw.url + "/v1/chat/completions", json=body, headers=ALICE) as r:
                    assert r.status == 200

            # new connections, a few at once, until both workers have served some
            while sum(1 for c in served_by_each() if c) < 2:
                assert time.monotonic() < deadline, served_by_each()
                await asyncio.gather(*(one() for _ in range(8)))
                sent += 8
                await asyncio.sleep(0.3)
        while True:  # each worker writes its snapshot about once a second
            found = samples(await scrape(gw.url))
            if total(found, "gateway_requests_total") == sent or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert total(found, "gateway_requests_total") == sent
    finally:
        gw.kill(signal.SIGTERM)
        assert await gw.exit_code() == 0
