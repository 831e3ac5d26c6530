"""upstream.py in isolation: how connection failures map to gateway errors (aioresponses
raises them; the request's shape, timing and the pool are tested over real sockets against
the fake upstream, since aioresponses cannot build replies for this aiohttp version)."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from aiohttp.client_reqrep import ConnectionKey
from aioresponses import aioresponses

from gateway.config import UpstreamSettings
from gateway.errors import GatewayOverloadedError, UpstreamError, UpstreamTimeoutError
from gateway.protocols.base import UpstreamCall
from gateway.upstream.pool import READ_FAILURES, Upstream, read_error
from tests.plugins.web_apps import served

URL = "http://upstream.test/v1/chat/completions"
CALL = UpstreamCall(URL, {"Authorization": "Bearer up-key"}, b'{"model":"m"}')


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    u = Upstream(UpstreamSettings())
    await u.start()
    yield u
    await u.stop()


@asynccontextmanager
async def pool_serving(app: web.Application) -> AsyncIterator[tuple[Upstream, str]]:
    """A started pool, and ``app`` served (its base URL), for the length of a block."""
    async with served(app) as url:
        u = Upstream(UpstreamSettings())
        await u.start()
        try:
            yield u, url
        finally:
            await u.stop()


def connector_error(code: int) -> aiohttp.ClientConnectorError:
    key = ConnectionKey("upstream.test", 80, False, True, None, None, None)
    return aiohttp.ClientConnectorError(key, OSError(code, "simulated"))


@pytest.mark.parametrize(
    ("exc", "error"),
    [
        (connector_error(errno.ECONNREFUSED), UpstreamError),  # the upstream is down
        (connector_error(errno.EMFILE), GatewayOverloadedError),  # we are out of sockets
        (connector_error(errno.EADDRNOTAVAIL), GatewayOverloadedError),
        (TimeoutError(), UpstreamTimeoutError),
        (aiohttp.ServerDisconnectedError(), UpstreamError),
    ],
)
async def test_failures_map_to_gateway_errors(upstream: Upstream, exc, error) -> None:
    with aioresponses() as m:
        m.post(URL, exception=exc)
        with pytest.raises(error) as got:
            await upstream.request(CALL)
    # our own exhaustion is neither retried on another channel nor held against this one
    assert got.value.retryable is (error is not GatewayOverloadedError)


async def test_the_pool_reuses_the_connection_used_last() -> None:
    """After a burst opened several connections, calls one at a time go over the one used
    last, not round all of them (aiohttp's own pool order): the rest idle out, and the
    upstream is not kept holding a burst's worth of sockets."""
    ports: list[int] = []
    release = asyncio.Event()
    arrived = asyncio.Event()
    waiting = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal waiting
        peer = request.transport.get_extra_info("peername") if request.transport else None
        ports.append(peer[1])
        if not release.is_set():
            waiting += 1
            if waiting == 6:
                arrived.set()
            await release.wait()
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    async with pool_serving(app) as (u, url):
        call = UpstreamCall(url + "/v1/chat/completions", {}, b"{}")

        async def one() -> None:
            resp = await u.request(call)
            assert resp.status == 200
            await resp.read()
            resp.close()  # read to its end: back to the pool

        burst = [asyncio.create_task(one()) for _ in range(6)]
        await asyncio.wait_for(arrived.wait(), 10)  # six connections open at once
        release.set()
        await asyncio.gather(*burst)
        assert len(set(ports)) == 6
        ports.clear()
        for _ in range(8):
            await one()
        assert len(set(ports)) == 1, ports  # first-in first-out would cycle through all six


async def test_a_response_closed_keeps_its_connection_only_when_read_to_its_end() -> None:
    """``close`` after the whole body: the next call goes over the same connection; before
    the end of a stream: the connection is closed (the upstream sees it go), the next call
    opens another, and what was left of the body cannot be read as if it had ended."""
    ports: list[int] = []
    gone = asyncio.Event()

    async def whole(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        ports.append(peer[1])
        return web.json_response({"ok": True})

    async def endless(request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        ports.append(peer[1])
        resp = web.StreamResponse()
        await resp.prepare(request)
        try:
            while True:
                await resp.write(b"data: {}\n\n")
                await asyncio.sleep(0.01)
        except (ConnectionError, asyncio.CancelledError):
            gone.set()
            raise

    app = web.Application()
    app.router.add_post("/whole", whole)
    app.router.add_post("/endless", endless)
    async with pool_serving(app) as (u, url):
        for _ in range(3):
            resp = await u.request(UpstreamCall(url + "/whole", {}, b"{}"))
            assert await resp.read() == b'{"ok": true}'
            resp.close()
        assert len(ports) == 3 and len(set(ports)) == 1, ports
        resp = await u.request(UpstreamCall(url + "/endless", {}, b"{}"))
        assert await resp.chunk()
        resp.close()
        await asyncio.wait_for(gone.wait(), 10)
        with pytest.raises(READ_FAILURES):
            await resp.chunk()
        resp = await u.request(UpstreamCall(url + "/whole", {}, b"{}"))
        await resp.read()
        resp.close()
        assert ports[3] == ports[0] and ports[4] != ports[0], ports


async def test_reads_of_a_response_raise_only_gateway_errors() -> None:
    """A connection the upstream drops mid-body is a gateway error from ``read``, and from
    ``chunk`` one of ``READ_FAILURES``, which the stream loop makes one with ``read_error``."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": "1000"})
        await resp.prepare(request)
        await resp.write(b"partial")
        assert request.transport is not None
        request.transport.close()  # dies before the promised 1000 bytes
        return resp

    app = web.Application()
    app.router.add_post("/x", handler)
    async with pool_serving(app) as (u, url):
        for read in ("read", "chunk"):
            resp = await u.request(UpstreamCall(url + "/x", {}, b"{}"))
            with pytest.raises(UpstreamError) as got:
                if read == "read":
                    await resp.read()
                else:
                    try:
                        while await resp.chunk():
                            pass
                    except READ_FAILURES as exc:
                        raise read_error(exc) from None
            assert got.value.retryable is False  # after the status: not retried elsewhere
            resp.close()


async def test_an_upstream_s_cookie_is_not_sent_with_the_next_call() -> None:
    """A provider's CDN sets a cookie on a reply (a bot-management one): the next call, which
    may be another account's, goes without it; the pool keeps no state between calls."""
    cookies: list[str | None] = []

    async def handler(request: web.Request) -> web.Response:
        cookies.append(request.headers.get("Cookie"))
        reply = web.json_response({"ok": True})
        reply.set_cookie("__cf_bm", "tracked", path="/", max_age=1800)
        return reply

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    async with pool_serving(app) as (u, url):
        # a host name, not an address: aiohttp's cookie jar keeps no cookie of an IP address
        call = UpstreamCall(url.replace("127.0.0.1", "localhost") + "/v1/chat/completions",
                            {}, b"{}")  # fmt: skip
        for _ in range(2):
            resp = await u.request(call)
            assert resp.status == 200 and "__cf_bm" in resp.headers.get("Set-Cookie", "")
            await resp.read()
            resp.close()
    assert cookies == [None, None]
