"""The store away: a gateway started without it is alive but not ready, answers 503 in each
protocol's shape (and its admin API 503 in JSON, within seconds), and serves once the store
answers; a gateway that loses its store serves from its cache for ``limits.store_grace``
seconds, then answers 503 until the store is back; a store that hangs (stopped, its
connections open) gets the same, and once it resumes every request is billed exactly once.
A restart does not fail the calls that follow it. Redis, started, stopped and frozen by the
test."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from bench.fake_upstream import FakeUpstream
from gateway.config import parse_settings
from gateway.operator.admin import STORE_TIMEOUT
from gateway.store import Account, cache
from tests.plugins.processes import (
    GATEWAY,
    OwnRedis,
    assert_billed_once,
    balance,
    free_port,
    opened,
    settled,
)
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


async def test_a_hung_store_is_503_at_the_admin_api_and_served_around_then_billed_exactly(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    """A store that stops answering without closing its connections (SIGSTOP: a frozen
    host, a network partition): the admin API answers 503 in JSON within its store timeout,
    /readyz 503, model requests are served from the cache; once it resumes (SIGCONT), the
    balance drops by exactly the sum of the usage records, every reply recorded once."""
    redis = OwnRedis(tmp_path / "redis")
    await redis.start()
    assert redis.proc is not None
    pid = redis.proc.pid
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    completed: list[str] = []
    try:
        async with opened(redis.url) as store:
            settings = parse_settings(make_config(fake.url, redis.url))
            async with serve_app(settings) as gw, aiohttp.ClientSession() as s:

                async def chat() -> None:
                    async with s.post(gw.v1 + "/chat/completions", json=CHAT, headers=HEADERS) as r:
                        assert r.status == 200, await r.text()
                        await r.read()
                        completed.append(r.headers["x-request-id"])

                before = await balance(store)
                await chat()
                await settled(store, set(completed))

                os.kill(pid, signal.SIGSTOP)
                try:
                    # a read, and a change that moves no money (it may apply once it resumes)
                    for method, path, body in [
                        ("GET", "/admin/accounts", None),
                        ("GET", "/admin/keys", None),
                        ("POST", "/admin/groups", {"name": "made-while-hung"}),
                    ]:
                        started = time.monotonic()
                        async with s.request(method, gw.url + path, json=body, headers=admin) as r:
                            took = time.monotonic() - started
                            assert r.status == 503, (path, await r.text())
                            assert r.headers["content-type"] == "application/json"
                            assert (await r.json())["error"]["code"] == "store_unavailable"
                        assert took < STORE_TIMEOUT + 0.75, (path, took)
                    async with s.get(gw.url + "/readyz") as r:
                        assert r.status == 503
                    for _ in range(5):  # from the cache, within the grace
                        await chat()
                finally:
                    os.kill(pid, signal.SIGCONT)

                await settled(store, set(completed))
                deadline = time.monotonic() + 30
                while True:
                    async with s.get(gw.url + "/readyz") as r:
                        if r.status == 200:
                            break
                    assert time.monotonic() < deadline, "never ready again"
                    await asyncio.sleep(0.1)
            records = await settled(store, set(completed))
            assert_billed_once(records, completed, before - await balance(store))
            assert len(records) == len(completed) == 6
    finally:
        os.kill(pid, signal.SIGCONT)
        redis.proc.kill()
        redis.proc.wait()


async def test_after_the_store_restarts_the_first_calls_succeed(tmp_path: Path) -> None:
    """A restart closes every pooled connection; the next calls reconnect instead of failing on
    a closed one. (redis-py 8's default, RESP3 with maintenance notifications, hands a closed
    connection out unchecked: a key made right after a restart was a 503 in CI.)"""
    redis = OwnRedis(tmp_path / "redis")
    await redis.start()
    try:
        async with opened(redis.url) as store:
            await store.create_account("before", 1)
            # several connections in the pool, each used once
            await asyncio.gather(*(store.get_account("before") for _ in range(8)))
            await redis.stop()
            await redis.start()
            for i in range(8):  # each would be a 503 at the admin API
                assert await store.create_account(f"after-{i}", 1) == Account(f"after-{i}", 1)
            assert await store.get_account("before") == Account("before", 1)
    finally:
        assert redis.proc is not None
        redis.proc.kill()
        redis.proc.wait()


def missing_database(redis_url: str) -> str:
    """The test Redis with a database number no default server has (16: 0-15)."""
    return redis_url.rsplit("/", 1)[0] + "/99"


def wrong_password(redis_url: str) -> str:
    """The test Redis (no password set) named with a user and password it does not know."""
    return redis_url.replace("redis://", "redis://nobody:not-the-password@", 1)


NEVER_WORKS = {
    "database": (missing_database, "redis database 99 does not exist"),
    "password": (wrong_password, "redis on 127.0.0.1:"),
}


@pytest.mark.parametrize("problem", sorted(NEVER_WORKS))
async def test_a_redis_store_that_can_never_work_ends_start_up_with_one_line(
    problem: str, redis_url: str, tmp_path: Path
) -> None:
    """Not 'not ready, retrying' for ever: a configuration error, exit code 2; the line never
    holds the password."""
    url_of, said = NEVER_WORKS[problem]
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"store: {url_of(redis_url)}\n"
        "admin_token: test-admin-token\ngroups: [default]\n"
        f"models: []\nchannels: []\njournal: {tmp_path}/journal\n"
    )
    proc = await asyncio.create_subprocess_exec(
        GATEWAY, "serve", "--config", str(config), "--port", str(free_port()),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(tmp_path),
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:  # still retrying: as it did before
            proc.kill()
            await proc.wait()
    assert proc.returncode == 2
    lines = err.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"gateway: config error: store: {said}")
    assert "not-the-password" not in lines[0]
    assert out == b""


async def test_the_lifespan_stops_retrying_a_database_that_does_not_exist(
    redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker that meets it (its store came back with it, or it was started another way)
    says so once and stays up, not ready, without retrying; a store not reachable is still
    retried."""
    from tests.plugins.inprocess import running

    async with running(missing_database(redis_url)) as app:
        await asyncio.sleep(1.2)  # two retries' time, were it retrying
        assert (await app.get("/readyz")).status == 503
    found = [r.getMessage() for r in caplog.records if r.name == "gateway.app"]
    assert [m for m in found if "store_misconfigured" in m] == [
        "gateway.store_misconfigured store=redis: redis database 99 does not exist on "
        + redis_url.split("//", 1)[1].rsplit("/", 1)[0]
        + " (a Redis server has the databases 0 to its 'databases' setting less one: 0-15 by "
        "default)"
    ]
    assert not [m for m in found if "store_unavailable" in m]
