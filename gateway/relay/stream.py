"""The one stream loop: upstream chunks -> a ``RelayStream`` -> ``send``, and the keep-alives
of quiet streams.

One loop in the request's task, no queue, no read-ahead: a slow client blocks ``send``, the
loop stops reading, and aiohttp pauses the upstream socket. The stream's last read goes out
with the end of the response (one send less per stream). The request is settled (billed and
recorded) before the last bytes leave, so a client that reads its balance right after the
stream ends sees the cost; a failure after the stream started is sent inside it, in the
client protocol's form, after what was converted before it.

A stream that has sent its client nothing for ``interval`` seconds (an upstream thinking)
gets its protocol's keep-alive (an SSE comment, the messages protocol's ``ping`` event), so a
load balancer's idle timeout does not cut it. One timer looks at every open stream
(``KeepAlive``); a stream pays a clock read per send, and no timer of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from gateway.edge.interrupt import UPSTREAM_QUIET, Interrupt
from gateway.errors import GatewayError
from gateway.policy.redaction import channel_secrets, redact_error
from gateway.protocols.base import RelayStream
from gateway.types import Send
from gateway.upstream import UpstreamReply

# a reverse proxy in front (nginx) must not buffer a stream
STREAM_HEADERS = [(b"x-accel-buffering", b"no")]


class Quiet:
    """One open stream as the keep-alive timer sees it."""

    __slots__ = ("send", "data", "interrupt", "last", "sending", "ping", "done", "waiting")

    def __init__(self, send: Send, data: bytes, interrupt: Interrupt | None) -> None:
        self.send = send
        self.data = data  # the protocol's keep-alive
        # the request's, fired when its first output is long in coming (``UPSTREAM_QUIET``)
        self.interrupt = interrupt
        self.last = time.monotonic()  # when the client was last sent something
        self.sending = False  # the stream's own send is under way
        self.ping: asyncio.Task[None] | None = None  # a keep-alive under way
        self.done = False  # the stream sent its last bytes: nothing more may follow
        self.waiting = False  # for the upstream's first output: no response started yet

    def wait(self) -> None:
        """The first output is awaited from here on."""
        self.waiting = True
        self.last = time.monotonic()

    def stop_waiting(self) -> None:
        self.waiting = False
        self.last = time.monotonic()  # no keep-alive before the response has started


class KeepAlive:
    """Keeps every open stream of the process alive with one timer, ticking a quarter of
    ``interval`` while any is open: a stream quiet for ``interval`` seconds gets its
    protocol's keep-alive; one still waiting for its upstream's first output that long is
    woken to start its response quiet (and get keep-alives from then on)."""

    __slots__ = ("interval", "_open", "_timer")

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._open: set[Quiet] = set()
        self._timer: asyncio.TimerHandle | None = None

    def open(self, send: Send, data: bytes, interrupt: Interrupt) -> Quiet | None:
        if not data:
            return None  # a stream without keep-alives (binary audio)
        quiet = Quiet(send, data, interrupt)
        self._open.add(quiet)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.interval / 4, self._tick)
        return quiet

    def close(self, quiet: Quiet | None) -> None:
        if quiet is not None:
            quiet.done = True
            quiet.interrupt = None
            self._open.discard(quiet)

    def _tick(self) -> None:
        self._timer = None
        now = time.monotonic()
        for quiet in self._open:
            if now - quiet.last < self.interval:
                continue
            if quiet.waiting:
                if quiet.interrupt is not None:
                    quiet.interrupt.fire(UPSTREAM_QUIET)
            elif not quiet.sending and quiet.ping is None:
                quiet.ping = asyncio.create_task(self._ping(quiet))
        if self._open:
            self._timer = asyncio.get_running_loop().call_later(self.interval / 4, self._tick)

    @staticmethod
    async def _ping(quiet: Quiet) -> None:
        try:
            if not quiet.done:
                await quiet.send(
                    {"type": "http.response.body", "body": quiet.data, "more_body": True}
                )
        except OSError:
            pass  # the client is gone: the stream's own send will find out
        finally:
            quiet.last = time.monotonic()
            quiet.ping = None


async def _send_last(send: Send, quiet: Quiet | None, body: bytes) -> None:
    """The stream's last send: no keep-alive may follow it, nor run beside it."""
    if quiet is not None:
        quiet.done = True
        if quiet.ping is not None:
            await quiet.ping
    await send({"type": "http.response.body", "body": body, "more_body": False})


class Opened(Protocol):
    """An attempt that answered with a stream (``relay.attempt.Answer``)."""

    resp: UpstreamReply
    stream: RelayStream | None
    first: bytes  # the stream's first output for the client, read already
    ended: bool  # the stream ended with it
    failure: GatewayError | None  # the error it ended with, in ``first``

    @property
    def channel(self) -> object:
        """The channel, whose credentials an error's message may not hold."""
        ...


async def pump(
    opened: Opened,
    send: Send,
    settle: Callable[[int], Awaitable[None] | None],
    quiet: Quiet | None = None,
    request_id: bytes = b"",
) -> GatewayError | None:
    """Relay the upstream's stream to the client through ``opened.stream``, whose first
    output was read already; ``settle(status)`` is called once, and what it returns awaited,
    before the last bytes are sent. Returns the error that ended the stream early (already
    sent to the client in its protocol's form), or None. ``quiet``: the stream's entry in the
    keep-alive timer, if it has one; ``request_id`` goes out as ``x-request-id``."""
    resp, stream, failure, ended = opened.resp, opened.stream, opened.failure, opened.ended
    assert stream is not None
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", stream.content_type.encode()),
                (b"x-request-id", request_id),
                *STREAM_HEADERS,
            ],
        }
    )
    out = opened.first  # converted, not yet sent: the last read's goes out with the end
    try:
        if failure is not None:
            raise failure
        while not ended:
            if out and not resp.at_eof():
                # never at once with a keep-alive; written out here, not in a helper: one
                # coroutine less for every chunk of every stream
                message = {"type": "http.response.body", "body": out, "more_body": True}
                out = b""
                if quiet is None:
                    await send(message)
                else:
                    if quiet.ping is not None:
                        await quiet.ping
                    quiet.sending = True
                    try:
                        await send(message)
                    finally:
                        quiet.sending = False
                        quiet.last = time.monotonic()
            raw = await resp.chunk()
            if not raw:
                out += stream.finish()
                break
            out += stream.feed(raw)
    except GatewayError as err:
        durable = settle(err.status)
        if durable is not None:
            await durable
        tail = b""  # in ``first`` already, or sent now without the channel's credentials
        if err is not failure:
            tail = stream.error(redact_error(err, channel_secrets(opened.channel)))
        await _send_last(send, quiet, out + tail)
        return err
    durable = settle(200)
    if durable is not None:
        await durable
    await _send_last(send, quiet, out)
    return None
