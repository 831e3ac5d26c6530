"""ASGI plumbing: the disconnect watcher cancels on a departing client and leaves nothing behind."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from gateway.asgi import DisconnectWatch


async def test_a_departing_client_cancels_the_request_task() -> None:
    gone = asyncio.Event()

    async def receive() -> dict[str, str]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def request() -> None:
        watch = DisconnectWatch(receive, 0.0)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            assert watch.client_gone()
            raise
        finally:
            watch.stop()

    task = asyncio.create_task(request())
    await asyncio.sleep(0)
    gone.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)


async def test_a_stopped_watcher_is_freed_without_a_garbage_collection() -> None:
    """A cancelled watcher's CancelledError holds its frame; if the watch still pointed at
    the task, the cycle lived until a full collection (tens of ms on a large heap)."""
    never = asyncio.Event()

    async def receive() -> dict[str, str]:
        await never.wait()
        return {"type": "http.disconnect"}

    gc.disable()
    try:
        watch = DisconnectWatch(receive, 0.0)
        watcher = weakref.ref(watch._watcher)  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the watcher now waits in receive()
        watch.stop()
        for _ in range(3):
            await asyncio.sleep(0)  # its cancellation runs
        del watch
        assert watcher() is None
    finally:
        gc.enable()
