"""A stream's body chunks written past the server's ASGI ``send`` (``server.body_writers``,
``server.uvicorn_body``), on a real uvicorn over a real socket: written in the response's
chunked framing, whole and in order with what ``send`` sends; none where the response is
sized or a HEAD's; and the ASGI ``send`` again while the client's flow control is paused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
import uvicorn

from gateway.server import mends
from gateway.server.body_writers import body_writer
from gateway.server.uvicorn_body import MEND
from tests.plugins.embedded import bound_socket

START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [(b"content-type", b"text/plain")],
}
SIZED = {**START, "headers": [(b"content-length", b"5")]}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """/chunked: three chunks by the writer between two by send; /sized: a sized reply;
    /paused: a chunk while uvicorn's flow control is paused, and one after."""
    path = scope["path"]
    await send(SIZED if path == "/sized" else START)
    write = body_writer(send)
    if path == "/chunked":
        assert write is not None
        await send({"type": "http.response.body", "body": b"zero ", "more_body": True})
        assert write(b"one ") and write(b"two ") and write(b"three ")
        await send({"type": "http.response.body", "body": b"four", "more_body": False})
    elif path == "/sized" or scope["method"] == "HEAD":
        assert write is None
        await send({"type": "http.response.body", "body": b"" if write else b"sized"})
    elif path == "/paused":
        assert write is not None
        flow = send.__self__.flow
        flow.pause_writing()
        assert not write(b"held ")  # uvicorn's send would wait: the writer leaves it to it
        flow.resume_writing()
        assert write(b"then ")
        await send({"type": "http.response.body", "body": b"end", "more_body": False})


@asynccontextmanager
async def uvicorn_serving() -> AsyncIterator[str]:
    sock = bound_socket()
    config = uvicorn.Config(app, lifespan="off", log_level="warning")  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("GET", "/chunked", b"zero one two three four"), ("GET", "/sized", b"sized"),
     ("HEAD", "/chunked", b""), ("GET", "/paused", b"then end")],
)  # fmt: skip
async def test_uvicorn_s_writer_writes_what_send_would(method: str, path: str, body: bytes) -> None:
    assert mends.fits(MEND)
    async with uvicorn_serving() as url, aiohttp.ClientSession() as s:
        async with s.request(method, url + path) as r:
            assert r.status == 200
            assert await r.read() == body
            chunked = r.headers.get("transfer-encoding") == "chunked"
            assert chunked == (method == "GET" and path != "/sized")
