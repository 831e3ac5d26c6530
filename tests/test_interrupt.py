"""A request's interrupt: the timers' one way to stop a request, read where it lands."""

from __future__ import annotations

import asyncio

import pytest

from gateway.edge.interrupt import BODY_LATE, CLIENT_GONE, UPSTREAM_QUIET, Interrupt


async def _stopped(interrupt_at: list[Interrupt], *causes: str) -> list[str]:
    """A task that awaits until interrupted, reads each cause in turn and goes on."""
    read: list[str] = []
    interrupt = Interrupt(asyncio.current_task())
    interrupt_at.append(interrupt)
    for _ in causes:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            for cause in (UPSTREAM_QUIET, BODY_LATE, CLIENT_GONE):
                if interrupt.absorb(cause):
                    read.append(cause)
                    break
            else:
                raise
    return read


async def test_a_fired_cause_is_read_where_the_cancellation_lands_and_the_task_goes_on() -> None:
    held: list[Interrupt] = []
    task = asyncio.create_task(_stopped(held, CLIENT_GONE))
    await asyncio.sleep(0)
    held[0].fire(CLIENT_GONE)
    assert await asyncio.wait_for(task, 2) == [CLIENT_GONE]
    assert not task.cancelled() and task.cancelling() == 0


async def test_a_second_cause_fired_before_the_first_was_read_stops_the_task_again() -> None:
    """The keep-alive timer woke a stream (quiet) as its client left: the quiet wake is
    read, and the client's departure still stops the request."""
    held: list[Interrupt] = []
    task = asyncio.create_task(_stopped(held, UPSTREAM_QUIET, CLIENT_GONE))
    await asyncio.sleep(0)
    held[0].fire(UPSTREAM_QUIET)
    held[0].fire(CLIENT_GONE)
    assert await asyncio.wait_for(task, 2) == [UPSTREAM_QUIET, CLIENT_GONE]


async def test_a_cancellation_without_a_cause_passes_on() -> None:
    held: list[Interrupt] = []
    task = asyncio.create_task(_stopped(held, CLIENT_GONE))
    await asyncio.sleep(0)
    task.cancel()  # the server shutting down
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)


async def test_a_released_interrupt_fires_no_more() -> None:
    held: list[Interrupt] = []
    task = asyncio.create_task(_stopped(held, CLIENT_GONE))
    await asyncio.sleep(0)
    held[0].release()
    held[0].fire(CLIENT_GONE)
    await asyncio.sleep(0.01)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_one_cause_fires_once() -> None:
    held: list[Interrupt] = []
    task = asyncio.create_task(_stopped(held, BODY_LATE))
    await asyncio.sleep(0)
    held[0].fire(BODY_LATE)
    held[0].fire(BODY_LATE)
    assert await asyncio.wait_for(task, 2) == [BODY_LATE]
    assert task.cancelling() == 0
