"""``POST /admin/channels/{name}/test`` (CONTRACT §5): one minimal request through a channel
of each type against the fake upstream reports ``ok``; a channel whose upstream is not there
reports the failure; neither bills an account or leaves a usage record."""

from __future__ import annotations

import socket
from typing import Any

import aiohttp

from bench.fake_upstream import FakeUpstream
from gateway.config import parse_settings
from tests.plugins.servers import ADMIN_TOKEN, make_config, serve_app

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port  # closed again: nothing listens there


async def test_each_channel_type_and_a_dead_one(fake: FakeUpstream, store_url: str) -> None:
    cfg = make_config(fake.url, store_url)
    dead = dict(cfg["channels"][0], name="dead", base_url=f"http://127.0.0.1:{dead_port()}/v1")
    cfg["channels"].append(dead)
    async with serve_app(parse_settings(cfg)) as gw, aiohttp.ClientSession() as s:
        store = gw.state.store
        before = (await store.get_account("alice")).balance  # type: ignore[union-attr]

        async def test(name: str) -> tuple[int, Any]:
            url = f"{gw.url}/admin/channels/{name}/test"
            async with s.post(url, headers=ADMIN) as r:
                return r.status, await r.json()

        for name in ("oa", "an", "gm"):
            status, result = await test(name)
            assert status == 200
            assert result["ok"] is True and result["status"] == 200, result
            assert result["latency_ms"] >= 0
        status, result = await test("dead")
        assert status == 200
        assert result["ok"] is False and result["error"]
        assert (await test("nowhere"))[0] == 404
        async with s.post(f"{gw.url}/admin/channels/oa/test") as r:
            assert r.status == 401
        await gw.state.writer.flush()
        assert await store.usage(None, 10) == []
        assert (await store.get_account("alice")).balance == before  # type: ignore[union-attr]
        # each probe went to its channel in the channel's own protocol, asking for one token
        paths = sorted(req.path for req in fake.requests)
        assert paths == sorted(
            [
                "/v1/chat/completions",
                "/v1/messages",
                "/v1beta/models/gemini-small:generateContent",
            ]
        )
        assert fake.requests[0].json["model"] == "up-small"  # the channel's model map
