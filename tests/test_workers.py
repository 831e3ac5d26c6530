"""``--workers 2``: new connections reach both workers, each its share, and each worker
listens on a socket of its own (``gateway.server.ListenerPerWorker``; hypercorn and uvicorn:
granian's workers share one socket, and a burst is spread over them evenly all the same)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import time
from pathlib import Path

import orjson
import pytest

from bench import procs
from gateway.observe.metrics import DIR_ENV
from tests.plugins.embedded import each_server
from tests.plugins.processes import LISTEN, Gateway, sockets_in_state

CONNECTIONS = 64
# each worker's least share of CONNECTIONS: the kernel spreads connections by a hash of their
# addresses, so fewer than an eighth on either worker is as likely as a broken spread is not
LEAST = CONNECTIONS // 8


def minimal_config(tmp_path: Path) -> Path:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"store: sqlite:///{tmp_path}/gateway.db\n"
        "admin_token: test-admin-token\ngroups: [default]\nmodels: []\nchannels: []\n"
    )
    return config


def served(snapshots: Path) -> dict[int, int]:
    """``/healthz`` requests each worker has counted, by pid (its snapshot: every second)."""
    counts = {}
    for path in snapshots.glob("*.json"):
        with contextlib.suppress(OSError, orjson.JSONDecodeError):
            snap = orjson.loads(path.read_bytes())
            counts[snap["pid"]] = sum(row[5] for row in snap["rows"] if row[2] == "healthz")
    return counts


def healthz(port: int) -> None:
    """One ``GET /healthz`` on a connection of its own."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        assert conn.getresponse().read() == b'{"status":"ok"}'
    finally:
        conn.close()


def listeners(port: int) -> int:
    """Listening TCP sockets on ``port``."""
    return sockets_in_state(port, LISTEN)


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's socket table")
@pytest.mark.parametrize("server", each_server("hypercorn", "uvicorn"))
async def test_two_workers_each_serve_their_share(tmp_path: Path, server: str) -> None:
    """Connections opened one after another, each with one request: both workers answer
    some. With one socket shared by the workers, whichever worker's loop woke first took
    what waited: a burst went mostly to one."""
    snapshots = tmp_path / "metrics"
    snapshots.mkdir()
    port = procs.free_port()
    gw = Gateway(minimal_config(tmp_path), port, tmp_path / "gw.log", workers=2,
                 env={DIR_ENV: str(snapshots)}, server=server)  # fmt: skip
    await gw.start()
    try:
        deadline = time.monotonic() + 60
        while len(served(snapshots)) < 2:  # both workers up (each writes its snapshot)
            assert time.monotonic() < deadline, gw.log.read_text()[-3000:]
            await asyncio.sleep(0.2)
        assert listeners(port) == 2  # one per worker, none in the server process
        before = served(snapshots)
        for _ in range(CONNECTIONS):
            await asyncio.to_thread(healthz, port)
        while sum(served(snapshots).values()) < sum(before.values()) + CONNECTIONS:
            assert time.monotonic() < deadline, served(snapshots)
            await asyncio.sleep(0.2)
        after = served(snapshots)
        shares = [after[pid] - before.get(pid, 0) for pid in after]
        assert len(shares) == 2 and min(shares) >= LEAST, shares
    finally:
        gw.kill(15)
        assert await gw.exit_code() == 0, gw.log.read_text()[-3000:]


HEADER_TIMEOUT = 2.0
SILENT = 16  # connections that send nothing: both workers get some


@pytest.mark.parametrize("server", each_server("hypercorn", "uvicorn"))
async def test_each_worker_closes_a_silent_connection_at_the_header_timeout(
    tmp_path: Path, server: str
) -> None:
    """The server's settings reach every worker (under uvicorn its protocol, pickled into
    each with them: ``gateway.server.uvicorn_guard``): connections that send nothing are
    closed at the header timeout, whichever worker took them."""
    config = minimal_config(tmp_path)
    config.write_text(
        config.read_text() + f"server: {{header_timeout_seconds: {HEADER_TIMEOUT}}}\n"
    )
    snapshots = tmp_path / "metrics"
    snapshots.mkdir()
    gw = Gateway(config, procs.free_port(), tmp_path / "gw.log", workers=2,
                 env={DIR_ENV: str(snapshots)}, server=server)  # fmt: skip
    await gw.start()
    try:
        deadline = time.monotonic() + 60
        while len(served(snapshots)) < 2:  # both workers up, and listening
            assert time.monotonic() < deadline, gw.log.read_text()[-3000:]
            await asyncio.sleep(0.2)
        opened = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(SILENT)]
        async with asyncio.timeout(HEADER_TIMEOUT + 20):  # a busy machine's delay, at most
            read = await asyncio.gather(*(reader.read() for reader, _ in opened))
        assert read == [b""] * SILENT  # nothing was asked: nothing is answered
        for _, writer in opened:
            writer.close()
    finally:
        gw.kill(15)
        assert await gw.exit_code() == 0, gw.log.read_text()[-3000:]
