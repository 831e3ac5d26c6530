"""What a server's worker does to its process: it tunes its garbage collector."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
