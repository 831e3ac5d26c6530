"""Child processes of the benchmark: start in their own process group, stop them all at exit.

Also the /proc readers the results need: resident memory and CPU time of a process tree.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

_CHILDREN: list[subprocess.Popen[bytes]] = []
_CLK_TCK = os.sysconf("SC_CLK_TCK")


PORTS_ENV = "BENCH_PORTS"  # "first-last": take ports from this range (a shared machine)
_next_port = 0


def free_port() -> int:
    """A port nothing listens on: the next free one of ``BENCH_PORTS`` when set, else one the
    kernel picks."""
    global _next_port
    first, _, last = os.environ.get(PORTS_ENV, "").partition("-")
    if first and last:
        _next_port = max(_next_port, int(first))
        while _next_port <= int(last):
            port, _next_port = _next_port, _next_port + 1
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
        raise RuntimeError(f"{PORTS_ENV}: no free port left")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pinned(cmd: Sequence[str], core: int | None) -> list[str]:
    """Prefix a command with ``taskset -c core`` (None: unpinned)."""
    return list(cmd) if core is None else ["taskset", "-c", str(core), *cmd]


def start(
    cmd: Sequence[str], log: Path, env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.Popen[bytes]:
    """Start a child in a new session (so it and its children form one process group)."""
    out = open(log, "ab")  # noqa: SIM115 - closed with the child
    proc = subprocess.Popen(
        list(cmd),
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        start_new_session=True,
    )
    out.close()
    _CHILDREN.append(proc)
    return proc


def stop(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """SIGTERM the child's process group, then SIGKILL it if it lingers."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    # the group may outlive its leader (workers of a server)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(1)
    except subprocess.TimeoutExpired:
        pass
    if proc in _CHILDREN:
        _CHILDREN.remove(proc)


def stop_all() -> None:
    for proc in list(reversed(_CHILDREN)):
        stop(proc, timeout=3.0)


def _on_signal(signum: int, _frame: object) -> None:
    stop_all()
    raise SystemExit(128 + signum)


def install_cleanup() -> None:
    """Stop every child at interpreter exit, on SIGTERM and on Ctrl-C."""
    atexit.register(stop_all)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.1)
    return False


def tree(pid: int) -> list[int]:
    """The pid and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def rss_kib(pids: Sequence[int]) -> int:
    """Sum of VmRSS (KiB) over pids."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
        except OSError:
            continue
    return total


def cpu_seconds(pids: Sequence[int]) -> float:
    """Sum of utime+stime (seconds) over pids."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return ticks / _CLK_TCK


def busiest_python(pids: Sequence[int]) -> int:
    """The pid in pids with the most CPU time whose command line is a Python process."""
    best, best_cpu = pids[0], -1.0
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"python" not in cmd and b"gateway" not in cmd and b"litellm" not in cmd:
            continue
        cpu = cpu_seconds([pid])
        if cpu > best_cpu:
            best, best_cpu = pid, cpu
    return best
