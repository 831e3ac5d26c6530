"""The probes' own listener: ``GET /healthz`` and ``GET /readyz`` on ``server.probe_port``,
a socket the client listener's floods cannot reach.

On the client port a probe waits in the same accept queue as every client and counts
against ``server.max_connections``: an unauthenticated client reopening thousands of
connections fills both, and the kubelet's liveness probe then fails with the clients' 503
(half of them, in one trial of 11,000 connections), so Kubernetes restarts a process that is
alive. Here a probe has a listening socket, backlog and connection count of its own
(``MAX_OPEN`` at once, the rest closed at once; each connection answers one request within
``READ_SECONDS`` and is closed): what floods the client port is not seen here, and what
floods here cannot take more than a few sockets. Deploy it where only the kubelet (and
monitoring) reach it: it is not part of the client surface.

The answer is the app's own: the request goes to the ASGI app as the server would hand it
over (same handlers, access-log line and metric as on the client port), so what ready means
stays the app's to say; this module knows the app only as an ASGI callable. The listener
lives as long as the app's lifespan (``Probed`` wraps the app for that), so it runs in every
worker process under every server, bound with ``SO_REUSEPORT``: several workers share the
port and the kernel hands each probe to one of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

from gateway.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger("gateway.server")

PATHS = frozenset({"/healthz", "/readyz"})
MAX_OPEN = 16  # probe connections at once; more are closed as soon as they are accepted
READ_SECONDS = 2.0  # a probe's request must arrive within this
MAX_HEAD = 4096  # bytes of a probe's request line and headers
ANSWER_SECONDS = 5.0  # the app must answer within this (readiness asks the store: 1 s)
BACKLOG = 64
REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 503: b"Service Unavailable"}


class ProbeListener:
    """The probe port of one process: ``start()`` binds and serves, ``stop()`` closes."""

    def __init__(self, app: ASGIApp, host: str, port: int) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.open = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve,
            self.host,
            self.port,
            backlog=BACKLOG,
            limit=MAX_HEAD,
            reuse_port=hasattr(socket, "SO_REUSEPORT"),
        )
        if not self.port:  # an ephemeral port (tests): the one given
            self.port = self._server.sockets[0].getsockname()[1]
        log.info("server.probes_listening host=%s port=%d", self.host, self.port)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), READ_SECONDS)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= MAX_OPEN:
            writer.close()
            return
        self.open += 1
        try:
            async with asyncio.timeout(READ_SECONDS):
                head = await reader.readuntil(b"\r\n\r\n")
            method, path = request_line(head)
            if method not in (b"GET", b"HEAD") or path not in PATHS:
                status, body = (400, b"") if not method else (404, b'{"status":"not found"}')
            else:
                async with asyncio.timeout(ANSWER_SECONDS):
                    status, body = await self._ask(path, writer.get_extra_info("peername"))
            if method == b"HEAD":
                body = b""
            writer.write(response(status, body))
            await writer.drain()
        except (TimeoutError, OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a probe that does not ask in time, or leaves: nothing to answer
        finally:
            self.open -= 1
            writer.close()

    async def _ask(self, path: str, peer: Any) -> tuple[int, bytes]:
        """The app's answer to ``GET path``, as the client port would give it."""
        scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.1"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [],
            "client": tuple(peer[:2]) if isinstance(peer, tuple) else None,
            "server": (self.host, self.port),
        }
        answered = asyncio.Event()
        status = 500
        parts: list[bytes] = []
        asked = False

        async def receive() -> dict[str, Any]:
            nonlocal asked
            if not asked:
                asked = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await answered.wait()  # the prober stays until its answer is complete
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                parts.append(message.get("body", b""))
                if not message.get("more_body", False):
                    answered.set()

        try:
            await self.app(scope, receive, send)
        finally:
            answered.set()
        return status, b"".join(parts)


def request_line(head: bytes) -> tuple[bytes, str]:
    """(method, path without its query) of an HTTP/1 request head; (b"", "") if it is none."""
    line = head.split(b"\r\n", 1)[0].split(b" ")
    if len(line) != 3 or not line[2].startswith(b"HTTP/1."):
        return b"", ""
    path = line[1].split(b"?", 1)[0]
    try:
        return line[0], path.decode("ascii")
    except UnicodeDecodeError:
        return b"", ""


def response(status: int, body: bytes) -> bytes:
    """A whole HTTP/1.1 response that ends its connection."""
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"cache-control: no-store\r\nconnection: close\r\n\r\n"
        % (status, REASONS.get(status, b"Error"), len(body))
    ) + body


class Probed:
    """The app with a probe listener for as long as its lifespan runs: the lifespan is the
    one moment every server gives each worker inside its event loop. Every other request goes
    straight through (one call more per request)."""

    __slots__ = ("app", "listener")

    def __init__(self, app: ASGIApp, host: str, port: int) -> None:
        self.app = app
        self.listener = ProbeListener(app, host, port)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        await self.listener.start()
        try:
            await self.app(scope, receive, send)
        finally:
            await self.listener.stop()
