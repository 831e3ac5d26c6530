"""What the server entry points do to the process: a worker tunes its garbage collector."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER = """
import gc
from gateway.app import create_app
from gateway.server import GC_GEN0_THRESHOLD
before = gc.get_threshold()[0]
create_app()  # as a server's worker builds it, from GATEWAY_CONFIG
print(before, gc.get_threshold()[0] == GC_GEN0_THRESHOLD, gc.get_freeze_count() > 10_000)
"""


def test_a_worker_building_the_app_freezes_start_up_and_collects_young_objects_less_often() -> None:
    env = {**os.environ, "GATEWAY_CONFIG": str(ROOT / "config" / "gateway.yaml")}
    done = subprocess.run(
        [sys.executable, "-c", WORKER], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["700", "True", "True"]
