"""The garbage collector of a server's worker process: tuned once the app is built.

After start-up, what start-up made (modules, the catalogue) moves out of the collector's sight
(``gc.freeze``) and the young generation is collected after 50,000 net allocations instead of
700. With the defaults, 64 concurrent streams spent ~9% of the CPU collecting: every in-flight
request's objects are young, so a young collection came every ~10 requests at ~0.3 ms, and a
full one (~40 ms over the start-up heap) about once a second. A young collection finds nothing
to free while requests are in flight (their objects are alive), so it is pure cost: at 10,000,
256 connections still spent 5-8% of the CPU in 37-44 young collections per 8 s (up to 20 ms
each); at 50,000, 0.6-0.8%, nearly all of it the periodic full collections below, and 64
connections ~0.1% at either (gc.callbacks under wrk, one pinned core).

With young collections that rare, full ones would almost never come, and some garbage is only
found by them: a connection that lived long enough to grow old and then closed leaves a
reference cycle (the server's connection objects, held by the traceback of the error that
closed it), ~12 KiB each. So a full collection runs every ``FULL_EVERY`` seconds, on the
event loop, over what was allocated since start-up.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

GEN0_THRESHOLD = 50_000  # net container allocations between young collections (default 700)
FULL_EVERY = 5.0  # seconds between full collections once tuned

_tuned = False


def tune_gc() -> None:
    """Freeze what start-up made and collect young objects less often (module docstring)."""
    global _tuned
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, GEN0_THRESHOLD), gen1, gen2)
    _tuned = True


def collect_periodically(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """In a tuned process, a full collection every ``FULL_EVERY`` seconds until the returned
    function is called; elsewhere (tests building apps in-process) nothing."""
    if not _tuned:
        return lambda: None
    handle: asyncio.TimerHandle | None = None

    def collect() -> None:
        nonlocal handle
        gc.collect()
        handle = loop.call_later(FULL_EVERY, collect)

    def stop() -> None:
        if handle is not None:
            handle.cancel()

    handle = loop.call_later(FULL_EVERY, collect)
    return stop
