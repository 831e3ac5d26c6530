"""CPU per request of the relay apps themselves, driven in-process with no HTTP server.

The gateway's cost over the bare relay is what the gateway's own code adds; an ASGI server adds
the same to both. Here each app is called directly (``app(scope, receive, send)``) by this
process, pinned to core 0, against the nginx upstream of the benchmark on core 1, so process
CPU time per request is the app's (plus aiohttp's upstream call), with far less noise than
throughput through a server. With ``--profile`` the gateway's requests run under cProfile and
the top functions are printed.

    python -m bench.inproc [-n 3000] [-c 16] [--profile] [--kinds json,sse]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import importlib
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from bench import payloads, procs, targets

RELAY_CORE = 0


def _scope(path: str, body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"authorization", f"Bearer {payloads.BENCH_KEY}".encode()),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


async def _one(app: Any, path: str, body: bytes, expect: list[str]) -> None:
    sent = False
    parts: list[bytes] = []
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never  # the client never leaves
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await app(_scope(path, body), receive, send)
    reply = b"".join(parts)
    if not all(e.encode() in reply for e in expect):
        raise RuntimeError(f"unexpected reply: {reply[:200]!r}")


async def _drive(app: Any, kind: str, n: int, conns: int) -> float:
    """CPU µs per request over n requests, conns at a time."""
    body = payloads.chat_request(kind, kind == "sse")
    expect = payloads.EXPECT[kind]
    queue = iter(range(n))

    async def worker() -> None:
        for _ in queue:
            await _one(app, "/v1/chat/completions", body, expect)

    for _ in range(50):  # warm-up: pool connections, caches
        await _one(app, "/v1/chat/completions", body, expect)
    gc.collect()
    start = time.process_time()
    await asyncio.gather(*(worker() for _ in range(conns)))
    return (time.process_time() - start) / n * 1e6


async def _lifespan(app: Any) -> tuple[asyncio.Task[None], asyncio.Queue[dict[str, Any]]]:
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    started = asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"].endswith(".failed"):
            raise RuntimeError(message)
        started.set()

    await inbox.put({"type": "lifespan.startup"})
    task = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, send)
    )
    await asyncio.wait_for(started.wait(), 30)
    return task, inbox


async def _measure(name: str, app: Any, kinds: list[str], n: int, conns: int, prof: bool) -> None:
    task, inbox = await _lifespan(app)
    try:
        for kind in kinds:
            if prof:
                profiler = cProfile.Profile()
                profiler.enable()
            us = await _drive(app, kind, n, conns)
            if prof:
                profiler.disable()
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(35)
                print(out.getvalue())
            print(f"{name:8} {kind:5} c={conns:<3} {us:8.0f} µs/req (process CPU)", flush=True)
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(task, 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3000)
    parser.add_argument("-c", type=int, default=16)
    parser.add_argument("--kinds", default="json,sse")
    parser.add_argument("--apps", default="bare,gateway")
    parser.add_argument("--profile", action="store_true", help="cProfile the gateway's requests")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {RELAY_CORE})
    kinds = args.kinds.split(",")
    with tempfile.TemporaryDirectory(prefix="gw-inproc-") as tmpdir:
        tmp = Path(tmpdir)
        up = targets.start_upstream(tmp, 200, 25)
        try:
            os.environ["BARE_UPSTREAMS"] = orjson.dumps(
                {payloads.MODEL[k]: up.base_url(k) for k in ("json", "sse")}
            ).decode()
            for name in args.apps.split(","):
                if name == "bare":
                    app = importlib.import_module("bench.bare_relay").app
                else:
                    from gateway.app import create_app
                    from gateway.config import load_settings

                    app = create_app(load_settings(targets.gateway_config(tmp, up)))
                asyncio.run(
                    _measure(name, app, kinds, args.n, args.c, args.profile and name != "bare")
                )
        finally:
            procs.stop(up.proc)
            if up.paced_proc is not up.proc:
                procs.stop(up.paced_proc)


if __name__ == "__main__":
    sys.exit(main())
