"""A worker whose server process is killed ends, even when the one signal Linux sends it then
is lost (uvloop drops a signal that arrives while its loop is not running, as a granian
worker's is between its lifespan start-up and serving)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"
)

# The worker: uvloop's handler for SIGTERM, set up as a granian worker sets it, then a wait
# outside the loop until its parent has been killed (the first SIGTERM is lost there), then the
# loop runs until a SIGTERM reaches the handler; ``stop`` says whether the handler stops it.
WORKER = textwrap.dedent(
    """
    import asyncio, os, sys, time
    import signal
    import uvloop
    from gateway.server.parent import end_with_parent

    out, stop = sys.argv[1], sys.argv[2] == "stop"
    parent = int(os.environ["GATEWAY_SERVER_PID"])
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    stopped = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopped.set if stop else (lambda: None))
    assert end_with_parent(1.0)
    with open(out, "w") as f:
        f.write("ready\\n")
    while os.getppid() == parent:
        time.sleep(0.01)
    time.sleep(0.2)
    loop.run_until_complete(stopped.wait())
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
    ("stop", "ends_with"),
    [("stop", "stopped"), ("ignore", "killed")],
    ids=["stops-on-a-later-SIGTERM", "killed-after-its-graceful-time"],
)
def test_a_worker_ends_when_the_first_signal_is_lost(
    tmp_path: Path, stop: str, ends_with: str
) -> None:
    out = tmp_path / "worker"
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, WORKER, str(out), stop],
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
        server.kill()
        server.wait(30)
        deadline = time.monotonic() + 30
        while alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(worker)
        lines = out.read_text().split()
        assert lines == (["ready", "stopped"] if ends_with == "stopped" else ["ready"])
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
        if server.stdout is not None:
            server.stdout.close()
        if worker and alive(worker):
            os.kill(worker, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
