"""What a server does to its process (it tunes its garbage collector) and to its replies."""

from __future__ import annotations

import http.client
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import procs

ROOT = Path(__file__).resolve().parent.parent

WORKER = """
import asyncio, gc
from gateway import gc_tuning
from gateway.app import create_app
before = gc.get_threshold()[0]
create_app()  # as a server's worker builds it, from GATEWAY_CONFIG
full = []
gc.callbacks.append(lambda p, info: p == "stop" and info["generation"] == 2 and full.append(1))
gc_tuning.FULL_EVERY = 0.05
async def main():
    stop = gc_tuning.collect_periodically(asyncio.get_running_loop())
    await asyncio.sleep(0.3)
    stop()
    seen = len(full)
    await asyncio.sleep(0.2)
    return seen, len(full) == seen
seen, stopped = asyncio.run(main())
print(before, gc.get_threshold()[0] == gc_tuning.GEN0_THRESHOLD, gc.get_freeze_count() > 10_000,
      seen >= 3, stopped)
"""


def test_a_worker_freezes_start_up_collects_young_objects_less_often_and_all_periodically() -> None:
    env = {**os.environ, "GATEWAY_CONFIG": str(ROOT / "config" / "gateway.yaml")}
    done = subprocess.run(
        [sys.executable, "-c", WORKER], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["700", "True", "True", "True", "True"]


SERVERS = [
    pytest.param(name, marks=pytest.mark.skipif(
        importlib.util.find_spec(name) is None, reason=f"{name} is not installed"))
    for name in ("hypercorn", "uvicorn")  # granian always names itself: no setting for it
]  # fmt: skip


@pytest.mark.parametrize("server", SERVERS)
def test_replies_do_not_name_the_server_software(tmp_path: Path, server: str) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"store: sqlite:///{tmp_path}/gateway.db\nadmin_token: t\ngroups: [default]\n"
        "models: []\nchannels: []\n"
    )
    port = procs.free_port()
    with (tmp_path / "log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port",
             str(port), "--server", server],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path),
        )  # fmt: skip
    try:
        assert procs.wait_port(port, proc, 60), (tmp_path / "log").read_text()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b'{"status":"ok"}'
        assert resp.getheader("server") is None
        assert resp.getheader("date")  # HTTP requires it of an origin server with a clock
        conn.close()
    finally:
        proc.terminate()
        proc.wait(30)
