"""The leaner buffers the gateway gives aiohttp's responses (``upstream.lean_buffers``): a
``LeanDeque`` does what ``aiohttp.streams`` does with a deque, and under the mend a chunked
body read through aiohttp arrives whole, its chunk boundaries kept, its deques lean."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from aiohttp import streams, web

from gateway.server import mends
from gateway.upstream.lean_buffers import LEAN_BUFFERS, LeanDeque
from tests.plugins.web_apps import served

PIECES = [b"data: one\n\n", b"data: two\n\n", b"data: [DONE]\n\n"]


def test_a_lean_deque_behaves_as_a_deque_does_here() -> None:
    lean, real = LeanDeque(), collections.deque[int]()
    for queue in (lean, real):
        queue.append(1)
        queue.append(2)
        queue.appendleft(0)
    assert list(lean) == list(real) == [0, 1, 2]
    assert (lean[0], lean[-1], len(lean), bool(lean)) == (real[0], real[-1], 3, True)
    assert [lean.popleft() for _ in range(3)] == [real.popleft() for _ in range(3)]
    assert not lean and not real


@pytest.fixture
def lean() -> Iterator[None]:
    saved = streams.collections
    mends.put_in_place(LEAN_BUFFERS)
    yield
    streams.collections = saved


@pytest.fixture
async def chunked() -> AsyncIterator[str]:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for piece in PIECES:
            await resp.write(piece)
            await asyncio.sleep(0.01)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/", handler)
    async with served(app) as url:
        yield url + "/"


async def test_a_chunked_body_arrives_whole_with_its_chunks(lean: None, chunked: str) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(chunked) as resp:
            assert isinstance(resp.content._buffer, LeanDeque)
            got = b""
            while piece := await resp.content.readany():
                got += piece
        assert got == b"".join(PIECES)
        async with session.get(chunked) as resp:
            ends = []
            while True:
                data, end = await resp.content.readchunk()
                if not data and not end:
                    break
                ends.append((data, end))
        assert b"".join(d for d, _ in ends) == b"".join(PIECES)
        assert all(end for _, end in ends if _)  # each piece ended at a chunk boundary
