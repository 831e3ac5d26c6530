"""A stream's reads handed to the relay inside the upstream socket's own callback.

Read the usual way, each read of a stream wakes the request's task: aiohttp's protocol feeds
the body's ``StreamReader``, which completes a future, which schedules the task, which runs in
the event loop's next turn, resumes ``readany`` and its ``_wait``, and makes a new future for
the read after. For a paced stream (a chunk every few tens of milliseconds, each its own read)
that is most of what the gateway itself spends on a chunk.

``DirectReads`` takes the turn out: while it is on, each piece of the body that aiohttp's
parser feeds the reader (within the connection's ``data_received``) goes to ``on_read`` as it
is fed, which converts it and hands it to be sent. The reader's class is made, for the stream,
a subclass of aiohttp's whose ``feed_data`` does this and whose ``end_http_chunk_receiving``
marks nothing: nothing goes through the reader's buffer, so there are no chunk marks to drop,
no ``_read_nowait``, and none of the ``resume_reading`` aiohttp makes after every read (which
parses the empty read again through ``data_received``). ``on_read`` returns False to stop (a
keep-alive under way, the account's limit): the awaitable ``relay`` returned then completes
and the stream goes on the usual way, as it does after ``stop`` (a send that has to wait). It
completes too when the body ends or fails (EOF, a read timeout, the connection lost), leaving
the end to the usual read; and raises what ``on_read`` raised.

How, and why it is safe: the reader's ``_waiter`` (the future ``_wait`` parks on) is set to a
stand-in, which is how the reader's ``feed_data`` knows the direct reads are on, and whose
``set_result``/``set_exception`` stop them: an end or a failure fed to the reader
(``feed_eof``, ``set_exception``, from the parser, ``connection_lost`` or aiohttp's read timer)
completes its waiter. Once they are off, a feed goes to the buffer as aiohttp's does. The
reader's counts (``total_bytes``, ``_cursor``) move as if each piece had been fed and read at
once, so a stop leaves it as the usual reads would have. ``release`` puts the reader's class
back, once per stream. aiohttp 3.14's ``StreamReader`` (its slots, and ``feed_data`` and
``end_http_chunk_receiving`` as what its parser calls) is what this relies on: a mend,
``aiohttp.direct_reads``, of kind ``speed`` (a ``gateway.server.mends.Mend``: checked when the
pool starts; where aiohttp differs, it is left out with a warning and reads go the usual
way). A channel's total timeout (aiohttp's timer of the whole body) stops a stream whose reads
are direct at its deadline, as it stops a read that waits (``wait``).

The read timeout (``sock_read``: the longest silence of an upstream) is the other cost of a
read: aiohttp cancels a timer and makes a new one at each (in uvloop, a libuv handle made and
closed). While the reads are direct it is this module's: one timer, which when it fires looks
at when the last read came and is set again from there, or calls aiohttp's own
``_on_read_timeout`` (the body's read then raises aiohttp's timeout, as before); when the
direct reads stop with the body going on, aiohttp's timer is set again (unless reading is
paused: aiohttp sets it when reading resumes). Measured by callgrind on a paced stream (100
reads a stream, 8 streams): 82.0k -> 76.4k instructions a read; the pieces taken as they are
fed, bench/RESULTS.md ("The paced stream").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from gateway.server.mends import Mend, Needs, module_flag

OnRead = Callable[[bytes], bool]
_NAME = "aiohttp.direct_reads"
_READER = "aiohttp.streams.StreamReader"
_on = False  # the mend is in place


def _check() -> list[str]:
    needs = Needs()
    streams = needs.module("aiohttp.streams")
    reader = needs.attr(streams, "StreamReader", "aiohttp.streams")
    if reader is not None:
        slots = set(getattr(reader, "__slots__", ()))
        for name in ("_buffer", "_eof", "_exception", "_waiter", "_timer", "_cursor",
                     "total_bytes"):  # fmt: skip
            needs.require(name in slots, f"{_READER} has no slot {name}")
        # what its parser calls: taken by the reader's subclass while the reads are direct
        needs.function(reader, "feed_data", _READER, ("self", "data", "size"), coroutine=False)
        needs.function(reader, "end_http_chunk_receiving", _READER, ("self",), coroutine=False)
        # what ends or fails a body completes its waiter (the stand-in's methods)
        for name in ("feed_eof", "set_exception"):
            needs.uses(getattr(reader, name, None), ["_waiter"], f"{_READER}.{name}")
        needs.require(_fits_subclass(reader), f"{_READER}'s instances cannot change class")
    helpers = needs.module("aiohttp.helpers")
    needs.uses(needs.attr(helpers, "set_result", "aiohttp.helpers"), ["done", "set_result"],
               "aiohttp.helpers.set_result")  # fmt: skip
    needs.uses(needs.attr(helpers, "set_exception", "aiohttp.helpers"), ["set_exception"],
               "aiohttp.helpers.set_exception")  # fmt: skip
    for name in ("TimerContext", "TimerNoop"):  # the body's total timeout (``wait``)
        timer = needs.attr(helpers, name, "aiohttp.helpers")
        needs.attr(timer, "__enter__", f"aiohttp.helpers.{name}")
    proto = needs.module("aiohttp.client_proto")
    handler = needs.attr(proto, "ResponseHandler", "aiohttp.client_proto")
    if handler is not None:
        where = "aiohttp.client_proto.ResponseHandler"
        # its read timeout, which the direct reads keep while on: set anew at each read
        timeout = vars(handler).get("read_timeout")
        needs.require(
            isinstance(timeout, property) and timeout.fset is not None,
            f"{where}.read_timeout is not a property that can be set",
        )
        for name in ("_drop_timeout", "_reschedule_timeout", "_on_read_timeout"):
            needs.function(handler, name, where, ("self",), coroutine=False)
        needs.uses(getattr(handler, "data_received", None), ["_reschedule_timeout"],
                   f"{where}.data_received")  # fmt: skip
    base = needs.module("aiohttp.base_protocol")
    protocol = needs.attr(base, "BaseProtocol", "aiohttp.base_protocol")
    if protocol is not None:
        slots = set(getattr(protocol, "__slots__", ()))
        for name in ("_reading_paused", "_buffer_paused"):
            needs.require(name in slots, f"aiohttp.base_protocol.BaseProtocol has no slot {name}")
    return needs.missing


def _fits_subclass(reader: Any) -> bool:
    """Whether an instance of ``reader`` can be made an instance of its subclass of
    ``_taking`` and back (the same layout: no slot of its own, no ``__dict__``)."""
    try:
        sub = _taking(reader)
        probe = object.__new__(reader)
        probe.__class__ = sub
        probe.__class__ = reader
    except TypeError:
        return False
    return True


_apply, _in_place = module_flag(__name__)  # sets and reads _on


DIRECT_READS = Mend(
    name=_NAME,
    library="aiohttp",
    written_for="3.14",
    kind="speed",
    fixes="each read of a stream wakes its task, in one more turn of the event loop",
    check=_check,
    apply=_apply,
    in_place=_in_place,
)
MENDS = (DIRECT_READS,)


class _Waiter:
    """Stands in for the future a read parks on while the reads are direct: the reader's
    ``feed_data`` hands what it is fed to ``on_read`` (``_taking``), and an end or a failure
    fed to the reader stops the relay."""

    __slots__ = ("reads",)

    def __init__(self, reads: DirectReads) -> None:
        self.reads = reads

    def done(self) -> bool:
        return False

    def set_result(self, _result: object) -> None:
        self.reads._fed()

    def set_exception(self, _exc: BaseException, _cause: object = None) -> None:
        self.reads._fed()

    def cancel(self) -> bool:
        return False


_SUBCLASSES: dict[Any, Any] = {}


def _taking(reader: Any) -> Any:
    """``reader``'s subclass (made once) whose instances, while their reads are direct, hand
    each piece their parser feeds them to ``on_read``, past the buffer, and mark no chunk
    ends (nothing is read from the buffer to drop them)."""
    sub = _SUBCLASSES.get(reader)
    if sub is not None:
        return sub
    if reader in _SUBCLASSES.values():  # one of these already
        return reader
    feed, end_chunk = reader.feed_data, reader.end_http_chunk_receiving

    def feed_data(self: Any, data: bytes, size: int = 0) -> bool:
        waiter = self._waiter
        if type(waiter) is not _Waiter:
            return feed(self, data, size)  # type: ignore[no-any-return]
        if data:
            waiter.reads._take(self, data)
        return False

    def end_http_chunk_receiving(self: Any) -> None:
        if type(self._waiter) is not _Waiter:
            end_chunk(self)

    sub = _SUBCLASSES[reader] = type(
        reader.__name__,
        (reader,),
        {"__slots__": (), "__module__": __name__, "feed_data": feed_data,
         "end_http_chunk_receiving": end_http_chunk_receiving},
    )  # fmt: skip
    return sub


class DirectReads:
    """One stream's reads, relayed inside its connection's callback while on (module
    docstring). Made by ``direct_reads``; ``release`` once the stream is over."""

    __slots__ = ("_reader", "_class", "_proto", "_on_read", "_done", "_waiter", "_timeout",
                 "_timer", "_last", "_clock")  # fmt: skip

    def __init__(self, reader: Any, proto: Any) -> None:
        self._reader = reader
        self._class = type(reader)
        self._proto = proto
        self._on_read: OnRead | None = None
        self._done: asyncio.Future[None] | None = None
        self._waiter = _Waiter(self)
        self._timeout = 0.0  # aiohttp's read timeout, kept here while the reads are direct
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0  # when the last read came (the loop's clock)
        self._clock: Callable[[], float] = time.monotonic
        reader.__class__ = _taking(self._class)

    def relay(self, on_read: OnRead) -> asyncio.Future[None] | None:
        """Hand each piece read to ``on_read`` until it returns False, ``stop`` is called or
        the body ends or fails; None (nothing started) when a read is waiting already or the
        body has ended."""
        reader = self._reader
        if not reads_wait(reader) or reader._waiter is not None or self._on_read is not None:
            return None
        self._on_read = on_read
        loop = asyncio.get_running_loop()
        done = self._done = loop.create_future()
        reader._waiter = self._waiter
        proto = self._proto
        timeout = proto.read_timeout
        if timeout:  # aiohttp's timer, set anew at every read, is this one's while on
            proto._drop_timeout()
            proto.read_timeout = None
            self._timeout = timeout
            self._clock = loop.time
            self._last = loop.time()
            self._timer = loop.call_at(self._last + timeout, self._quiet_too_long)
        return done

    def stop(self) -> None:
        """The direct reads end here (outside the connection's callback), the body going on:
        its next read goes the usual way."""
        if self._on_read is not None:
            self._stop(None, timing=True)

    async def wait(self, done: asyncio.Future[None]) -> None:
        """Awaits ``done`` (``relay``'s) within the body's total timeout, as a read that
        waits does: at its deadline aiohttp's timer cancels the stream's task, and this raises
        ``asyncio.TimeoutError``."""
        with self._reader._timer:
            await done

    def release(self) -> None:
        """The stream is over: the reader as it was."""
        self._stop(None)
        self._reader.__class__ = self._class

    def _take(self, reader: Any, data: bytes) -> None:
        """A piece the parser fed the reader, to ``on_read``; counted as fed and read at once,
        so that a stop leaves the reader as the usual reads would have."""
        done = self._done
        if done is not None and done.cancelled():  # the stream's task was stopped: no more
            self._stop(None)
            return
        size = len(data)
        reader.total_bytes += size
        reader._cursor += size
        if self._timeout:
            self._last = self._clock()
        try:
            go_on = self._on_read(data)  # type: ignore[misc]
        except BaseException as exc:  # to the stream's task, which raises it
            self._stop(exc)
            return
        if not go_on:
            self._stop(None, timing=True)  # the body goes on: aiohttp's timer with it

    def _fed(self) -> None:
        """An end or a failure completed the waiter (aiohttp took it off the reader)."""
        self._stop(None)

    def _quiet_too_long(self) -> None:
        """The read timeout: the upstream has said nothing for its length since the last
        read (one timer a direct phase, set again from that read when it fires early, where
        aiohttp sets one anew at every read)."""
        self._timer = None
        if self._on_read is None:
            return
        due = self._last + self._timeout
        if due > self._clock():
            self._timer = asyncio.get_running_loop().call_at(due, self._quiet_too_long)
            return
        proto = self._proto
        self._stop(None)
        proto._on_read_timeout()  # aiohttp's own: the body's next read raises its timeout

    def _stop(self, exc: BaseException | None, timing: bool = False) -> None:
        """The direct reads end (``exc``: what the stream's task raises). aiohttp's read
        timeout is its own again; ``timing``: the body goes on, and its timer is set from
        now, unless reading is paused (a slow client: aiohttp sets it when reading resumes)."""
        self._on_read = None
        reader = self._reader
        if reader._waiter is self._waiter:
            reader._waiter = None
        if self._timeout:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            proto = self._proto
            proto.read_timeout, self._timeout = self._timeout, 0.0
            if timing and not proto._reading_paused and not proto._buffer_paused:
                proto._reschedule_timeout()
        done, self._done = self._done, None
        if done is not None and not done.done():
            if exc is None:
                done.set_result(None)
            else:
                done.set_exception(exc)


def reads_wait(reader: Any) -> bool:
    """A body's next read would wait (nothing buffered, no end, no failure)."""
    return not reader._buffer and not reader._eof and reader._exception is None


def direct_reads(resp: aiohttp.ClientResponse) -> DirectReads | None:
    """``DirectReads`` for a streaming response, or None where it cannot be used (the mend
    is not in place, or the connection is gone)."""
    if not _on:
        return None
    conn = resp.connection
    proto = conn.protocol if conn is not None else None
    if proto is None or proto.transport is None:
        return None
    try:
        return DirectReads(resp.content, proto)
    except TypeError:  # a reader of another layout than the checked one's: read as usual
        return None
