"""bench.gc_probe: every collection is counted in its generation, with its time and what it
freed, and a probed process hands its counters over on SIGUSR1 and starts afresh."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

from bench.gc_probe import Counters, describe

ROOT = Path(__file__).resolve().parent.parent


def test_collections_are_counted_by_generation_with_what_they_freed() -> None:
    counters = Counters()
    gc.callbacks.append(counters.callback)
    try:
        for _ in range(3):
            cycle: list[object] = []
            cycle.append(cycle)
            del cycle
            gc.collect(2)
        gc.collect(0)
    finally:
        gc.callbacks.remove(counters.callback)
    full, young = counters.by_generation[2], counters.by_generation[0]
    assert full["count"] == 3 and young["count"] >= 1
    assert full["freed"] >= 3  # the three self-referencing lists
    assert 0 <= full["longest"] <= full["seconds"]


PROBED = """
import gc, json, os, signal, sys, time
from pathlib import Path
from bench.gc_probe import install
out = Path(sys.argv[1])
install(out)
gc.collect(2); gc.collect(2)
os.kill(os.getpid(), signal.SIGUSR1)
first = json.loads(out.read_text())
os.kill(os.getpid(), signal.SIGUSR1)
print(json.dumps([first, json.loads(out.read_text())]))
"""


def test_a_probed_process_writes_its_counters_on_sigusr1_and_resets_them(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBED, str(tmp_path / "counters.json")],
        capture_output=True, text=True, timeout=60, cwd=str(ROOT),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, second = json.loads(done.stdout)
    assert first["generations"]["2"]["count"] == 2
    assert second["generations"]["2"]["count"] == 0
    assert first["tracked"] > 0


def test_the_share_of_cpu_spent_collecting() -> None:
    data = {
        "generations": {
            "0": {"count": 4, "seconds": 0.2, "longest": 0.08, "freed": 0},
            "1": {"count": 0, "seconds": 0.0, "longest": 0.0, "freed": 0},
            "2": {"count": 1, "seconds": 0.3, "longest": 0.3, "freed": 10},
        },
        "tracked": 1234,
    }
    line = describe("json:256:8", 1000.0, 700.0, 2.0, data)
    assert "collecting 25.0% of the CPU (500 ms)" in line
    assert "g0: 4 in 200 ms, longest 80.0 ms, freed 0" in line and "freed 10" in line
    assert "tracked after: 1,234" in line
