"""ASGI plumbing: the disconnect watcher cancels on a departing client and leaves nothing behind."""

from __future__ import annotations

import asyncio
import gc
import weakref

from gateway.edge.asgi import WATCH_TICK, Watchlist
from gateway.edge.interrupt import CLIENT_GONE, Interrupt


async def test_a_departing_client_cancels_the_request_task() -> None:
    gone = asyncio.Event()

    async def receive() -> dict[str, str]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def request() -> str:
        interrupt = Interrupt(asyncio.current_task())
        watch = Watchlist().watch(receive, 0.0, interrupt)
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            assert interrupt.absorb(CLIENT_GONE)
            return "stopped: client gone"
        finally:
            watch.stop()
        return "slept"

    task = asyncio.create_task(request())
    await asyncio.sleep(0)
    gone.set()
    assert await asyncio.wait_for(task, 2) == "stopped: client gone"


async def test_a_stopped_watcher_is_freed_without_a_garbage_collection() -> None:
    """A cancelled watcher's CancelledError holds its frame; if the watch still pointed at
    the task, the cycle lived until a full collection (tens of ms on a large heap)."""
    never = asyncio.Event()

    async def receive() -> dict[str, str]:
        await never.wait()
        return {"type": "http.disconnect"}

    gc.disable()
    try:
        watch = Watchlist().watch(receive, 0.0, Interrupt(asyncio.current_task()))
        watcher = weakref.ref(watch._watcher)  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the watcher now waits in receive()
        watch.stop()
        for _ in range(3):
            await asyncio.sleep(0)  # its cancellation runs
        del watch
        assert watcher() is None
    finally:
        gc.enable()


async def test_a_watch_starts_after_its_delay_and_a_stopped_one_never_does() -> None:
    never = asyncio.Event()
    calls: list[str] = []

    async def receive() -> dict[str, str]:
        calls.append("receive")
        await never.wait()
        return {"type": "http.disconnect"}

    watchlist = Watchlist()
    interrupt = Interrupt(asyncio.current_task())
    late = watchlist.watch(receive, 0.2, interrupt)
    early = watchlist.watch(receive, 0.2, interrupt)
    early.stop()  # a request that ended before its delay
    await asyncio.sleep(0.1)
    assert calls == [] and late._watcher is None
    await asyncio.sleep(0.1 + 2 * WATCH_TICK)
    assert calls == ["receive"] and late._watcher is not None and early._watcher is None
    late.stop()
    await asyncio.sleep(0)


async def test_watches_of_two_delays_start_each_after_its_own() -> None:
    never = asyncio.Event()
    started: list[float] = []

    async def receive() -> dict[str, str]:
        started.append(asyncio.get_running_loop().time())
        await never.wait()
        return {"type": "http.disconnect"}

    watchlist = Watchlist()
    t0 = asyncio.get_running_loop().time()
    interrupt = Interrupt(asyncio.current_task())
    watches = [watchlist.watch(receive, 0.3, interrupt), watchlist.watch(receive, 0.1, interrupt)]
    await asyncio.sleep(0.3 + 2 * WATCH_TICK)
    assert len(started) == 2
    assert 0.1 <= started[0] - t0 < 0.3 <= started[1] - t0
    for w in watches:
        w.stop()
    await asyncio.sleep(0)
