"""`make bench`: the side-by-side benchmark of the gateway against nginx, a bare relay and LiteLLM.

One run installs nginx, wrk and LiteLLM (pinned, ``bench.peers``) when missing, starts a
fixed-reply nginx upstream (core 1), then each target in turn (core 0), drives it with wrk and
bench.streams (core 1), and writes bench/RESULTS.md. The gateway runs on each server; its
targets are judged on the default one (`gateway-uvicorn-1w`). `gateway-uvicorn-1w-nometrics`,
the same gateway with metrics and the access log off, runs (a) and (b) beside
`gateway-uvicorn-1w` and is counted in (e): the report judges their cost on the hot path (on
≥ 95% of off). Settings (environment):

    BENCH_QUICK=1         smoke run: short cells, one repetition
    BENCH_DURATION=S      seconds per wrk cell (default 4; quick 2)
    BENCH_REPS=N          repetitions per cell, medians reported (default 3; quick 1)
    BENCH_TARGETS=a,b     only targets whose name contains one of these
    BENCH_SCENARIOS=abcdef which scenarios to run
    BENCH_STREAMS=256,1000,10000   paced-stream counts of scenario (c)
    BENCH_PACED=python    paced streams from bench.fake_upstream even when nginx echo exists
    BENCH_EMBED_CONNS=1,64  connection counts of the embeddings cell (f)
    BENCH_EMBED_TARGETS=a,b targets of the embeddings cell (f), by name as BENCH_TARGETS, or
                          `all` (default: direct, bare-uvicorn, gateway-uvicorn-1w, litellm)
    BENCH_NO_INSTALL=1    install nothing
    BENCH_OUT=path        where to write the report (default bench/RESULTS.md)
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import agent_report, instructions, payloads, peers, procs, profile, report, targets, wrk
from bench.targets import DEFAULT_SERVER as DEFAULT
from bench.targets import Target, Upstream

HERE = Path(__file__).resolve().parent
QUICK = os.environ.get("BENCH_QUICK", "") not in ("", "0")
DURATION = float(os.environ.get("BENCH_DURATION", "2" if QUICK else "4"))
REPS = int(os.environ.get("BENCH_REPS", "1" if QUICK else "3"))
SCENARIOS = os.environ.get("BENCH_SCENARIOS", "abcdef")
CONNS = [1, 16, 64, 256]
STREAM_CONNS = [1, 64]
EMBED_CONNS = [int(n) for n in os.environ.get("BENCH_EMBED_CONNS", "1,64").split(",")]
# the embeddings cell (f) runs on these only, to keep `make bench` under 30 minutes: each
# target costs it ~30 s (2 connection counts x 3 repetitions of 4 s, plus settling)
EMBED_TARGETS = ("direct", f"bare-{targets.DEFAULT_SERVER}", report.GATEWAY, "litellm")
STREAMS = [int(n) for n in os.environ.get("BENCH_STREAMS", "256,1000,10000").split(",")]
CONVERTED_STREAMS = 64
FIRST_MS, DELAY_MS = 200, 25
# LiteLLM handles ~100 req/s on one core: 10,000 paced streams would take minutes
LITELLM_MAX_STREAMS = 256


@dataclass
class Settings:
    quick: bool = QUICK
    duration: float = DURATION
    reps: int = REPS
    started: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)


def _sudo() -> list[str]:
    return [] if os.geteuid() == 0 else ["sudo"]


def ensure_tools(settings: Settings) -> None:
    """nginx and wrk from Debian; py-spy, uvicorn and granian from PyPI into this venv;
    LiteLLM, pinned, into a virtualenv of its own (``bench.peers``)."""
    if os.environ.get("BENCH_NO_INSTALL"):
        return
    # the peer (a), (b), (c) and (f) compare against: without it a new machine's first run
    # would have no LiteLLM column (its install fails soft: the run notes it and goes on)
    peers.install_litellm()
    missing = [
        pkg
        for pkg, exe in (("nginx", "nginx"), ("wrk", "wrk"), ("valgrind", "valgrind"))
        if not shutil.which(exe)
    ]
    if missing or not Path("/usr/lib/nginx/modules/ngx_http_echo_module.so").exists():
        print(f"installing Debian packages: {missing or ['libnginx-mod-http-echo']}")
        subprocess.run([*_sudo(), "apt-get", "update", "-qq"], check=False)
        if missing:
            subprocess.run([*_sudo(), "apt-get", "install", "-y", "-qq", *missing], check=True)
        # optional: lets nginx itself pace the streams (else bench.fake_upstream does)
        subprocess.run(
            [*_sudo(), "apt-get", "install", "-y", "-qq", "libnginx-mod-http-echo"], check=False
        )
    # uvloop too: uvicorn may be here without it (another package's dependency), and the bare
    # relays of uvicorn and granian ask for it
    wanted = {"uvicorn": "uvicorn[standard]", "uvloop": "uvicorn[standard]", "granian": "granian"}
    wanted = {mod: pkg for mod, pkg in wanted.items() if not _has_module(mod)}
    if not shutil.which("py-spy") and not (Path(sys.executable).parent / "py-spy").exists():
        wanted["py_spy"] = "py-spy"
    if wanted:
        print(f"installing into {sys.prefix}: {sorted(wanted.values())}")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", *wanted.values()], check=False
        )
        if done.returncode:
            settings.notes.append(f"pip install {sorted(wanted.values())} failed")


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "kernel": platform.release()}
    for cmd, key in ((["nginx", "-v"], "nginx"), (["wrk", "-v"], "wrk")):
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            first = (done.stderr + done.stdout).strip().splitlines()[0]
            out[key] = first.replace("nginx version: nginx/", "").split(" [")[0]
        except (OSError, IndexError):
            out[key] = "missing"
    from importlib import metadata

    for dist in ("hypercorn", "uvicorn", "granian", "aiohttp", "orjson", "model-gateway"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    lite = peers.LITELLM / "bin" / "python"
    if lite.exists():
        done = subprocess.run(
            [str(lite), "-c", "from importlib import metadata; print(metadata.version('litellm'))"],
            capture_output=True,
            text=True,
        )
        out["litellm"] = done.stdout.strip() or "unknown"
    return out


# ---------------------------------------------------------------- the cells


def wrk_lua(tmp: Path, target: Target, kind: str) -> Path:
    """The wrk script of a kind: json (chat reply), sse (chat stream) or embeddings."""
    return wrk.script(
        tmp,
        f"{target.name}-{kind}",
        target.paths[kind],
        payloads.request(kind),
        payloads.BENCH_KEY,
        payloads.EXPECT[kind],
    )


def embed_wanted(name: str, chosen: str | None = None) -> bool:
    """Whether a target is in the embeddings cell (f): BENCH_EMBED_TARGETS as BENCH_TARGETS
    (names containing one of the comma-separated parts), `all`, or by default EMBED_TARGETS."""
    chosen = os.environ.get("BENCH_EMBED_TARGETS", "") if chosen is None else chosen
    parts = [s for s in chosen.split(",") if s]
    if not parts:
        return name in EMBED_TARGETS
    return "all" in parts or any(s in name for s in parts)


def embed_ready(tmp: Path, target: Target, settings: Settings) -> bool:
    """Whether a target joins the embeddings cell: chosen, serving the kind (one correct
    reply), then warmed up with a short run; a target that is chosen but fails is left out of
    the cell with a note."""
    if "f" not in SCENARIOS or "embeddings" not in target.paths or not embed_wanted(target.name):
        return False
    problem = targets.check_kind(target, "embeddings")
    if problem is not None:
        settings.notes.append(f"{target.name}: left out of the embeddings cell (f): {problem}")
        print(f"  ! {target.name} left out of the embeddings cell: {problem}", flush=True)
        return False
    wrk.run(target.port, wrk_lua(tmp, target, "embeddings"), 16, 1)
    settle(target)
    return True


def wrk_rep(target: Target, lua: Path, conns: int, seconds: float) -> tuple[wrk.WrkResult, float]:
    """One repetition of a wrk cell: the result and CPU µs per request of the target."""
    cpu0 = procs.cpu_seconds(target.pids())
    res = wrk.run(target.port, lua, conns, seconds)
    cpu = procs.cpu_seconds(target.pids()) - cpu0
    served = max(1, res.requests)
    if res.requests == 0:  # nothing completed within the cell: every connection failed
        res = wrk.WrkResult(0, res.seconds, max(res.errors, conns), float("nan"), float("nan"))
    settle(target)
    return res, cpu * 1e6 / served


def wrk_summary(runs: list[tuple[wrk.WrkResult, float]]) -> dict[str, Any]:
    return {
        "rps": statistics.median(r.rps for r, _ in runs),
        "p50": statistics.median(r.p50_ms for r, _ in runs),
        "p99": statistics.median(r.p99_ms for r, _ in runs),
        "errors": sum(r.errors for r, _ in runs),
        "requests": sum(r.requests for r, _ in runs),
        "cpu_us": statistics.median(c for _, c in runs),
        "reps": len(runs),
        "rps_reps": [r.rps for r, _ in runs],  # in turn order: ratios are taken turn by turn
    }


def turn_order(live: list[Target], turn: int) -> list[Target]:
    """The targets of one turn, each pinned gateway right beside the bare relay of its server
    (and the gateway without metrics beside it), their order reversed from turn to turn: the
    ratios the targets are judged by compare measurements seconds apart, not a minute, on a
    machine whose speed drifts."""
    by_name = {t.name: t for t in live}
    bare = {t.server for t in live if t.group == "bare"}
    partners = {
        f"gateway-{server}-1w{suffix}" for server in bare for suffix in ("", targets.NO_METRICS)
    }
    order: list[Target] = []
    for target in live:
        if target.name in partners:
            continue  # placed beside its bare relay
        if target.group != "bare":
            order.append(target)
            continue
        group = [target] + [
            by_name[name]
            for name in (
                f"gateway-{target.server}-1w",
                f"gateway-{target.server}-1w{targets.NO_METRICS}",
            )
            if name in by_name
        ]
        order += group if turn % 2 == 0 else group[::-1]
    return order


def wrk_cells() -> list[tuple[str, str, int]]:
    """The wrk cells of the run, in order: (scenario, kind, connections)."""
    cells = [("a", "json", c) for c in CONNS if "a" in SCENARIOS]
    cells += [("b", "sse", c) for c in STREAM_CONNS if "b" in SCENARIOS]
    cells += [("f", "embeddings", c) for c in EMBED_CONNS if "f" in SCENARIOS]
    return cells


def wrk_interleaved(
    tmp: Path,
    live: list[Target],
    results: dict[str, Any],
    settings: Settings,
    embed: list[Target] | None = None,
) -> None:
    """Scenarios (a), (b) and (f) with the repetitions of one cell taken in turns across all
    targets (target 1, 2, ..., then again), so a machine that slows down or speeds up during
    the run moves every target alike and the ratios, taken turn by turn, stay fair. The targets not
    being measured are paused (SIGSTOP), so their timers and background work stay out of
    the measured one's core and tails. The embeddings cell (f) runs on `embed` only."""
    try:
        for target in live:
            pause(target, True)
        for scenario, kind, conns in wrk_cells():
            cell_live = live if kind != "embeddings" else (embed or [])
            if not cell_live:
                continue
            runs: dict[str, list[tuple[wrk.WrkResult, float]]] = {t.name: [] for t in cell_live}
            luas = {t.name: wrk_lua(tmp, t, kind) for t in cell_live}
            for turn in range(settings.reps):
                for target in turn_order(cell_live, turn):
                    pause(target, False)
                    runs[target.name].append(
                        wrk_rep(target, luas[target.name], conns, settings.duration)
                    )
                    pause(target, True)
            _report_cells(scenario, conns, cell_live, runs, results)
    finally:
        for target in live:
            pause(target, False)


def pause(target: Target, stop: bool) -> None:
    """SIGSTOP (or SIGCONT) every process of a target; never `direct`, the upstream itself."""
    if target.group == "direct":
        return
    for pid in target.pids():
        try:
            os.kill(pid, signal.SIGSTOP if stop else signal.SIGCONT)
        except ProcessLookupError:
            pass


def _report_cells(
    scenario: str,
    conns: int,
    live: list[Target],
    runs: dict[str, list[tuple[wrk.WrkResult, float]]],
    results: dict[str, Any],
) -> None:
    for target in live:
        cell = wrk_summary(runs[target.name])
        results[scenario].setdefault(target.name, {})[conns] = cell
        print(f"  ({scenario}) {target.name} c={conns}: {report.fmt_wrk(cell)}", flush=True)


def settle(target: Target, limit: float = 30.0) -> None:
    """Wait until the target is idle again (a slow target still works off the last cell's
    backlog after wrk stops), at most `limit` seconds."""
    deadline = time.monotonic() + limit
    time.sleep(0.3)
    while time.monotonic() < deadline:
        pids = target.pids()
        before = procs.cpu_seconds(pids)
        time.sleep(0.5)
        if procs.cpu_seconds(pids) - before < 0.1:
            return


def fd_cap(target: Target) -> int:
    """How many streams this target can hold: a relay needs 2 fds per stream (client and
    upstream side) under the hard RLIMIT_NOFILE that no process here can raise."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    per = 1 if target.group == "direct" else 2
    return (hard - 200) // per


def streams_cell(
    tmp: Path,
    target: Target,
    n: int,
    reps: int,
    path: str | None = None,
    body: bytes | None = None,
    marker: str = "[DONE]",
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    body_file = tmp / f"streams-{target.name}-{abs(hash(body))}.json"
    body_file.write_bytes(body if body is not None else payloads.chat_request("paced", True))
    hdrs = {"Authorization": f"Bearer {payloads.BENCH_KEY}", **(headers or {})}
    cmd = procs.pinned(
        [sys.executable, "-m", "bench.streams", "--port", str(target.port), "--path",
         path or target.paths["paced"], "--body-file", str(body_file), "-n", str(n),
         "--timeout", str(30 + n * 0.006), "--marker", marker]
        + [arg for k, v in hdrs.items() for arg in ("--header", f"{k}: {v}")],
        1,
    )  # fmt: skip
    runs = []
    for _ in range(reps):
        pids = target.pids()
        peak = 0
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while proc.poll() is None:
            peak = max(peak, procs.rss_kib(pids))
            time.sleep(0.02)
        out, err = proc.communicate()
        line = next((x for x in out.splitlines() if x.startswith("STREAMSJSON ")), None)
        if line is None:
            raise RuntimeError(f"bench.streams failed: {err[-800:]}")
        res = json.loads(line[len("STREAMSJSON ") :])
        res["rss_per_stream_kib"] = (peak - target.baseline_rss_kib) / n if pids else float("nan")
        res["peak_rss_kib"] = peak
        runs.append(res)
        time.sleep(0.5)
    return {
        "n": n,
        "ttfb_p50": statistics.median(r["ttfb_p50_ms"] for r in runs),
        "ttfb_p99": statistics.median(r["ttfb_p99_ms"] for r in runs),
        "completion": statistics.median(r["completion_rate"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
        "rss_per_stream_kib": statistics.median(r["rss_per_stream_kib"] for r in runs),
        "peak_rss_kib": max(r["peak_rss_kib"] for r in runs),
        "statuses": runs[-1]["statuses"],
        "seconds": statistics.median(r["seconds"] for r in runs),
        "reps": reps,
    }


# ---------------------------------------------------------------- one target


def warm_up(tmp: Path, target: Target) -> None:
    """One short run so lazy imports, pools and caches are in place."""
    warm = wrk.script(tmp, "warm", target.paths["json"], payloads.chat_request("json", False),
                      payloads.BENCH_KEY, payloads.EXPECT["json"])  # fmt: skip
    wrk.run(target.port, warm, 16, 1)
    settle(target)


def bench_target(tmp: Path, target: Target, results: dict[str, Any], settings: Settings) -> None:
    """Scenarios (c), (d) and (e) of one target, the others stopped."""
    name = target.name
    secs, reps = settings.duration, settings.reps
    # memory per stream is counted from here: what the process holds after the wrk cells
    target.baseline_rss_kib = procs.rss_kib(target.pids())
    if "c" in SCENARIOS:
        for n in STREAMS:
            if target.group == "litellm" and n > LITELLM_MAX_STREAMS:
                continue
            cap = fd_cap(target)
            run_n = min(n, cap)
            # the largest cell takes long through a Python relay: one repetition
            cell = streams_cell(tmp, target, run_n, 1 if n >= 10000 else reps)
            cell["requested"] = n
            results["c"].setdefault(name, {})[n] = cell
            print(f"  (c) {name} n={run_n}: {report.fmt_streams(cell)}")
    if "d" in SCENARIOS and target.group in ("gateway", "direct"):
        # counted from here: after (c), the process keeps its high-water mark
        target.baseline_rss_kib = procs.rss_kib(target.pids())
        pas = streams_cell(tmp, target, CONVERTED_STREAMS, reps)
        results["d"].setdefault(name, {})["pass-through"] = pas
        print(f"  (d) {name} pass-through: {report.fmt_streams(pas)}")
        if target.group == "gateway":
            conv = streams_cell(
                tmp,
                target,
                CONVERTED_STREAMS,
                reps,
                path="/v1/messages",
                body=payloads.messages_request("paced"),
                marker="message_stop",
                headers={"anthropic-version": "2023-06-01"},
            )
            results["d"][name]["converted"] = conv
            print(f"  (d) {name} converted: {report.fmt_streams(conv)}")
    if "e" in SCENARIOS and target.group in ("gateway", "bare") and target.server == DEFAULT:
        if target.group == "gateway" and not target.pinned:
            return
        out = profile.profile_target(tmp, target, HERE, max(5.0, secs))
        results["e"][name] = out
        print(f"  (e) {name} profile: {out}")


def main() -> int:
    procs.install_cleanup()
    settings = Settings(started=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    t_start = time.monotonic()
    ensure_tools(settings)
    settings.versions = versions()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    selected = [s for s in os.environ.get("BENCH_TARGETS", "").split(",") if s]

    def wanted(name: str) -> bool:
        return not selected or any(s in name for s in selected)

    results: dict[str, Any] = {k: {} for k in "abcdef"}
    results["e_instructions"] = {}
    tmp = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        up = targets.start_upstream(tmp, FIRST_MS, DELAY_MS)
        settings.notes.append(f"paced streams served by the {up.paced_by}")
        print(f"upstream: nginx on :{up.port}, paced streams by {up.paced_by} on :{up.paced_port}")
        steps = [(name, start) for name, start in plan(tmp, up, settings) if wanted(name)]
        if set(SCENARIOS) & set("abf"):
            live, embed = [], []
            for name, start in steps:
                print(f"== starting {name}", flush=True)
                target = start()
                if target is None:
                    settings.notes.append(f"{name}: not run (not installed or did not start)")
                    continue
                warm_up(tmp, target)
                live.append(target)
                if embed_ready(tmp, target, settings):
                    embed.append(target)
            try:
                wrk_interleaved(tmp, live, results, settings, embed)
            finally:
                for target in live:
                    stop_target(target)
        for name, start in steps:
            if not set(SCENARIOS) & set("cde"):
                break
            if name.endswith(targets.NO_METRICS):
                continue  # there for the cost of metrics in (a) and (b) only
            print(f"== {name}", flush=True)
            target = start()
            if target is None:
                settings.notes.append(f"{name}: not run (not installed or did not start)")
                continue
            try:
                warm_up(tmp, target)
                bench_target(tmp, target, results, settings)
            except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                settings.notes.append(f"{name}: aborted: {exc}")
                print(f"  ! {name} aborted: {exc}")
            finally:
                stop_target(target)
        if "e" in SCENARIOS and instructions.available():
            results["e_instructions"] = instructions.run(tmp, up)
            # converted streams: a Bedrock stream's cost beside an Anthropic one's
            results["e_converted"] = instructions.run_converted(tmp)
        elif "e" in SCENARIOS:
            settings.notes.append("instructions per request: valgrind not installed")
    finally:
        procs.stop_all()
        settings.seconds = time.monotonic() - t_start
    raw = HERE / "results"
    raw.mkdir(exist_ok=True)
    (raw / "last.json").write_text(json.dumps(results, indent=1, default=str))
    text = report.render(
        results, settings, STREAMS, CONNS, STREAM_CONNS, CONVERTED_STREAMS, EMBED_CONNS
    )
    out = Path(os.environ.get("BENCH_OUT", str(HERE / "RESULTS.md")))
    # the agent workloads' section (`make bench-agents`) stays as that run wrote it, and so
    # does every section added by hand or by another bench command
    old = out.read_text() if out.exists() else ""
    out.write_text(agent_report.carry(old, report.keep_sections(agent_report.without(old), text)))
    print()
    print(text)
    print(f"wrote {out} in {settings.seconds / 60:.1f} min")
    return 0


def stop_target(target: Target) -> None:
    if target.group != "direct" and target.proc is not None:
        procs.stop(target.proc)


def plan(tmp: Path, up: Upstream, settings: Settings) -> list[tuple[str, Any]]:
    """The targets in order, each with a function that starts it (None when unavailable)."""
    steps: list[tuple[str, Any]] = [
        ("direct", lambda: targets.direct(up)),
        ("nginx-relay", lambda: targets.nginx_relay(tmp, up)),
    ]
    for server in targets.SERVERS:
        if targets.server_available(server):
            steps.append((f"bare-{server}", lambda s=server: targets.bare_relay(tmp, up, s)))
        else:
            settings.notes.append(f"bare-{server}: {server} not installed")
    if peers.LITELLM_BIN.exists():
        steps.append(("litellm", lambda: targets.litellm(tmp, up)))
    else:
        settings.notes.append("litellm: not installed (`python -m bench.peers` says why)")
    help_text = targets.gateway_help()
    if not help_text:
        settings.notes.append("gateway: `gateway serve --help` failed; gateway not run")
        return steps
    server = DEFAULT if "--server" in help_text else None
    steps.append((report.GATEWAY, lambda: targets.gateway(tmp, up, 1, True, server)))
    # the same without metrics and access log: what they cost, measured beside it
    steps.append(
        (
            report.NO_METRICS,
            lambda: targets.gateway(tmp, up, 1, True, server, metrics=False),
        )
    )
    steps.append(
        (f"gateway-{DEFAULT}-2w-unpinned", lambda: targets.gateway(tmp, up, 2, False, server))
    )
    if server is not None:  # the same gateway under the other servers
        for other in targets.SERVERS:
            if other != DEFAULT and targets.server_available(other):
                steps.append(
                    (f"gateway-{other}-1w", lambda o=other: targets.gateway(tmp, up, 1, True, o))
                )
    settings.commands.append(
        "gateway serve --config <tmp>/<target>.bench.yaml --host 127.0.0.1 --port P --workers N"
        + (f" --server {DEFAULT}" if server else "")
    )
    return steps


if __name__ == "__main__":
    raise SystemExit(main())
