"""Gateways and Redis servers in processes of their own, as an operator runs them, and the
mixed load and money checks that the crash and load-balancer tests share.

``Gateway`` runs ``gateway serve`` with a config file from ``write_config``, on the suite's
server (``GATEWAY_TEST_SERVER``) unless told another; ``OwnRedis`` is a
redis-server on disk (append-only, fsync always) that a test can stop and start again;
``load`` drives every client protocol, streams and replies, and collects the request ids of
the replies that arrived complete; ``settled`` and ``assert_billed_once`` check that each of
those was billed exactly once and that the balance dropped by the sum of the records.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from gateway.store import Store, UsageRecord
from gateway.store.backends import open_store
from tests.plugins.embedded import SERVER
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
    ("/v1/responses", {"model": "gemini-small", "input": "hello there"}, False, b'"output"'),
    (
        "/v1/responses",
        {"model": "claude-small", "input": "hello there", "stream": True},
        True,
        b"event: response.completed",
    ),
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


# the states of Linux's socket table (/proc/net/tcp*) the tests look for
LISTEN, CLOSE_WAIT = "0A", "08"


def sockets_in_state(port: int, state: str) -> int:
    """The local TCP sockets on ``port`` in ``state`` (Linux's socket table, both families)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                local, found = line.split()[1], line.split()[3]
                count += int(local.rsplit(":", 1)[1], 16) == port and found == state
    return count


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Gateway:
    """``gateway serve`` in a process of its own, as an operator runs it."""

    def __init__(
        self,
        config: Path,
        port: int,
        log: Path,
        workers: int = 1,
        env: dict[str, str] | None = None,
        server: str = SERVER,
    ) -> None:
        self.config, self.port, self.log = config, port, log
        self.workers, self.env, self.server = workers, env or {}, server
        self.proc: subprocess.Popen[bytes] | None = None
        self.preexec: Callable[[], None] | None = None  # run in the child before it starts

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [GATEWAY, "serve", "--config", str(self.config)]
                + ["--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers)]
                + ["--server", self.server],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
                preexec_fn=self.preexec,
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


def write_config(tmp_path: Path, upstream: str, store_url: str, name: str = "gateway") -> Path:
    """A config file for ``gateway serve``, journaling into ``tmp_path / "journal"`` (an
    instance named other than "gateway" journals into ``journal-<name>``: one per instance)."""
    cfg = make_config(upstream, store_url)
    cfg["journal"] = str(tmp_path / ("journal" if name == "gateway" else f"journal-{name}"))
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


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
