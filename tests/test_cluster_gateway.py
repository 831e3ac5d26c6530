"""The gateway on a Redis Cluster (``redis+cluster://``, three masters the tests start):
requests on every client protocol are served and billed exactly (the balance drops by the sum
of the usage records), a key made through the admin API serves, holds and cooldowns are
shared, and the daily totals add up."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import aiohttp

from bench.fake_upstream import FakeUpstream
from gateway.config import parse_settings
from tests.plugins.servers import ADMIN_TOKEN, KEYS, make_config, serve_app

HEADERS = {"Authorization": f"Bearer {KEYS['alice']}", "anthropic-version": "2023-06-01"}
HI = [{"role": "user", "content": "hello"}]
CALLS = [
    ("/v1/chat/completions", {"model": "chat-small", "messages": HI}),
    ("/v1/chat/completions", {"model": "claude-small", "messages": HI, "stream": True}),
    ("/v1/messages", {"model": "gemini-small", "max_tokens": 16, "messages": HI}),
    ("/v1/responses", {"model": "chat-small", "input": "hello", "stream": True}),
    (
        "/v1beta/models/gemini-small:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]},
    ),
]


async def test_the_gateway_serves_and_bills_on_a_cluster(
    fake: FakeUpstream, cluster_url: str
) -> None:
    settings = parse_settings(make_config(fake.url, cluster_url))
    async with serve_app(settings) as gw, aiohttp.ClientSession() as s:
        store = gw.state.store
        before = (await store.get_account("alice")).balance  # type: ignore[union-attr]
        for _ in range(4):
            for path, body in CALLS:
                async with s.post(gw.url + path, json=body, headers=HEADERS) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        made = {"account": "alice", "group": "default", "quota": 1}
        async with s.post(gw.url + "/admin/keys", json=made, headers=admin) as r:
            key = (await r.json())["key"]
        body = {"model": "chat-small", "messages": HI}
        async with s.post(
            gw.v1 + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as r:
            assert r.status == 200
        await gw.state.writer.flush()
        records = await store.usage("alice", 1_000)
        assert len(records) == 4 * len(CALLS) + 1
        after = (await store.get_account("alice")).balance  # type: ignore[union-attr]
        assert before - after == sum(r.cost for r in records) > 0
        today = datetime.now(UTC).date().isoformat()
        days = await store.usage_daily(today, today, "alice")
        assert sum(d.cost for d in days) == before - after
        # the shared state other instances read: this instance's holds, all settled by now,
        # published empty at its next share (a share during a request published its hold)
        clock = asyncio.get_running_loop().time
        deadline = clock() + 5
        while (shared := await store.share_holds("other", {"alice": 5}, 5_000, 0)) and (
            clock() < deadline
        ):
            await asyncio.sleep(0.1)
        assert shared == {}
        assert await store.share_cooling({"an": 2**50}, 0) == {"an": 2**50}
