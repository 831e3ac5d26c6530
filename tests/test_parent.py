"""A worker whose server process is killed ends: it stops as on SIGTERM, and is killed at a
deadline when it does not, even when that one SIGTERM is lost (uvloop drops a signal that
arrives while its loop is not running, as a granian worker's is between its lifespan's start-up
and serving); it gets no second SIGTERM (granian's worker stopped relaying on one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.plugins.processes import alive

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"
)

DEADLINE = 1.0  # the worker's, after its parent's end

# The worker: uvloop's handler for SIGTERM, set up as a granian worker sets it, writing a line
# for each SIGTERM it sees. ``late``: the loop first runs once the parent has been killed (the
# first SIGTERM is lost); ``stops``: the handler ends the loop; ``lingers``: it does not (a
# worker letting long streams finish).
WORKER = textwrap.dedent(
    f"""
    import asyncio, os, sys, time
    import signal
    import uvloop
    from gateway.server.parent import end_with_parent

    out, mode = sys.argv[1], sys.argv[2]
    parent = int(os.environ["GATEWAY_SERVER_PID"])
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    stopped = asyncio.Event()

    def on_term():
        with open(out, "a") as f:
            f.write("SIGTERM\\n")
        if mode != "lingers":
            stopped.set()

    def ready():
        with open(out, "w") as f:
            f.write("ready\\n")

    async def serve():
        if mode != "late":
            ready()  # with the loop running: no SIGTERM lost from here on
        await stopped.wait()

    loop.add_signal_handler(signal.SIGTERM, on_term)
    assert end_with_parent({DEADLINE})
    if mode == "late":
        ready()
        while os.getppid() == parent:
            time.sleep(0.01)
        time.sleep(0.2)
    loop.run_until_complete(serve())
    with open(out, "a") as f:
        f.write("stopped\\n")
    """
)

# The server: starts the worker with its own pid named, then waits to be killed.
SERVER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    env = dict(os.environ, GATEWAY_SERVER_PID=str(os.getpid()))
    worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], env=env)
    print(worker.pid, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize(
    ("mode", "lines", "killed"),
    [
        ("stops", ["ready", "SIGTERM", "stopped"], False),
        ("lingers", ["ready", "SIGTERM"], True),
        ("late", ["ready"], True),
    ],
    ids=["stops-on-SIGTERM", "killed-at-the-deadline", "killed-when-the-SIGTERM-is-lost"],
)
def test_a_worker_ends_with_its_killed_server(
    tmp_path: Path, mode: str, lines: list[str], killed: bool
) -> None:
    out = tmp_path / "worker"
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, WORKER, str(out), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    worker = 0
    try:
        assert server.stdout is not None
        worker = int(server.stdout.readline())
        deadline = time.monotonic() + 30
        while not (out.exists() and "ready" in out.read_text()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        killed_at = time.monotonic()  # before: the worker's deadline runs from the kill on
        server.kill()
        server.wait(30)
        deadline = time.monotonic() + 30
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(worker)
        assert out.read_text().split() == lines  # one SIGTERM at most
        if killed:  # by the deadline, not before it
            assert time.monotonic() - killed_at >= DEADLINE
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
        if server.stdout is not None:
            server.stdout.close()
        if worker and alive(worker):
            os.kill(worker, signal.SIGKILL)
