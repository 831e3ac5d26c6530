"""Failover before the first byte: a channel that stalls, sends garbage, answers 200 with a body
that is not its protocol's, or reports an error before any content has failed, and the request
is served by the next channel; the failures count toward the bad channel's cooldown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp import web

from bench.fake_upstream import FakeUpstream
from tests.plugins.servers import KEYS, ServedGateway, make_config, serve_app

MODES = ("stall", "garbage", "notjson", "empty", "error_event", "cut")


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
