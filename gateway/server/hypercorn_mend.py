"""Mends for hypercorn (0.18, the newest): a connection its client closed while idle is let go
at once instead of after the keep-alive; a cap on the connections one process holds; and two
costs of every response made small (``ServerConfig``'s Date header, ``h11_headers``' check).

hypercorn's ``TCPServer`` runs a connection in a TaskGroup that holds, between requests, an
idle task sleeping ``keep_alive_timeout``. When the client closes an idle connection, the read
loop ends, but the idle task is only stopped in the ``finally`` that runs after the TaskGroup
exits, and the TaskGroup waits for it: the socket stays in CLOSE_WAIT and the connection's
objects (TaskGroup, tasks, StreamWriter, the tracebacks of its cancelled tasks) stay alive for
the whole keep-alive (bench/RESULTS.md, "Garbage collection", has what that cost).

The mend stops the idle task as soon as the read loop has ended. Nothing can arrive on the
connection any more, so nothing is lost; a request still being answered is not touched (its
stream was closed by the read loop, as before). A hypercorn without that read loop or idle task
is left alone, and says so in the log once.

hypercorn has no limit on connections: enough idle or half-open ones (20,000 seen) use every
file descriptor, and then the probes and every client fail. ``limit_connections`` counts the
connections of ``TCPServer.run``; past the cap a new one gets a short 503 in the OpenAI error
shape with ``Retry-After`` and ``Connection: close`` before anything is read, and is closed.

Every mend of ``TCPServer`` (``header_timeout``'s too) finds what it wraps with
``tcp_server_parts``, which also tells it when it is in place already, and when hypercorn has
changed: the mend is then left out, with one log line.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import Any
from wsgiref.handlers import format_date_time

from hypercorn.config import Config

from gateway.edge.request_ids import new_request_id
from gateway.server.h11_headers import speed_up

log = logging.getLogger("gateway.server")
_MENDED = "_gateway_mended_idle_close"
_CAPPED = "_gateway_connection_cap"
_REFUSAL_BODY = (
    b'{"error":{"message":"The gateway has too many connections open; retry shortly.",'
    b'"type":"overloaded_error","code":"too_many_connections"}}'
)
# the refusal, with its x-request-id (one of the gateway's own ids) put in where %s stands
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nretry-after: 1\r\nconnection: close\r\n"
    % len(_REFUSAL_BODY)
    + b"x-request-id: %s\r\n\r\n"
    + _REFUSAL_BODY.replace(b"%", b"%%")
)


def refusal(request_id: str) -> bytes:
    """The connection cap's 503, carrying ``request_id`` as every reply carries one."""
    return REFUSAL % request_id.encode()


class ConnectionCap:
    """Connections open in this process, and how many it may hold (0: no cap)."""

    def __init__(self) -> None:
        self.limit = 0
        self.open = 0
        self.refused = 0


CONNECTIONS = ConnectionCap()


def tcp_server_parts(
    marker: str, names: Sequence[str], warning: str, events: Sequence[str] = ()
) -> list[Any] | bool:
    """hypercorn's ``TCPServer``, then its attributes ``names``, then the classes ``events`` of
    ``hypercorn.events``: what a mend wraps and uses. Or else whether the mend is in place:
    True when ``marker`` is set on ``TCPServer`` already; False when this process has not
    loaded hypercorn, or when one of those parts is missing (a changed hypercorn: the mend is
    left out, and ``warning`` logged)."""
    module = sys.modules.get("hypercorn.asyncio.tcp_server")
    server_class = getattr(module, "TCPServer", None)
    if server_class is None:
        return False
    if getattr(server_class, marker, False):
        return True
    event_module = sys.modules.get("hypercorn.events")
    parts = [getattr(server_class, name, None) for name in names]
    parts += [getattr(event_module, name, None) for name in events]
    if any(part is None for part in parts):
        log.warning(warning)
        return False
    return [server_class, *parts]


def limit_connections(limit: int) -> bool:
    """Cap the connections this process's hypercorn holds at ``limit``; True when it can."""
    CONNECTIONS.limit = limit
    parts = tcp_server_parts(_CAPPED, ["run"], "server.connections_not_capped reason=no_run")
    if isinstance(parts, bool):
        return parts
    server_class, run = parts

    async def capped_run(self: Any) -> None:
        cap = CONNECTIONS
        if cap.limit and cap.open >= cap.limit:
            cap.refused += 1
            request_id = new_request_id()
            if cap.refused == 1 or cap.refused % 1000 == 0:
                log.warning(
                    "server.connections_refused request_id=%s open=%d refused=%d",
                    request_id,
                    cap.open,
                    cap.refused,
                )
            writer = self.writer
            try:
                writer.write(refusal(request_id))
                await writer.drain()
            except OSError:
                pass
            finally:
                writer.close()
            return
        cap.open += 1
        try:
            await run(self)
        finally:
            cap.open -= 1

    server_class.run = capped_run
    setattr(server_class, _CAPPED, True)
    return True


def http_date() -> bytes:
    """Now as an HTTP ``Date`` value, formatted once a second."""
    now = int(time.time())
    if now != _DATE[0]:
        _DATE[0], _DATE[1] = now, format_date_time(now).encode("ascii")
    return _DATE[1]  # type: ignore[return-value]


_DATE: list[int | bytes] = [-1, b""]


class ServerConfig(Config):
    """hypercorn's ``Config``, its responses carrying a ``Date`` made once a second:
    hypercorn formats it anew for every response (about 13,000 instructions, as much as the
    rest of its response headers). No ``Server`` header: the gateway does not advertise its
    software, and each header costs h11 a check. (A class of this module's own, not one made
    in a function: several workers get it pickled.)"""

    include_date_header = False  # added by response_headers, formatted once a second
    include_server_header = False

    def response_headers(self, protocol: str) -> list[tuple[bytes, bytes]]:
        return [(b"date", http_date()), *super().response_headers(protocol)]


def default_connection_limit() -> int:
    """About half the open-file limit (each stream holds its client's socket and an upstream
    one), less a reserve for the store, the journal and the listening sockets; at most 10,000."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return 10_000
    if soft == resource.RLIM_INFINITY:
        return 10_000
    return max(16, min(10_000, (soft - 64) // 2))


def mend_hypercorn() -> bool:
    """Mend hypercorn's TCPServer if this process has loaded it, and give its h11 the cheaper
    check of response headers (``h11_headers``); True when the TCPServer is mended."""
    speed_up()
    parts = tcp_server_parts(
        _MENDED, ["_read_data"], "server.hypercorn_not_mended reason=no_read_loop"
    )
    if isinstance(parts, bool):
        return parts
    server_class, read_data = parts

    async def _read_data(self: Any) -> None:
        await read_data(self)
        idle_task = getattr(self, "idle_task", None)
        if idle_task is not None:
            await idle_task.stop()

    server_class._read_data = _read_data
    setattr(server_class, _MENDED, True)
    return True
