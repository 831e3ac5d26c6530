"""uvicorn's guarded protocol (``gateway.server.uvicorn_guard``), one connection at a time on a
stand-in transport, its timers in hand (a loop whose ``call_later`` records them, fired by the
test): when the headers' deadline starts, what it closes with, when it is cancelled, and the
connection cap at accept. Served behaviour (real sockets, ``gateway serve --server
uvicorn``): tests/test_abuse.py and tests/test_probe_listener.py."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable
from typing import Any

import orjson
import pytest

pytest.importorskip("uvicorn")

import uvicorn  # noqa: E402
from uvicorn.server import ServerState  # noqa: E402

from gateway.config import ServerSettings  # noqa: E402
from gateway.server import uvicorn_options  # noqa: E402
from gateway.server.defences import TIMEOUT_REPLY  # noqa: E402
from gateway.server.uvicorn_guard import Guard, GuardedProtocol, guard_of, guarded  # noqa: E402

HEADERS = 5.0
KEEP_ALIVE = 75
GET = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"


class Transport:
    """What the protocol writes, and whether it closed."""

    def __init__(self, protocol: GuardedProtocol) -> None:
        self.protocol = protocol
        self.written = b""
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name)

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.protocol.connection_lost(None)

    def set_protocol(self, protocol: Any) -> None: ...
    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...


class Timer:
    def __init__(self, delay: float, callback: Callable[[], None]) -> None:
        self.delay, self.callback, self.cancelled = delay, callback, False

    def cancel(self) -> None:
        self.cancelled = True


class Loop:
    """The running loop for the app's tasks; timers recorded instead of scheduled."""

    def __init__(self) -> None:
        self.real = asyncio.get_running_loop()
        self.timers: list[Timer] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        self.timers.append(Timer(delay, callback))
        return self.timers[-1]

    def create_task(self, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        return self.real.create_task(coro, **kw)

    def header_timers(self) -> list[Timer]:
        """The headers' deadlines armed, live or not (the keep-alive's are uvicorn's)."""
        return [t for t in self.timers if t.callback.__name__ == "_headers_late"]

    def live(self) -> list[Timer]:
        return [t for t in self.header_timers() if not t.cancelled]


async def app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def connection(
    guard: Guard, state: ServerState | None = None
) -> tuple[GuardedProtocol, Transport, Loop]:
    config = uvicorn.Config(app, timeout_keep_alive=KEEP_ALIVE, log_level="warning")
    loop = Loop()
    protocol = GuardedProtocol(
        config=config,
        server_state=state or ServerState(),
        app_state={},
        _loop=loop,  # type: ignore[arg-type]
        guard=guard,
    )
    transport = Transport(protocol)
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, transport, loop


async def answered(protocol: GuardedProtocol, transport: Transport) -> None:
    """Until the request in hand has been answered (the app runs in a task)."""
    for _ in range(100):
        if protocol.cycle is not None and protocol.cycle.response_complete:
            return
        await asyncio.sleep(0)
    raise AssertionError(transport.written)


# (reads of a first request, what the deadline closes it with: None when it is cancelled)
FIRST_REQUEST: list[tuple[str, list[bytes], bytes | None]] = [
    ("silent", [], b""),
    ("crlf only", [b"\r\n"], b""),
    ("part of the request line", [b"GET /heal"], TIMEOUT_REPLY),
    ("all but the blank line", [GET[:-2]], TIMEOUT_REPLY),
    ("whole in one read", [GET], None),
    ("whole across reads", [GET[:10], GET[10:20], GET[20:]], None),
]


@pytest.mark.parametrize(("reads", "closed_with"), [c[1:] for c in FIRST_REQUEST],
                         ids=[c[0] for c in FIRST_REQUEST])  # fmt: skip
async def test_a_first_request_has_the_deadline_from_accept(
    reads: list[bytes], closed_with: bytes | None
) -> None:
    protocol, transport, loop = connection(Guard(HEADERS, True, 0))
    (timer,) = loop.header_timers()  # armed at accept
    assert timer.delay == HEADERS
    for data in reads:
        protocol.data_received(data)
    if closed_with is None:
        assert loop.live() == []
        await answered(protocol, transport)
        assert transport.written.startswith(b"HTTP/1.1 200 ") and not transport.closed
        return
    timer.callback()
    assert transport.closed and transport.written == closed_with


# (reads after a response, when the keep-alive runs: the header timers armed, what the last
# one closes with)
LATER_REQUEST: list[tuple[str, list[bytes], int, bytes | None]] = [
    ("nothing: the keep-alive's", [], 0, None),
    ("whole in one read: none armed", [GET], 0, None),
    ("part: from its first byte", [b"GET /he"], 1, TIMEOUT_REPLY),
    ("dripped: armed once", [b"G", b"E", b"T"], 1, TIMEOUT_REPLY),
    ("part, then the rest: cancelled", [GET[:10], GET[10:]], 1, None),
]


@pytest.mark.parametrize(("reads", "armed", "closed_with"), [c[1:] for c in LATER_REQUEST],
                         ids=[c[0] for c in LATER_REQUEST])  # fmt: skip
async def test_a_later_request_has_the_deadline_from_its_first_byte(
    reads: list[bytes], armed: int, closed_with: bytes | None
) -> None:
    protocol, transport, loop = connection(Guard(HEADERS, True, 0))
    protocol.data_received(GET)
    await answered(protocol, transport)
    assert protocol.timeout_keep_alive_task is not None  # idle: the keep-alive runs
    before = len(loop.header_timers())
    for data in reads:
        protocol.data_received(data)
    timers = loop.header_timers()[before:]
    assert len(timers) == armed
    if closed_with is None:
        assert all(t.cancelled for t in timers) and not transport.closed
        return
    (timer,) = timers
    assert timer.delay == HEADERS and not timer.cancelled
    transport.written = b""
    timer.callback()
    assert transport.closed and transport.written == closed_with


async def test_a_request_begun_while_the_last_was_answered_has_the_deadline_from_its_end() -> None:
    protocol, transport, loop = connection(Guard(HEADERS, True, 0))
    protocol.data_received(GET + b"GET /hea")  # the next one's first bytes with the first
    await answered(protocol, transport)
    (timer,) = loop.live()
    transport.written = b""
    timer.callback()
    assert transport.closed and transport.written == TIMEOUT_REPLY


UPGRADE = (
    b"GET /ws HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: upgrade\r\n"
    b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
)


@pytest.mark.parametrize("kept", [False, True], ids=["first request", "after a request"])
async def test_a_websocket_upgrade_ends_the_deadline(kept: bool) -> None:
    pytest.importorskip("websockets")
    protocol, transport, loop = connection(Guard(HEADERS, True, 0))
    if kept:
        protocol.data_received(GET)
        await answered(protocol, transport)
    protocol.data_received(UPGRADE)  # the connection is the WebSocket protocol's from here
    assert loop.live() == []


async def test_no_deadline_arms_no_timer_and_a_lost_connection_cancels_it() -> None:
    protocol, transport, loop = connection(Guard(0.0, True, 0))
    protocol.data_received(b"GET /he")
    assert loop.header_timers() == []
    protocol, transport, loop = connection(Guard(HEADERS, True, 0))
    transport.close()
    assert loop.live() == []


async def test_a_deadline_of_the_keep_alive_closes_without_an_answer() -> None:
    protocol, transport, loop = connection(guard_of(KEEP_ALIVE + 5, KEEP_ALIVE, 0))
    protocol.data_received(b"GET /he")
    (timer,) = loop.live()
    assert timer.delay == KEEP_ALIVE
    timer.callback()
    assert transport.closed and transport.written == b""


async def test_past_the_cap_a_connection_gets_503_and_is_closed_at_accept() -> None:
    state = ServerState()
    held = [connection(Guard(0.0, True, 2), state) for _ in range(2)]
    assert len(state.connections) == 2
    protocol, transport, loop = connection(Guard(HEADERS, True, 2), state)
    assert transport.closed and protocol not in state.connections
    assert loop.header_timers() == []  # nothing is read from it
    head, _, body = transport.written.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ") and b"connection: close" in head
    assert orjson.loads(body)["error"]["code"] == "too_many_connections"
    held[0][1].close()  # one fewer open: the next is taken in
    _, transport, _ = connection(Guard(HEADERS, True, 2), state)
    assert not transport.closed and transport.written == b""


# (header_timeout_seconds, keep_alive_seconds, guard)
GUARDS = [
    (5.0, 75.0, Guard(5.0, True, 100)),
    (0.0, 75.0, Guard(0.0, True, 100)),
    (75.0, 75.0, Guard(75.0, False, 100)),
    (90.0, 75.0, Guard(75.0, False, 100)),
]


@pytest.mark.parametrize(("header", "keep_alive", "guard"), GUARDS)
def test_uvicorn_is_given_the_guard_of_the_settings(
    header: float, keep_alive: float, guard: Guard
) -> None:
    server = ServerSettings(header_timeout_seconds=header, keep_alive_seconds=keep_alive)
    made = uvicorn_options(server, 100)["http"]
    assert made.func is GuardedProtocol and made.keywords == {"guard": guard}
    # several workers get it with uvicorn's Config, pickled: the settings travel with it
    again = pickle.loads(pickle.dumps(guarded(guard)))
    assert again.func is GuardedProtocol and again.keywords == {"guard": guard}
