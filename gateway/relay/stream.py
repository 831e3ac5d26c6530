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

An upstream that withholds its status line sends nothing the gateway could pass on, and the
client would get nothing at all: no headers, so no keep-alive either. A stream whose client
has waited ``commit`` seconds while its attempt still awaits the upstream's status is
*committed* by the timer: its response starts (status 200, headers, one keep-alive) and it
gets keep-alives from then on. A committed stream can no longer go to another channel: a
later failure of its upstream is sent inside it, in the client's protocol.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from types import CoroutineType
from typing import Any, Protocol

from gateway.edge.interrupt import UPSTREAM_QUIET, Interrupt
from gateway.errors import GatewayError
from gateway.policy.redaction import channel_secrets, redact_error
from gateway.policy.spend import Meter
from gateway.protocols.base import RelayStream
from gateway.server.body_writers import body_writer
from gateway.types import Send
from gateway.upstream import UpstreamReply
from gateway.upstream.direct_reads import DirectReads
from gateway.upstream.pool import READ_FAILURES, read_error

# a reverse proxy in front (nginx) must not buffer a stream
STREAM_HEADERS = [(b"x-accel-buffering", b"no")]


def stream_start(content_type: str, request_id: bytes) -> dict[str, Any]:
    """A stream's ``http.response.start``."""
    return {
        "type": "http.response.start",
        "status": 200,
        "headers": [
            (b"content-type", content_type.encode()),
            (b"x-request-id", request_id),
            *STREAM_HEADERS,
        ],
    }


class Responding(Protocol):
    """The request's record as a stream sees it (``relay.call.Call``)."""

    responded: bool  # the response's status line went out
    reply_id: str  # its x-request-id


class Streaming(Protocol):
    """The attempt under way, as a commit needs it (``kinds.base.Exchange``): the stream it
    would make, for its content type."""

    def stream(self, headers: Mapping[str, str]) -> RelayStream: ...


class Quiet:
    """One open stream as the keep-alive timer sees it."""

    __slots__ = ("send", "data", "interrupt", "last", "sending", "ping", "done", "waiting",
                 "began", "opening", "started", "call", "exchange")  # fmt: skip

    def __init__(
        self, send: Send, data: bytes, interrupt: Interrupt | None, call: Responding
    ) -> None:
        self.send = send
        self.data = data  # the protocol's keep-alive
        # the request's, fired when its first output is long in coming (``UPSTREAM_QUIET``)
        self.interrupt = interrupt
        self.last = self.began = time.monotonic()  # when the client was last sent something
        self.sending = False  # the stream's own send is under way
        self.ping: asyncio.Task[None] | None = None  # a keep-alive (or the commit) under way
        self.done = False  # the stream sent its last bytes: nothing more may follow
        self.waiting = False  # for the upstream's first output: no response started yet
        self.opening = False  # its attempt awaits the upstream's status line
        self.started = False  # its response started (the stream's own, or committed)
        self.call = call
        self.exchange: Streaming | None = None  # the attempt under way

    def wait(self) -> None:
        """The first output is awaited from here on."""
        self.waiting = True
        self.last = time.monotonic()

    def stop_waiting(self) -> None:
        self.waiting = False
        self.last = time.monotonic()  # no keep-alive before the response has started


class KeepAlive:
    """Keeps every open stream of the process alive with one timer, ticking a quarter of
    ``interval`` (or of ``commit``, if less) while any is open: a stream quiet for
    ``interval`` seconds gets its protocol's keep-alive; one still waiting for its upstream's
    first output that long is woken to start its response quiet (and get keep-alives from
    then on); one whose upstream has not sent its status line ``commit`` seconds after the
    stream opened is committed (module docstring; 0: never)."""

    __slots__ = ("interval", "commit", "_tick_every", "_open", "_timer")

    def __init__(self, interval: float, commit: float = 0.0) -> None:
        self.interval = interval
        self.commit = commit
        self._tick_every = min(interval, commit or interval) / 4
        self._open: set[Quiet] = set()
        self._timer: asyncio.TimerHandle | None = None

    def open(self, send: Send, data: bytes, interrupt: Interrupt, call: Responding) -> Quiet | None:
        if not data:
            return None  # a stream without keep-alives (binary audio)
        quiet = Quiet(send, data, interrupt, call)
        self._open.add(quiet)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._tick_every, self._tick)
        return quiet

    def close(self, quiet: Quiet | None) -> None:
        """The request is over: nothing more is sent for it."""
        if quiet is not None:
            quiet.done = True
            quiet.interrupt = None
            quiet.exchange = None
            self._open.discard(quiet)

    def _tick(self) -> None:
        self._timer = None
        now = time.monotonic()
        commit = self.commit
        for quiet in self._open:
            if not quiet.started:
                if quiet.opening:  # no status line yet: nothing to keep alive but by a commit
                    if commit and now - quiet.began >= commit and quiet.exchange is not None:
                        # from here on the stream is answered: the request knows at once
                        quiet.started = quiet.call.responded = True
                        quiet.ping = asyncio.create_task(self._ping(quiet, True))
                    continue
                if not quiet.waiting:
                    continue  # between attempts, or its response about to start
            if now - quiet.last < self.interval:
                continue
            if quiet.waiting:
                if quiet.interrupt is not None:
                    quiet.interrupt.fire(UPSTREAM_QUIET)
            elif not quiet.sending and quiet.ping is None:
                quiet.ping = asyncio.create_task(self._ping(quiet))
        if self._open:
            self._timer = asyncio.get_running_loop().call_later(self._tick_every, self._tick)

    @staticmethod
    async def _ping(quiet: Quiet, commit: bool = False) -> None:
        """One keep-alive; ``commit``: the response's start before it, which goes out even if
        the stream's last bytes are already waiting (``send_last`` awaits this), unless the
        request is over (``close``)."""
        try:
            if commit:
                exchange = quiet.exchange
                if exchange is None:
                    return
                content_type = exchange.stream({}).content_type
                await quiet.send(stream_start(content_type, quiet.call.reply_id.encode()))
            if not quiet.done:
                await quiet.send(
                    {"type": "http.response.body", "body": quiet.data, "more_body": True}
                )
        except OSError:
            pass  # the client is gone: the stream's own send will find out
        finally:
            quiet.last = time.monotonic()
            quiet.ping = None


async def send_last(send: Send, quiet: Quiet | None, body: bytes) -> None:
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
    first: bytes  # the stream's first output for the client, read already (``pump`` empties it)
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
    meter: Meter | None = None,
) -> GatewayError | None:
    """Relay the upstream's stream to the client through ``opened.stream``, whose first
    output was read already; ``settle(status)`` is called once, and what it returns awaited,
    before the last bytes are sent. Returns the error that ended the stream early (already
    sent to the client in its protocol's form), or None. ``quiet``: the stream's entry in the
    keep-alive timer, if it has one; ``request_id`` goes out as ``x-request-id``; ``meter``:
    what the stream's account can pay, looked at after each read (``policy.spend``: past it,
    the stream ends with a 402 inside it)."""
    resp, stream, failure, ended = opened.resp, opened.stream, opened.failure, opened.ended
    assert stream is not None
    if quiet is None:
        await send(stream_start(stream.content_type, request_id))
    elif not quiet.started:  # else committed: started by the timer (its send awaited below)
        await send(stream_start(stream.content_type, request_id))
        quiet.started = True  # keep-alives may follow from here on
    out = opened.first  # converted, not yet sent: the last read's goes out with the end
    opened.first = b""  # held here alone: not for as long as the stream lasts
    relaying: Relaying | None = None
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
                del message  # sent: not held (nor its body) while the next read waits
            if relaying is None and (direct := resp.direct()) is not None:
                relaying = Relaying(direct, stream, send, quiet, meter)
            if relaying is not None and (done := relaying.start()) is not None:
                out = await relaying.stopped(done)  # a read that must go the usual way
                continue
            try:
                raw = await resp.chunk()
            except READ_FAILURES as exc:
                raise read_error(exc) from None
            if not raw:
                out += stream.finish()
                break
            out += stream.feed(raw)
            if meter is not None and meter.over(stream):
                raise meter.exceeded()
    except GatewayError as err:
        if relaying is not None:  # a read's output that the direct reads left
            out = relaying.take() + out
        durable = settle(err.status)
        if durable is not None:
            await durable
        tail = b""  # in ``first`` already, or sent now without the channel's credentials
        if err is not failure:
            tail = stream.error(redact_error(err, channel_secrets(opened.channel)))
        await send_last(send, quiet, out + tail)
        return err
    finally:
        if relaying is not None:
            relaying.direct.release()
    durable = settle(200)
    if durable is not None:
        await durable
    await send_last(send, quiet, out)
    return None


class Relaying:
    """A stream's reads converted inside the upstream socket's callback
    (``upstream.direct_reads``) and sent at the end of the event loop's turn (``Outbox``):
    no task wakes for a read. ``on_read`` stops the direct reads (returns False) where the
    stream's task must act: a keep-alive being sent (the read's output waits in ``out``) or
    the account's limit passed (``over``, the read's output in ``out``); a send that has to
    wait (carried on in ``sending``) stops them too."""

    __slots__ = ("direct", "stream", "send", "write", "quiet", "meter", "outbox", "queued",
                 "out", "sending", "over", "failed")  # fmt: skip

    def __init__(
        self,
        direct: DirectReads,
        stream: RelayStream,
        send: Send,
        quiet: Quiet | None,
        meter: Meter | None,
    ) -> None:
        self.direct = direct
        self.stream = stream
        self.send = send
        # the server's writer of a body chunk, past ``send`` (None: the server has none)
        self.write = body_writer(send)
        self.quiet = quiet
        self.meter = meter
        self.outbox = outbox(asyncio.get_running_loop())
        self.queued = b""  # converted in this turn of the loop, sent at its end
        self.out = b""  # left to the stream's task, after ``queued``
        self.sending: asyncio.Future[None] | None = None
        self.over = False
        self.failed: BaseException | None = None  # what a send at the turn's end raised

    def start(self) -> asyncio.Future[None] | None:
        """The reads relayed directly from here on, until the future completes; None when a
        read would not wait (``DirectReads.relay``)."""
        return self.direct.relay(self.on_read)

    def take(self) -> bytes:
        """The output converted and not yet sent, in order; this stream's to send now."""
        out, self.queued, self.out = self.queued + self.out, b"", b""
        return out

    async def stopped(self, done: asyncio.Future[None]) -> bytes:
        """Awaits the direct reads' end and what they left to the stream's task: a send to
        finish, the account's limit; returns the output not yet sent. Raises what a read or
        a send raised (a failure of the upstream's as ``read_error``'s, as the usual read
        does: the channel's total timeout while the reads were direct)."""
        try:
            await self.direct.wait(done)
        except READ_FAILURES as exc:
            raise read_error(exc) from None
        if self.over and self.meter is not None:
            raise self.meter.exceeded()  # ``take()`` goes before the error (``pump``)
        if self.failed is not None:
            failed, self.failed = self.failed, None
            raise failed
        if self.sending is not None:
            quiet = self.quiet
            try:
                await self.sending
            finally:
                self.sending = None
                if quiet is not None:
                    quiet.sending = False
                    quiet.last = time.monotonic()
        return self.take()

    def on_read(self, raw: bytes) -> bool:
        stream = self.stream
        out = stream.feed(raw)
        meter = self.meter
        if meter is not None and meter.over(stream):
            self.out, self.over = out, True
            return False
        if not out:
            return True
        quiet = self.quiet
        if quiet is not None and quiet.ping is not None:
            self.out = out
            return False
        if self.queued:
            self.queued += out
        else:
            self.queued = out
            self.outbox.post(self)
        return True

    def flush(self) -> None:
        """What this turn's reads gave, sent (the ``Outbox``'s call): by the server's writer
        where it has one and can, else its ``send`` driven by hand, as most finish without
        waiting and so need no task (a coroutine, as uvicorn's and hypercorn's sends are, is
        stepped without its wrapper). A send that waits (a client reading slowly) goes on in
        a task, and the direct reads stop: the stream's task awaits it before anything else
        goes out. One that fails stops them too, and the stream's task raises its error."""
        out, self.queued = self.queued, b""
        if not out:
            return  # taken by the stream's task already
        quiet = self.quiet
        if quiet is not None and quiet.ping is not None:  # a keep-alive under way
            self.out = out + self.out
            self.direct.stop()
            return
        try:
            write = self.write
            if write is not None and write(out):  # written as the server's send would
                if quiet is not None:
                    quiet.last = time.monotonic()
                return
            sending = self.send({"type": "http.response.body", "body": out, "more_body": True})
            steps = sending if type(sending) is CoroutineType else sending.__await__()
            waiting = _step(steps)
        except StopIteration:
            if quiet is not None:
                quiet.last = time.monotonic()
            return
        except Exception as exc:  # noqa: BLE001 - the stream's task raises it (``stopped``)
            self.failed = exc
            self.direct.stop()
            return
        self.sending = asyncio.ensure_future(_carry_on(steps, waiting))
        if quiet is not None:
            quiet.sending = True
        self.direct.stop()


class Outbox:
    """The sends of the streams whose reads are direct, made at the end of the event loop's
    turn in which their reads came, one after the other. A write to a client that sleeps
    wakes it, and a local client (a load balancer on the same machine, the bench's) wakes
    once for a turn's writes instead of once for each (bench/RESULTS.md, "The paced
    stream"); a read's output waits for no more than the turn's other callbacks."""

    __slots__ = ("_loop", "_posted")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._posted: list[Relaying] = []

    def post(self, relaying: Relaying) -> None:
        if not self._posted:
            self._loop.call_soon(self._flush)
        self._posted.append(relaying)

    def _flush(self) -> None:
        posted, self._posted = self._posted, []
        for relaying in posted:
            relaying.flush()


_OUTBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Outbox] = (
    weakref.WeakKeyDictionary()
)


def outbox(loop: asyncio.AbstractEventLoop) -> Outbox:
    """The event loop's ``Outbox`` (one a loop)."""
    box = _OUTBOXES.get(loop)
    if box is None:
        box = _OUTBOXES[loop] = Outbox(loop)
    return box


def _step(steps: Iterator[Any] | Coroutine[Any, Any, Any]) -> Any:
    """One step of an awaitable driven by hand: a coroutine's ``send``, or the next of the
    iterator another awaitable's ``__await__`` gave (granian's sends are such: an iterator
    with no ``send``)."""
    if type(steps) is CoroutineType:
        return steps.send(None)
    return next(steps)  # type: ignore[arg-type]


async def _carry_on(steps: Iterator[Any] | Coroutine[Any, Any, Any], waiting: Any) -> None:
    """An awaitable that suspended outside any task (on ``waiting``, its steps driven by
    hand), run to its end in this one. What ``waiting`` ends with, the awaitable reads from it
    itself when resumed."""
    while True:
        try:
            if waiting is None:  # a bare yield (``asyncio.sleep(0)``)
                await asyncio.sleep(0)
            else:  # a future, marked as yielded to a task: a task takes the mark off first
                waiting._asyncio_future_blocking = False
                await waiting
        except BaseException:  # noqa: BLE001,S110 - the coroutine gets it from ``waiting``
            pass
        try:
            waiting = _step(steps)
        except StopIteration:
            return
