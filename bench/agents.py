"""`make bench-agents`: the workloads coding agents send, through this gateway, LiteLLM and
Portkey side by side, nginx proxy_pass as the machine's limit (see bench/agent_payloads.py).

One run installs the pinned peers when missing (bench.peers), starts the nginx upstream (core
1), then every relay (core 0), all paused (SIGSTOP) but the one measured. Per workload and
relay: one wrk cell at 64 connections (req/s, p50, p99, errors, CPU µs per request of the
relay's processes, peak RSS), or for the paced long stream N concurrent streams by
bench.streams (time to first byte and total time p50/p99, CPU µs per stream, peak RSS). Writes
its section of bench/RESULTS.md and bench/results/agents.json. Settings (environment):

    BENCH_QUICK=1               a development run: 3 s cells
    BENCH_DURATION=S            seconds per cell (default 10; quick 3)
    BENCH_AGENTS_CONNS=N        wrk connections (default 64)
    BENCH_AGENTS_STREAMS=N      concurrent paced streams (default 64)
    BENCH_AGENTS_WORKLOADS=a,b  only these workloads (responses,messages,tools,embeddings,long)
    BENCH_TARGETS=a,b           only relays whose name contains one of these
    BENCH_NO_INSTALL=1          install nothing
    BENCH_OUT=path              the file whose agents section is written (bench/RESULTS.md)

`python -m bench.agents --render` writes the section again from the last run's figures.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import agent_payloads, agent_report, nginx, peers, procs, wrk
from bench import agent_targets as at
from bench.agent_payloads import Workload
from bench.agent_targets import Relay

HERE = Path(__file__).resolve().parent
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
DURATION = float(os.environ.get("BENCH_DURATION", "3" if QUICK else "10"))
CONNS = int(os.environ.get("BENCH_AGENTS_CONNS", "64"))
STREAMS = int(os.environ.get("BENCH_AGENTS_STREAMS", "64"))
WARM_SECONDS = 1
WARM_STREAMS = 8  # the paced stream's warm-up: streams run untimed before the cell
RAW = HERE / "results" / "agents.json"  # the last run's figures


def pause(relay: Relay, stop: bool) -> None:
    """SIGSTOP (or SIGCONT) a relay's processes."""
    for pid in relay.pids():
        try:
            os.kill(pid, signal.SIGSTOP if stop else signal.SIGCONT)
        except ProcessLookupError:
            pass


def settle(relay: Relay, limit: float = 30.0) -> None:
    """Wait until the relay is idle again (a slow one works off its backlog after the cell)."""
    deadline = time.monotonic() + limit
    time.sleep(0.3)
    while time.monotonic() < deadline:
        before = procs.cpu_seconds(relay.pids())
        time.sleep(0.5)
        if procs.cpu_seconds(relay.pids()) - before < 0.1:
            return


def sampled(relay: Relay, work: Any) -> tuple[Any, int, float]:
    """Run ``work()`` while sampling the relay's RSS: its result, the peak RSS (KiB) and the
    relay's CPU seconds over it."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = work()
        except Exception as exc:  # reported as the cell's failure
            out["error"] = exc

    pids = relay.pids()
    cpu0 = procs.cpu_seconds(pids)
    thread = threading.Thread(target=run)
    thread.start()
    peak = procs.rss_kib(pids)
    while thread.is_alive():
        peak = max(peak, procs.rss_kib(pids))
        time.sleep(0.05)
    cpu = procs.cpu_seconds(pids) - cpu0
    if "error" in out:
        raise out["error"]
    return out["result"], peak, cpu


def lua_for(tmp: Path, relay: Relay, work: Workload) -> Path:
    headers = dict(relay.headers[work.key])
    auth = headers.pop("authorization", f"Bearer {agent_payloads.payloads.BENCH_KEY}")
    return wrk.script(tmp, f"agents-{relay.name}-{work.key}", relay.paths[work.key], work.body,
                      auth.split(" ", 1)[1], work.expect, headers)  # fmt: skip


def wrk_cell(tmp: Path, relay: Relay, work: Workload, seconds: float) -> dict[str, Any]:
    lua = lua_for(tmp, relay, work)
    wrk.run(relay.port, lua, 16, WARM_SECONDS)
    settle(relay)
    res, peak, cpu = sampled(relay, lambda: wrk.run(relay.port, lua, CONNS, seconds))
    settle(relay)
    good = max(0, res.requests - res.errors)
    return {
        "rps": res.rps,
        # no reply within the cell: wrk's percentiles of nothing are zeros, not latencies
        "p50": res.p50_ms if res.requests else float("nan"),
        "p99": res.p99_ms if res.requests else float("nan"),
        "errors": res.errors,
        "requests": res.requests,
        "cpu_us": cpu * 1e6 / max(1, good) if good else float("nan"),
        "peak_rss_kib": peak,
        "conns": CONNS,
        "seconds": res.seconds,
    }


def streams_cell(tmp: Path, relay: Relay, work: Workload) -> dict[str, Any]:
    body = tmp / f"agents-{work.key}.json"
    body.write_bytes(work.body)
    headers = dict(relay.headers[work.key])
    headers.setdefault("authorization", f"Bearer {agent_payloads.payloads.BENCH_KEY}")
    cmd = procs.pinned(
        [sys.executable, "-m", "bench.streams", "--port", str(relay.port), "--path",
         relay.paths[work.key], "--body-file", str(body), "-n", str(STREAMS),
         "--timeout", "150", "--marker", work.expect[-1]]
        + [arg for k, v in headers.items() for arg in ("--header", f"{k}: {v}")],
        1,
    )  # fmt: skip

    def run(command: list[str] = cmd) -> dict[str, Any]:
        done = subprocess.run(
            command, capture_output=True, text=True, cwd=str(at.ROOT), timeout=240
        )
        line = next((x for x in done.stdout.splitlines() if x.startswith("STREAMSJSON ")), None)
        if line is None:
            raise RuntimeError(f"bench.streams failed: {done.stderr[-500:]}")
        return dict(json.loads(line[len("STREAMSJSON ") :]))

    # a few streams first, untimed, as each wrk cell has its warm-up: a relay's first streams
    # pay for what its process does once (imports, caches, a JIT's compiling)
    run([str(WARM_STREAMS) if arg == str(STREAMS) and cmd[i - 1] == "-n" else arg
         for i, arg in enumerate(cmd)])  # fmt: skip
    settle(relay)
    res, peak, cpu = sampled(relay, run)
    settle(relay)
    return {
        "n": STREAMS,
        "ttfb_p50": res["ttfb_p50_ms"],
        "ttfb_p99": res["ttfb_p99_ms"],
        "total_p50": res["total_p50_ms"],
        "total_p99": res["total_p99_ms"],
        "completed": res["completed"],
        "errors": res["errors"],
        "cpu_us": cpu * 1e6 / max(1, res["completed"]),
        "peak_rss_kib": peak,
        "seconds": res["seconds"],
    }


def measure(tmp: Path, relay: Relay, work: Workload) -> dict[str, Any]:
    """One cell: what the relay cannot do, a failed check, or the measures."""
    if work.key in relay.cannot:
        return {"cannot": relay.cannot[work.key]}
    problem = at.check(relay, work)
    if problem is not None:
        return {"cannot": "fails: " + problem[:160].replace("\n", " ").replace("|", "/")}
    if work.paced:
        return streams_cell(tmp, relay, work)
    return wrk_cell(tmp, relay, work, DURATION)


def start_relays(tmp: Path, upstream: int, works: list[Workload]) -> tuple[list[Relay], str]:
    """Every relay that starts, in the report's order; the gateway's default server."""
    default = at.default_server()

    def gateway(server: str | None, name: str) -> Relay | None:
        return at.gateway(tmp, upstream, works, server, name)

    starts: list[tuple[str, Any]] = [
        ("nginx-relay", lambda: at.nginx_relay(tmp, upstream, works)),
        ("litellm", lambda: at.litellm(tmp, upstream, works)),
        ("portkey", lambda: at.portkey(tmp, upstream, works)),
        (f"gateway-{default}", lambda: gateway(None, f"gateway-{default}")),
    ]
    # the gateway on the other servers too (issue 30 weighs them)
    for other in ("hypercorn", "granian"):
        if other != default and importlib_has(other):
            starts.append((f"gateway-{other}", lambda o=other: gateway(o, f"gateway-{o}")))
    chosen = [s for s in os.environ.get("BENCH_TARGETS", "").split(",") if s]
    relays = []
    for name, start in starts:
        if chosen and not any(c in name for c in chosen):
            continue
        print(f"== starting {name}", flush=True)
        relay = start()
        if relay is not None:
            pause(relay, True)
            relays.append(relay)
    return relays, default


def importlib_has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def run_cells(tmp: Path, relays: list[Relay], works: list[Workload]) -> dict[str, dict[str, Any]]:
    """Every workload through every relay, the relay order reversed from one workload to the
    next (so no relay always goes first)."""
    results: dict[str, dict[str, Any]] = {}
    for i, work in enumerate(works):
        cells: dict[str, Any] = {}
        for relay in relays if i % 2 == 0 else relays[::-1]:
            pause(relay, False)
            try:
                cells[relay.name] = measure(tmp, relay, work)
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                cells[relay.name] = {"cannot": f"aborted: {exc}"}
            finally:
                pause(relay, True)
            print(f"  ({work.key}) {relay.name}: {agent_report.fmt(cells[relay.name])}", flush=True)
        results[work.key] = {r.name: cells[r.name] for r in relays}
    return results


def ensure_tools() -> None:
    """nginx, its echo module (the paced stream) and wrk from Debian, when missing."""
    wanted = [pkg for pkg in ("nginx", "wrk") if shutil.which(pkg) is None]
    if not nginx.ECHO_MODULE.exists():
        wanted.append("libnginx-mod-http-echo")
    if wanted:
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        print(f"installing Debian packages: {wanted}")
        subprocess.run([*sudo, "apt-get", "update", "-qq"], check=False)
        subprocess.run([*sudo, "apt-get", "install", "-y", "-qq", *wanted], check=True)


def machine() -> dict[str, str]:
    load = os.getloadavg()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=str(at.ROOT))  # fmt: skip
    return {
        "load": f"{load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}",
        "commit": head.stdout.strip() or "unknown",
        "litellm": peers.litellm_version() or "not installed",
        "portkey": peers.portkey_version() or "not installed",
        "node": peers.node_version() or "missing",
    }


def main() -> int:
    procs.install_cleanup()
    if not os.environ.get("BENCH_NO_INSTALL"):
        ensure_tools()
        peers.main()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    wanted = [s for s in os.environ.get("BENCH_AGENTS_WORKLOADS", "").split(",") if s]
    works = [w for w in agent_payloads.workloads() if not wanted or w.key in wanted]
    tmp = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    t0 = time.monotonic()
    info = machine()
    try:
        port, _ = at.start_upstream(tmp)
        relays, default = start_relays(tmp, port, agent_payloads.workloads())
        results = run_cells(tmp, relays, works)
        info["load_after"] = machine()["load"]
    finally:
        procs.stop_all()
    info.update(started=started, minutes=f"{(time.monotonic() - t0) / 60:.1f}",
                default=default, seconds=f"{DURATION:g}", conns=str(CONNS),
                streams=str(STREAMS))  # fmt: skip
    RAW.parent.mkdir(exist_ok=True)
    RAW.write_text(json.dumps({"info": info, "results": results}, indent=1))
    return write(results, works, info)


def write(results: dict[str, Any], works: list[Workload], info: dict[str, str]) -> int:
    section = agent_report.render(results, works, info)
    out = Path(os.environ.get("BENCH_OUT", str(HERE / "RESULTS.md")))
    old = out.read_text() if out.exists() else ""
    out.write_text(agent_report.splice(old, section))
    print(section)
    print(f"wrote the agents section of {out}")
    return 0


def render_again() -> int:
    """The section written again from the last run's figures (bench/results/agents.json)."""
    last = json.loads(RAW.read_text())
    works = [w for w in agent_payloads.workloads() if w.key in last["results"]]
    return write(last["results"], works, last["info"])


if __name__ == "__main__":
    raise SystemExit(render_again() if sys.argv[1:] == ["--render"] else main())
