"""Money across a crash: the gateway served by its own command in a process of its own, killed
with SIGKILL under mixed load (stream and non-stream, every client protocol, on each store),
then started again; and stopped with SIGTERM while its Redis is down, then started again with
Redis back. Every request whose client received a complete reply has exactly one usage record,
and the balance dropped by exactly the sum of the records' costs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from bench.fake_upstream import FakeUpstream
from gateway.store import Store, UsageRecord, open_store
from tests.plugins.servers import KEYS, make_config

KEY = KEYS["alice"]
START_DEADLINE = 30.0
SETTLE_DEADLINE = 30.0
WORKERS = 16
GATEWAY = str(Path(sys.executable).with_name("gateway"))  # the command the package installs

# (path, body, stream, what the complete reply's bytes contain)
Request = tuple[str, dict[str, Any], bool, bytes]
HI = [{"role": "user", "content": "hello there"}]
REQUESTS: list[Request] = [
    ("/v1/chat/completions", {"model": "chat-small", "messages": HI}, False, b'"choices"'),
    (
        "/v1/chat/completions",
        {"model": "claude-small", "messages": HI, "stream": True},
        True,
        b"data: [DONE]",
    ),
    (
        "/v1/messages",
        {"model": "claude-small", "max_tokens": 64, "messages": HI},
        False,
        b'"content"',
    ),
    (
        "/v1/messages",
        {"model": "gemini-small", "max_tokens": 64, "messages": HI, "stream": True},
        True,
        b"event: message_stop",
    ),
    (
        "/v1beta/models/gemini-small:generateContent",
        {"contents": [{"role": "user", "parts": [{"text": "hello there"}]}]},
        False,
        b'"candidates"',
    ),
    (
        "/v1beta/models/chat-small:streamGenerateContent?alt=sse",
        {"contents": [{"role": "user", "parts": [{"text": "hello there"}]}]},
        True,
        b'"finishReason"',
    ),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Gateway:
    """``gateway serve`` in a process of its own, as an operator runs it."""

    def __init__(self, config: Path, port: int, log: Path) -> None:
        self.config, self.port, self.log = config, port, log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [GATEWAY, "serve", "--config", str(self.config)]
                + ["--host", "127.0.0.1", "--port", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + START_DEADLINE
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                assert self.proc.poll() is None, self.log.read_text()[-3000:]
                with contextlib.suppress(aiohttp.ClientError):
                    async with s.get(self.url + "/healthz") as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.05)
        raise AssertionError("the gateway did not start:\n" + self.log.read_text()[-3000:])

    def kill(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def exit_code(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        code = await asyncio.to_thread(self.proc.wait, timeout)
        return code


async def one_request(s: aiohttp.ClientSession, url: str, req: Request) -> str | None:
    """The request id of a reply the client received complete, else None."""
    path, body, _, complete = req
    headers = {"authorization": f"Bearer {KEY}", "x-api-key": KEY, "x-goog-api-key": KEY}
    async with s.post(url + path, json=body, headers=headers) as r:
        data = await r.read()
        if r.status == 200 and complete in data:
            return r.headers["x-request-id"]
    return None


async def load(url: str, completed: list[str], stop: asyncio.Event) -> None:
    """Requests from ``WORKERS`` clients until ``stop`` or the gateway dies; the ids of
    complete replies go to ``completed``."""

    async def worker(n: int) -> None:
        async with aiohttp.ClientSession() as s:
            i = n
            while not stop.is_set():
                try:
                    got = await one_request(s, url, REQUESTS[i % len(REQUESTS)])
                except (TimeoutError, aiohttp.ClientError):
                    return  # the gateway is gone
                if got is not None:
                    completed.append(got)
                i += 1

    await asyncio.gather(*(worker(n) for n in range(WORKERS)))


async def settled(
    store: Store, want: set[str], check: Callable[[list[UsageRecord]], bool] | None = None
) -> list[UsageRecord]:
    """The store's records once every id of ``want`` is among them (polled, with a
    deadline)."""
    deadline = time.monotonic() + SETTLE_DEADLINE
    while True:
        records = await store.usage(limit=100_000)
        if want <= {r.request_id for r in records} and (check is None or check(records)):
            return records
        if time.monotonic() > deadline:
            missing = want - {r.request_id for r in records}
            raise AssertionError(f"{len(missing)} complete replies never recorded")
        await asyncio.sleep(0.1)


async def balance(store: Store) -> int:
    account = await store.get_account("alice")
    assert account is not None
    return account.balance


def assert_billed_once(records: list[UsageRecord], completed: list[str], drop: int) -> None:
    ids = [r.request_id for r in records]
    assert len(ids) == len(set(ids)), "a request recorded twice"
    assert set(completed) <= set(ids)
    assert drop == sum(r.cost for r in records)
    assert all(r.cost > 0 for r in records if r.request_id in set(completed))


@contextlib.asynccontextmanager
async def opened(url: str) -> AsyncIterator[Store]:
    store = open_store(url)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def write_config(tmp_path: Path, upstream: str, store_url: str) -> Path:
    cfg = make_config(upstream, store_url)
    cfg["journal"] = str(tmp_path / "journal")
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


async def test_sigkill_mid_load_loses_no_complete_reply(
    fake: FakeUpstream, store_url: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path, fake.url, store_url)
    gw = Gateway(config, free_port(), tmp_path / "gateway.log")
    await gw.start()
    async with opened(store_url) as store:
        before = await balance(store)
        completed: list[str] = []
        stop = asyncio.Event()
        running = asyncio.create_task(load(gw.url, completed, stop))
        deadline = time.monotonic() + 60
        while len(completed) < 300 and time.monotonic() < deadline and not running.done():
            await asyncio.sleep(0.01)
        gw.kill(signal.SIGKILL)  # mid-load: replies in flight, records in the writer's batch
        assert await gw.exit_code() == -signal.SIGKILL
        await running
        assert len(completed) >= 300

        await gw.start()  # adopts what the dead process journaled
        try:
            records = await settled(store, set(completed))
            assert_billed_once(records, completed, before - await balance(store))
            # at most the requests in flight at the kill were recorded beyond those completed
            assert len(records) - len(completed) <= WORKERS
        finally:
            gw.kill(signal.SIGTERM)
            assert await gw.exit_code() == 0
    assert list((tmp_path / "journal").iterdir()) == []  # everything settled, nothing left


class OwnRedis:
    """A redis-server of the test's own (on disk, append-only), to stop and start again."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self.dir.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            + ["--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        await poll(self._answers, "redis-server did not start")

    async def stop(self) -> None:
        assert self.proc is not None
        self.proc.terminate()
        await asyncio.to_thread(self.proc.wait, 30)

    async def _answers(self) -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return False
        writer.close()
        return True


async def poll(ready: Callable[[], Awaitable[bool]], failure: str) -> None:
    deadline = time.monotonic() + START_DEADLINE
    while not await ready():
        assert time.monotonic() < deadline, failure
        await asyncio.sleep(0.05)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
async def test_sigterm_with_redis_down_keeps_every_record_for_the_next_start(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    redis = OwnRedis(tmp_path / "redis")
    await redis.start()
    config = write_config(tmp_path, fake.url, redis.url)
    gw = Gateway(config, free_port(), tmp_path / "gateway.log")
    await gw.start()
    try:
        async with opened(redis.url) as store:
            before = await balance(store)
        await redis.stop()  # the store is away; the gateway serves from its cache
        completed: list[str] = []
        async with aiohttp.ClientSession() as s:
            for i in range(30):
                got = await one_request(s, gw.url, REQUESTS[i % len(REQUESTS)])
                assert got is not None
                completed.append(got)
        gw.kill(signal.SIGTERM)
        assert await gw.exit_code() == 0  # nothing lost: it is all in the journal
        assert "writer.stop_journaled records=30" in gw.log.read_text()

        await redis.start()
        await gw.start()
        async with opened(redis.url) as store:
            records = await settled(store, set(completed))
            assert len(records) == 30
            assert_billed_once(records, completed, before - await balance(store))
        gw.kill(signal.SIGTERM)
        assert await gw.exit_code() == 0
        assert list((tmp_path / "journal").iterdir()) == []
    finally:
        for proc in (gw.proc, redis.proc):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
