"""What garbage collection costs the gateway under load: ``python -m bench.gc_probe [CELL ...]``.

Starts the fake upstream (nginx) and one gateway worker pinned like the bench's, with
``gc.callbacks`` timing every collection in the worker's thread CPU time, then runs wrk cells
(``KIND:CONNS:SECONDS``, KIND ``json`` or ``sse``; by default json at 1, 64 and 256
connections and sse at 64, 8 s each) and prints for each: req/s, CPU µs per request, the share
of that CPU spent collecting, and per generation the collections, their total and their longest
pause, and the objects the collector tracks after the cell (outside the frozen start-up heap).
A ``paced:N`` cell holds N paced streams open together (``bench.streams``), to see what a burst
leaves behind for the cells after it.

``gateway.server.gc_tuning`` was tuned with it; run it again when the hot path's allocations change.
The probed worker is ``python -m bench.gc_probe serve --config ...``: the gateway's own CLI
with the callbacks installed; SIGUSR1 writes the counters to ``GC_PROBE_OUT`` and resets them.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_CELLS = ("json:1:8", "json:64:8", "json:256:8", "sse:64:8")
GENERATIONS = (0, 1, 2)


class Counters:
    """Collections per generation: count, thread CPU seconds in all, longest, objects freed."""

    def __init__(self) -> None:
        self._started = 0.0
        self.reset()

    def reset(self) -> None:
        self.by_generation = {g: {"count": 0, "seconds": 0.0, "longest": 0.0, "freed": 0}
                              for g in GENERATIONS}  # fmt: skip

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
            return
        spent = time.thread_time() - self._started
        seen = self.by_generation[info["generation"]]
        seen["count"] += 1
        seen["seconds"] += spent
        seen["longest"] = max(seen["longest"], spent)
        seen["freed"] += info["collected"]

    def report(self) -> dict[str, Any]:
        """The counters so far and the objects tracked now (outside the frozen heap)."""
        return {"generations": self.by_generation, "tracked": len(gc.get_objects())}


def install(out: Path) -> Counters:
    """Time every collection of this process; SIGUSR1 writes the counters to ``out`` (JSON)
    and starts them afresh."""
    counters = Counters()
    gc.callbacks.append(counters.callback)

    def write(_signum: int, _frame: object) -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(counters.report()))
        tmp.replace(out)  # a reader never sees half a file
        counters.reset()

    signal.signal(signal.SIGUSR1, write)
    return counters


def read_counters(pid: int, out: Path, timeout: float = 10.0) -> dict[str, Any]:
    """Ask the probed worker for its counters (and reset them)."""
    out.unlink(missing_ok=True)
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while not out.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the probed gateway wrote no counters")
        time.sleep(0.02)
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def describe(cell: str, rps: float, cpu_us: float, cpu_seconds: float, data: dict[str, Any]) -> str:
    gens = data["generations"]
    collecting = sum(g["seconds"] for g in gens.values())
    share = collecting / cpu_seconds * 100 if cpu_seconds else 0.0
    parts = [
        f"g{g}: {v['count']} in {v['seconds'] * 1000:.0f} ms, longest {v['longest'] * 1000:.1f} ms"
        f", freed {v['freed']:,}"
        for g, v in gens.items()
    ]
    return (
        f"{cell}: {rps:,.0f} req/s, {cpu_us:,.0f} µs/req, collecting {share:.1f}% of the CPU"
        f" ({collecting * 1000:.0f} ms); {'; '.join(parts)}; tracked after: {data['tracked']:,}"
    )


def run_cells(cells: list[str]) -> int:
    from bench import procs, run, targets, wrk

    procs.install_cleanup()
    tmp = Path(tempfile.mkdtemp(prefix="gc-probe-"))
    out = tmp / "counters.json"
    up = targets.start_upstream(tmp, 200, 25)
    port = procs.free_port()
    conf = targets.gateway_config(tmp, up, "gc-probe")
    cmd = [sys.executable, "-m", "bench.gc_probe", "serve", "--config", str(conf),
           "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
    proc = procs.start(
        procs.pinned(cmd, targets.RELAY_CORE), tmp / "gateway.log",
        env={"GC_PROBE_OUT": str(out)}, cwd=str(targets.ROOT),
    )  # fmt: skip
    paths = dict.fromkeys(("json", "sse", "paced"), "/v1/chat/completions")
    probed = targets.Target("gc-probe", "gateway", targets.DEFAULT_SERVER, port, proc, paths)
    gateway = targets._settle(probed, 60)
    if gateway is None:
        print((tmp / "gateway.log").read_text()[-2000:], file=sys.stderr)
        return 2
    try:
        run.warm_up(tmp, gateway)
        read_counters(proc.pid, out)
        for cell in cells:
            kind, conns, *seconds = cell.split(":")
            cpu_before = procs.cpu_seconds([proc.pid])
            if kind == "paced":
                began = time.monotonic()
                streams = run.streams_cell(tmp, gateway, int(conns), 1)
                served = round(streams["n"] * streams["completion"])
                rps = served / (time.monotonic() - began)
            else:
                lua = run.wrk_lua(tmp, gateway, kind, kind == "sse")
                result = wrk.run(port, lua, int(conns), float(seconds[0]))
                served, rps = result.requests, result.rps
            cpu = procs.cpu_seconds([proc.pid]) - cpu_before
            data = read_counters(proc.pid, out)
            print(describe(cell, rps, cpu * 1e6 / max(1, served), cpu, data), flush=True)
            run.settle(gateway)
    finally:
        procs.stop_all()
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        from gateway import cli

        install(Path(os.environ["GC_PROBE_OUT"]))
        return cli.main(argv)
    return run_cells(argv or list(DEFAULT_CELLS))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
