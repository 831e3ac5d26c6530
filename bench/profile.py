"""Scenario (e): where a relayed request's CPU goes, sampled with py-spy while wrk drives it.

py-spy attaches to the busiest Python process of the target (no restart, --nonblocking) and
records collapsed stacks; we keep them (profile-<target>.raw.txt is not committed) plus a
summary of the top functions by own and by inclusive samples (profile-<target>.txt), and a
flamegraph of the streaming case (profile-<target>-sse.svg). When py-spy cannot attach, the
note says so and no profile is written.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bench import payloads, procs, wrk
from bench.targets import Target

TOP = 30


def _py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def _record(exe: str, pid: int, seconds: float, fmt: str, out: Path) -> subprocess.Popen[bytes]:
    cmd = [exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "250",
           "--nonblocking", "--format", fmt, "--output", str(out)]  # fmt: skip
    return subprocess.Popen(procs.pinned(cmd, 1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _function(frame: str) -> str:
    head, sep, tail = frame.rpartition(":")
    return head + ")" if sep and tail.rstrip(")").isdigit() else frame


def summarize(raw: str, title: str) -> str:
    """Top functions by own samples and by inclusive samples, from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        total += count
        # one entry per function: drop the line number of each frame ("f (file.py:12)")
        frames = [_function(f) for f in stack.split(";")]
        own[frames[-1]] += count
        for frame in set(frames):
            incl[frame] += count
    lines = [title, f"samples: {total}", "", f"top {TOP} by own samples:"]
    for frame, count in own.most_common(TOP):
        lines.append(f"{100 * count / max(1, total):6.1f}%  {frame}")
    lines += ["", f"top {TOP} by inclusive samples:"]
    for frame, count in incl.most_common(TOP):
        lines.append(f"{100 * count / max(1, total):6.1f}%  {frame}")
    return "\n".join(lines) + "\n"


def profile_target(tmp: Path, target: Target, out_dir: Path, seconds: float) -> str:
    exe = _py_spy()
    if exe is None:
        return "py-spy not installed"
    pid = procs.busiest_python(target.pids())
    written = []
    for kind, stream, fmt in (("json", False, "raw"), ("sse", True, "flamegraph")):
        lua = wrk.script(tmp, f"prof-{target.name}-{kind}", target.paths[kind],
                         payloads.chat_request(kind, stream), payloads.BENCH_KEY,
                         payloads.EXPECT[kind])  # fmt: skip
        raw_out = tmp / f"profile-{target.name}-{kind}.{'txt' if fmt == 'raw' else 'svg'}"
        rec = _record(exe, pid, seconds, fmt, raw_out)
        wrk.run(target.port, lua, 64, seconds + 1)
        log, _ = rec.communicate(timeout=seconds + 60)
        if rec.returncode != 0 or not raw_out.exists():
            return f"py-spy failed: {log.decode(errors='replace')[-300:]}"
        if fmt == "raw":
            title = f"py-spy, {target.name} (pid {pid}), non-streaming chat at 64 connections"
            dest = out_dir / f"profile-{target.name}.txt"
            dest.write_text(summarize(raw_out.read_text(), title))
        else:
            dest = out_dir / f"profile-{target.name}-sse.svg"
            dest.write_bytes(raw_out.read_bytes())
        written.append(dest.name)
    return ", ".join(written)
