"""The app served in the test's own event loop by the server the suite runs on.

``GATEWAY_TEST_SERVER`` (uvicorn, the default, hypercorn or granian) names it, for the
served fixtures here and for ``gateway serve`` in ``tests/plugins/processes.py``: the whole
served suite runs on any supported server. ``each_server`` parametrizes a test of a
server-specific behaviour over every supported server that is installed.

``listening(app, settings)`` yields the port once ``/healthz`` answers there, and stops the
server (its graceful shutdown) when the block ends. Each server is told what ``gateway serve``
tells it (``gateway.server.uvicorn_options``, ``granian_http1``); hypercorn here is not
mended (the mends are ``gateway serve``'s and tests/test_mends.py's).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from gateway.config import Settings
from gateway.server import SERVERS, granian_http1, uvicorn_options
from gateway.server.defences import default_connection_limit
from gateway.types import ASGIApp

ENV = "GATEWAY_TEST_SERVER"
SERVER = os.environ.get(ENV, "uvicorn")
if SERVER not in SERVERS:
    raise pytest.UsageError(f"{ENV}={SERVER!r}: expected one of {', '.join(SERVERS)}")
STOP_DEADLINE = 30.0  # a shutdown takes well under a second; the bound is for a busy machine


def installed(server: str) -> bool:
    return importlib.util.find_spec(server) is not None


def each_server(*names: str, gaps: dict[str, str] | None = None) -> list[Any]:
    """``pytest.param`` per server (every supported one unless named), skipped where it is not
    installed; ``gaps``: server -> why it lacks the behaviour (a strict xfail: the test must
    fail there, so that the day it passes the gap is seen closed)."""
    params = []
    for name in names or SERVERS:
        marks = [pytest.mark.skipif(not installed(name), reason=f"{name} is not installed")]
        if gaps and name in gaps:
            marks.append(pytest.mark.xfail(strict=True, reason=gaps[name]))
        params.append(pytest.param(name, marks=marks, id=name))
    return params


def bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


async def _healthy(port: int, running: asyncio.Task[Any]) -> None:
    url = f"http://127.0.0.1:{port}/healthz"
    async with aiohttp.ClientSession() as s:
        for _ in range(500):
            with contextlib.suppress(aiohttp.ClientError):
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            if running.done():
                running.result()
            await asyncio.sleep(0.02)
    raise AssertionError(f"the {SERVER} server never answered /healthz")


@contextlib.asynccontextmanager
async def _running(
    serve: Awaitable[Any], stop: Callable[[], None], port: int
) -> AsyncIterator[int]:
    task = asyncio.ensure_future(serve)
    try:
        await _healthy(port, task)
        yield port
    finally:
        stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, STOP_DEADLINE)


def _hypercorn(app: ASGIApp, settings: Settings, sock: socket.socket) -> Any:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    cfg = Config()
    cfg.bind = [f"fd://{sock.fileno()}"]
    cfg.accesslog = None
    cfg.errorlog = None
    cfg.graceful_timeout = 1.0
    stop = asyncio.Event()
    return serve(app, cfg, shutdown_trigger=stop.wait), stop.set  # type: ignore[arg-type]


def _uvicorn(app: ASGIApp, settings: Settings, sock: socket.socket) -> Any:
    import uvicorn

    limit = settings.server.max_connections or default_connection_limit()
    options = {**uvicorn_options(settings.server, limit), "timeout_graceful_shutdown": 1}
    server = uvicorn.Server(uvicorn.Config(app, lifespan="on", **options))  # type: ignore[arg-type]
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # pytest's

    def stop() -> None:
        server.should_exit = True

    return server.serve(sockets=[sock]), stop


def _granian(app: ASGIApp, settings: Settings, sock: socket.socket) -> Any:
    """granian's embedded server (its own listener: the port of ``sock``, closed first)."""
    from granian.constants import Interfaces
    from granian.http import HTTP1Settings
    from granian.server.embed import Server

    from gateway.server import GRANIAN_MAX_CONCURRENT

    port = sock.getsockname()[1]
    sock.close()
    server = Server(
        app,
        address="127.0.0.1",
        port=port,
        interface=Interfaces.ASGI,
        backpressure=GRANIAN_MAX_CONCURRENT,
        http1_settings=granian_http1(settings.server, HTTP1Settings),  # type: ignore[arg-type]
        log_enabled=False,
    )
    return server.serve(), server.stop


SERVE = {"hypercorn": _hypercorn, "uvicorn": _uvicorn, "granian": _granian}


@contextlib.asynccontextmanager
async def listening(app: ASGIApp, settings: Settings) -> AsyncIterator[int]:
    """``app`` served by ``SERVER`` on an ephemeral port of 127.0.0.1 until the block ends."""
    sock = bound_socket()
    port = sock.getsockname()[1]
    try:
        serve, stop = SERVE[SERVER](app, settings, sock)
        async with _running(serve, stop, port):
            yield port
    finally:
        with contextlib.suppress(OSError):  # the server may have closed the fd already
            sock.close()
