"""The one upstream HTTP client of a process: a keep-alive pool, timeouts, error mapping.

One ``aiohttp.ClientSession`` per process with an explicit ``TCPConnector`` (pool size, DNS
cache) and ``ClientTimeout(total=None, connect=..., sock_read=<longest silence>)``: a stream
may last as long as it keeps sending; aiohttp's 5-minute default total is never relied on.

The pool hands out the idle connection used last (``RecentFirstConnector``), where aiohttp's
own takes the one idle longest: after a burst, light traffic keeps reusing a few warm
connections and the rest idle out, instead of cycling through every connection of the burst.
That reaches into aiohttp's private pool, so it is a mend, ``aiohttp.recent_first`` (speed;
checked before it is put in place, ``gateway.server.mends``), kept for a request about 5%
cheaper after a burst (bench/RESULTS.md, "Mends"). Starting the pool also puts in place
``aiohttp.lean_buffers`` (``lean_buffers.py``: each response's buffers without deques) and
``aiohttp.lean_request_info`` (``lean_request_info.py``: a started response lets go of its
request's headers) and ``aiohttp.direct_reads`` (``direct_reads.py``: a stream's reads relayed
inside the socket's callback), ``aiohttp.lean_send`` (``lean_send.py``: a call on a pooled
connection, idle or new, written to it without ``ClientSession._request``'s layers), and
``aiohttp.lean_connect`` (``lean_connect.py``: a new connection to one address opened in one
step of the event loop).

Every upstream request says ``User-Agent: model-gateway/<version>``, as a session default
header, so aiohttp's own (``Python/3.x aiohttp/3.x``) is never added.

This module is the one boundary for upstream I/O: ``Upstream.request`` returns an
``UpstreamResponse`` whose reads raise only ``GatewayError``s, so nothing else in the gateway
imports aiohttp or maps its exceptions.
"""

from __future__ import annotations

import asyncio
import errno
from collections import defaultdict, deque
from collections.abc import AsyncIterable, Awaitable, Mapping
from typing import Any

import aiohttp

from gateway import __version__
from gateway.config import Channel, ChannelTimeouts, Limits, UpstreamSettings
from gateway.errors import (
    GatewayError,
    GatewayOverloadedError,
    UpstreamError,
    UpstreamTimeoutError,
)
from gateway.protocols.base import UpstreamCall
from gateway.server import mends
from gateway.upstream.direct_reads import DIRECT_READS, DirectReads, direct_reads, reads_wait
from gateway.upstream.lean_buffers import LEAN_BUFFERS
from gateway.upstream.lean_connect import LEAN_CONNECT, LeanConnector
from gateway.upstream.lean_request_info import LEAN_REQUEST_INFO, forget_request_headers
from gateway.upstream.lean_send import LEAN_SEND, LeanSend

# connect failures that say this process is exhausted, not that the upstream is down
LOCAL_EXHAUSTION = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.EADDRNOTAVAIL})
USER_AGENT = f"model-gateway/{__version__}"


class RecentFirstConnector(LeanConnector):
    """A ``TCPConnector`` whose idle pool is last-in first-out (module docstring), under the
    mend ``aiohttp.recent_first`` (speed; a ``gateway.server.mends.Mend``). The first one made
    in a process checks aiohttp's private pool and puts the mend in place; when aiohttp lays
    it out otherwise, the pool stays as aiohttp made it (first-in first-out), with one warning
    line naming the mend and what is missing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        mends.fits(RECENT_FIRST)


def _recent_first(get: Any) -> Any:
    """``_get`` over aiohttp's own ``get``: aiohttp takes idle connections from the left of a
    per-host deque and returns them on the right; turning the deque one step right first puts
    the newest on the left. Not a coroutine itself: it hands back aiohttp's, which the caller
    awaits (one coroutine less per request)."""

    def _get(self: aiohttp.TCPConnector, key: Any, traces: Any) -> Any:
        idle = self._conns.get(key)
        if idle is not None and len(idle) > 1:
            idle.rotate(1)
        return get(self, key, traces)

    return _get


def _check_recent_first() -> list[str]:
    needs = mends.Needs()
    where = "aiohttp.TCPConnector"
    get = needs.function(
        aiohttp.TCPConnector, "_get", where, ["self", "key", "traces"], coroutine=True
    )
    needs.uses(aiohttp.TCPConnector.connect, ["_get"], f"{where}.connect")
    needs.uses(get, ["_conns", "popleft"], f"{where}._get")  # takes from the left
    needs.uses(
        getattr(aiohttp.TCPConnector, "_release", None), ["_conns", "append"], f"{where}._release"
    )
    loop = asyncio.new_event_loop()  # a connector of its own to look at, never run
    try:
        pool = getattr(aiohttp.TCPConnector(loop=loop), "_conns", None)
    finally:
        loop.close()
    needs.require(
        isinstance(pool, defaultdict) and pool.default_factory is deque,
        f"{where}()._conns is missing or not a dict of deques",
    )
    return needs.missing


def _apply_recent_first() -> None:
    get = aiohttp.TCPConnector._get
    recent_first = mends.wrapping(RECENT_FIRST_NAME, get, _recent_first(get))
    RecentFirstConnector._get = recent_first  # type: ignore[method-assign]


RECENT_FIRST_NAME = "aiohttp.recent_first"
RECENT_FIRST = mends.Mend(
    name=RECENT_FIRST_NAME,
    library="aiohttp",
    written_for="3.14",
    kind="speed",
    fixes="aiohttp's pool cycles through every idle connection of a burst",
    check=_check_recent_first,
    apply=_apply_recent_first,
    in_place=lambda: mends.mended(vars(RecentFirstConnector).get("_get"), RECENT_FIRST_NAME),
)
MENDS = (RECENT_FIRST,)


class Upstream:
    """The pool. ``max_response_bytes``: the most a whole reply's body may hold
    (``limits.max_response_bytes``); its reads past it fail (``UpstreamResponse.read``)."""

    def __init__(self, settings: UpstreamSettings, max_response_bytes: int | None = None) -> None:
        self._settings = settings
        if max_response_bytes is None:
            max_response_bytes = Limits().max_response_bytes
        self._max_response_bytes = max_response_bytes
        self._session: aiohttp.ClientSession | None = None
        self._lean: LeanSend | None = None
        self._timeouts: dict[ChannelTimeouts, aiohttp.ClientTimeout] = {}

    async def start(self) -> None:
        s = self._settings
        mends.fits(LEAN_BUFFERS)  # each response's buffers without deques (a speed mend)
        mends.fits(LEAN_REQUEST_INFO)  # and without its request's headers (another)
        mends.fits(DIRECT_READS)  # a stream's reads relayed in the socket's callback (another)
        mends.fits(LEAN_SEND)  # a call on a pooled connection sent without _request's layers
        mends.fits(LEAN_CONNECT)  # a new connection to one address in one step (another)
        connector = RecentFirstConnector(
            limit=s.pool_size,
            limit_per_host=s.pool_size_per_host,
            ttl_dns_cache=300,
            keepalive_timeout=60,
            enable_cleanup_closed=False,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=None, connect=s.connect_timeout, sock_read=s.read_timeout
            ),
            auto_decompress=True,
            headers={"User-Agent": USER_AGENT},
            # an upstream's cookies (a CDN's bot-management one) are neither kept nor sent
            # with the next call, which may be another account's
            cookie_jar=aiohttp.DummyCookieJar(),
            read_bufsize=2**16,
        )
        self._lean = LeanSend.for_session(self._session)

    async def stop(self) -> None:
        self._lean = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        call: UpstreamCall,
        upload: AsyncIterable[bytes] | None = None,
        timeouts: ChannelTimeouts | None = None,
        channel: Channel | None = None,
    ) -> UpstreamResponse:
        """Send the call (its body, or ``upload`` streamed chunked as it is produced); the
        response once its status and headers arrived. ``timeouts``: the channel's own, where
        it has some. ``channel`` is not read: its credentials are in the call already
        (``auth.ChannelAuths`` sends through this pool). Raises only ``GatewayError``."""
        assert self._session is not None, "Upstream.start() was not awaited"
        timeout = self._timeout(timeouts) if timeouts is not None and timeouts.custom else None
        data: bytes | AsyncIterable[bytes]
        if upload is None:
            # orjson's output keeps its whole working buffer (4 KiB at the least) for as long
            # as it lives, and the request body lives as long as the response: a right-sized
            # copy is kept instead
            data = call.body = memoryview(call.body).tobytes()
        else:
            data = upload
        lean = self._lean if upload is None else None
        if timeout is not None and timeout.total is not None:
            lean = None  # a deadline for the whole call: aiohttp's timer keeps it
        try:
            # on a pooled connection, idle or new, written to it (``lean_send``), with the
            # channel's own timeouts if it has some; else (a call it does not cover) the usual
            # way
            resp = None
            if lean is not None:
                resp = await lean.send(call.url, call.body, call.headers, timeout)
            if resp is None and timeout is None:
                resp = await self._session.post(
                    call.url, data=data, headers=call.headers, allow_redirects=False
                )
            elif resp is None:
                resp = await self._session.post(
                    call.url,
                    data=data,
                    headers=call.headers,
                    allow_redirects=False,
                    timeout=timeout,
                )
        except TimeoutError:
            raise UpstreamTimeoutError("the upstream did not answer in time") from None
        except aiohttp.ClientConnectorError as exc:
            if exc.os_error.errno in LOCAL_EXHAUSTION:
                raise GatewayOverloadedError("the gateway is out of connections") from None
            raise UpstreamError(f"cannot reach the upstream: {type(exc).__name__}") from None
        except (aiohttp.ClientError, OSError) as exc:  # OSError: unwrapped, on the lean path
            raise UpstreamError(f"cannot reach the upstream: {type(exc).__name__}") from None
        return UpstreamResponse(resp, self._max_response_bytes)

    def _timeout(self, timeouts: ChannelTimeouts) -> aiohttp.ClientTimeout:
        """The client timeout of a channel with timeouts of its own (made once per channel)."""
        timeout = self._timeouts.get(timeouts)
        if timeout is None:
            s = self._settings
            timeout = self._timeouts[timeouts] = aiohttp.ClientTimeout(
                total=timeouts.total,
                connect=timeouts.connect if timeouts.connect is not None else s.connect_timeout,
                sock_read=timeouts.idle if timeouts.idle is not None else s.read_timeout,
            )
        return timeout


class UpstreamResponse:
    """An upstream reply whose status and headers arrived. Its reads raise only
    ``GatewayError`` (a failure after the status is never retried elsewhere)."""

    __slots__ = ("status", "headers", "_resp", "_limit", "_waits")

    def __init__(self, resp: aiohttp.ClientResponse, limit: int) -> None:
        self.status = resp.status
        self.headers: Mapping[str, str] = resp.headers
        self._resp = resp
        self._limit = limit  # the most ``read()`` takes
        self._waits = 0  # times a stream's read found nothing yet (``direct``)
        forget_request_headers(resp)  # under aiohttp.lean_request_info

    async def read(self) -> bytes:
        """The whole body, of at most ``limit`` bytes (decompressed: a compressed bomb stops
        there too); a larger one fails as soon as it is known to be larger (its
        Content-Length, else the read that passes the limit), and what was read goes."""
        resp, limit = self._resp, self._limit
        length = resp.content_length
        if length is not None and length > limit and not resp.headers.get("content-encoding"):
            raise too_large(limit)
        parts: list[bytes] = []
        size = 0
        try:
            while part := await resp.content.readany():
                size += len(part)
                if size > limit:
                    raise too_large(limit)
                parts.append(part)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise read_error(exc) from None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def chunk(self) -> Awaitable[bytes]:
        """The next piece of the body as the socket delivered it; b"" at its end. aiohttp's
        own read, awaited by the stream loop itself (no coroutine of this one's between them
        for as long as a stream waits): its failures are ``READ_FAILURES``, which the loop
        makes gateway errors with ``read_error``."""
        return self._resp.content.readany()

    def at_eof(self) -> bool:
        """The body was read to its end."""
        return self._resp.content.at_eof()

    def direct(self) -> DirectReads | None:
        """The body's reads relayed inside the socket's callback (``direct_reads``), where
        they can be, from the second time a read would wait on: a stream that came whole,
        or all but its first chunk at once, is read the usual way (cheaper for a few reads
        than putting the direct reads in place)."""
        if not reads_wait(self._resp.content):
            return None
        self._waits += 1
        return direct_reads(self._resp) if self._waits > 1 else None

    def close(self) -> None:
        """Let go of the connection: back to the pool when the body was read to its end,
        else closed (an upstream still sending is stopped). A body read to its end gave its
        connection back as its last bytes came (aiohttp's ``connection`` is None then):
        nothing is left to let go, and ``ClientResponse.close`` is not called, which would
        fail the finished body's reader for later reads (asyncio's ``isfuture`` raising and
        clearing an AttributeError on the way, ~2k instructions a call)."""
        resp = self._resp
        if resp.connection is None and resp.content.at_eof():
            return
        resp.close()


def too_large(limit: int) -> GatewayError:
    """A whole reply past ``limits.max_response_bytes``: a bad reply, as one that is not
    JSON (another channel is tried while nothing reached the client)."""
    return UpstreamError(
        f"the upstream's reply is larger than limits.max_response_bytes ({limit} bytes)"
    )


# what aiohttp's reads of a body raise (``UpstreamResponse.chunk``'s awaitable)
READ_FAILURES: tuple[type[BaseException], ...] = (aiohttp.ClientError, TimeoutError)


def read_error(exc: BaseException) -> GatewayError:
    """The gateway error for a failure while reading an upstream body or stream."""
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return UpstreamTimeoutError("the upstream stopped sending", retryable=False)
    return UpstreamError(f"the upstream connection failed: {type(exc).__name__}", retryable=False)
