"""An upstream call on a pooled connection, idle or new, sent without aiohttp's ``_request``
(``upstream.lean_send``): the upstream gets the very bytes aiohttp's usual way sends, on the
connection the last call left idle or on a new one when none is; replies of every framing
arrive whole; a connection that failed or was given up is never handed out again; a new
connection keeps the channel's connect timeout and the pool's TLS checks; a call the lean
path does not cover goes the usual way. Each test runs with the mend and without it
(aiohttp's own path), and expects the same of both, but for which way each call went."""

from __future__ import annotations

import asyncio
import gzip
import ssl
from collections.abc import Callable

import aiohttp
import aiohttp.connector
import pytest
from aiohttp import web
from aiohttp.client_proto import ResponseHandler

from gateway.config import ChannelTimeouts, UpstreamSettings
from gateway.errors import GatewayError, UpstreamError, UpstreamTimeoutError
from gateway.protocols.base import UpstreamCall
from gateway.server import mends
from gateway.upstream import lean_request_info, lean_send
from gateway.upstream.pool import Upstream
from tests.plugins.raw_upstreams import JSON, RawUpstream, chunked, silent_upstream, sized
from tests.plugins.web_apps import served

HEADERS = {"Authorization": "Bearer up-key", "Content-Type": "application/json",
           "anthropic-version": "2023-06-01"}  # fmt: skip
# a reply's bytes after its status line, by how it is framed
Reply = Callable[[int], bytes]


@pytest.fixture(params=[True, False], ids=["mended", "unmended"])
def mended(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """With the mend, and without it (the way every call went before)."""
    monkeypatch.setattr(lean_send, "_on", False)
    monkeypatch.setattr(mends, "_left_out", set())
    if not request.param:  # an aiohttp the mend does not know: left out
        start_timeout = ResponseHandler.start_timeout

        def changed(self: ResponseHandler, *later: object) -> None:
            start_timeout(self)

        monkeypatch.setattr(ResponseHandler, "start_timeout", changed)
    return bool(request.param)


@pytest.fixture
def usual_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URLs of the calls that went aiohttp's usual way (``ClientSession._request``)."""
    calls: list[str] = []
    request = aiohttp.ClientSession._request

    def counted(self: aiohttp.ClientSession, method: str, url: str, **kwargs: object) -> object:
        calls.append(url)
        return request(self, method, url, **kwargs)  # type: ignore[arg-type]

    # marked as a wrapper, so that the mend's check reads aiohttp's own under it
    monkeypatch.setattr(aiohttp.ClientSession, "_request", mends.wrapping("test", request, counted))
    return calls


async def started(settings: UpstreamSettings | None = None) -> Upstream:
    upstream = Upstream(settings or UpstreamSettings())
    await upstream.start()
    return upstream


async def call(
    pool: Upstream, url: str, body: bytes = b'{"model":"m"}', headers: dict[str, str] | None = None
) -> bytes:
    resp = await pool.request(UpstreamCall(url, headers or dict(HEADERS), body))
    try:
        return b"%d " % resp.status + await resp.read()
    finally:
        resp.close()


async def answered(url: str, times: int, headers: dict[str, str]) -> None:
    """``times`` calls with ``headers`` on a pool of their own, each answered whole."""
    pool = await started()
    try:
        for _ in range(times):
            assert await call(pool, url, headers=headers) == b"200 " + JSON
    finally:
        await pool.stop()


async def test_a_call_on_an_idle_connection_sends_what_the_usual_way_sends(
    raw: RawUpstream, mended: bool, usual_calls: list[str]
) -> None:
    pool = await started()
    try:
        assert lean_send.LEAN_SEND.in_place() is mended
        bodies = [b'{"model":"m","n":1}', b'{"model":"m","n":2}', b'{"model":"m","n":3}']
        for body in bodies:
            assert await call(pool, raw.url, body) == b"200 " + JSON
    finally:
        await pool.stop()
    # one connection, kept alive; the first call opened it, the others were sent on it: all
    # the lean way (or the usual way without the mend)
    assert [conn for conn, _, _ in raw.requests] == [1, 1, 1]
    assert len(usual_calls) == (0 if mended else 3)
    assert [body for _, _, body in raw.requests] == bodies
    first = raw.requests[0][1]
    assert all(head == first for _, head, _ in raw.requests)  # byte for byte, in order
    assert first.split(b"\r\n")[:4] == [
        b"POST /v1/chat/completions?alt=sse HTTP/1.1",
        b"Host: " + raw.url.split("/")[2].encode(),
        b"User-Agent: model-gateway/0.1.0",
        b"Authorization: Bearer up-key",
    ]


@pytest.mark.parametrize(
    "headers",
    [
        {"User-Agent": "sdk/1.0"},  # replaces the session's; no Content-Type: aiohttp's
        {"Accept": "text/event-stream", "Accept-Encoding": "identity", "X-Goog-Api-Key": "k"},
    ],
    ids=["own-user-agent", "own-accept"],
)
async def test_a_call_s_own_headers_replace_the_added_ones_as_aiohttp_does(
    raw: RawUpstream, mended: bool, headers: dict[str, str]
) -> None:
    await answered(raw.url, 2, headers)
    (_, usual, _), (_, second, _) = raw.requests
    assert second == usual
    lines = usual.split(b"\r\n")
    for name, value in headers.items():
        assert f"{name}: {value}".encode() in lines
    assert sum(line.lower().startswith(b"user-agent:") for line in lines) == 1


@pytest.mark.parametrize(
    "headers",
    [{"Connection": "close"}, {"authorization": "a", "Authorization": "b"}],
    ids=["connection-header", "a-name-twice"],
)
async def test_a_call_the_lean_path_does_not_cover_goes_the_usual_way(
    raw: RawUpstream, mended: bool, usual_calls: list[str], headers: dict[str, str]
) -> None:
    await answered(raw.url, 2, headers)
    assert len(usual_calls) == 2
    assert raw.requests[0][1] == raw.requests[1][1]


async def test_credentials_in_the_url_are_sent_as_basic_auth_as_aiohttp_sends_them(
    raw: RawUpstream, mended: bool, usual_calls: list[str]
) -> None:
    url = raw.url.replace("http://", "http://user:secret@")
    await answered(url, 2, {"Content-Type": "application/json"})
    assert len(usual_calls) == 2  # the lean path leaves such a URL to aiohttp
    for _, head, _ in raw.requests:
        assert b"Authorization: Basic dXNlcjpzZWNyZXQ=" in head.split(b"\r\n")
        assert b"secret@" not in head


async def test_a_control_character_in_a_header_is_refused_as_the_usual_way_refuses_it(
    raw: RawUpstream, mended: bool
) -> None:
    pool = await started()
    try:
        assert await call(pool, raw.url) == b"200 " + JSON
        for bad in ("Bearer k\r\nX-Evil: 1", "Bearer k\nX-Evil: 1", "Bearer \x00k"):
            with pytest.raises(ValueError, match="Forbidden control character"):
                await call(pool, raw.url, headers={"Authorization": bad})
        assert await call(pool, raw.url) == b"200 " + JSON
    finally:
        await pool.stop()
    assert all(b"X-Evil" not in head for _, head, _ in raw.requests)
    assert len(raw.requests) == 2


def _gzipped(n: int) -> bytes:
    body = gzip.compress(JSON)
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body)
    return head + body


REPLIES: list[tuple[str, Reply, bytes]] = [
    ("sized", lambda n: sized(), b"200 " + JSON),
    ("chunked", lambda n: chunked([b"data: 1\n\n", b"data: 2\n\n"]), b"200 data: 1\n\ndata: 2\n\n"),
    ("gzip", _gzipped, b"200 " + JSON),
    ("error", lambda n: sized(b'{"error":"no"}', "429 Too Many Requests"), b'429 {"error":"no"}'),
    (
        "until-eof",
        lambda n: b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + JSON,
        b"200 " + JSON,
    ),
]


@pytest.mark.parametrize(("framing", "reply", "expected"), REPLIES, ids=[r[0] for r in REPLIES])
async def test_a_reply_of_each_framing_arrives_whole(
    raw: RawUpstream, mended: bool, framing: str, reply: Reply, expected: bytes
) -> None:
    raw.answer = reply
    pool = await started()
    try:
        for _ in range(3):
            assert await call(pool, raw.url) == expected
    finally:
        await pool.stop()
    closes = framing == "until-eof"
    assert [conn for conn, _, _ in raw.requests] == ([1, 2, 3] if closes else [1, 1, 1])


async def test_a_stream_s_pieces_arrive_as_they_are_sent(raw: RawUpstream, mended: bool) -> None:
    raw.answer = lambda n: chunked([b"data: %d\n\n" % i for i in range(50)])
    pool = await started()
    try:
        for _ in range(2):
            resp = await pool.request(UpstreamCall(raw.url, dict(HEADERS), b"{}"))
            got = b""
            while piece := await resp.chunk():
                got += piece
            assert resp.at_eof()
            resp.close()
            assert got == b"".join(b"data: %d\n\n" % i for i in range(50))
    finally:
        await pool.stop()
    assert [conn for conn, _, _ in raw.requests] == [1, 1]


FAILURES = [  # the second call's answer, the pool's settings, and what that call raises
    ("closed-unanswered", None, UpstreamSettings(), UpstreamError, "cannot reach the upstream"),
    ("silent", b"", UpstreamSettings(read_timeout=0.3), UpstreamTimeoutError, "did not answer"),
]


@pytest.mark.parametrize(
    ("second", "settings", "error", "message"),
    [f[1:] for f in FAILURES],
    ids=[f[0] for f in FAILURES],
)
async def test_a_call_that_fails_on_its_connection_fails_alone(
    raw: RawUpstream,
    mended: bool,
    second: bytes | None,
    settings: UpstreamSettings,
    error: type[GatewayError],
    message: str,
) -> None:
    """A connection closed unanswered, or silent past the read timeout: that call fails as a
    gateway error, and the next goes on a new connection."""
    raw.answer = lambda n: second if n == 2 else sized()
    pool = await started(settings)
    try:
        assert await call(pool, raw.url) == b"200 " + JSON
        with pytest.raises(error, match=message):
            await call(pool, raw.url)
        assert await call(pool, raw.url) == b"200 " + JSON
    finally:
        await pool.stop()
    assert [conn for conn, _, _ in raw.requests] == [1, 1, 2]


@pytest.mark.parametrize(
    ("timeouts", "lean"),
    [(ChannelTimeouts(idle=0.3), True), (ChannelTimeouts(idle=0.3, total=30), False)],
    ids=["own-idle", "own-total"],
)
async def test_a_channel_s_own_read_timeout_applies_to_its_calls(
    raw: RawUpstream,
    mended: bool,
    usual_calls: list[str],
    timeouts: ChannelTimeouts,
    lean: bool,
) -> None:
    """A channel's own longest silence applies however its calls go (the session's is 600 s
    here); one with a deadline for the whole call goes the usual way, whose timer keeps it."""
    raw.answer = lambda n: b"" if n == 2 else sized()
    pool = await started()
    try:
        for n in range(3):
            resp = pool.request(UpstreamCall(raw.url, dict(HEADERS), b"{}"), timeouts=timeouts)
            if n == 1:
                with pytest.raises(UpstreamTimeoutError):
                    await asyncio.wait_for(resp, 10)
                continue
            answered = await resp
            assert await answered.read() == JSON
            answered.close()
    finally:
        await pool.stop()
    assert [conn for conn, _, _ in raw.requests] == [1, 1, 2]
    assert len(usual_calls) == (0 if mended and lean else 3)


async def test_a_call_given_up_while_waiting_closes_its_connection(
    raw: RawUpstream, mended: bool
) -> None:
    raw.answer = lambda n: b"" if n == 2 else sized()
    pool = await started()
    try:
        assert await call(pool, raw.url) == b"200 " + JSON
        waiting = asyncio.ensure_future(call(pool, raw.url))
        while len(raw.requests) < 2:
            await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert await call(pool, raw.url) == b"200 " + JSON  # not on the abandoned one
    finally:
        await pool.stop()
    assert [conn for conn, _, _ in raw.requests] == [1, 1, 2]


async def test_an_upstream_that_is_gone_is_a_gateway_error(mended: bool) -> None:
    pool = await started(UpstreamSettings(connect_timeout=2))
    try:
        with pytest.raises(GatewayError):
            await call(pool, "http://127.0.0.1:9/v1/chat/completions")
    finally:
        await pool.stop()


async def test_calls_at_once_each_open_a_connection_and_send_the_same_bytes(
    raw: RawUpstream, mended: bool, usual_calls: list[str]
) -> None:
    """A burst's calls find no connection idle: each opens one (the lean way with the mend)
    and sends on it what the usual way sends."""
    pool = await started()
    try:
        got = await asyncio.gather(*(call(pool, raw.url, b"{}") for _ in range(5)))
    finally:
        await pool.stop()
    assert got == [b"200 " + JSON] * 5
    assert raw.connections == 5 and sorted(conn for conn, _, _ in raw.requests) == [1, 2, 3, 4, 5]
    assert len({head for _, head, _ in raw.requests}) == 1
    assert len(usual_calls) == (0 if mended else 5)


async def test_a_new_connection_keeps_the_channel_s_connect_timeout(
    mended: bool, usual_calls: list[str]
) -> None:
    """An upstream that takes the connection and never answers the TLS handshake: the
    channel's own connect timeout ends the call, however it went (the pool's is 30 s)."""

    pool = await started(UpstreamSettings(connect_timeout=30))
    try:
        async with silent_upstream() as port:
            url = f"https://127.0.0.1:{port}/v1/chat/completions"
            answer = pool.request(
                UpstreamCall(url, dict(HEADERS), b"{}"), timeouts=ChannelTimeouts(connect=0.3)
            )
            with pytest.raises(UpstreamTimeoutError):
                await asyncio.wait_for(answer, 10)
    finally:
        await pool.stop()
    assert len(usual_calls) == (0 if mended else 1)


async def test_headers_that_change_each_call_are_sent_as_given_past_the_heads_kept(
    raw: RawUpstream, mended: bool, usual_calls: list[str]
) -> None:
    """A signed call's headers (SigV4: a date and a signature each time) differ call after
    call: more of them than the lean path keeps heads for, each sent as given."""
    calls = lean_send.HEADS_KEPT + 4
    pool = await started()
    try:
        for n in range(calls):
            signed = {"X-Amz-Date": f"20261127T0000{n:02d}Z", "Authorization": f"AWS4 sig-{n}"}
            assert await call(pool, raw.url, b"{}", signed) == b"200 " + JSON
    finally:
        await pool.stop()
    assert len(usual_calls) == (0 if mended else calls)
    for n, (conn, head, body) in enumerate(raw.requests):
        assert (conn, body) == (1, b"{}")
        lines = head.split(b"\r\n")
        assert b"X-Amz-Date: 20261127T0000%02dZ" % n in lines
        assert b"Authorization: AWS4 sig-%d" % n in lines
        assert head == raw.requests[0][1].replace(b"00Z", b"%02dZ" % n).replace(
            b"sig-0", b"sig-%d" % n
        )


async def test_a_response_keeps_none_of_its_call_s_headers(raw: RawUpstream, mended: bool) -> None:
    """The upstream's credentials are not held for as long as a response lasts, whichever way
    its call went (``aiohttp.lean_request_info`` for the usual way's)."""
    pool = await started()
    try:
        for _ in range(2):
            resp = await pool.request(UpstreamCall(raw.url, dict(HEADERS), b"{}"))
            info = resp._resp.request_info
            assert (str(info.url), info.method, str(info.real_url)) == (raw.url, "POST", raw.url)
            assert dict(info.headers) == {}
            assert await resp.read() == JSON
            resp.close()
    finally:
        await pool.stop()


async def test_calls_over_tls_go_on_one_verified_connection(
    monkeypatch: pytest.MonkeyPatch,
    tls: tuple[ssl.SSLContext, ssl.SSLContext],
    mended: bool,
    usual_calls: list[str],
) -> None:
    """As providers serve: HTTPS, the certificate verified (the pool's default context, here
    one that trusts the test's certificate alone), every call after the first on the same
    TLS connection."""
    monkeypatch.setattr(aiohttp.connector, "_SSL_CONTEXT_VERIFIED", tls[1])
    peers: list[object] = []

    async def answer(request: web.Request) -> web.Response:
        peers.append(request.transport)
        assert request.headers["Authorization"] == "Bearer up-key"
        return web.json_response({"got": (await request.read()).decode()})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    async with served(app, tls[0]) as url:
        assert url.startswith("https://")
        pool = await started()
        try:
            for n in range(3):
                body = b'{"n":%d}' % n
                got = await call(pool, url + "/v1/chat/completions", body)
                assert got == b'200 {"got": "{\\"n\\":%d}"}' % n
        finally:
            await pool.stop()
    assert len(peers) == 3 and peers[1] is peers[0] and peers[2] is peers[0]
    assert len(usual_calls) == (0 if mended else 3)


async def test_a_certificate_the_pool_does_not_trust_is_refused(
    tls: tuple[ssl.SSLContext, ssl.SSLContext], mended: bool
) -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    async with served(app, tls[0]) as url:
        pool = await started()
        try:
            for _ in range(2):
                with pytest.raises(UpstreamError, match="cannot reach the upstream"):
                    await call(pool, url + "/v1/chat/completions")
        finally:
            await pool.stop()


async def test_a_request_method_replaced_since_sees_every_call(
    raw: RawUpstream, mended: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tracer that wraps ``ClientSession._request`` (or a test's mock of it), put in place
    after the pool started: the lean path stands aside, and the wrapper sees each call."""
    pool = await started()
    seen: list[str] = []
    usual = aiohttp.ClientSession._request

    async def traced(self: aiohttp.ClientSession, method: str, url: object, **kw: object) -> object:
        seen.append(str(url))
        return await usual(self, method, url, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(aiohttp.ClientSession, "_request", traced)
    try:
        for _ in range(3):
            assert await call(pool, raw.url) == b"200 " + JSON
    finally:
        await pool.stop()
    assert seen == [raw.url] * 3


async def test_with_request_info_changed_every_call_goes_the_usual_way(
    raw: RawUpstream, monkeypatch: pytest.MonkeyPatch, usual_calls: list[str]
) -> None:
    """A lean call's ``RequestInfo`` is made in the shape ``lean_request_info`` knows: an
    aiohttp whose ``RequestInfo`` changed leaves that mend out, and this path stands aside."""
    monkeypatch.setattr(lean_request_info, "_on", False)
    monkeypatch.setattr(lean_request_info, "FIELDS", ("url", "method", "headers"))
    monkeypatch.setattr(mends, "_left_out", set())
    pool = await started()
    try:
        assert not lean_request_info.LEAN_REQUEST_INFO.in_place()
        for _ in range(3):
            assert await call(pool, raw.url) == b"200 " + JSON
    finally:
        await pool.stop()
    assert len(usual_calls) == 3
