"""Scenario (e), the noise-free half: instructions per relayed request, counted by callgrind.

Wall-clock cells on a shared machine move 20-30% from run to run; instruction counts do not
(the bare relay's to ~0.1% twice in a row here). Each target runs under
``valgrind --tool=callgrind`` (children followed: hypercorn's worker process is counted),
a warm-up is sent, the counters are zeroed, N requests are sent 8 at a time, the counters
are dumped, and the instructions of every process of the target are summed and divided by N.
The ratio bare/gateway estimates the throughput share without the machine's noise (both
spend about the same instructions per nanosecond).

callgrind slows a process ~40×, and the gateway's periodic work (usage batches, disconnect
watchlist, key cache reloads, periodic collections) follows the clock: counted as it is, each
request would carry ~40× its real share of that work. So the gateway runs through
``bench.clock_scaled``, its intervals stretched by ``SLOWDOWN`` (see there). The bare relay
has no such work.
"""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson

from bench import payloads, procs, targets
from bench.targets import Upstream

REQUESTS = 400
WARM_UP = 100
CONNS = 8
KINDS = ("json", "sse")
SLOWDOWN = 40  # callgrind's, roughly: the gateway's intervals are stretched by it


def available() -> bool:
    return shutil.which("valgrind") is not None and shutil.which("callgrind_control") is not None


async def _drive(port: int, kind: str, n: int) -> None:
    body = payloads.chat_request(kind, kind == "sse")
    headers = {"Authorization": f"Bearer {payloads.BENCH_KEY}", "Content-Type": "application/json"}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    todo = iter(range(n))
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            for _ in todo:
                async with session.post(url, data=body, headers=headers) as resp:
                    data = await resp.read()
                    if resp.status != 200 or payloads.EXPECT[kind][0].encode() not in data:
                        raise RuntimeError(f"bad reply {resp.status}: {data[:200]!r}")

        await asyncio.gather(*(worker() for _ in range(CONNS)))


def _total(path: Path) -> int:
    for line in path.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    return 0


def _callgrind(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], capture_output=True, timeout=60)


def measure(tmp: Path, name: str, cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    """Instructions per request of one target for each kind; {} when it did not come up."""
    port = procs.free_port()
    cmd = [c.replace("{port}", str(port)) for c in cmd]
    out = tmp / f"callgrind-{name}"
    out.mkdir(exist_ok=True)
    valgrind = ["valgrind", "--tool=callgrind", "--trace-children=yes",
                f"--callgrind-out-file={out}/cg.%p", "--dump-instr=no"]  # fmt: skip
    proc = subprocess.Popen(
        procs.pinned(valgrind + cmd, targets.RELAY_CORE),
        env={**os.environ, **env},
        cwd=str(tmp),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    results: dict[str, float] = {}
    try:
        if not procs.wait_port(port, proc, 300):
            return results
        for kind in KINDS:
            asyncio.run(_drive(port, kind, WARM_UP))
            _callgrind("-z")
            began = time.monotonic()
            asyncio.run(_drive(port, kind, REQUESTS))
            rate = REQUESTS / (time.monotonic() - began)
            _callgrind("-d")
            print(f"  (e) {name} {kind}: {rate:.1f} req/s under callgrind", flush=True)
            time.sleep(1)
            dumps = glob.glob(f"{out}/cg.*.*")
            results[kind] = sum(_total(Path(d)) for d in dumps) / REQUESTS
            for d in dumps:
                os.unlink(d)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return results


def run(tmp: Path, up: Upstream) -> dict[str, dict[str, float]]:
    """bare relay and gateway (with metrics and access log, and without), all under
    hypercorn with one worker."""
    py = sys.executable
    bare_env = {
        "BARE_UPSTREAMS": orjson.dumps(
            {payloads.MODEL[k]: up.base_url(k) for k in ("json", "sse")}
        ).decode(),
        "PYTHONPATH": str(targets.ROOT),
    }
    conf = targets.gateway_config(tmp, up)
    off_conf = targets.gateway_config(tmp, up, "gateway-nometrics", metrics=False)

    def gateway(config: Path) -> list[str]:
        return [py, "-m", "bench.clock_scaled", str(SLOWDOWN), "serve", "--config", str(config),
                "--host", "127.0.0.1", "--port", "{port}"]  # fmt: skip

    plan = {
        "bare-hypercorn": (
            [py, "-m", "hypercorn", "-b", "127.0.0.1:{port}", "bench.bare_relay:app"],
            bare_env,
        ),
        "gateway-hypercorn-1w": (gateway(conf), {"PYTHONPATH": str(targets.ROOT)}),
        # metrics and access log off: their cost, free of the machine's noise
        "gateway-hypercorn-1w" + targets.NO_METRICS: (
            gateway(off_conf),
            {"PYTHONPATH": str(targets.ROOT)},
        ),
    }
    out: dict[str, dict[str, float]] = {}
    for name, (cmd, env) in plan.items():
        print(f"  (e) {name}: counting instructions under callgrind", flush=True)
        out[name] = measure(tmp, name, cmd, env)
        print(f"  (e) {name}: {out[name]}", flush=True)
    return out
