"""The upstream side: what the relay needs of an upstream (``UpstreamPool``, ``UpstreamReply``)
and the aiohttp pool that provides it (``pool``), the one place aiohttp errors become gateway
errors; per channel type, what signs or authorises a call (``auth``, over ``sigv4`` and
``google_token``), and the framing of AWS's streams (``eventstream``). Tests hand the app a
scripted pool instead (``create_app(upstream=...)``), which ``auth`` wraps as it wraps the
aiohttp one."""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Mapping
from typing import TYPE_CHECKING, Protocol

from gateway.config import Channel, ChannelTimeouts
from gateway.protocols.base import UpstreamCall

if TYPE_CHECKING:
    from gateway.upstream.direct_reads import DirectReads


class UpstreamReply(Protocol):
    """An upstream's reply whose status and headers arrived; its reads raise only
    ``GatewayError`` (a failure after the status is never retried elsewhere), but for
    ``chunk``'s, which may raise ``pool.READ_FAILURES`` too (``pool.read_error`` says which
    gateway error each is)."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    async def read(self) -> bytes:
        """The whole body."""
        ...

    def chunk(self) -> Awaitable[bytes]:
        """The next piece of the body as it arrived; b"" at its end."""
        ...

    def at_eof(self) -> bool: ...
    def direct(self) -> DirectReads | None:
        """The reads relayed inside the socket's callback from here on (``direct_reads``), or
        None to read the usual way."""
        ...

    def close(self) -> None: ...


class UpstreamPool(Protocol):
    """Sends upstream calls; raises only ``GatewayError``. A call sent with its ``channel``
    gets that channel's credentials first where a header written by the adapter is not
    enough (a signature, an access token: ``auth.ChannelAuths``, the pool the app hands out)."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def request(
        self,
        call: UpstreamCall,
        upload: AsyncIterable[bytes] | None = None,
        timeouts: ChannelTimeouts | None = None,
        channel: Channel | None = None,
    ) -> UpstreamReply: ...
