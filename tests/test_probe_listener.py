"""The probes' own listener (``server.probe_port``, ``gateway.server.probes``): /healthz and
/readyz answered on a socket that floods of the client port and its connection cap cannot
starve. In process for what it answers; on each server, in a process of its own, under a
flood of connections (a bounded count, on loopback, stopping by itself) for what it is for."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from bench.fake_upstream import FakeUpstream
from gateway.server import probes
from gateway.server.probes import ProbeListener
from tests.plugins.embedded import each_server
from tests.plugins.inprocess import InProcess
from tests.plugins.processes import Gateway, free_port, write_config


async def ask(port: int, raw: bytes, within: float = 10.0) -> bytes:
    """What a prober gets for ``raw`` on 127.0.0.1:``port``, up to the connection's end
    (b"" for a connection refused, reset or closed without an answer, or no answer
    ``within`` seconds: a prober's own timeout)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return b""
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(within):
            return await reader.read()
    except (ConnectionError, TimeoutError):
        return b""
    finally:
        writer.close()


def get(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nhost: probe\r\n\r\n".encode()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


@pytest.fixture
async def listener(inproc: InProcess) -> AsyncIterator[ProbeListener]:
    probe = ProbeListener(inproc.app, "127.0.0.1", 0)
    await probe.start()
    yield probe
    await probe.stop()


async def test_the_probe_port_answers_what_the_app_answers(listener: ProbeListener) -> None:
    healthz = await ask(listener.port, get("/healthz"))
    assert status_of(healthz) == 200 and b"connection: close" in healthz
    assert orjson.loads(healthz.split(b"\r\n\r\n", 1)[1]) == {"status": "ok"}
    readyz = await ask(listener.port, get("/readyz?verbose=1"))
    assert status_of(readyz) == 200 and readyz.endswith(b'{"status":"ready"}')
    head = await ask(listener.port, get("/healthz", "HEAD"))
    assert status_of(head) == 200 and head.endswith(b"\r\n\r\n")


@pytest.mark.parametrize(
    ("raw", "status"),
    [(get("/metrics"), 404), (get("/v1/chat/completions", "POST"), 404),
     (get("/admin/keys"), 404), (b"hello\r\n\r\n", 400)],
)  # fmt: skip
async def test_the_probe_port_answers_nothing_else(
    listener: ProbeListener, raw: bytes, status: int
) -> None:
    assert status_of(await ask(listener.port, raw)) == status


async def test_a_prober_that_says_nothing_is_let_go(
    listener: ProbeListener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(probes, "READ_SECONDS", 0.1)
    assert await ask(listener.port, b"") == b""  # closed without an answer
    held = [await asyncio.open_connection("127.0.0.1", listener.port) for _ in range(40)]
    try:  # past MAX_OPEN silent ones, a probe is still answered once they are let go
        assert status_of(await ask(listener.port, get("/healthz"))) in (0, 200)
    finally:
        for _, writer in held:
            writer.close()
    assert status_of(await ask(listener.port, get("/healthz"))) == 200


# the served gateway under a flood ---------------------------------------------------------
CAP = 20  # the client port's connection cap
HELD = 40  # idle connections the flood keeps open: twice the cap
CHURN = 2000  # connections it opens and drops meanwhile
CHURN_AT_ONCE = 50
PROBES = 8  # each one the client port does not answer waits out its 1 s


def probe_config(tmp_path: Path, fake: FakeUpstream, probe_port: int) -> Path:
    path = write_config(tmp_path, fake.url, f"sqlite:///{tmp_path / 'gw.db'}")
    cfg = yaml.safe_load(path.read_text())
    cfg["server"] = {"max_connections": CAP, "probe_port": probe_port}
    path.write_text(yaml.safe_dump(cfg))
    return path


async def churn(port: int) -> int:
    """Open and drop ``CHURN`` connections to the client port, ``CHURN_AT_ONCE`` at a time:
    a client reopening connections as fast as it can; it stops by itself."""
    opened = 0
    left = CHURN

    async def one() -> None:
        nonlocal opened, left
        while left > 0:
            left -= 1
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                opened += 1
                writer.close()

    await asyncio.gather(*(one() for _ in range(CHURN_AT_ONCE)))
    return opened


async def every_worker_ready(probe_port: int, workers: int) -> None:
    """Until the probe port's readiness is 200 many times in a row: ``Gateway.start`` waits for
    one worker to answer, and a worker still starting is rightly not ready."""
    in_a_row = 0
    for _ in range(600):
        ready = status_of(await ask(probe_port, get("/readyz"))) == 200
        in_a_row = in_a_row + 1 if ready else 0
        if in_a_row == 5 * workers:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the probe port never said every worker was ready")


@pytest.mark.parametrize("server", each_server())
@pytest.mark.parametrize("workers", [1, 2])
async def test_probes_are_answered_under_a_flood_of_the_client_port(
    fake: FakeUpstream, tmp_path: Path, workers: int, server: str
) -> None:
    probe_port = free_port()
    config = probe_config(tmp_path, fake, probe_port)
    gw = Gateway(config, free_port(), tmp_path / "log", workers, server=server)
    await gw.start()
    held: list[Any] = []
    try:
        await every_worker_ready(probe_port, workers)
        for _ in range(HELD * workers):  # idle connections, as a flood holds them: the cap
            held.append(await asyncio.open_connection("127.0.0.1", gw.port))  # is full
        flood = asyncio.create_task(churn(gw.port))
        on_client_port: list[int] = []
        on_probe_port: list[int] = []
        for _ in range(PROBES):
            # the kubelet's default probe timeout: 1 s
            on_client_port.append(status_of(await ask(gw.port, get("/healthz"), 1.0)))
            for path in ("/healthz", "/readyz"):
                on_probe_port.append(status_of(await ask(probe_port, get(path))))
        assert await flood > 0
        # the flood starves the client port's probes (the cap's 503, or nothing; granian has
        # no connection cap: a flood this small does not starve it) ...
        if server != "granian":
            assert 200 not in on_client_port, on_client_port
        # ... and not the probe port's
        assert on_probe_port == [200] * (2 * PROBES), on_probe_port
    finally:
        for _, writer in held:
            writer.close()
        gw.kill(signal.SIGTERM)
        await gw.exit_code()


FILE_LIMIT = 256  # the gateway's open-file limit in the next test
FLOOD = 800  # idle connections to its client port: more than it may open


@pytest.mark.parametrize("server", each_server())
async def test_probes_are_answered_when_a_flood_reaches_the_file_limit(
    fake: FakeUpstream, tmp_path: Path, server: str
) -> None:
    """A flood of idle connections past the process's file limit: the probe port answers
    (hypercorn's connection cap, half the limit by default, leaves descriptors to spare)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < FILE_LIMIT:
        pytest.skip("the hard file limit is too low")
    probe_port = free_port()
    config = probe_config(tmp_path, fake, probe_port)
    cfg = yaml.safe_load(config.read_text())
    cfg["server"] = {"probe_port": probe_port}  # the default cap: from the file limit
    config.write_text(yaml.safe_dump(cfg))
    gw = Gateway(config, free_port(), tmp_path / "log", server=server)
    gw.preexec = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (FILE_LIMIT, hard))
    await gw.start()
    held: list[Any] = []
    try:
        for _ in range(FLOOD):
            with contextlib.suppress(OSError):
                held.append(await asyncio.open_connection("127.0.0.1", gw.port))
        await asyncio.sleep(0.5)  # the server takes them in
        statuses = [status_of(await ask(probe_port, get("/healthz"), 5.0)) for _ in range(5)]
        assert statuses == [200] * 5, statuses
    finally:
        for _, writer in held:
            writer.close()
        gw.kill(signal.SIGTERM)
        await gw.exit_code()
