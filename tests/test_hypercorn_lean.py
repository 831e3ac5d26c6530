"""The leaner app queue and events the gateway gives hypercorn (``server.hypercorn_lean``)
keep ``asyncio.Queue``'s and ``asyncio.Event``'s behaviour as hypercorn uses them: first in
first out, a bound that makes ``put`` wait, nothing lost to a cancelled getter, every waiter
woken by ``set``; and under the mends hypercorn makes its queues and events of them, a
connection's writer waits for the socket to drain as before without its deque, and its read
loop reads what the client sends and ends as before: at the client's close, or at hypercorn's
``read_timeout`` when one is set, without ``asyncio.wait_for``'s coroutine when none is."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from hypercorn.asyncio import task_group, tcp_server
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.asyncio.worker_context import WorkerContext
from hypercorn.config import Config
from hypercorn.events import Closed, RawData

from gateway.server import mends
from gateway.server.hypercorn_lean import (
    LEAN_APP_QUEUE,
    LEAN_DRAIN_WAITERS,
    LEAN_EVENTS,
    LEAN_READ,
    AppQueue,
    LeanEvent,
)


async def test_the_queue_is_first_in_first_out_and_bounded() -> None:
    queue = AppQueue(2)
    await queue.put(1)
    await queue.put(2)
    third = asyncio.create_task(queue.put(3))
    await asyncio.sleep(0)
    assert not third.done()  # full: the put waits for a get
    assert await queue.get() == 1
    await third
    assert [await queue.get(), await queue.get()] == [2, 3]


async def test_a_getter_waits_for_a_put() -> None:
    queue = AppQueue(10)
    getter = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    assert not getter.done()
    await queue.put({"type": "http.disconnect"})
    assert await getter == {"type": "http.disconnect"}


async def test_a_getter_cancelled_after_it_was_woken_loses_nothing() -> None:
    queue = AppQueue(10)
    first = asyncio.create_task(queue.get())
    second = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    await queue.put("item")  # wakes the first getter, which is cancelled before it runs
    first.cancel()
    assert await second == "item"
    assert first.cancelled()


async def test_a_cancelled_getter_is_forgotten() -> None:
    queue = AppQueue(10)
    gone = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    later = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    await queue.put("item")
    assert await later == "item"


async def test_a_cancelled_put_leaves_the_queue_as_it_was() -> None:
    queue = AppQueue(1)
    await queue.put(1)
    waiting = asyncio.create_task(queue.put(2))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.sleep(0)
    assert await queue.get() == 1
    await queue.put(3)
    assert await queue.get() == 3


async def test_the_event_wakes_every_waiter_and_clears() -> None:
    event = LeanEvent()
    assert not event.is_set()
    waiters = [asyncio.create_task(event.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    await event.set()
    await asyncio.gather(*waiters)
    assert event.is_set()
    await event.wait()  # set: returns at once
    await event.clear()
    assert not event.is_set()
    late = asyncio.create_task(event.wait())
    await asyncio.sleep(0)
    late.cancel()  # a waiter cancelled is forgotten
    await asyncio.sleep(0)
    await event.set()


@pytest.fixture
def lean() -> Iterator[None]:
    saved = task_group.asyncio, WorkerContext.event_class, TCPServer.__init__, tcp_server.asyncio
    for mend in (LEAN_APP_QUEUE, LEAN_EVENTS, LEAN_DRAIN_WAITERS, LEAN_READ):
        mends.put_in_place(mend)
    yield
    task_group.asyncio, WorkerContext.event_class, TCPServer.__init__, tcp_server.asyncio = saved


async def test_under_the_mends_hypercorn_makes_them(lean: None) -> None:
    received = []

    async def app(scope: object, receive: object, send: object, *_: object) -> None:
        received.append(await receive())  # type: ignore[operator]

    async def send(event: object) -> None:
        pass

    assert isinstance(WorkerContext(None).terminated, LeanEvent)
    async with task_group.TaskGroup(asyncio.get_running_loop()) as group:
        put = await group.spawn_app(app, Config(), {"type": "http"}, send)  # type: ignore[arg-type]
        assert isinstance(put.__self__, AppQueue)  # type: ignore[attr-defined]
        await put({"type": "http.request", "body": b"", "more_body": False})
    assert received == [{"type": "http.request", "body": b"", "more_body": False}]


async def test_under_the_mends_a_connection_drains_as_before(lean: None) -> None:
    drained: list[bool] = []

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        TCPServer(None, loop, Config(), WorkerContext(None), None, reader, writer)  # type: ignore[arg-type]
        protocol: asyncio.Protocol = writer.transport.get_protocol()  # type: ignore[assignment]
        protocol.pause_writing()  # the socket's buffer full: a drain waits
        waiting = asyncio.create_task(writer.drain())
        await asyncio.sleep(0)
        drained.append(waiting.done())
        protocol.resume_writing()
        await waiting
        drained.append(waiting.done())
        writer.close()

    listener = await asyncio.start_server(connected, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(100):
        if len(drained) == 2:
            break
        await asyncio.sleep(0.01)
    writer.close()
    listener.close()
    assert drained == [False, True]


class Recorder:
    """A connection's protocol that keeps what the read loop hands it."""

    def __init__(self) -> None:
        self.events: list[object] = []

    async def handle(self, event: object) -> None:
        self.events.append(event)


REQUEST = b"GET / HTTP/1.1\r\n"


@pytest.mark.parametrize(
    ("read_timeout", "client_closes", "seen"),
    [
        (None, True, [RawData(REQUEST), RawData(b""), Closed()]),  # the client's close ends it
        (0.2, False, [RawData(REQUEST), Closed()]),  # the timeout ends it
        (5.0, True, [RawData(REQUEST), RawData(b""), Closed()]),  # a timeout not reached
    ],
)
@pytest.mark.parametrize("mended", [False, True])
async def test_under_the_mends_a_connection_reads_as_before(
    request: pytest.FixtureRequest,
    mended: bool,
    read_timeout: float | None,
    client_closes: bool,
    seen: list[object],
) -> None:
    if mended:
        request.getfixturevalue("lean")
    ended: asyncio.Future[list[object]] = asyncio.get_running_loop().create_future()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        config = Config()
        config.read_timeout = read_timeout
        loop = asyncio.get_running_loop()
        server = TCPServer(None, loop, config, WorkerContext(None), None, reader, writer)  # type: ignore[arg-type]
        server.protocol = recorder = Recorder()  # type: ignore[assignment]
        await server._read_data()
        ended.set_result(recorder.events)
        writer.close()

    listener = await asyncio.start_server(connected, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(REQUEST)
    await writer.drain()
    await asyncio.sleep(0.05)
    if client_closes:
        writer.close()
    try:
        assert await asyncio.wait_for(ended, 10) == seen
    finally:
        writer.close()
        listener.close()
