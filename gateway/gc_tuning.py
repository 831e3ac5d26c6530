"""The garbage collector of a server's worker process: tuned once the app is built.

After start-up, what start-up made (modules, the catalogue) moves out of the collector's sight
(``gc.freeze``) and the young generation is collected after 50,000 net allocations instead of
700. With the defaults, 64 concurrent streams spent ~9% of the CPU collecting: every in-flight
request's objects are young, so a young collection came every ~10 requests at ~0.3 ms, and a
full one (~40 ms over the start-up heap) about once a second. A young collection finds nothing
to free while requests are in flight (their objects are alive), so it is pure cost: at 10,000,
256 connections still spent 5-8% of the CPU in 37-44 young collections per 8 s (up to 20 ms
each); at 50,000, 0.6-0.8%, nearly all of it the periodic collections below, and 64
connections ~0.1% at either (gc.callbacks under wrk, one pinned core).

With young collections that rare, older ones would almost never come, and some garbage is
only found by them: a connection its client reset leaves a reference cycle (the server's
connection objects, held by the traceback of the error that closed it), ~45 objects, ~12 KiB;
requests themselves leave none. So the young and middle generations are collected every
``COLLECT_EVERY`` seconds, and everything every ``FULL_EVERY`` seconds, on the event loop.

A full collection walks every live object, and after a burst that is a lot: right after 5,000
streams the gateway tracked ~540k objects (the idle upstream pool, the cycles of the reset
connections), and each full collection took up to 0.55 s. Every 5 s that was 10-12% of the
CPU, and a 0.5-s stall of every open stream, for as long as the pool stayed large; every 60 s
it is under 1%, while the young and middle collections every 5 s take 2-12 ms in steady
traffic (90 ms right after the burst; ``python -m bench.gc_probe``). The price: garbage that
grew old (the cycle of a long stream reset by its client) waits up to a minute, or until
CPython's own rule for full collections (old objects a quarter more than at the last one)
calls one first.
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
