"""The usage writer: the one task that moves usage records (and their debits) into the store.

The hot path calls ``submit()``, which never blocks and never awaits: the record goes on an
unbounded queue and its cost is debited from the cache at once, so the next request already sees
the lower balance. One task takes batches off the queue and calls ``store.settle(batch)``. A
failed settle is retried with backoff, with the same batch: records are never dropped (SQLite
settles a batch in one transaction; Redis ignores a record it already holds, so a re-sent batch
never debits twice). Failures are logged as one line with counts and a request id, never a
record's contents.

A store that is down refuses every batch, and the writer waits for it. A store that answers
(``store.version()`` works) yet keeps refusing one batch is refusing something in it: the batch
is split in halves until the record it refuses stands alone, and that record is *parked*. A
parked record stays pending (in memory, in the cache's balance) and is retried on its own every
``PARK_RETRY`` seconds, so one record the store cannot take never holds back the ones after it.

With a ``Journal`` (the app always has one), every record is also on local disk from
``submit()`` until the store holds it: records left pending at a crash, or at a shutdown the
store did not answer, are adopted and settled by the next process to start (``journal``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Sequence

from gateway.store import Store, UsageRecord
from gateway.store.cache import KEY_SLOT, Cache
from gateway.store.cancellation import cancel_and_wait, raise_if_cancelled
from gateway.store.journal import Journal

log = logging.getLogger("gateway.store.writer")

DEFAULT_BATCH = 256
# how long the first record of a batch waits for company, so that the store takes records one
# transaction per batch rather than one per record; the cache is debited at once anyway, and
# flush() cuts the wait short
LINGER = 0.05
RETRY_FIRST = 0.05  # seconds before the first retry, doubling each time
RETRY_MAX = 5.0
STOP_TIMEOUT = 30.0
# with a journal, a shutdown waits this long for a store that is away: the records are on disk
JOURNALED_STOP_TIMEOUT = 5.0
SYNC_INTERVAL = 1.0  # seconds between the journal's syncs to disk
ISOLATE_AFTER = 3  # failed attempts at one batch, with the store answering, before it is split
PARK_RETRY = 30.0  # seconds between retries of a parked record


class UsageWriter:
    def __init__(
        self,
        store: Store,
        cache: Cache | None = None,
        batch: int = DEFAULT_BATCH,
        journal: Journal | None = None,
    ) -> None:
        self._store = store
        self._cache = cache
        self._journal = journal
        self._sync_task: asyncio.Task[None] | None = None
        self._batch = max(1, batch)
        # records not yet taken into a batch; a plain deque (an asyncio.Queue costs a few
        # times more per record), and the future the writer waits on while it is empty
        self._queue: deque[UsageRecord] = deque()
        self._arrival: asyncio.Future[None] | None = None
        self._submitted = 0
        self._written = 0
        self._parked: list[UsageRecord] = []
        self._parked_task: asyncio.Task[None] | None = None
        self._progress = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._urgent = False  # a flush() is waiting: no lingering
        self._waker: asyncio.Future[None] | None = None  # ends the current linger early

    def submit(self, rec: UsageRecord, held: int = 0) -> Awaitable[None] | None:
        """Queue a record and debit its cost from the cache in place of what the request
        ``held``; sync, never blocks. Returns what to await before the reply's last bytes go
        out for the record to survive the process dying, or None when there is nothing to
        wait for (the journal's write is done)."""
        if self._journal is not None:
            self._journal.append(rec)
        self._queue_record(rec, held)
        return None

    def _queue_record(self, rec: UsageRecord, held: int = 0) -> None:
        self._submitted += 1
        self._queue.append(rec)
        if self._arrival is not None:
            _wake(self._arrival)
        if self._cache is not None:
            self._cache.debit(rec.account, rec.key_id, rec.cost, held)

    @property
    def pending(self) -> int:
        """Records submitted and not yet in the store (parked ones included)."""
        return self._submitted - self._written

    def journal_writable(self) -> bool:
        """Whether records submitted now survive a crash: the journal can be written (tried
        again when it could not: ``Journal.check``); True without a journal (nothing to
        lose but what a journal-less writer never had)."""
        return self._journal is None or self._journal.check()

    @property
    def parked(self) -> int:
        """Records the store refused on their own, waiting for a retry of their own."""
        return len(self._parked)

    async def start(self) -> None:
        """Open the journal (adopting what dead processes left in it) and start writing."""
        if self._journal is not None and self._sync_task is None:
            for rec in self._journal.open():
                self._queue_record(rec)
            self._sync_task = asyncio.create_task(self._sync(), name="gateway.journal_sync")
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="gateway.usage_writer")

    async def flush(self) -> None:
        """Return once every record submitted before this call is in the store, or parked
        (every admin call flushes: one record the store refuses must not hang them all)."""
        target = self._submitted
        if self._resolved() < target:
            self._urgent = True
            if self._waker is not None:
                _wake(self._waker)
        while self._resolved() < target:
            if self._task is None:
                batch = self._take(len(self._queue))
                if not batch:
                    return  # lost to a stop() that gave up; it logged them
                await self._write(batch)
                continue
            async with self._progress:
                await self._progress.wait_for(
                    lambda: self._resolved() >= target or self._task is None
                )

    async def stop(self, timeout: float | None = None) -> None:
        """Write everything queued, give each parked record one last try, then stop. If the
        store stays unreachable for ``timeout`` seconds, stop anyway: what is left stays in
        the journal for the next start (without one, it is lost and logged as such)."""
        if timeout is None:
            timeout = STOP_TIMEOUT if self._journal is None else JOURNALED_STOP_TIMEOUT
        if self._task is None and (self._queue or self._parked):
            await self.start()
        task = self._task
        if task is None:
            return
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except TimeoutError:
            pass  # the store stayed down: reported below
        self._task = None
        for running in (task, self._parked_task):
            if running is not None:
                await cancel_and_wait(running)
        self._parked_task = None  # a task cancelled before it ran never reached its finally
        left = deadline - asyncio.get_running_loop().time()
        if self._parked and left > 0:
            try:
                await asyncio.wait_for(self._retry_parked(), left)
            except TimeoutError:
                pass
        journaled = 0
        if self._journal is not None:
            if self._sync_task is not None:
                await cancel_and_wait(self._sync_task)
                self._sync_task = None
            journaled = self._journal.close()
        if journaled:
            log.warning("writer.stop_journaled records=%d", journaled)
        if self.pending > journaled:
            log.error("writer.stop_undelivered records=%d", self.pending - journaled)
        async with self._progress:
            self._progress.notify_all()

    def _resolved(self) -> int:
        """Records written or parked: what flush() waits for (a parked record that is
        written later moves from one count to the other)."""
        return self._written + len(self._parked)

    def _take(self, limit: int) -> list[UsageRecord]:
        queue = self._queue
        return [queue.popleft() for _ in range(min(limit, len(queue)))]

    async def _run(self) -> None:
        while True:
            while not self._queue:
                self._arrival = asyncio.get_running_loop().create_future()
                try:
                    await self._arrival
                finally:
                    self._arrival = None
            if len(self._queue) < self._batch and not self._urgent:
                await self._linger()
            batch = self._take(self._batch)
            if not self._queue:
                self._urgent = False
            await self._write(batch)
            raise_if_cancelled()

    async def _linger(self) -> None:
        """Wait ``LINGER`` seconds, or less if flush() is called: one future that a timer or
        flush() completes, so no task is made per batch."""
        loop = asyncio.get_running_loop()
        waker = self._waker = loop.create_future()
        timer = loop.call_later(LINGER, _wake, waker)
        try:
            await waker
        finally:
            timer.cancel()
            self._waker = None

    async def _write(self, batch: Sequence[UsageRecord]) -> None:
        """Settle one batch, retrying until the store takes it; split it, or park its one
        record, if the store answers but keeps refusing it."""
        if not batch:
            return
        delay = RETRY_FIRST
        attempt = 0
        while True:
            try:
                await self._settle(batch)
                break
            except Exception as exc:
                raise_if_cancelled()
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
                if attempt >= ISOLATE_AFTER and await self._store_answers():
                    if len(batch) == 1:
                        await self._park(batch[0], exc)
                    else:
                        half = len(batch) // 2
                        await self._write(batch[:half])
                        await self._write(batch[half:])
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
        if attempt:
            log.info("writer.settle_recovered records=%d attempts=%d", len(batch), attempt + 1)
        await self._settled(batch)

    async def _settle(self, batch: Sequence[UsageRecord]) -> None:
        """``store.settle``, and the cache told its debits are in the store, with no reload of
        the cache in between (``Cache.settling``)."""
        cache = self._cache
        if cache is None:
            await self._store.settle(batch)
            return
        async with cache.settling():
            await self._store.settle(batch)
            cache.settled(debits(batch))

    async def _settled(self, batch: Sequence[UsageRecord]) -> None:
        """Count a batch the store took, and tell the journal (the records need not be
        kept)."""
        if self._journal is not None:
            self._journal.settled(batch)
        async with self._progress:
            self._written += len(batch)
            self._progress.notify_all()

    async def _store_answers(self) -> bool:
        """Whether the store is up (it answers a read), so a refusal is about the batch."""
        try:
            await self._store.version()
        except Exception:
            raise_if_cancelled()
            return False
        return True

    async def _park(self, rec: UsageRecord, exc: Exception) -> None:
        self._parked.append(rec)
        log.error(
            "writer.parked request_id=%s error=%s parked=%d retry_in=%.0f",
            rec.request_id,
            type(exc).__name__,
            len(self._parked),
            PARK_RETRY,
        )
        if self._parked_task is None:
            self._parked_task = asyncio.create_task(
                self._retry_parked_forever(), name="gateway.usage_writer.parked"
            )
        async with self._progress:
            self._progress.notify_all()

    async def _retry_parked_forever(self) -> None:
        try:
            while self._parked:
                await asyncio.sleep(PARK_RETRY)
                await self._retry_parked()
                if self._journal is not None:
                    self._journal.carry(self._parked)
        finally:
            if asyncio.current_task() is self._parked_task:
                self._parked_task = None

    async def _retry_parked(self) -> None:
        """Try each parked record once, on its own."""
        for rec in list(self._parked):
            try:
                await self._settle([rec])
            except Exception:
                raise_if_cancelled()
                continue
            self._parked.remove(rec)
            log.info("writer.unparked request_id=%s parked=%d", rec.request_id, len(self._parked))
            await self._settled([rec])

    async def _sync(self) -> None:
        """Put the journal on disk about once a second, off the event loop."""
        journal = self._journal
        assert journal is not None
        while True:
            await asyncio.sleep(SYNC_INTERVAL)
            if journal.unsynced:
                await asyncio.to_thread(journal.sync)


def _wake(waker: asyncio.Future[None]) -> None:
    if not waker.done():
        waker.set_result(None)


def debits(batch: Sequence[UsageRecord]) -> dict[str, int]:
    """What a batch debits, per account and per ``KEY_SLOT`` + key id."""
    amounts: dict[str, int] = {}
    for rec in batch:
        if rec.cost:
            amounts[rec.account] = amounts.get(rec.account, 0) + rec.cost
            slot = KEY_SLOT + rec.key_id
            amounts[slot] = amounts.get(slot, 0) + rec.cost
    return amounts
