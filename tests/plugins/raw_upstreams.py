"""Upstreams on raw sockets for the upstream pool's tests (``tests/test_lean_send.py``,
``tests/test_lean_connect.py``): one that answers each request as a test says and keeps what
it was sent, one that takes connections and says nothing; and a certificate to serve TLS with
(``tests/test_direct_reads.py`` too)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest

from tests.plugins.web_apps import self_signed

JSON = b'{"id":"r-1","ok":true}'


def sized(body: bytes = JSON, status: str = "200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status.encode(),
        len(body),
        body,
    )


def chunked(pieces: list[bytes]) -> bytes:
    framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    return head + b"\r\n" + framed + b"0\r\n\r\n"


@dataclass
class RawUpstream:
    """An upstream on a raw socket: each request's head and body as they came, on which
    connection; each answered by ``answer`` (None: the connection is closed unanswered,
    ``b""``: the request is left unanswered and the connection open)."""

    answer: Callable[[int], bytes | None] = lambda n: sized()
    requests: list[tuple[int, bytes, bytes]] = field(default_factory=list)
    connections: int = 0
    url: str = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                self.requests.append((conn, head, body))
                reply = self.answer(len(self.requests))
                if reply is None:
                    break
                if reply == b"":
                    await reader.read()  # silent until the client goes
                    break
                writer.write(reply)
                await writer.drain()
                if b"Connection: close" in reply:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def raw() -> AsyncIterator[RawUpstream]:
    upstream = RawUpstream()
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    upstream.url = f"http://127.0.0.1:{port}/v1/chat/completions?alt=sse"
    async with server:
        yield upstream


@asynccontextmanager
async def silent_upstream() -> AsyncIterator[int]:
    """An upstream that takes a connection and never answers (a TLS handshake never ends):
    its port."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for 127.0.0.1: the server's context and a client's that
    trusts it."""
    return self_signed(tmp_path_factory.mktemp("tls"))
