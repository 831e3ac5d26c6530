"""Failover before the first byte: a channel that stalls, sends garbage, answers 200 with a body
that is not its protocol's, or reports an error before any content has failed, and the request
is served by the next channel; the failures count toward the bad channel's cooldown."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp import web

from bench.fake_upstream import FakeUpstream
from tests.plugins.servers import KEYS, ServedGateway, make_config, serve_app

MODES = ("stall", "garbage", "notjson", "empty", "error_event", "cut", "pause")


class BadUpstream:
    """An OpenAI-style upstream that misbehaves as its path says: /{mode}/v1/chat/completions."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = dict.fromkeys(MODES, 0)
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> BadUpstream:
        app = web.Application()
        app.router.add_post("/{mode}/v1/chat/completions", self.handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        mode = request.match_info["mode"]
        self.hits[mode] += 1
        body = await request.json()
        streaming = bool(body.get("stream"))
        if mode == "stall":
            await asyncio.sleep(3)  # far past the gateway's first-byte timeout (0.5 s)
        if mode == "notjson":
            return web.Response(text="<html>bad gateway</html>", content_type="text/html")
        if mode == "empty" and not streaming:
            return web.Response(body=b"", content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if mode == "garbage":
            await resp.write(b"data: {this is not json\n\n")
        elif mode == "error_event":
            await resp.write(
                b'data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n'
            )
        elif mode == "cut":
            pass  # the stream ends at once, without [DONE]
        elif mode == "pause":  # one word, then a silence far past the channel's idle timeout
            chunk = {"choices": [{"index": 0, "delta": {"content": "first"}}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(3)
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@pytest.fixture
async def bad() -> AsyncIterator[BadUpstream]:
    async with BadUpstream() as upstream:
        yield upstream


def config(fake: FakeUpstream, bad: BadUpstream, store_url: str, mode: str) -> dict[str, Any]:
    cfg = make_config(fake.url, store_url)
    cfg["channels"] = [
        {
            "name": "bad",
            "type": "openai",
            "base_url": f"{bad.url}/{mode}/v1",
            "api_key": "k",
            "groups": ["default"],
            "models": ["chat-small"],
            "priority": 0,
        },
        *({**ch, "priority": 1} for ch in cfg["channels"]),
    ]
    cfg["upstream"] = {"first_byte_timeout": 0.5}
    return cfg


async def ask(gw: ServedGateway, stream: bool) -> str:
    async with openai.AsyncOpenAI(base_url=gw.v1, api_key=KEYS["alice"], max_retries=0) as c:
        messages: Any = [{"role": "user", "content": "[[fake text='served by the good one']]"}]
        if not stream:
            reply = await c.chat.completions.create(model="chat-small", messages=messages)
            return reply.choices[0].message.content or ""
        parts = []
        async for chunk in await c.chat.completions.create(
            model="chat-small", messages=messages, stream=True
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        return "".join(parts)


CASES = [
    ("stall", False),
    ("stall", True),
    ("garbage", True),
    ("notjson", False),
    ("notjson", True),
    ("empty", False),
    ("error_event", True),
    ("cut", True),
]


@pytest.mark.parametrize(("mode", "stream"), CASES, ids=[f"{m}-{s}" for m, s in CASES])
async def test_a_bad_channel_fails_over_before_the_first_byte_and_cools_down(
    fake: FakeUpstream, bad: BadUpstream, store_url: str, mode: str, stream: bool
) -> None:
    async with serve_app(parse(config(fake, bad, store_url, mode))) as gw:
        for _ in range(3):
            assert await ask(gw, stream) == "served by the good one"
        assert bad.hits[mode] == 3
        # three failures in a row: the bad channel rests, the next request goes straight on
        assert await ask(gw, stream) == "served by the good one"
        assert bad.hits[mode] == 3
        await gw.state.writer.flush()
        records = await gw.state.store.usage("alice", 4)
    assert {r.channel for r in records} == {"oa"}
    assert all(r.status == 200 and r.cost > 0 for r in records)


def parse(cfg: dict[str, Any]) -> Any:
    from gateway.config import parse_settings

    return parse_settings(cfg)


async def test_a_channel_one_instance_cooled_is_skipped_by_another(
    fake: FakeUpstream, bad: BadUpstream, store_url: str
) -> None:
    """Two instances on one store: once the first has cooled the bad channel down, the
    second (which never saw it fail) does not call it."""
    settings = parse(config(fake, bad, store_url, "notjson"))
    async with serve_app(settings) as first, serve_app(settings) as second:
        for _ in range(3):
            assert await ask(first, False) == "served by the good one"
        assert bad.hits["notjson"] == 3
        assert "bad" in first.state.health.cooling
        deadline = asyncio.get_running_loop().time() + 10
        while "bad" not in second.state.health.cooling:  # shared twice a second
            assert asyncio.get_running_loop().time() < deadline, "the cooldown never arrived"
            await asyncio.sleep(0.05)
        for _ in range(3):
            assert await ask(second, False) == "served by the good one"
        assert bad.hits["notjson"] == 3


async def test_cooldowns_shared_through_the_store_expire(store: Any) -> None:
    """The store keeps the later of two cooldowns of a channel and forgets those over."""
    assert await store.share_cooling({"a": 5_000, "b": 2_000}, 1_000) == {"a": 5_000, "b": 2_000}
    assert await store.share_cooling({"a": 4_000}, 1_500) == {"a": 5_000, "b": 2_000}
    assert await store.share_cooling({}, 2_000) == {"a": 5_000}
    assert await store.share_cooling({}, 6_000) == {}


async def test_a_channel_s_own_first_byte_timeout(
    fake: FakeUpstream, bad: BadUpstream, store_url: str
) -> None:
    """No first-byte timeout for the service; the stalling channel has one of its own."""
    cfg = config(fake, bad, store_url, "stall")
    cfg["upstream"] = {}
    cfg["channels"][0]["timeouts"] = {"first_byte": 0.3}
    async with serve_app(parse(cfg)) as gw:
        assert await ask(gw, True) == "served by the good one"
        assert bad.hits["stall"] == 1


async def test_a_channel_s_own_idle_timeout_ends_a_silent_stream(
    fake: FakeUpstream, bad: BadUpstream, store_url: str
) -> None:
    cfg = config(fake, bad, store_url, "pause")
    cfg["upstream"] = {}
    cfg["channels"][0]["timeouts"] = {"idle": 0.3}
    async with serve_app(parse(cfg)) as gw:
        started = asyncio.get_running_loop().time()
        with pytest.raises(openai.APIError):
            await ask(gw, True)  # "first", then the error event of the timeout
        assert asyncio.get_running_loop().time() - started < 2.5
        await gw.state.writer.flush()
        (rec,) = await gw.state.store.usage("alice", 1)
        assert (rec.channel, rec.status) == ("bad", 504)


async def test_streams_that_stall_past_the_idle_timeout_cool_their_channel(
    fake: FakeUpstream, bad: BadUpstream, store_url: str
) -> None:
    """Over real sockets: three streams in a row stall after their first word past the
    channel's idle timeout (aiohttp's read timeout); the channel cools down and the next
    stream goes to the healthy channel instead of stalling too."""
    cfg = config(fake, bad, store_url, "pause")
    cfg["upstream"] = {}
    cfg["channels"][0]["timeouts"] = {"idle": 0.3}
    async with serve_app(parse(cfg)) as gw:
        for _ in range(3):
            with pytest.raises(openai.APIError):
                await ask(gw, True)
        assert "bad" in gw.state.health.cooling
        assert await ask(gw, True) == "served by the good one"
        assert bad.hits["pause"] == 3
