"""The servers side by side on what a choice of default rests on besides throughput, in one run:
``python -m bench.servers`` (``make bench-servers``).

Per server (hypercorn, uvicorn, granian; each ``gateway serve --server S``, one worker, pinned
to core 0, the nginx upstream on core 1):

- **idle RSS**: the process tree's RSS after start-up and a warm-up request of each kind;
- **memory per open stream**: ``--streams`` N paced streams held open at once (the upstream
  sends its first chunk, then nothing for minutes), every one seen past its first chunk; the
  tree's RSS minus idle, over N. Each stream holds two sockets in the gateway (client and
  upstream), both counted: the gateway's open sockets are reported beside it. The kernel's TCP
  buffer pages (``/proc/net/sockstat``, every socket of the machine: the client's and the
  upstream's ends too) are shown apart, per stream;
- **a silent connection**: one connection that sends nothing; closed by the server after how
  long, or still open after ``SILENT_BOUND`` seconds;
- **under a connection flood**: the gateway started with ``RLIMIT_NOFILE`` at ``FLOOD_LIMIT``
  and ``server.probe_port`` set; ``FLOOD`` idle connections (more than its file limit) held on
  its client port, then ``PROBES`` ``GET /healthz`` on the client port and on the probe port,
  each with the kubelet's 1 s timeout: what each answered (a status, ``timeout``, ``reset``);
- **instructions per request** by callgrind (``bench.instructions.measure``, the same harness
  as scenario (e)): non-stream and stream chat through the gateway on each server.

127.0.0.1 only; every phase bounded in time. Prints a markdown section for bench/RESULTS.md
and the figures as JSON (``--json FILE``). Raises its own open-file limit to the hard limit
(N streams take 2N descriptors in the gateway, N here and N in nginx).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from bench import instructions, payloads, procs, targets

HOLD_MS = 600_000  # the paced upstream's pause after the first chunk: the streams stay open
SILENT_BOUND = 30.0
FLOOD_LIMIT = 1024
FLOOD = 1500
PROBES = 10
PROBE_TIMEOUT = 1.0
CONNECT_AT_ONCE = 256
HOLD_DEADLINE = 120.0  # for every stream to be past its first chunk


@dataclass
class Figures:
    server: str
    version: str
    idle_rss_kib: int = 0
    streams_asked: int = 0
    streams_held: int = 0
    streams_failed: dict[str, int] = field(default_factory=dict)
    held_rss_kib: int = 0
    per_stream_kib: float = 0.0
    gateway_sockets: int = 0
    kernel_tcp_kib_per_stream: float = 0.0
    silent_closed_after: float | None = None
    flood_client: dict[str, int] = field(default_factory=dict)
    flood_probe: dict[str, int] = field(default_factory=dict)
    instructions: dict[str, float] = field(default_factory=dict)


class Held(asyncio.Protocol):
    """One client connection carrying one paced stream; ``first`` is True at its first chunk,
    False if the connection ended before (``status``: the status line it got, if any)."""

    def __init__(self, request: bytes, first: asyncio.Future[bool]) -> None:
        self.request, self.first, self.seen = request, first, b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if not self.first.done():
            self.seen += data
            if b"data:" in self.seen:
                self.first.set_result(True)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.first.done():
            self.first.set_result(False)

    @property
    def status(self) -> str:
        line = self.seen.split(b"\r\n", 1)[0]
        return line.split()[1].decode() if line.startswith(b"HTTP/") else "none"


def http_request(path: str, body: bytes, port: int) -> bytes:
    head = [
        f"POST {path} HTTP/1.1",
        f"host: 127.0.0.1:{port}",
        "content-type: application/json",
        f"authorization: Bearer {payloads.BENCH_KEY}",
        f"content-length: {len(body)}",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def hold_streams(
    port: int, n: int
) -> tuple[list[asyncio.BaseTransport], int, dict[str, int]]:
    """N paced streams held open together: their transports, how many got their first chunk, and
    what the others got (a status, ``none``: nothing, ``connect``: no connection)."""
    loop = asyncio.get_running_loop()
    request = http_request(targets.CHAT_PATH, payloads.chat_request("paced", True), port)
    gate = asyncio.Semaphore(CONNECT_AT_ONCE)
    transports: list[asyncio.BaseTransport] = []
    held: list[Held] = []
    failed: dict[str, int] = {}

    async def one() -> None:
        first: asyncio.Future[bool] = loop.create_future()
        async with gate:
            try:
                transport, proto = await asyncio.wait_for(
                    loop.create_connection(lambda: Held(request, first), "127.0.0.1", port), 10
                )
            except (OSError, TimeoutError):
                failed["connect"] = failed.get("connect", 0) + 1
                return
            transports.append(transport)
            held.append(proto)
            # the next waits for this one to be past its first chunk: N streams set up at most
            # CONNECT_AT_ONCE at a time, so that the upstream's accept queue is not what fails
            await asyncio.wait([first], timeout=HOLD_DEADLINE)

    await asyncio.gather(*(one() for _ in range(n)))
    if held:
        await asyncio.wait([h.first for h in held], timeout=HOLD_DEADLINE)
    for h in held:
        if not (h.first.done() and h.first.result()):
            failed[h.status] = failed.get(h.status, 0) + 1
    return transports, sum(1 for h in held if h.first.done() and h.first.result()), failed


def kernel_tcp_kib() -> int:
    """The kernel's TCP buffer memory (pages of every socket of the machine), in KiB."""
    for line in Path("/proc/net/sockstat").read_text().splitlines():
        if line.startswith("TCP:"):
            words = line.split()
            return int(words[words.index("mem") + 1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    return 0


def sockets_of(pids: list[int]) -> int:
    count = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


async def silent(port: int) -> float | None:
    """Seconds until the server closes a connection that sends nothing; None: still open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    began = time.monotonic()
    try:
        async with asyncio.timeout(SILENT_BOUND):
            with contextlib.suppress(ConnectionError):
                await reader.read()
        return round(time.monotonic() - began, 1)
    except TimeoutError:
        return None
    finally:
        writer.close()


def config(tmp: Path, up: targets.Upstream, name: str, probe_port: int = 0) -> Path:
    path = targets.gateway_config(tmp, up, name)
    if probe_port:
        path.write_text(path.read_text() + f"server: {{probe_port: {probe_port}}}\n")
    return path


def start_gateway(
    tmp: Path, conf: Path, server: str, port: int, nofile: int | None = None
) -> subprocess.Popen[bytes]:
    exe = targets.gateway_binary()
    assert exe is not None, "the gateway is not installed"
    cmd = [exe, "serve", "--config", str(conf), "--host", "127.0.0.1", "--port", str(port),
           "--server", server]  # fmt: skip

    def limit() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    log = open(tmp / f"{conf.stem}.log", "ab")  # noqa: SIM115 - closed once started
    proc = subprocess.Popen(
        procs.pinned(cmd, targets.RELAY_CORE), stdout=log, stderr=subprocess.STDOUT,
        cwd=str(tmp), start_new_session=True, preexec_fn=limit,
    )  # fmt: skip
    log.close()
    procs._CHILDREN.append(proc)
    if not procs.wait_port(port, proc, 60):
        raise RuntimeError(f"gateway on {server} did not start: {tmp / conf.stem}.log")
    return proc


def warm_up(port: int) -> None:
    for kind in ("json", "sse"):
        status, _ = targets.post(port, targets.CHAT_PATH, payloads.request(kind))
        if status != 200:
            raise RuntimeError(f"warm-up {kind}: {status}")


async def memory(tmp: Path, up: targets.Upstream, server: str, n: int, figures: Figures) -> None:
    """Idle RSS, memory per open stream, and the silent connection, on one gateway."""
    port = procs.free_port()
    proc = start_gateway(tmp, config(tmp, up, f"servers-{server}"), server, port)
    try:
        warm_up(port)
        await asyncio.sleep(1.0)
        figures.idle_rss_kib = procs.rss_kib(procs.tree(proc.pid))
        kernel_before = kernel_tcp_kib()
        quiet = asyncio.create_task(silent(port))
        transports, held, figures.streams_failed = await hold_streams(port, n)
        await asyncio.sleep(1.0)
        pids = procs.tree(proc.pid)
        figures.streams_asked, figures.streams_held = n, held
        figures.held_rss_kib = max(procs.rss_kib(pids) for _ in range(5))
        figures.gateway_sockets = sockets_of(pids)
        if held:
            grown = figures.held_rss_kib - figures.idle_rss_kib
            figures.per_stream_kib = round(grown / held, 1)
            kernel = kernel_tcp_kib() - kernel_before
            figures.kernel_tcp_kib_per_stream = round(kernel / held, 1)
        for transport in transports:
            transport.abort()
        figures.silent_closed_after = await quiet
    finally:
        procs.stop(proc)


async def outcome(port: int, path: str) -> str:
    """What one ``GET path`` got within ``PROBE_TIMEOUT``: its status, ``timeout`` or
    ``reset`` (closed without an answer, or refused)."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(
                    f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode()
                )
                line = await reader.readline()
            finally:
                writer.close()
    except TimeoutError:
        return "timeout"
    except OSError:
        return "reset"
    return line.split()[1].decode() if line.startswith(b"HTTP/") else "reset"


async def flood(tmp: Path, up: targets.Upstream, server: str, figures: Figures) -> None:
    """/healthz on the client port and the probe port while the client port is flooded past
    the process's file limit."""
    port, probe_port = procs.free_port(), procs.free_port()
    conf = config(tmp, up, f"servers-flood-{server}", probe_port)
    proc = start_gateway(tmp, conf, server, port, nofile=FLOOD_LIMIT)
    writers: list[asyncio.StreamWriter] = []
    gate = asyncio.Semaphore(CONNECT_AT_ONCE)

    async def connect() -> None:
        async with gate:
            with contextlib.suppress(OSError, TimeoutError):
                _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
                writers.append(writer)

    try:
        await asyncio.gather(*(connect() for _ in range(FLOOD)))
        await asyncio.sleep(1.0)
        for _ in range(PROBES):
            for got, where in ((figures.flood_client, port), (figures.flood_probe, probe_port)):
                seen = await outcome(where, "/healthz")
                got[seen] = got.get(seen, 0) + 1
    finally:
        for writer in writers:
            writer.close()
        procs.stop(proc)


def callgrind(tmp: Path, up: targets.Upstream, server: str) -> dict[str, float]:
    conf = config(tmp, up, f"servers-cg-{server}")
    cmd = [sys.executable, "-m", "bench.clock_scaled", str(instructions.SLOWDOWN), "serve",
           "--config", str(conf), "--host", "127.0.0.1", "--port", "{port}",
           "--server", server]  # fmt: skip
    env = {"PYTHONPATH": str(targets.ROOT)}
    return instructions.measure(tmp, f"servers-{server}", cmd, env)


def version(server: str) -> str:
    try:
        return importlib.metadata.version(server)
    except importlib.metadata.PackageNotFoundError:
        return ""


def tally(seen: dict[str, int]) -> str:
    return ", ".join(f"{k} ×{v}" for k, v in sorted(seen.items())) or "–"


def markdown(rows: list[Figures], n: int, command: str) -> str:
    """The section for bench/RESULTS.md."""
    cg = all(r.instructions for r in rows)
    lines = [
        f"Written by `{command}` on {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}.",
        "",
        f"Versions: python {platform.python_version()}, kernel {platform.release()}, "
        + ", ".join(f"{r.server} {r.version}" for r in rows)
        + f", aiohttp {version('aiohttp')}, model-gateway {version('model-gateway')}.",
        "",
        "| server | idle RSS MiB | streams held / asked | RSS per stream KiB | gateway sockets "
        "| kernel TCP KiB per stream | silent connection closed after | /healthz under flood "
        "(client port) | /healthz under flood (probe port) |"
        + (" instructions / request (non-stream, stream) |" if cg else ""),
        "|---|---:|---:|---:|---:|---:|---|---|---|" + ("---:|" if cg else ""),
    ]
    for r in rows:
        closed = f"{r.silent_closed_after} s" if r.silent_closed_after is not None else (
            f"open after {SILENT_BOUND:.0f} s")  # fmt: skip
        cells = [r.server, f"{r.idle_rss_kib / 1024:.1f}",
                 f"{r.streams_held:,} / {r.streams_asked:,}", f"{r.per_stream_kib:.1f}",
                 f"{r.gateway_sockets:,}", f"{r.kernel_tcp_kib_per_stream:.1f}", closed,
                 tally(r.flood_client), tally(r.flood_probe)]  # fmt: skip
        if cg:
            cells.append(
                ", ".join(f"{r.instructions.get(k, 0) / 1000:,.0f}k" for k in ("json", "sse"))
            )
        lines.append("| " + " | ".join(cells) + " |")
    flooded = f"{FLOOD} idle connections against a file limit of {FLOOD_LIMIT}"
    lines += [
        "",
        f"N = {n}; flood: {flooded}, {PROBES} probes, {PROBE_TIMEOUT:.0f} s timeout each.",
    ]
    return "\n".join(lines) + "\n"


def run(servers: list[str], n: int, with_callgrind: bool) -> list[Figures]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-servers-") as name:
        tmp = Path(name)
        for server in servers:
            # an upstream of its own per server: the paced upstream holds a stream whose client
            # went away until its pause ends, so one shared upstream would still hold the
            # previous server's streams, near its connection limit, while the next one's open
            (tmp / server).mkdir()
            up = targets.start_upstream(tmp / server, 0, HOLD_MS)
            try:
                figures = Figures(server, version(server))
                print(f"servers: {server}: memory and a silent connection", flush=True)
                asyncio.run(memory(tmp, up, server, n, figures))
                print(f"servers: {server}: a connection flood", flush=True)
                asyncio.run(flood(tmp, up, server, figures))
                print(orjson.dumps(asdict(figures)).decode(), flush=True)
                if with_callgrind:
                    try:
                        figures.instructions = callgrind(tmp, up, server)
                    except RuntimeError as exc:  # a bad reply under callgrind: said, not fatal
                        print(f"servers: {server}: callgrind: {exc}", flush=True)
                print(orjson.dumps(asdict(figures)).decode(), flush=True)
                rows.append(figures)
            finally:
                procs.stop(up.proc)
                if up.paced_proc is not up.proc:
                    procs.stop(up.paced_proc)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.servers", description=__doc__)
    parser.add_argument("--streams", type=int, default=5000)
    parser.add_argument("--server", action="append", choices=targets.SERVERS)
    parser.add_argument("--no-callgrind", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    procs.install_cleanup()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    servers = [s for s in args.server or targets.SERVERS if targets.server_available(s)]
    n = min(args.streams, (hard - 200) // 2) if hard != resource.RLIM_INFINITY else args.streams
    with_cg = not args.no_callgrind and instructions.available()
    rows = run(servers, n, with_cg)
    command = "python -m bench.servers " + " ".join(argv if argv is not None else sys.argv[1:])
    print(markdown(rows, n, command.strip()))
    if args.json:
        args.json.write_bytes(orjson.dumps([asdict(r) for r in rows], option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
