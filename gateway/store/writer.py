"""The usage writer: the one task that moves usage records (and their debits) into the store.

The hot path calls ``submit()``, which never blocks and never awaits: the record goes on an
unbounded queue and its cost is debited from the cache at once, so the next request already sees
the lower balance. One task takes batches off the queue and calls ``store.settle(batch)``. A
failed settle is retried with backoff, forever, with the same batch: records are never dropped
(SQLite settles a batch in one transaction; Redis ignores a record it already holds, so a
re-sent batch never debits twice). Failures are logged as one line with counts and a request
id, never a record's contents.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from gateway.store import Store, UsageRecord
from gateway.store.cache import Cache

log = logging.getLogger("gateway.store.writer")

DEFAULT_BATCH = 256
# how long the first record of a batch waits for company: one transaction per record costs
# ~0.5 ms of CPU here, one per batch a fraction of that; the cache is debited at once anyway,
# and flush() cuts the wait short
LINGER = 0.05
RETRY_FIRST = 0.05  # seconds before the first retry, doubling each time
RETRY_MAX = 5.0
STOP_TIMEOUT = 30.0


class UsageWriter:
    def __init__(
        self, store: Store, cache: Cache | None = None, batch: int = DEFAULT_BATCH
    ) -> None:
        self._store = store
        self._cache = cache
        self._batch = max(1, batch)
        self._queue: asyncio.Queue[UsageRecord] = asyncio.Queue()
        self._submitted = 0
        self._written = 0
        self._progress = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._urgent = False  # a flush() is waiting: no lingering
        self._waker: asyncio.Future[None] | None = None  # ends the current linger early

    def submit(self, rec: UsageRecord) -> None:
        """Queue a record and debit its cost from the cache; sync, never blocks."""
        self._submitted += 1
        self._queue.put_nowait(rec)
        if self._cache is not None:
            self._cache.debit(rec.account, rec.cost)

    @property
    def pending(self) -> int:
        """Records submitted and not yet in the store."""
        return self._submitted - self._written

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="gateway.usage_writer")

    async def flush(self) -> None:
        """Return once every record submitted before this call is in the store."""
        target = self._submitted
        if self._written < target:
            self._urgent = True
            if self._waker is not None:
                _wake(self._waker)
        while self._written < target:
            if self._task is None:
                batch = self._take(self._queue.qsize())
                if not batch:
                    return  # lost to a stop() that gave up; it logged them
                await self._write(batch)
                continue
            async with self._progress:
                await self._progress.wait_for(lambda: self._written >= target or self._task is None)

    async def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Write everything queued, then stop the task. If the store stays unreachable for
        ``timeout`` seconds, log how many records could not be written and stop anyway."""
        task = self._task
        if task is None:
            if self._queue.qsize():
                await self.start()
                task = self._task
            if task is None:
                return
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except TimeoutError:
            pass  # the store stayed down: reported below
        self._task = None
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            if _cancelling():
                raise
        if self.pending:
            log.error("writer.stop_undelivered records=%d", self.pending)
        async with self._progress:
            self._progress.notify_all()

    def _take(self, limit: int) -> list[UsageRecord]:
        batch: list[UsageRecord] = []
        while len(batch) < limit:
            try:
                batch.append(self._queue.get_nowait())
            except asyncio.QueueEmpty:
                break
        return batch

    async def _run(self) -> None:
        while True:
            first = await self._queue.get()
            if self._queue.qsize() < self._batch - 1 and not self._urgent:
                await self._linger()
            batch = [first, *self._take(self._batch - 1)]
            if self._queue.empty():
                self._urgent = False
            await self._write(batch)
            _raise_if_cancelled()

    async def _linger(self) -> None:
        """Wait ``LINGER`` seconds, or less if flush() is called: one future and one timer
        (``asyncio.wait_for`` on an event made a task and cancelled it, every batch)."""
        loop = asyncio.get_running_loop()
        waker = self._waker = loop.create_future()
        timer = loop.call_later(LINGER, _wake, waker)
        try:
            await waker
        finally:
            timer.cancel()
            self._waker = None

    async def _write(self, batch: Sequence[UsageRecord]) -> None:
        """Settle one batch, retrying until the store takes it."""
        if not batch:
            return
        delay = RETRY_FIRST
        attempt = 0
        while True:
            try:
                await self._store.settle(batch)
                break
            except Exception as exc:
                _raise_if_cancelled()
                attempt += 1
                log.warning(
                    "writer.settle_failed records=%d first_request_id=%s attempt=%d "
                    "retry_in=%.2f error=%s",
                    len(batch),
                    batch[0].request_id,
                    attempt,
                    delay,
                    type(exc).__name__,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
        if attempt:
            log.info("writer.settle_recovered records=%d attempts=%d", len(batch), attempt + 1)
        if self._cache is not None:
            amounts: dict[str, int] = {}
            for rec in batch:
                if rec.cost:
                    amounts[rec.account] = amounts.get(rec.account, 0) + rec.cost
            self._cache.settled(amounts)
        async with self._progress:
            self._written += len(batch)
            self._progress.notify_all()


def _wake(waker: asyncio.Future[None]) -> None:
    if not waker.done():
        waker.set_result(None)


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _raise_if_cancelled() -> None:
    """Some clients (redis-py's pipelines) swallow a cancellation that lands mid-command; a
    task that was cancelled must still stop, so check after every store call."""
    if _cancelling():
        raise asyncio.CancelledError
