"""A deadline for a request's headers under hypercorn (written for 0.18), which has none of its
own: a client that drips its headers a byte at a time held a connection for the whole
keep-alive (75 s), and was then closed with no answer. The mend, ``hypercorn.header_timeout``
(a ``gateway.server.mends.Mend``), is kept for safety: without it slow clients hold
connections at no cost to themselves.

``HEADER_TIMEOUT.seconds`` gives every request's headers that long to arrive, as nginx's
``client_header_timeout`` does: the first request of a new connection from the moment it is
accepted, each later one from its first byte (until then the connection is idle and the
keep-alive applies). Past the deadline the connection is closed, with a ``408`` in the OpenAI
error shape and ``Connection: close`` first when part of a request had arrived (HTTP/1.1;
HTTP/2 is only closed), with nothing when nothing had. A deadline no shorter than the
keep-alive leaves it to the keep-alive (closed with no answer). Once the headers are in, the
body has its own deadline (``asgi.BodyDeadlines``).

How: hypercorn's ``TCPServer`` runs one idle task per connection (``_idle_timeout``), sleeping
the keep-alive between requests and stopped while one is served. The mend tracks which of the
two waits a connection is in (``Updated`` events from the protocol: idle or busy), and
restarts the idle task when a request's first bytes arrive on an idle connection without its
whole headers (checked after hypercorn handled them, in ``ProtocolWrapper.handle``, which
reaches its connection's ``TCPServer`` through the ``send`` it was given: whole headers began
a request, and cost no restart). It wraps ``_idle_timeout``: while a connection waits for
headers, hypercorn's own wait runs under the header deadline, and past it the 408 (when due)
precedes hypercorn's own close. Nothing of the mend's own stays alive per connection but its
``_gw_wait``. uvicorn gets the same deadline through its own protocol hook, not a mend
(``gateway.server.uvicorn_guard``); granian has a header timeout of its own, which closes
without an answer (README: Abusive clients).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from hypercorn.config import Config

from gateway.server.defences import TIMEOUT_REPLY
from gateway.server.hypercorn_mend import WRITTEN_FOR, tcp_server, tcp_server_class
from gateway.server.mends import Mend, Needs, mended, wrapping

_NAME = "hypercorn.header_timeout"
# what a connection waits for (the ``_gw_wait`` of a ``TCPServer``)
HEADERS = "headers"  # a request's headers: from accept, or from its first byte
IDLE = "idle"  # the next request, between requests: the keep-alive
BUSY = "busy"  # nothing: a request is being served


class HeaderTimeout:
    """The seconds a request's headers have (0: no limit)."""

    def __init__(self) -> None:
        self.seconds = 0.0


HEADER_TIMEOUT = HeaderTimeout()


def _check() -> list[str]:
    needs = Needs()
    server_class, sample = tcp_server(needs)
    where = "TCPServer"
    read_data = needs.function(server_class, "_read_data", where, ["self"], coroutine=True)
    protocol_send = ["self", "event"]
    needs.function(server_class, "protocol_send", where, protocol_send, coroutine=True)
    needs.function(server_class, "_idle_timeout", where, ["self"], coroutine=True)
    needs.function(server_class, "_initiate_server_close", where, ["self"], coroutine=True)
    # run sets the connection's protocol (given its protocol_send) and task group, and starts
    # the idle task
    run_uses = ["protocol", "protocol_send", "_task_group", "idle_task", "restart", "_idle_timeout"]
    needs.uses(getattr(server_class, "run", None), run_uses, "TCPServer.run")
    # the read loop hands what it reads to the protocol's handle (wrapped)
    needs.uses(read_data, ["protocol", "handle", "RawData"], "TCPServer._read_data")
    idle_task = needs.attr(sample, "idle_task", "TCPServer()")
    restart_params = ["task_group", "action"]
    needs.function(idle_task, "restart", "TCPServer().idle_task", restart_params, coroutine=True)
    needs.attr(sample, "writer", "TCPServer()")  # the 408 is written to it
    config = needs.attr(sample, "config", "TCPServer()")
    needs.attr(config, "keep_alive_timeout", "TCPServer().config")
    events = needs.module("hypercorn.events")
    needs.fields(needs.attr(events, "RawData", "hypercorn.events"), ["data"], "RawData")
    needs.fields(needs.attr(events, "Updated", "hypercorn.events"), ["idle"], "Updated")
    _check_protocol(needs, sample)
    return needs.missing


def _check_protocol(needs: Needs, server: Any) -> None:
    """An HTTP/1.1 connection's protocol: it keeps the ``send`` it is given (its connection's
    ``protocol_send``, by which ``handle`` finds the connection), and an ``h11.Connection``
    (``protocol.connection``) whose buffer says what of a request has arrived."""
    module = needs.module("hypercorn.protocol")
    wrapper_class = needs.attr(module, "ProtocolWrapper", "hypercorn.protocol")
    needs.function(wrapper_class, "handle", "ProtocolWrapper", ["self", "event"], coroutine=True)
    if wrapper_class is None or server is None:
        return
    try:  # as TCPServer.run makes it, for a connection that speaks HTTP/1.1
        send = server.protocol_send
        args = (None, Config(), server.context, None, None, False, None, None, send, "http/1.1")
        sample = wrapper_class(*args)
    except Exception as exc:  # a changed __init__, whatever it raises
        needs.missing.append(f"ProtocolWrapper(...) cannot be made: {type(exc).__name__}: {exc}")
        return
    needs.require(
        getattr(getattr(sample, "send", None), "__self__", None) is server,
        "ProtocolWrapper(...).send is missing or not the send it was given",
    )
    connection = getattr(getattr(sample, "protocol", None), "connection", None)
    if needs.require(
        isinstance(connection, h11.Connection),
        "ProtocolWrapper(...).protocol.connection is missing or not an h11.Connection",
    ):
        buffered = getattr(connection, "trailing_data", None)
        needs.require(
            isinstance(buffered, tuple)
            and len(buffered) == 2
            and isinstance(buffered[0], bytes | bytearray),
            "h11.Connection.trailing_data is missing or not (buffered bytes, closed)",
        )


def _apply() -> None:
    from hypercorn.events import RawData, Updated
    from hypercorn.protocol import ProtocolWrapper

    server_class = tcp_server_class()
    handle = ProtocolWrapper.handle
    protocol_send = server_class.protocol_send
    idle_timeout = server_class._idle_timeout

    async def handling(self: Any, event: Any) -> None:
        server = getattr(self.send, "__self__", None)  # the connection's (its protocol_send)
        if not isinstance(server, server_class):  # not a connection of hypercorn's asyncio
            await handle(self, event)
            return
        idle = server._gw_wait == IDLE
        await handle(self, event)
        # a request's first bytes on an idle HTTP/1 connection that did not complete its
        # headers: their time begins (an idle HTTP/2 connection gets frames that begin no
        # request: pings, settings). Headers whole in the read that brought them, the usual
        # case, began a request (BUSY) and cost no restart of the idle task.
        if (
            idle
            and server._gw_wait == IDLE
            and type(event) is RawData
            and _http1(server)
            and _buffered(server)
        ):
            server._gw_wait = HEADERS
            await server.idle_task.restart(server._task_group, server._idle_timeout)

    async def sending(self: Any, event: Any) -> None:
        if type(event) is Updated:
            if not event.idle:
                self._gw_wait = BUSY
            elif _buffered(self):  # the next request's first bytes came with the last one's
                self._gw_wait = HEADERS
            else:
                self._gw_wait = IDLE
        await protocol_send(self, event)

    async def _idle_timeout(self: Any) -> None:
        seconds = HEADER_TIMEOUT.seconds
        if self._gw_wait != HEADERS or not 0 < seconds < self.config.keep_alive_timeout:
            await idle_timeout(self)  # hypercorn's own: the keep-alive
            return
        try:
            async with asyncio.timeout(seconds):
                await idle_timeout(self)  # ended sooner: the server is stopping, and closed it
            return
        except TimeoutError:
            pass
        if _buffered(self):
            await _refuse(self)
        await asyncio.shield(self._initiate_server_close())

    server_class._gw_wait = HEADERS  # a new connection waits for its first request's headers
    ProtocolWrapper.handle = wrapping(_NAME, handle, handling)  # type: ignore[method-assign]
    server_class.protocol_send = wrapping(_NAME, protocol_send, sending)
    server_class._idle_timeout = wrapping(_NAME, idle_timeout, _idle_timeout)


def _in_place() -> bool:
    from hypercorn.protocol import ProtocolWrapper

    server_class = tcp_server_class()
    parts = ("protocol_send", "_idle_timeout")
    return mended(ProtocolWrapper.handle, _NAME) and all(
        mended(getattr(server_class, part, None), _NAME) for part in parts
    )


HEADER_DEADLINE = Mend(
    name=_NAME,
    library="hypercorn",
    written_for=WRITTEN_FOR,
    kind="safety",
    fixes="no deadline for a request's headers: a client dripping them holds a connection",
    check=_check,
    apply=_apply,
    in_place=_in_place,
)
MENDS = (HEADER_DEADLINE,)


def _h11(server: Any) -> h11.Connection | None:
    """The connection's h11 state machine; None once it speaks HTTP/2."""
    wrapper = getattr(server, "protocol", None)
    connection = getattr(getattr(wrapper, "protocol", None), "connection", None)
    return connection if isinstance(connection, h11.Connection) else None


def _http1(server: Any) -> bool:
    return HEADER_TIMEOUT.seconds > 0 and _h11(server) is not None


def _buffered(server: Any) -> bool:
    """Whether part of a request has arrived and waits in h11 (HTTP/1 only)."""
    connection = _h11(server)
    return connection is not None and bool(connection.trailing_data[0])


async def _refuse(server: Any) -> None:
    writer = server.writer
    try:
        writer.write(TIMEOUT_REPLY)
        await writer.drain()
    except (ConnectionError, OSError, RuntimeError):
        pass
