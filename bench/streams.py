"""Paced-stream client: hold N streams open at once and time each one's first byte.

All N connections are opened first (untimed), then every connection posts one streaming request,
the starts spread evenly over --spread-ms, so that all N streams are open together while the
upstream waits before its first chunk. Per stream: time from sending the request to the first
``data:`` byte (TTFB) and to the done marker (total), and whether the stream completed (status
200 and the done marker seen).

``--burst``: a burst of arrivals instead (issue 30): no connection is opened beforehand; each
stream connects at its start (spread over --spread-ms) and posts as soon as it is connected,
and its TTFB counts from the connect call, so the server's accept queue is inside the figure.
Prints one JSON line. Raises its own file-descriptor limit to the hard limit.

    python -m bench.streams --port P --path /v1/chat/completions --body-file F -n 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import struct
import sys
import time
from pathlib import Path

CONNECT_TIMEOUT = 10.0  # a server whose accept queue is full must not stall the run
CONNECT_PHASE_TIMEOUT = 30.0  # the whole connect phase of one cell
CONNECT_CONCURRENCY = 256
BURST_START = "BURSTSTART"  # --burst: the line said just before the first arrival is due


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


class Stream(asyncio.Protocol):
    """One connection carrying one streaming request; records its own timings."""

    def __init__(self, marker: bytes, done: asyncio.Future[None] | None = None) -> None:
        self.marker = marker
        self.transport: asyncio.Transport | None = None
        self.sent = 0.0
        self.first = 0.0
        self.ended = 0.0  # when the done marker arrived
        self.status = 0
        self.head = b""
        self.tail = b""
        self.completed = False
        self.closed = False
        self.done: asyncio.Future[None] | None = done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:  # close with RST: thousands of streams leave no TIME_WAIT behind
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def send(self, request: bytes) -> None:
        if self.transport is None or self.closed:
            return
        self.sent = time.perf_counter()
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        if not self.status:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            try:
                self.status = int(self.head.split(b" ", 2)[1])
            except (IndexError, ValueError):
                self.status = -1
            data = self.head[end + 4 :]
            self.head = b""
            if self.status != 200:  # an error reply: not a stream, done
                self._finish()
                return
        if not self.first:
            if b"data:" not in self.tail + data:
                self.tail = (self.tail + data)[-8:]
                return
            self.first = time.perf_counter()
        window = self.tail + data
        if self.marker in window:
            self.completed = self.status == 200
            self.ended = time.perf_counter()
            self._finish()
            return
        self.tail = window[-len(self.marker) :]

    def _finish(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()
        if self.done is not None and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            self.done.set_result(None)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def run(
    port: int,
    path: str,
    body: bytes,
    n: int,
    spread_ms: float,
    timeout: float,
    marker: bytes,
    headers: dict[str, str],
    burst: bool = False,
) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    head.append(f"Content-Length: {len(body)}")
    request = ("\r\n".join(head) + "\r\n\r\n").encode() + body

    if burst:
        return await arrivals(port, request, n, spread_ms, timeout, marker)
    streams: list[Stream] = []
    connect_errors = 0
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def connect() -> None:
        nonlocal connect_errors
        async with gate:
            fut: asyncio.Future[None] = loop.create_future()
            try:
                _, proto = await asyncio.wait_for(
                    loop.create_connection(lambda: Stream(marker, fut), "127.0.0.1", port),
                    CONNECT_TIMEOUT,
                )
            except (OSError, TimeoutError):
                connect_errors += 1
                return
        streams.append(proto)

    t_connect = time.perf_counter()
    tasks = [asyncio.ensure_future(connect()) for _ in range(n)]
    _, late = await asyncio.wait(tasks, timeout=CONNECT_PHASE_TIMEOUT)
    for task in late:  # a server whose accept queue stays full: give up on the rest
        task.cancel()
    if late:
        await asyncio.wait(late)
        connect_errors += len(late)
    connect_seconds = time.perf_counter() - t_connect
    opened = len(streams)

    t0 = loop.time() + 0.05
    step = spread_ms / 1000 / max(1, opened)
    for i, stream in enumerate(streams):
        loop.call_at(t0 + i * step, stream.send, request)
    start = time.perf_counter()
    waits = [s.done for s in streams if s.done is not None]
    if waits:
        await asyncio.wait(waits, timeout=timeout)
    elapsed = time.perf_counter() - start
    for stream in streams:
        if not stream.closed and stream.transport is not None:
            stream.transport.abort()
    return {
        "requested": n,
        "opened": opened,
        "connect_errors": connect_errors,
        "connect_seconds": round(connect_seconds, 3),
        **summary(streams, n),
        "seconds": round(elapsed, 3),
    }


async def arrivals(
    port: int, request: bytes, n: int, spread_ms: float, timeout: float, marker: bytes
) -> dict[str, object]:
    """``--burst``: N streams, each connecting at its start and posting once connected."""
    loop = asyncio.get_running_loop()
    streams: list[Stream] = []
    connect_ms: list[float] = []
    connect_errors = 0

    lag_ms: list[float] = []  # how late the client started each arrival (it is no bottleneck)

    async def arrive(due: float) -> None:
        nonlocal connect_errors
        stream = Stream(marker, loop.create_future())
        began = time.perf_counter()
        lag_ms.append((began - due) * 1000)
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: stream, "127.0.0.1", port), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError):
            connect_errors += 1
            return
        connect_ms.append((time.perf_counter() - began) * 1000)
        stream.send(request)
        stream.sent = began  # the arrival: the accept queue counts
        streams.append(stream)
        assert stream.done is not None
        await stream.done

    t0, due0 = loop.time() + 0.05, time.perf_counter() + 0.05
    sys.stdout.write(f"{BURST_START} 50\n")  # the first arrival in 50 ms (bench.burst's clock)
    sys.stdout.flush()
    step = spread_ms / 1000 / max(1, n)
    tasks: list[asyncio.Future[None]] = []

    def start(due: float) -> None:
        tasks.append(asyncio.ensure_future(arrive(due)))

    for i in range(n):
        loop.call_at(t0 + i * step, start, due0 + i * step)
    await asyncio.sleep(t0 - loop.time() + spread_ms / 1000 + 0.01)
    while len(tasks) < n:  # a late loop: every start made before waiting
        await asyncio.sleep(0.005)
    start = time.perf_counter()
    await asyncio.wait(tasks, timeout=timeout)
    elapsed = time.perf_counter() - start
    for stream in streams:
        if not stream.closed and stream.transport is not None:
            stream.transport.abort()
    for task in tasks:
        task.cancel()
    return {
        "requested": n,
        "opened": len(streams),
        "connect_errors": connect_errors,
        "connect_p99_ms": percentile(connect_ms, 99),
        "client_lag_p99_ms": percentile(lag_ms, 99),
        **summary(streams, n),
        "seconds": round(elapsed, 3),
    }


def summary(streams: list[Stream], n: int) -> dict[str, object]:
    """TTFB and total percentiles, completion and statuses of a run's streams."""
    ttfb = [(s.first - s.sent) * 1000 for s in streams if s.first and s.sent]
    total = [(s.ended - s.sent) * 1000 for s in streams if s.completed and s.sent]
    completed = sum(1 for s in streams if s.completed)
    statuses: dict[str, int] = {}
    for s in streams:
        statuses[str(s.status)] = statuses.get(str(s.status), 0) + 1
    return {
        "completed": completed,
        "errors": n - completed,
        "completion_rate": completed / n if n else 0.0,
        "ttfb_p50_ms": percentile(ttfb, 50),
        "ttfb_p99_ms": percentile(ttfb, 99),
        "total_p50_ms": percentile(total, 50),
        "total_p99_ms": percentile(total, 99),
        "statuses": statuses,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/v1/chat/completions")
    parser.add_argument("--body-file", type=Path, required=True)
    parser.add_argument("-n", type=int, default=256)
    parser.add_argument("--spread-ms", type=float, default=100.0)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--marker", default="[DONE]")
    parser.add_argument("--header", action="append", default=[], help="Name: value")
    parser.add_argument("--burst", action="store_true", help="connect at each start (timed)")
    args = parser.parse_args(argv)
    raise_fd_limit()
    headers = dict(h.split(": ", 1) for h in args.header)
    try:
        import uvloop  # the client should not be the bottleneck: use uvloop when installed

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    result = runner(
        run(
            args.port,
            args.path,
            args.body_file.read_bytes(),
            args.n,
            args.spread_ms,
            args.timeout,
            args.marker.encode(),
            headers,
            args.burst,
        )
    )
    sys.stdout.write("STREAMSJSON " + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
