"""What the gateway answers a connection it will not serve, under hypercorn and uvicorn alike
(``hypercorn_mend``, ``header_timeout``, ``uvicorn_guard``): the connection cap's count of
connections and its short 503, and the header deadline's 408. Nothing here imports a server.
"""

from __future__ import annotations

import logging

from gateway.edge.request_ids import new_request_id

log = logging.getLogger("gateway.server")

# the header deadline's answer to a request whose headers did not arrive in time
_BODY = (
    b'{"error":{"message":"The request headers did not arrive in time.",'
    b'"type":"invalid_request_error","code":"request_timeout"}}'
)
TIMEOUT_REPLY = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_BODY), _BODY)
)

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


def refused(cap: ConnectionCap, open_now: int) -> str:
    """One more connection refused at the cap (``open_now`` open): its request id, logged
    with the count for the first refusal and every thousandth (hypercorn's and uvicorn's)."""
    cap.refused += 1
    request_id = new_request_id()
    if cap.refused == 1 or cap.refused % 1000 == 0:
        log.warning(
            "server.connections_refused request_id=%s open=%d refused=%d",
            request_id,
            open_now,
            cap.refused,
        )
    return request_id


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
