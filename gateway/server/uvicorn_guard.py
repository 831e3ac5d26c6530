"""uvicorn's HTTP/1 protocol (httptools, written for 0.54) with the defences hypercorn is
mended to have: a deadline for a request's headers and a cap on the connections a process
holds. Given through uvicorn's own extension point, ``uvicorn.Config(http=...)``, which takes
anything that makes a protocol: ``guarded(guard_of(...))`` is a ``functools.partial`` of
``GuardedProtocol`` with the settings bound (``Guard``), so it pickles by value into each of
several workers (uvicorn spawns them with its ``Config``) and needs no module state.

**Header deadline** (``header_timeout.py`` has its meaning, the same under both servers):
the first request of a connection has ``Guard.header_seconds`` from accept
(``connection_made``), each later one from its first byte; between requests uvicorn's own
keep-alive applies. Past it the connection is closed, with the mend's ``408`` first
(``TIMEOUT_REPLY``) when part of a request had arrived, with nothing when nothing had. A
deadline no shorter than the keep-alive leaves it to the keep-alive: closed at that time with
no answer. Once the headers are in, the body has its own deadline (``asgi.BodyDeadlines``).
uvicorn itself has none: a connection that sent nothing was held for ever, one dripping its
headers as long as it kept dripping.

**Connection cap**: a connection accepted while this process holds ``Guard.limit`` open ones
gets hypercorn's cap's short 503 (``defences.refusal``) and is closed in
``connection_made``, before anything is read, so that a flood of idle connections leaves
descriptors for the probe port. uvicorn's ``limit_concurrency`` answered 503 only to a
request, and counted connections already accepted: idle ones were held.

Cost: a timer (``loop.call_later``) per connection, cancelled when its first headers are in;
per read two attribute checks; a keep-alive request whose headers arrive whole in one read,
the usual case, arms none: 0.7k instructions a request on the protocol alone (bench/RESULTS.md,
"uvicorn with the gateway's connection guard"). Its two attributes are slots: in the
instance's dict they made each connection 1.3 KiB larger. Written against uvicorn's
internals as 0.54 has them (``cycle``, ``scope``, ``timeout_keep_alive_task``, the parser's
callbacks); tests/test_uvicorn_guard.py runs it against the installed uvicorn, and at start-up
they are checked as a mend's are: ``uvicorn.guard``, of kind ``safety``
(``gateway.server.mends``): where the installed uvicorn differs the process does not start,
unless ``GATEWAY_UNMENDED`` names it, when it serves on uvicorn's own protocol and says so.

Not given: a line when accepts fail for want of descriptors (uvloop's libuv sheds those
connections itself, accepting and closing them, and tells no Python code; ``accept_errors``
sees only asyncio's accept loop).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.server.defences import CONNECTIONS, TIMEOUT_REPLY, refusal, refused
from gateway.server.mends import Mend, Needs, module_flag


@dataclass(frozen=True, slots=True)
class Guard:
    """What a ``GuardedProtocol`` holds a connection to. ``header_seconds``: the deadline
    for a request's headers (0: none); ``answer``: whether a late request gets the 408 (not
    when the deadline is the keep-alive's); ``limit``: connections per process (0: no cap)."""

    header_seconds: float = 0.0
    answer: bool = True
    limit: int = 0


def guard_of(header_seconds: float, keep_alive_seconds: float, limit: int) -> Guard:
    """The guard for these settings: a header deadline no shorter than the keep-alive is the
    keep-alive's, without an answer (as under hypercorn's mend)."""
    if header_seconds <= 0:
        return Guard(0.0, True, limit)
    if header_seconds >= keep_alive_seconds:
        return Guard(keep_alive_seconds, False, limit)
    return Guard(header_seconds, True, limit)


_UPGRADED = Guard()  # a connection handed to the WebSocket protocol: nothing more of the guard's
_read = HttpToolsProtocol.data_received
_answered = HttpToolsProtocol.on_response_complete


def guarded(guard: Guard) -> functools.partial[GuardedProtocol]:
    """What ``uvicorn.Config(http=...)`` is given: makes a ``GuardedProtocol`` per connection."""
    return functools.partial(GuardedProtocol, guard=guard)


class GuardedProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` with ``guard`` applied to each connection."""

    # slots, not the instance's dict: uvicorn's protocol has about as many attributes as a
    # dict shares its keys for (30), and two more made each connection's dict a whole one of
    # its own (1.3 KiB more a held stream, measured)
    __slots__ = ("guard", "_header_timer")

    def __init__(self, *args: Any, guard: Guard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self._header_timer: asyncio.TimerHandle | None = None  # the headers' deadline

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        guard = self.guard
        if guard.limit and len(self.connections) >= guard.limit:
            self.transport = transport  # connection_lost closes it
            _refuse(transport, len(self.connections))
            return
        super().connection_made(transport)
        if guard.header_seconds:
            self._header_timer = self.loop.call_later(guard.header_seconds, self._headers_late)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # (httptools_impl's own methods are called as functions, not through super(): a read
        # and a response each cost the guard no more than a few attribute checks)
        timer = self._header_timer
        if timer is None and self.timeout_keep_alive_task is None:
            _read(self, data)  # the usual read: a request's body
            return
        # a first request's headers, or the first bytes after an idle time (the keep-alive:
        # uvicorn's timer, which its data_received cancels)
        cycle = self.cycle
        _read(self, data)
        if self.cycle is not cycle:  # whole headers: a request began
            if timer is not None:
                timer.cancel()
                self._header_timer = None
        elif timer is None and self.guard.header_seconds and not self.transport.is_closing():
            # the next request's first bytes, its headers not whole: their time begins
            self._header_timer = self.loop.call_later(self.guard.header_seconds, self._headers_late)

    def handle_websocket_upgrade(self) -> None:
        # the connection is the WebSocket protocol's from here: no deadline of this one's
        self.guard = _UPGRADED
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().handle_websocket_upgrade()

    def on_response_complete(self) -> None:
        _answered(self)
        # the next request's first bytes came while this one was answered, its headers not
        # whole (pipelined, and not queued): their time begins now, not the keep-alive's
        if (
            self.timeout_keep_alive_task is not None
            and self._header_timer is None
            and self.scope is not self.cycle.scope
            and self.guard.header_seconds
        ):
            self._header_timer = self.loop.call_later(self.guard.header_seconds, self._headers_late)

    def _headers_late(self) -> None:
        """The headers' deadline passed: the connection is closed, with the 408 when part of
        a request had arrived (a message begun since the last one's headers)."""
        self._header_timer = None
        transport = self.transport
        if transport.is_closing():
            return
        scope, cycle = self.scope, self.cycle
        begun = scope is not None and (cycle is None or scope is not cycle.scope)
        if begun and self.guard.answer:
            transport.write(TIMEOUT_REPLY)
        transport.close()


def _refuse(transport: asyncio.Transport, open_now: int) -> None:
    """The cap's 503, written to a connection not taken in, which is closed at once."""
    request_id = refused(CONNECTIONS, open_now)
    transport.write(refusal(request_id))
    transport.close()


_PROTOCOL = "uvicorn.protocols.http.httptools_impl.HttpToolsProtocol"
# what the guard calls, and what each of uvicorn's methods must still do for it: the names its
# code reads or sets (the request begun, the request answered, the keep-alive's timer)
_METHODS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "__init__": (("self", "config", "server_state", "app_state", "_loop"),
                 ("connections", "cycle", "loop", "scope", "timeout_keep_alive_task")),
    "connection_made": (("self", "transport"), ("connections", "transport")),
    "connection_lost": (("self", "exc"), ("connections",)),
    "data_received": (("self", "data"), ("parser", "feed_data")),
    "on_message_begin": (("self",), ("scope",)),
    "on_headers_complete": (("self",), ("cycle", "scope")),
    "on_response_complete": (("self",), ("timeout_keep_alive_task",)),
    "handle_websocket_upgrade": (("self",), ()),
}  # fmt: skip
_checked = False  # the installed uvicorn fits (``UVICORN_GUARD``)


def _check() -> list[str]:
    needs = Needs()
    module = needs.module("uvicorn.protocols.http.httptools_impl")
    protocol = needs.attr(module, "HttpToolsProtocol", "uvicorn.protocols.http.httptools_impl")
    if protocol is None:
        return needs.missing
    for name, (params, names) in _METHODS.items():
        method = needs.function(protocol, name, _PROTOCOL, params, coroutine=False)
        needs.uses(method, names, f"{_PROTOCOL}.{name}")
    return needs.missing


_apply, _in_place = module_flag(__name__, "_checked")  # sets and reads _checked


UVICORN_GUARD = Mend(
    name="uvicorn.guard",
    library="uvicorn",
    written_for="0.54",
    kind="safety",
    fixes="uvicorn holds a silent connection for ever, a dripping one as long as it drips, "
    "and idle ones past any cap",
    check=_check,
    apply=_apply,
    in_place=_in_place,
)
MENDS = (UVICORN_GUARD,)
