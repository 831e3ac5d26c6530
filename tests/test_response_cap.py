"""``limits.max_response_bytes``: a whole upstream reply is read up to the limit and no
further, and the client gets a 502 in its protocol past it (CONTRACT §4), over real sockets
(the pool's read against an aiohttp server, and a served gateway before the fake upstream)."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager

import aiohttp
import pytest
from aiohttp import web

from bench.fake.reply import Reply
from bench.fake_upstream import FakeUpstream
from gateway.config import UpstreamSettings
from gateway.errors import UpstreamError
from gateway.protocols.base import UpstreamCall
from gateway.upstream.pool import Upstream
from tests.plugins.servers import KEYS, ServedGateway
from tests.plugins.web_apps import served

LIMIT = 1024 * 1024
BIG = b'{"x":"' + b"a" * (2 * LIMIT) + b'"}'
SMALL = b'{"x":"' + b"a" * (LIMIT // 2) + b'"}'


async def stream(request: web.Request, body: bytes, **headers: str) -> web.StreamResponse:
    """``body`` chunked, 64 KiB a write: no Content-Length to go by."""
    resp = web.StreamResponse(headers={"content-type": "application/json", **headers})
    await resp.prepare(request)
    for i in range(0, len(body), 65536):
        await resp.write(body[i : i + 65536])
    await resp.write_eof()
    return resp


async def length(request: web.Request) -> web.StreamResponse:
    return web.Response(body=BIG, content_type="application/json")


async def chunked(request: web.Request) -> web.StreamResponse:
    return await stream(request, BIG)


async def gzipped(request: web.Request) -> web.StreamResponse:
    return await stream(request, gzip.compress(BIG), **{"content-encoding": "gzip"})


async def small(request: web.Request) -> web.StreamResponse:
    return await stream(request, SMALL)


REPLIES: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] = {
    "/length": length,
    "/chunked": chunked,
    "/gzip": gzipped,
    "/small": small,
}


@pytest.fixture
async def server() -> AsyncIterator[str]:
    app = web.Application()
    for path, handler in REPLIES.items():
        app.router.add_post(path, handler)
    async with served(app) as url:
        yield url


@pytest.mark.parametrize("path", ["/length", "/chunked", "/gzip"])
async def test_a_whole_reply_past_the_limit_is_not_read_past_it(server: str, path: str) -> None:
    u = Upstream(UpstreamSettings(), max_response_bytes=LIMIT)
    await u.start()
    try:
        resp = await u.request(UpstreamCall(server + path, {}, b"{}"))
        assert resp.status == 200
        with pytest.raises(UpstreamError, match="max_response_bytes"):
            await resp.read()
        resp.close()
        small = await u.request(UpstreamCall(server + "/small", {}, b"{}"))
        assert await small.read() == SMALL  # under the limit: whole
        small.close()
    finally:
        await u.stop()


@pytest.fixture
async def capped(
    gateway_factory: Callable[..., AbstractAsyncContextManager[ServedGateway]],
) -> AsyncIterator[ServedGateway]:
    async with gateway_factory(limits={"max_response_bytes": LIMIT}) as gw:
        yield gw


@pytest.mark.parametrize(
    ("path", "model", "shape"),
    [("/v1/chat/completions", "chat-small", "openai"),
     ("/v1/messages", "claude-small", "anthropic")],
)  # fmt: skip
async def test_a_client_gets_a_502_in_its_protocol_for_a_reply_past_the_limit(
    capped: ServedGateway, fake: FakeUpstream, path: str, model: str, shape: str
) -> None:
    fake.queue(Reply(text="word " * (LIMIT // 2)))  # the model's one channel: one attempt
    # the fake cuts its reply at max_tokens: room for all of it
    body = {"model": model, "max_tokens": 10**6, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"Authorization": f"Bearer {KEYS['alice']}", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as s:
        async with s.post(capped.url + path, json=body, headers=headers) as r:
            assert r.status == 502
            error = await r.json()
    if shape == "anthropic":
        assert error["type"] == "error"
    else:
        assert error["error"]["type"] == "upstream_error"
    assert "max_response_bytes" in error["error"]["message"]
    await capped.state.writer.flush()
    (rec,) = await capped.state.store.usage("alice", 1)
    assert (rec.status, rec.cost) == (502, 0)
    # a reply within the limit goes through
    fake.queue(Reply(text="word " * 1000))
    async with aiohttp.ClientSession() as s:
        async with s.post(capped.url + path, json=body, headers=headers) as r:
            assert r.status == 200
