"""`make soak`: mixed streaming and non-streaming load on the gateway for a long while, watching
whether its memory stays flat.

SOAK_SECONDS (default 600) of wrk load in alternating 10-second slices (non-streaming chat at 64
connections, streaming chat at 32, and every third slice 256 paced streams) against one pinned
gateway worker; the RSS of the gateway's process tree is sampled every 10 s. At the end it
compares the median of the minute after a warm-up (pools, caches and allocator arenas fill in
the first minute) with the median of the last minute and says whether memory stayed flat
(growth under SOAK_MAX_GROWTH, default 10%). Exit code 1 when it did not.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import payloads, procs, targets, wrk
from bench.streams import raise_fd_limit

SAMPLE_EVERY = 10.0
MAX_GROWTH = float(os.environ.get("SOAK_MAX_GROWTH", "0.10"))


def main() -> int:
    procs.install_cleanup()
    raise_fd_limit()
    total = float(os.environ.get("SOAK_SECONDS", "600"))
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    if not targets.gateway_help():
        print("soak: `gateway serve --help` failed: nothing to soak", file=sys.stderr)
        return 2
    up = targets.start_upstream(tmp, 200, 25)
    server = targets.DEFAULT_SERVER if "--server" in targets.gateway_help() else None
    gw = targets.gateway(tmp, up, 1, True, server)
    if gw is None:
        print("soak: the gateway did not start", file=sys.stderr)
        return 2
    scripts = [
        (wrk.script(tmp, "soak-json", gw.paths["json"], payloads.chat_request("json", False),
                    payloads.BENCH_KEY, payloads.EXPECT["json"]), 64),
        (wrk.script(tmp, "soak-sse", gw.paths["sse"], payloads.chat_request("sse", True),
                    payloads.BENCH_KEY, payloads.EXPECT["sse"]), 32),
    ]  # fmt: skip
    body = tmp / "paced.json"
    body.write_bytes(payloads.chat_request("paced", True))
    samples: list[tuple[float, int]] = []
    requests = errors = 0
    start = time.monotonic()
    i = 0
    print(f"soak: {total:.0f} s against {gw.name} (pid {gw.proc.pid if gw.proc else '?'})")
    while (elapsed := time.monotonic() - start) < total:
        slice_s = max(1.0, min(SAMPLE_EVERY, total - elapsed))
        if i % 3 == 2:
            cmd = procs.pinned(
                [sys.executable, "-m", "bench.streams", "--port", str(gw.port), "--path",
                 gw.paths["paced"], "--body-file", str(body), "-n", "256", "--timeout", "30",
                 "--header", f"Authorization: Bearer {payloads.BENCH_KEY}"],
                1,
            )  # fmt: skip
            t0 = time.monotonic()
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
            requests += 256
            errors += 0 if '"errors": 0' in out else 1
            time.sleep(max(0.0, slice_s - (time.monotonic() - t0)))
        else:
            lua, conns = scripts[i % 2]
            res = wrk.run(gw.port, lua, conns, slice_s)
            requests += res.requests
            errors += res.errors
        i += 1
        rss = procs.rss_kib(gw.pids())
        samples.append((time.monotonic() - start, rss))
        print(f"  t={samples[-1][0]:6.0f}s  rss={rss / 1024:7.1f} MiB  requests={requests:,}")
    procs.stop_all()
    window = min(60.0, total / 4)
    warm = window  # the first window is warm-up, not a baseline
    first = [r for t, r in samples if warm < t <= warm + window] or [samples[0][1]]
    last = [r for t, r in samples if t >= samples[-1][0] - window] or [samples[-1][1]]
    m_first, m_last = statistics.median(first), statistics.median(last)
    growth = (m_last - m_first) / m_first
    flat = growth < MAX_GROWTH
    print(
        f"soak: {requests:,} requests, {errors} errors; RSS median after warm-up {window:.0f}s "
        f"{m_first / 1024:.1f} MiB, last {window:.0f}s {m_last / 1024:.1f} MiB "
        f"({growth:+.1%}): memory {'stayed flat' if flat else 'GREW'}"
    )
    return 0 if flat else 1


if __name__ == "__main__":
    raise SystemExit(main())
