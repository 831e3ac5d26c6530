"""The garbage collector of a server's worker process: tuned once the app is built.

After start-up, what start-up made (modules, the catalogue) moves out of the collector's sight
(``gc.freeze``) and the young generation is collected after ``GEN0_THRESHOLD`` net
allocations instead of 700: while requests are in flight their objects are alive, so frequent
young collections find nothing to free and only cost CPU.

With young collections that rare, older ones would almost never come, and some garbage is
only found by them (a connection its client reset leaves a reference cycle; requests
themselves leave none). So the young and middle generations are collected every
``COLLECT_EVERY`` seconds, and everything every ``FULL_EVERY`` seconds, on the event loop. A
full collection walks every live object, which after a burst of streams is many: rare full
collections keep that stall rare. The price: garbage that grew old waits up to ``FULL_EVERY``,
or until CPython's own rule for full collections calls one first. The measurements behind
these numbers are in bench/RESULTS.md ("Garbage collection"); ``python -m bench.gc_probe``
measures them again.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable

GEN0_THRESHOLD = 50_000  # net container allocations between young collections (default 700)
COLLECT_EVERY = 5.0  # seconds between collections of the young and middle generations
FULL_EVERY = 60.0  # seconds between full collections

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
    """In a tuned process, the young and middle generations collected every
    ``COLLECT_EVERY`` seconds and all of them every ``FULL_EVERY`` seconds, until the returned
    function is called; elsewhere (tests building apps in-process) nothing."""
    if not _tuned:
        return lambda: None
    handle: asyncio.TimerHandle | None = None
    full_due = loop.time() + FULL_EVERY

    def collect() -> None:
        nonlocal handle, full_due
        if loop.time() >= full_due:
            gc.collect()
            full_due = loop.time() + FULL_EVERY
        else:
            gc.collect(1)
        handle = loop.call_later(COLLECT_EVERY, collect)

    def stop() -> None:
        if handle is not None:
            handle.cancel()

    handle = loop.call_later(COLLECT_EVERY, collect)
    return stop
