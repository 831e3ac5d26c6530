"""The store away: a gateway started without it is alive but not ready, answers 503 in each
protocol's shape (and its admin API 503 in JSON, within seconds), and serves once the store
answers; a gateway that loses its store serves from its cache for ``limits.store_grace``
seconds, then answers 503 until the store is back. Redis, started and stopped by the test."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import aiohttp
import pytest

from bench.fake_upstream import FakeUpstream
from gateway.config import parse_settings
from gateway.store import cache
from tests.plugins.processes import OwnRedis
from tests.plugins.servers import ADMIN_TOKEN, KEYS, make_config, serve_app

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="redis-server is not installed"
)
HEADERS = {"Authorization": f"Bearer {KEYS['alice']}", "anthropic-version": "2023-06-01"}
CHAT = {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {**CHAT, "model": "claude-small", "max_tokens": 16}


async def test_a_gateway_started_without_its_store_serves_once_it_answers(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    redis = OwnRedis(tmp_path / "redis")  # not started yet: the store is away
    settings = parse_settings(make_config(fake.url, redis.url))
    try:
        async with serve_app(settings) as gw, aiohttp.ClientSession() as s:
            async with s.get(gw.url + "/readyz") as r:
                assert r.status == 503
            async with s.post(gw.v1 + "/chat/completions", json=CHAT, headers=HEADERS) as r:
                assert r.status == 503
                assert (await r.json())["error"]["type"] == "overloaded_error"
                assert r.headers["retry-after"]
            async with s.post(gw.v1 + "/messages", json=MESSAGES, headers=HEADERS) as r:
                assert r.status == 503
                assert (await r.json())["type"] == "error"
            started = time.monotonic()
            admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            async with s.get(gw.url + "/admin/accounts", headers=admin) as r:
                assert r.status == 503
                assert (await r.json())["error"]["code"] == "store_unavailable"
            assert time.monotonic() - started < 5

            await redis.start()
            deadline = time.monotonic() + 30
            while True:  # retried with backoff (at most 5 s apart)
                async with s.get(gw.url + "/readyz") as r:
                    if r.status == 200:
                        break
                assert time.monotonic() < deadline, "never ready"
                await asyncio.sleep(0.1)
            async with s.post(gw.v1 + "/chat/completions", json=CHAT, headers=HEADERS) as r:
                assert r.status == 200
            async with s.get(gw.url + "/admin/accounts", headers=admin) as r:
                assert r.status == 200
    finally:
        if redis.proc is not None:
            redis.proc.kill()
            redis.proc.wait()


async def test_a_lost_store_is_served_around_for_the_grace_then_503_until_it_is_back(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    redis = OwnRedis(tmp_path / "redis")
    await redis.start()
    grace = 1.0
    settings = parse_settings(make_config(fake.url, redis.url, limits={"store_grace": grace}))
    try:
        async with serve_app(settings) as gw, aiohttp.ClientSession() as s:

            async def status() -> int:
                async with s.post(gw.v1 + "/chat/completions", json=CHAT, headers=HEADERS) as r:
                    await r.read()
                    return r.status

            assert await status() == 200
            await redis.stop()
            lost = time.monotonic()
            # from the cache, within the grace (which began at the cache's last reload, at most
            # one interval before the store went away)
            fresh_for = grace - cache.DEFAULT_INTERVAL
            first = await status()
            assert first == 200 or time.monotonic() - lost >= fresh_for
            deadline = lost + grace + 30
            while (got := await status()) == 200:
                assert time.monotonic() < deadline, "served without its store forever"
                await asyncio.sleep(0.1)
            assert got == 503
            assert time.monotonic() - lost >= fresh_for
            async with s.post(gw.v1 + "/messages", json=MESSAGES, headers=HEADERS) as r:
                assert r.status == 503
                assert (await r.json())["type"] == "error"
                assert r.headers["retry-after"]

            await redis.start()
            deadline = time.monotonic() + 30
            while await status() != 200:
                assert time.monotonic() < deadline, "never served again"
                await asyncio.sleep(0.1)
    finally:
        if redis.proc is not None:
            redis.proc.kill()
            redis.proc.wait()
