"""A deadline for a request's headers under hypercorn (0.18), which has none of its own: a
client that drips its headers a byte at a time held a connection for the whole keep-alive
(75 s), and was then closed with no answer.

``time_headers(seconds)`` gives every request's headers ``seconds`` to arrive, as nginx's
``client_header_timeout`` does: the first request of a new connection from the moment it is
accepted, each later one from its first byte (until then the connection is idle and the
keep-alive applies). Past the deadline the connection is closed, with a ``408`` in the OpenAI
error shape and ``Connection: close`` first when part of a request had arrived (HTTP/1.1;
HTTP/2 is only closed), with nothing when nothing had. Once the headers are in, the body has
its own deadline (``asgi.BodyDeadlines``).

How: hypercorn's ``TCPServer`` runs one idle task per connection, sleeping the keep-alive
between requests and stopped while one is served. The mend tracks which of the two waits a
connection is in (``Updated`` events from the protocol: idle or busy), restarts the idle task
with the header deadline when a request's first bytes arrive on an idle connection without
its whole headers (checked after hypercorn handled them: whole headers began a request, and a
restart per request cost about 100k instructions), and has the idle task use that deadline
then. A hypercorn without those parts is left alone, and says
so in the log once. uvicorn and granian are not mended (README: Operations).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11

from gateway.server.hypercorn_mend import tcp_server_parts

_TIMED = "_gateway_header_timeout"
_BODY = (
    b'{"error":{"message":"The request headers did not arrive in time.",'
    b'"type":"invalid_request_error","code":"request_timeout"}}'
)
TIMEOUT_REPLY = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_BODY), _BODY)
)
# what a connection waits for (the ``_gw_wait`` of a ``TCPServer``)
HEADERS = "headers"  # a request's headers: from accept, or from its first byte
IDLE = "idle"  # the next request, between requests: the keep-alive
BUSY = "busy"  # nothing: a request is being served


class HeaderTimeout:
    """The seconds a request's headers have (0: no limit)."""

    def __init__(self) -> None:
        self.seconds = 0.0


HEADER_TIMEOUT = HeaderTimeout()


def time_headers(seconds: float) -> bool:
    """Give the headers of every request this process's hypercorn reads ``seconds`` to
    arrive (0: no limit); True when it can."""
    HEADER_TIMEOUT.seconds = seconds
    parts = tcp_server_parts(
        _TIMED,
        ["_read_data", "protocol_send", "_idle_timeout", "_initiate_server_close"],
        "server.headers_not_timed reason=hypercorn_changed",
        events=["RawData", "Updated"],
    )
    if isinstance(parts, bool):
        return parts
    server_class, read_data, protocol_send, _, _, raw_data, updated = parts

    async def _read_data(self: Any) -> None:
        protocol = self.protocol
        handle = protocol.handle

        async def handling(event: Any) -> None:
            idle = self._gw_wait == IDLE
            await handle(event)
            # a request's first bytes on an idle HTTP/1 connection that did not complete its
            # headers: their time begins (an idle HTTP/2 connection gets frames that begin no
            # request: pings, settings). Headers whole in the read that brought them, the
            # usual case, began a request (BUSY) and cost no restart of the idle task.
            if (
                idle
                and self._gw_wait == IDLE
                and type(event) is raw_data
                and _http1(self)
                and _buffered(self)
            ):
                self._gw_wait = HEADERS
                await self.idle_task.restart(self._task_group, self._idle_timeout)

        protocol.handle = handling
        await read_data(self)

    async def sending(self: Any, event: Any) -> None:
        if type(event) is updated:
            if not event.idle:
                self._gw_wait = BUSY
            elif _buffered(self):  # the next request's first bytes came with the last one's
                self._gw_wait = HEADERS
            else:
                self._gw_wait = IDLE
        await protocol_send(self, event)

    async def _idle_timeout(self: Any) -> None:
        headers = self._gw_wait == HEADERS and HEADER_TIMEOUT.seconds > 0
        wait = HEADER_TIMEOUT.seconds if headers else self.config.keep_alive_timeout
        try:
            await asyncio.wait_for(self.context.terminated.wait(), wait)
        except TimeoutError:
            if headers and _buffered(self):
                await _refuse(self)
        await asyncio.shield(self._initiate_server_close())

    server_class._gw_wait = HEADERS  # a new connection waits for its first request's headers
    server_class._read_data = _read_data
    server_class.protocol_send = sending
    server_class._idle_timeout = _idle_timeout
    setattr(server_class, _TIMED, True)
    return True


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
