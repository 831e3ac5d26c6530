"""Bursts (issue 30): N streams *arriving* within a short spread on fresh connections, and how
the gateway's workers share them: ``python -m bench.burst`` (``make bench-burst``).

Each cell runs ``bench.streams --burst`` (pinned to core 1 with the upstream): N new
connections, their connect calls spread evenly over ``--spread-ms``, each posting one paced
streaming chat request as soon as it is connected (the upstream waits ``FIRST_MS`` before its
first chunk, as in scenario (c)). TTFB counts from the connect call, so the server's accept
queue is inside it. Targets: direct (the upstream itself), then the gateway on each server with
one worker (pinned to core 0) and with two (unpinned: both cores, shared with the upstream and
the client). With ``--bare``, the bare relay (``bench.bare_relay``) on each server with one
worker too, pinned as the gateway is: what the least a Python relay does costs in a burst, the
yardstick for the gateway's own share of the added time.

Which worker served each request: every gateway runs with ``GATEWAY_METRICS_DIR`` set to a
directory of the bench's, where each worker writes its counters to ``<pid>.json`` every second
(``gateway.observe.metrics``, what ``/metrics`` adds up anyway: nothing is added to the hot
path). A cell's share per worker is the growth of that worker's request count across the cell.
CPU per stream: the target's process tree's CPU time across a run (the whole stream, not only
up to its first byte), over N. With ``--first-ms 3000`` (an upstream that waits 3 s before its
first chunk) the set-up CPU per stream too: the CPU time from the first arrival until just
before a first chunk can come back (accept, parse, admission, routing, the upstream
connection and request of every stream), over N.

Prints a markdown section for bench/RESULTS.md and the figures as JSON (``--json FILE``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench import payloads, procs, streams, targets

FIRST_MS, DELAY_MS = 200, 25  # the paced upstream, as in scenario (c)
METRICS_DIR_ENV = "GATEWAY_METRICS_DIR"
REQUESTS = 5  # a snapshot row's request count: model, protocol, endpoint, channel, status, then it
SNAPSHOT_WAIT = 1.6  # a worker writes its snapshot every second
WARM_UP = 200  # streams of an untimed burst first: imports, pools and caches in place
SETUP_FIRST_MS = 1000  # an upstream this slow leaves the set-up alone before its first chunk


@dataclass
class Cell:
    target: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    shares: list[list[int]] = field(default_factory=list)  # per run: requests per worker

    def median(self, key: str) -> float:
        return float(statistics.median(r[key] for r in self.runs))


def start_gateway(
    tmp: Path, up: targets.Upstream, server: str, workers: int
) -> tuple[targets.Target, Path] | None:
    """The gateway on ``server`` with ``workers`` workers, its metrics directory the bench's."""
    exe = targets.gateway_binary()
    if exe is None:
        return None
    name = f"gateway-{server}-{workers}w" + ("" if workers == 1 else "-unpinned")
    snapshots = tmp / f"{name}.metrics"
    snapshots.mkdir()
    port = procs.free_port()
    conf = targets.gateway_config(tmp, up, name)
    cmd = [exe, "serve", "--config", str(conf), "--host", "127.0.0.1", "--port", str(port),
           "--workers", str(workers), "--server", server]  # fmt: skip
    proc = procs.start(
        procs.pinned(cmd, targets.RELAY_CORE if workers == 1 else None),
        tmp / f"{name}.log",
        env={METRICS_DIR_ENV: str(snapshots)},
        cwd=str(tmp),
    )
    target = targets.Target(name, "gateway", server, port, proc, targets.relay_paths())
    if targets._settle(target, 60) is None:
        return None
    deadline = time.monotonic() + 60  # every worker up: each has written its snapshot
    while len(list(snapshots.glob("*.json"))) < workers and time.monotonic() < deadline:
        time.sleep(0.2)
    return target, snapshots


def served(snapshots: Path | None) -> dict[int, int]:
    """Requests each worker has counted so far, by pid."""
    if snapshots is None:
        return {}
    counts = {}
    for path in snapshots.glob("*.json"):
        try:
            snap = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        counts[int(snap["pid"])] = sum(int(row[REQUESTS]) for row in snap["rows"])
    return counts


def burst(
    tmp: Path, target: targets.Target, n: int, spread_ms: float, first_ms: int = FIRST_MS
) -> dict[str, Any]:
    """One burst; with its figures, ``setup_cpu_ms``: the target's CPU time from the first
    arrival until 50 ms before the upstream's first chunk can be back (``first_ms`` after the
    first request): the streams' set-up alone, when ``first_ms`` is long enough for all of it."""
    body = tmp / "burst-body.json"
    body.write_bytes(payloads.chat_request("paced", True))
    cmd = procs.pinned(
        [sys.executable, "-m", "bench.streams", "--burst", "--port", str(target.port),
         "--path", target.paths["paced"], "--body-file", str(body), "-n", str(n),
         "--spread-ms", str(spread_ms), "--timeout", str(30 + n * 0.006),
         "--header", f"Authorization: Bearer {payloads.BENCH_KEY}"],
        1,
    )  # fmt: skip
    client = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert client.stdout is not None
    pids, setup = target.pids(), float("nan")
    for started in client.stdout:
        if started.startswith(streams.BURST_START):
            cpu = procs.cpu_seconds(pids)
            time.sleep((int(started.split()[1]) + first_ms - 50) / 1000)
            setup = (procs.cpu_seconds(pids) - cpu) * 1000
            break
    out, err = client.communicate(timeout=300)
    line = next((x for x in out.splitlines() if x.startswith("STREAMSJSON ")), None)
    if line is None:
        raise RuntimeError(f"bench.streams failed: {err[-800:]}")
    return {**json.loads(line[len("STREAMSJSON ") :]), "setup_cpu_ms": setup}


def measure(
    tmp: Path, target: targets.Target, snapshots: Path | None, n: int, spread: float, reps: int,
    first_ms: int,
) -> Cell:  # fmt: skip
    cell = Cell(target.name)
    burst(tmp, target, min(n, WARM_UP), spread, first_ms)
    for _ in range(reps):
        time.sleep(SNAPSHOT_WAIT)
        before, cpu = served(snapshots), procs.cpu_seconds(target.pids())
        cell.runs.append(burst(tmp, target, n, spread, first_ms))
        cell.runs[-1]["cpu_ms_per_stream"] = (procs.cpu_seconds(target.pids()) - cpu) * 1000 / n
        time.sleep(SNAPSHOT_WAIT)
        after = served(snapshots)
        cell.shares.append(sorted((after[p] - before.get(p, 0) for p in after), reverse=True))
        print(f"  {target.name}: {cell.runs[-1]} shares {cell.shares[-1]}", flush=True)
    return cell


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def markdown(
    cells: list[Cell], n: int, spread: float, reps: int, first_ms: int, command: str
) -> str:
    """The section for bench/RESULTS.md; with an upstream slow enough to answer
    (``SETUP_FIRST_MS``), the set-up CPU per stream too."""
    setup = first_ms >= SETUP_FIRST_MS
    direct = next((c for c in cells if c.target == "direct"), None)
    base = direct.median("ttfb_p99_ms") if direct else float("nan")
    lines = [
        f"Written by `{command}` on {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; "
        f"N = {n} arrivals over {spread:g} ms, upstream first chunk after {first_ms} ms, "
        f"median of {reps} runs (errors: all runs).",
        "",
        f"Versions: python {platform.python_version()}, kernel {platform.release()}, "
        + ", ".join(f"{s} {version(s)}" for s in targets.SERVERS)
        + f", aiohttp {version('aiohttp')}, uvloop {version('uvloop')}.",
        "",
        "| target | TTFB p50 ms | TTFB p99 ms | p99 − direct | p99 each run | connect p99 ms "
        "| errors | CPU ms per stream |"
        + (" set-up CPU ms per stream |" if setup else "")
        + " requests per worker (each run) |",
        "|---|---:|---:|---:|---|---:|---:|---:|" + ("---:|" if setup else "") + "---|",
    ]
    for c in cells:
        p99 = c.median("ttfb_p99_ms")
        added = "–" if c is direct else f"{p99 - base:,.0f}"
        shares = "; ".join(" / ".join(str(x) for x in s) for s in c.shares if s) or "–"
        errors = sum(int(r["errors"]) for r in c.runs)
        # the first run after the warm-up opens most of its upstream connections; later ones
        # find the earlier run's idle in the pool
        each = ", ".join(f"{r['ttfb_p99_ms']:,.0f}" for r in c.runs)
        lines.append(
            f"| {c.target} | {c.median('ttfb_p50_ms'):,.0f} | {p99:,.0f} | {added} "
            f"| {each} | {c.median('connect_p99_ms'):,.1f} | {errors} "
            f"| {c.median('cpu_ms_per_stream'):.2f} "
            + (f"| {c.median('setup_cpu_ms') / n:.2f} " if setup else "")
            + f"| {shares} |"
        )
    return "\n".join(lines) + "\n"


def run(
    servers: list[str], workers: list[int], n: int, spread: float, reps: int, first_ms: int,
    bare: bool = False,
) -> list[Cell]:  # fmt: skip
    cells = []
    with tempfile.TemporaryDirectory(prefix="bench-burst-") as name:
        tmp = Path(name)
        up = targets.start_upstream(tmp, first_ms, DELAY_MS)
        try:
            direct = targets.direct(up)
            cells.append(measure(tmp, direct, None, n, spread, reps, first_ms))
            for server in servers if bare else ():
                relay = targets.bare_relay(tmp, up, server)
                if relay is None:
                    print(f"  ! the bare relay on {server} did not start")
                    continue
                try:
                    cells.append(measure(tmp, relay, None, n, spread, reps, first_ms))
                finally:
                    assert relay.proc is not None
                    procs.stop(relay.proc)
            for server in servers:
                for count in workers:
                    started = start_gateway(tmp, up, server, count)
                    if started is None:
                        print(f"  ! gateway on {server}, {count} workers, did not start")
                        continue
                    target, snapshots = started
                    try:
                        cells.append(measure(tmp, target, snapshots, n, spread, reps, first_ms))
                    finally:
                        assert target.proc is not None
                        procs.stop(target.proc)
        finally:
            procs.stop(up.proc)
            if up.paced_proc is not up.proc:
                procs.stop(up.paced_proc)
    return cells


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__)
    parser.add_argument("-n", type=int, default=1000)
    parser.add_argument("--spread-ms", type=float, default=100.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--first-ms", type=int, default=FIRST_MS, help="the upstream's wait")
    parser.add_argument("--server", action="append", choices=targets.SERVERS)
    parser.add_argument("--workers", action="append", type=int)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--bare", action="store_true", help="the bare relay on each server too")
    args = parser.parse_args(argv)
    procs.install_cleanup()
    servers = [s for s in args.server or targets.SERVERS if targets.server_available(s)]
    cells = run(
        servers, args.workers or [1, 2], args.n, args.spread_ms, args.reps, args.first_ms, args.bare
    )
    command = "python -m bench.burst " + " ".join(argv if argv is not None else sys.argv[1:])
    print(markdown(cells, args.n, args.spread_ms, args.reps, args.first_ms, command.strip()))
    if args.json:
        args.json.write_bytes(orjson.dumps([asdict(c) for c in cells], option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
