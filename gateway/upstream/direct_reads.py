"""A stream's reads handed to the relay inside the upstream socket's own callback.

Read the usual way, each read of a stream wakes the request's task: aiohttp's protocol feeds
the body's ``StreamReader``, which completes a future, which schedules the task, which runs in
the event loop's next turn, resumes ``readany`` and its ``_wait``, and makes a new future for
the read after. For a paced stream (a chunk every few tens of milliseconds, each its own read)
that is most of what the gateway itself spends on a chunk.

``DirectReads`` takes the turn out: while it is on, what aiohttp's parser feeds the body's
reader within the connection's ``data_received`` is taken as it is fed (the reader's class is
a subclass of aiohttp's whose ``feed_data`` keeps it aside, and whose
``end_http_chunk_receiving`` marks nothing), and given, once the callback has parsed the read,
to ``on_read``, which converts it and writes it to the client in the same callback. Nothing
goes through the reader's buffer: no chunk marks to drop, no ``_read_nowait``, and none of the
``resume_reading`` it makes at every read (which parses the empty read again through
``data_received``). ``on_read`` returns False to stop (a send that has to wait, a keep-alive
under way): the awaitable ``relay`` returned then completes and the stream goes on the usual
way. It completes too when the body ends or fails (EOF, a read timeout, the connection lost),
after what came before the end was given to ``on_read``, leaving the end to the usual read;
and raises what ``on_read`` raised.

How, and why it is safe: the reader's ``_waiter`` (the future ``_wait`` parks on) is set to a
stand-in, which is also how the reader's ``feed_data`` knows the direct reads are on; its
``set_result``/``set_exception`` only look at the reader, so an end, a failure or a timeout
that comes outside ``data_received`` (``connection_lost``, aiohttp's read timer) stops the
relay. A feed outside ``data_received`` goes to the buffer as aiohttp's does. The reader's
counts (``total_bytes``, ``_cursor``) move as if each read had been fed and read at once, so a
stop leaves it as the usual reads would have. ``data_received`` is wrapped by an attribute on
the protocol instance, and the transport told again of its protocol (``set_protocol``),
because uvloop keeps the bound method it was first given. ``release`` puts the protocol and
the reader's class back, once per stream. aiohttp 3.14's ``StreamReader`` (its slots, and
``feed_data`` and ``end_http_chunk_receiving`` as what its parser calls) and
``ResponseHandler.data_received`` are what this relies on: a mend, ``aiohttp.direct_reads``,
of kind ``speed`` (a ``gateway.server.mends.Mend``: checked when the pool starts; where aiohttp
differs, it is left out with a warning and reads go the usual way). A channel's total timeout
(aiohttp's timer of the whole body) stops a stream whose reads are direct at its deadline, as
it stops a read that waits (``wait``).

The read timeout (``sock_read``: the longest silence of an upstream) is the other cost of a
read: aiohttp cancels a timer and makes a new one at each (in uvloop, a libuv handle made and
closed). While the reads are direct it is this module's: one timer, which when it fires looks
at when the last read came and is set again from there, or calls aiohttp's own
``_on_read_timeout`` (the body's read then raises aiohttp's timeout, as before); when the
direct reads stop with the body going on, aiohttp's timer is set again (unless reading is
paused: aiohttp sets it when reading resumes). Measured by callgrind on a paced stream (100
reads a stream, 8 streams): 82.0k -> 76.4k instructions a read; the reads taken as they are
fed, bench/RESULTS.md ("The paced stream").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from gateway.server.mends import Mend, Needs

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
        needs.require(
            "__dict__" in dir(handler), "aiohttp.client_proto.ResponseHandler has __slots__ only"
        )
        where = "aiohttp.client_proto.ResponseHandler"
        needs.attr(handler, "data_received", where)
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


def _apply() -> None:
    global _on
    _on = True


DIRECT_READS = Mend(
    name=_NAME,
    library="aiohttp",
    written_for="3.14",
    kind="speed",
    fixes="each read of a stream wakes its task, in one more turn of the event loop",
    check=_check,
    apply=_apply,
    in_place=lambda: _on,
)
MENDS = (DIRECT_READS,)


class _Waiter:
    """Stands in for the future a read parks on while the reads are direct: what the reader's
    parser feeds then is taken (``_taking``), and an end or a failure fed to the reader outside
    ``data_received`` stops the relay."""

    __slots__ = ("reads",)

    def __init__(self, reads: DirectReads) -> None:
        self.reads = reads

    def done(self) -> bool:
        # within data_received an end need not be told (it is looked at after): aiohttp's
        # set_result then makes no call
        return self.reads._inside

    def set_result(self, _result: object) -> None:
        self.reads._fed()

    def set_exception(self, _exc: BaseException, _cause: object = None) -> None:
        self.reads._fed()

    def cancel(self) -> bool:
        return False


_SUBCLASSES: dict[Any, Any] = {}


def _taking(reader: Any) -> Any:
    """``reader``'s subclass (made once) whose instances, while their reads are direct, keep
    what the parser feeds them within ``data_received`` aside for ``on_read``, past the
    buffer, and mark no chunk ends (nothing is read from the buffer to drop them)."""
    sub = _SUBCLASSES.get(reader)
    if sub is not None:
        return sub
    feed, end_chunk = reader.feed_data, reader.end_http_chunk_receiving

    def feed_data(self: Any, data: bytes, size: int = 0) -> bool:
        waiter = self._waiter
        if type(waiter) is _Waiter and waiter.reads._inside:
            if data:
                waiter.reads._pending.append(data)
            return False
        return feed(self, data, size)  # type: ignore[no-any-return]

    def end_http_chunk_receiving(self: Any) -> None:
        waiter = self._waiter
        if type(waiter) is _Waiter and waiter.reads._inside:
            return
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

    __slots__ = (
        "_reader", "_class", "_proto", "_original", "_on_read", "_done", "_inside", "_taking",
        "_pending", "_waiter", "_timeout", "_timer", "_last", "_clock",
    )  # fmt: skip

    def __init__(self, reader: Any, proto: Any) -> None:
        self._reader = reader
        self._class = type(reader)
        self._proto = proto
        self._original = proto.data_received
        self._on_read: OnRead | None = None
        self._done: asyncio.Future[None] | None = None
        self._inside = False  # within aiohttp's data_received
        self._taking = False  # handing what was read to on_read
        self._pending: list[bytes] = []  # what the parser fed within data_received
        self._waiter = _Waiter(self)
        self._timeout = 0.0  # aiohttp's read timeout, kept here while the reads are direct
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0  # when the last read came (the loop's clock)
        self._clock: Callable[[], float] = time.monotonic
        reader.__class__ = _taking(self._class)
        proto.data_received = self._data_received
        _refresh(proto)

    def relay(self, on_read: OnRead) -> asyncio.Future[None] | None:
        """Hand each read to ``on_read`` until it returns False or the body ends or fails;
        None (nothing started) when a read is waiting already or the body has ended."""
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

    async def wait(self, done: asyncio.Future[None]) -> None:
        """Awaits ``done`` (``relay``'s) within the body's total timeout, as a read that
        waits does: at its deadline aiohttp's timer cancels the stream's task, and this raises
        ``asyncio.TimeoutError``."""
        with self._reader._timer:
            await done

    def release(self) -> None:
        """The stream is over: the protocol and reader as they were."""
        self._stop(None)
        proto = self._proto
        if proto.__dict__.get("data_received") == self._data_received:
            del proto.data_received
            _refresh(proto)
        self._reader.__class__ = self._class

    def _data_received(self, data: bytes) -> None:
        self._inside = True
        try:
            self._original(data)
        finally:
            self._inside = False
        pending = self._pending
        if self._taking or not pending and self._on_read is None:
            # within on_read's own call below (what was fed waits for its loop), or off
            return
        reader, done = self._reader, self._done
        if done is not None and done.cancelled():  # the stream's task was stopped: no more
            pending.clear()
            self._stop(None)
            return
        self._taking = True
        try:
            while pending:
                raw = pending[0] if len(pending) == 1 else b"".join(pending)
                pending.clear()
                # counted as fed and read at once: a stop leaves the reader as reads would
                size = len(raw)
                reader.total_bytes += size
                reader._cursor += size
                if self._timeout:
                    self._last = self._clock()
                try:
                    go_on = self._on_read(raw)  # type: ignore[misc]
                except BaseException as exc:  # to the stream's task, which raises it
                    self._stop(exc)
                    return
                if not go_on:
                    self._stop(None, timing=True)  # the body goes on: aiohttp's timer with it
                    return
            if reader._eof or reader._exception is not None:
                self._stop(None)  # the usual read takes the end, or the failure
        finally:
            self._taking = False
            if pending:  # fed while on_read stopped them: the usual read's
                for piece in pending:
                    self._class.feed_data(reader, piece)
                pending.clear()

    def _fed(self) -> None:
        """The reader was fed: inside ``data_received`` that is looked at after; outside it,
        only an end or a failure feeds a reader."""
        if not self._inside:
            self._reader._waiter = None
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


def _refresh(proto: Any) -> None:
    """Tell the transport its protocol again: uvloop keeps the ``data_received`` it was
    given."""
    transport = proto.transport
    if transport is not None and not transport.is_closing():
        transport.set_protocol(proto)


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
    if proto is None or proto.transport is None or not hasattr(proto, "__dict__"):
        return None
    return DirectReads(resp.content, proto)
