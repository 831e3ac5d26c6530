"""A new upstream connection to a single address opened in one step of the event loop
(``upstream.lean_connect``): calls on new connections are answered as before, over plain TCP
and over verified TLS; a connect timeout is the channel's and is not waited out twice; a
connect that fails otherwise (refused, a certificate not trusted) fails as aiohttp's own way
says, by going that way; a name with several addresses goes aiohttp's way (happy eyeballs).
Each test runs with the mend and without it, and expects the same of both, but for which way
each connection was opened."""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any

import aiohttp
import aiohttp.connector
import pytest
from aiohttp import web

from gateway.config import ChannelTimeouts, UpstreamSettings
from gateway.errors import UpstreamError, UpstreamTimeoutError
from gateway.protocols.base import UpstreamCall
from gateway.server import mends
from gateway.upstream import lean_connect
from gateway.upstream.lean_connect import LEAN_CONNECT, LeanConnector
from gateway.upstream.pool import RecentFirstConnector, Upstream
from tests.plugins.raw_upstreams import JSON, RawUpstream, silent_upstream
from tests.plugins.web_apps import served

HEADERS = {"Authorization": "Bearer up-key", "Content-Type": "application/json"}


@pytest.fixture(params=[True, False], ids=["mended", "unmended"])
def mended(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """With the mend, and without it (aiohttp's own way, as where it does not fit)."""
    monkeypatch.setattr(mends, "_left_out", set() if request.param else {LEAN_CONNECT.name})
    if not request.param:
        monkeypatch.delattr(LeanConnector, "_wrap_create_connection", raising=False)
    return bool(request.param)


@pytest.fixture
def usual(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The connections opened aiohttp's own way (``aiohappyeyeballs.start_connection``)."""
    opened: list[object] = []
    start = aiohttp.connector.aiohappyeyeballs.start_connection

    async def counted(*args: Any, **kwargs: Any) -> Any:
        opened.append(kwargs.get("addr_infos"))
        return await start(*args, **kwargs)

    monkeypatch.setattr(aiohttp.connector.aiohappyeyeballs, "start_connection", counted)
    return opened


async def started(settings: UpstreamSettings | None = None) -> Upstream:
    pool = Upstream(settings or UpstreamSettings())
    await pool.start()
    return pool


async def call(pool: Upstream, url: str, timeouts: ChannelTimeouts | None = None) -> bytes:
    resp = await pool.request(UpstreamCall(url, dict(HEADERS), b"{}"), timeouts=timeouts)
    try:
        return b"%d " % resp.status + await resp.read()
    finally:
        resp.close()


async def test_calls_at_once_each_open_a_connection_and_are_answered(
    raw: RawUpstream, mended: bool, usual: list[object]
) -> None:
    pool = await started()
    try:
        got = await asyncio.gather(*(call(pool, raw.url) for _ in range(5)))
        again = await call(pool, raw.url)  # on a connection the burst left idle
    finally:
        await pool.stop()
    assert got == [b"200 " + JSON] * 5 and again == b"200 " + JSON
    assert raw.connections == 5 and len(raw.requests) == 6
    assert len(usual) == (0 if mended else 5)


def _answering() -> web.Application:
    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    return app


async def test_a_tls_connection_is_verified_and_kept(
    monkeypatch: pytest.MonkeyPatch,
    tls: tuple[ssl.SSLContext, ssl.SSLContext],
    mended: bool,
    usual: list[object],
) -> None:
    monkeypatch.setattr(aiohttp.connector, "_SSL_CONTEXT_VERIFIED", tls[1])
    async with served(_answering(), tls[0]) as url:
        pool = await started()
        try:
            got = [await call(pool, url + "/v1/chat/completions") for _ in range(3)]
        finally:
            await pool.stop()
    assert got == [b'200 {"ok": true}'] * 3
    assert len(usual) == (0 if mended else 1)  # one connection, kept for the next calls


async def test_a_certificate_the_pool_does_not_trust_is_refused_as_aiohttp_refuses_it(
    tls: tuple[ssl.SSLContext, ssl.SSLContext], mended: bool, usual: list[object]
) -> None:
    async with served(_answering(), tls[0]) as url:
        pool = await started()
        try:
            with pytest.raises(UpstreamError, match="cannot reach the upstream"):
                await call(pool, url + "/v1/chat/completions")
        finally:
            await pool.stop()
    assert len(usual) == 1  # aiohttp's way says why: with the mend, after its own try


async def test_a_refused_connection_is_a_gateway_error_as_aiohttp_reports_it(
    mended: bool, usual: list[object]
) -> None:
    closed = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()
    pool = await started(UpstreamSettings(connect_timeout=2))
    try:
        with pytest.raises(UpstreamError, match="cannot reach the upstream"):
            await call(pool, f"http://127.0.0.1:{port}/v1/chat/completions")
    finally:
        await pool.stop()
    assert len(usual) == 1


async def test_a_connect_timeout_is_the_channel_s_and_is_waited_once(
    mended: bool, usual: list[object]
) -> None:
    """An upstream that takes the connection and never answers the TLS handshake: the
    channel's connect timeout (0.3 s; the pool's is 30 s) ends the call, and with the mend
    aiohttp's way is not tried after it (the timeout would be waited out twice)."""

    pool = await started(UpstreamSettings(connect_timeout=30))
    try:
        async with silent_upstream() as port:
            url = f"https://127.0.0.1:{port}/v1/chat/completions"
            with pytest.raises(UpstreamTimeoutError):
                await asyncio.wait_for(call(pool, url, ChannelTimeouts(connect=0.3)), 10)
    finally:
        await pool.stop()
    assert len(usual) == (0 if mended else 1)


async def test_a_socket_connect_timeout_is_raised_as_aiohttp_raises_it(
    mended: bool, usual: list[object]
) -> None:
    """The pool times a connect as a whole (``ClientTimeout.connect``); a session of the
    connector's that times the socket's alone (``sock_connect``) gets aiohttp's own error,
    and with the mend aiohttp's way is not tried after it."""

    assert mends.fits(LEAN_CONNECT) == mended
    timeout = aiohttp.ClientTimeout(sock_connect=0.3)
    async with (
        silent_upstream() as port,
        aiohttp.ClientSession(connector=RecentFirstConnector(), timeout=timeout) as session,
    ):
        with pytest.raises(aiohttp.ConnectionTimeoutError):
            await asyncio.wait_for(session.post(f"https://127.0.0.1:{port}/v1", data=b"{}"), 10)
    assert len(usual) == (0 if mended else 1)


async def test_a_name_with_several_addresses_goes_aiohttp_s_way(
    raw: RawUpstream, mended: bool, usual: list[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Happy eyeballs across a name's addresses is aiohttp's: the mend takes one address
    only."""
    port = int(raw.url.split(":")[2].split("/")[0])

    async def two(self: aiohttp.TCPConnector, host: str, port: int, traces: Any = None) -> Any:
        one = {"hostname": host, "host": "127.0.0.1", "port": port, "family": 2, "proto": 6,
               "flags": 0}  # fmt: skip
        return [one, dict(one)]

    monkeypatch.setattr(aiohttp.TCPConnector, "_resolve_host", two)
    pool = await started()
    try:
        got = await call(pool, f"http://upstream.test:{port}/v1/chat/completions")
    finally:
        await pool.stop()
    assert got == b"200 " + JSON
    assert len(usual) == 1 and len(usual[0]) == 2  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("addr_infos", "one"),
    [
        ([(socket.AF_INET, 1, 6, "", ("10.0.0.1", 443))], (socket.AF_INET, "10.0.0.1", 443)),
        ([(socket.AF_INET6, 1, 6, "", ("::1", 443, 0, 0))], (socket.AF_INET6, "::1", 443)),
        ([(socket.AF_INET6, 1, 6, "", ("fe80::1", 443, 0, 2))], None),  # a scope: the socket's
        ([(socket.AF_INET6, 1, 6, "", ("fe80::1", 443, 7, 0))], None),  # a flow label
        ([(socket.AF_INET, 1, 6, "", ("10.0.0.1", 443))] * 2, None),  # happy eyeballs' case
        ([], None),
    ],
)
def test_only_a_single_plain_address_is_connected_to_in_one_step(
    addr_infos: list[Any], one: tuple[int, str, int] | None
) -> None:
    assert lean_connect._one_address(addr_infos) == one


async def test_an_ipv6_literal_is_connected_to_as_plainly(
    raw: RawUpstream, mended: bool, usual: list[object]
) -> None:
    try:
        server = await asyncio.start_server(raw.serve, "::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    port = server.sockets[0].getsockname()[1]
    pool = await started()
    try:
        async with server:
            got = await call(pool, f"http://[::1]:{port}/v1/chat/completions")
    finally:
        await pool.stop()
    assert got == b"200 " + JSON
    assert len(usual) == (0 if mended else 1)
