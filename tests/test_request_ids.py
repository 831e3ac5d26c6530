"""Request ids (CONTRACT §5a): every reply carries ``x-request-id``, the client's own when it
is a safe token; the same id is in the request's usage record and its log line, and a
client that sends one id twice is still billed twice. One access-log line per request, in
JSON by default or text, with nothing of the key, the prompt or the full address."""

from __future__ import annotations

import dataclasses
import logging
import time
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson
import pytest

from bench.fake_upstream import FakeUpstream
from gateway.config import parse_settings
from gateway.relay.call import Call
from tests.plugins.servers import ADMIN_TOKEN, KEYS, ServedGateway, make_config, serve_app

ALICE = {"Authorization": f"Bearer {KEYS['alice']}"}
PROMPT = "nothing of this may be logged"
CHAT = {"model": "chat-small", "messages": [{"role": "user", "content": PROMPT}]}


async def post(
    s: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str]
) -> tuple[int, str, bytes]:
    async with s.post(url, json=body, headers=headers) as r:
        return r.status, r.headers.get("x-request-id", ""), await r.read()


async def test_the_clients_id_is_echoed_recorded_and_never_merges_two_requests(
    gateway: ServedGateway,
) -> None:
    store = gateway.state.store
    before = (await store.get_account("alice")).balance  # type: ignore[union-attr]
    mine = {**ALICE, "x-request-id": "trace-42.a:b_c"}
    async with aiohttp.ClientSession() as s:
        for _ in range(2):
            status, rid, _ = await post(s, gateway.v1 + "/chat/completions", CHAT, mine)
            assert (status, rid) == (200, "trace-42.a:b_c")
        stream = {**CHAT, "stream": True}
        status, rid, body = await post(s, gateway.v1 + "/chat/completions", stream, mine)
        assert (status, rid) == (200, "trace-42.a:b_c") and b"[DONE]" in body
    await gateway.state.writer.flush()
    records = [r for r in await store.usage("alice", 100) if r.request_id.startswith("trace-42")]
    assert len(records) == 3 == len({r.request_id for r in records})
    after = (await store.get_account("alice")).balance  # type: ignore[union-attr]
    assert before - after == sum(r.cost for r in records) > 0


@pytest.mark.parametrize("given", ["has spaces", "x" * 129, "semi;colon", ""])
async def test_an_unsafe_id_is_replaced(gateway: ServedGateway, given: str) -> None:
    async with aiohttp.ClientSession() as s:
        status, rid, _ = await post(
            s, gateway.v1 + "/chat/completions", CHAT, {**ALICE, "x-request-id": given}
        )
    assert status == 200
    assert rid and rid != given and "/" not in rid


async def test_every_reply_carries_one(gateway: ServedGateway) -> None:
    mine = {"x-request-id": "every-1"}
    async with aiohttp.ClientSession() as s:
        status, rid, _ = await post(s, gateway.v1 + "/chat/completions", CHAT, mine)  # no key
        assert (status, rid) == (401, "every-1")
        for path, headers in (
            ("/v1/models", {**ALICE, **mine}),
            ("/v1/nowhere", mine),
            ("/healthz", mine),
            ("/admin/accounts", {"Authorization": f"Bearer {ADMIN_TOKEN}", **mine}),
            ("/v1/dashboard/billing/subscription", {**ALICE, **mine}),
        ):
            async with s.get(gateway.url + path, headers=headers) as r:
                assert r.headers.get("x-request-id") == "every-1", path
        async with s.get(gateway.url + "/healthz") as r:
            assert r.headers["x-request-id"]  # one of the gateway's own


async def test_one_json_line_per_request(
    gateway: ServedGateway, capfd: pytest.CaptureFixture[str]
) -> None:
    async with aiohttp.ClientSession() as s:
        status, rid, _ = await post(
            s, gateway.v1 + "/chat/completions", CHAT, {**ALICE, "x-request-id": "logged-1"}
        )
        assert status == 200
    access = gateway.state.observers.access
    assert access is not None
    access.flush()
    err = capfd.readouterr().err
    assert PROMPT not in err and KEYS["alice"] not in err and "127.0.0.1" not in err
    lines = [orjson.loads(line) for line in err.splitlines() if '"reply_id":"logged-1"' in line]
    (line,) = lines
    await gateway.state.writer.flush()
    (rec,) = [
        r
        for r in await gateway.state.store.usage("alice", 10)
        if r.request_id.startswith("logged-1/")
    ]
    assert line["request_id"] == rec.request_id
    assert (line["key_id"], line["model"], line["channel"], line["status"]) == (
        "k-alice",
        "chat-small",
        "oa",
        200,
    )
    assert (line["prompt_tokens"], line["completion_tokens"]) == (
        rec.prompt_tokens,
        rec.completion_tokens,
    )
    assert line["ip_range"] == "127.0.0.0/24"


async def test_text_lines_when_asked(
    fake: FakeUpstream, store_url: str, capfd: pytest.CaptureFixture[str]
) -> None:
    cfg = make_config(fake.url, store_url, logging={"format": "text"})
    async with serve_app(parse_settings(cfg)) as gw, aiohttp.ClientSession() as s:
        mine = {**ALICE, "x-request-id": "texty"}
        assert (await post(s, gw.v1 + "/chat/completions", CHAT, mine))[0] == 200
        assert gw.state.observers.access is not None
        gw.state.observers.access.flush()
    (line,) = [x for x in capfd.readouterr().err.splitlines() if " texty/" in x]
    assert " 200 openai chat model=chat-small channel=oa key=k-alice " in line
    # a model name is the client's: one that would split the line, or its fields, is quoted
    async with serve_app(parse_settings(cfg)) as gw, aiohttp.ClientSession() as s:
        for n, model in enumerate(["evil\n2026-01-01 forged 200", "two words", "tab\there"]):
            mine = {**ALICE, "x-request-id": f"odd-{n}"}
            status, _, _ = await post(
                s, gw.v1 + "/chat/completions", {**CHAT, "model": model}, mine
            )
            assert status == 404
        assert gw.state.observers.access is not None
        gw.state.observers.access.flush()
    lines = capfd.readouterr().err.splitlines()
    assert not [x for x in lines if "forged" in x and " odd-0/" not in x], lines
    for n, quoted in enumerate(['"evil\\n2026-01-01 forged 200"', '"two words"', '"tab\\there"']):
        (line,) = [x for x in lines if f" odd-{n}/" in x]
        assert f" 404 openai chat model={quoted} channel=- " in line, line
    cfg = make_config(fake.url, store_url, logging={"access": False})
    async with serve_app(parse_settings(cfg)) as gw:
        assert gw.state.observers.access is None


async def test_log_lines_a_request_causes_carry_its_id(
    gateway: ServedGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """The upstream failures of a request, and the channel cooldown the third one in a row
    begins, are logged with that request's id."""
    caplog.set_level(logging.WARNING)
    failing = {
        "model": "chat-small",
        "messages": [{"role": "user", "content": "[[fake status=500]]"}],
    }
    async with aiohttp.ClientSession() as s:
        for n in range(3):
            mine = {**ALICE, "x-request-id": f"failing-{n}"}
            status, rid, _ = await post(s, gateway.v1 + "/chat/completions", failing, mine)
            assert status >= 500 and rid == f"failing-{n}"
    lines = [r.getMessage() for r in caplog.records]
    (cooling,) = [x for x in lines if x.startswith("relay.channel_cooling")]
    assert cooling.startswith("relay.channel_cooling request_id=failing-2/"), cooling
    for n in range(3):
        assert any(f"request_id=failing-{n}/" in x and "upstream" in x for x in lines), lines


def test_a_record_arrives_with_its_ids_and_nothing_else_filled_in() -> None:
    """``Call.arriving`` passes its values by position (cheaper on every request): each one
    must land in the field of its name."""
    at = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
    call = Call.arriving(at, ("mine/abc", "mine"), "anthropic", "chat", "10.1.2.0/24")
    assert dataclasses.asdict(call) == {
        "time": at,
        "request_id": "mine/abc",
        "account": "",
        "key_id": "",
        "model": "",
        "channel": None,
        "protocol": "anthropic",
        "endpoint": "chat",
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost": 0,
        "status": 200,
        "latency_ms": 0,
        "ip_range": "10.1.2.0/24",
        "cache_read_tokens": 0,
        "cache_write_tokens": 0,
        "reasoning_tokens": 0,
        "cost_pico": 0,
        "cache_write_1h_tokens": 0,
        "started": call.started,
        "reply_id": "mine",
        "key": None,
        "responded": False,
        "recorded": False,
        "held": 0,
        "first_chunk": None,
        "upstream_started": 0.0,
        "upstream_first": None,
        "span": None,
    }
    assert 0 < call.started <= time.perf_counter()
