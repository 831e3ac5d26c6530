"""The settlement journal: each usage record on local disk from the moment it is billed until
the store holds it, so that neither a crash nor a store outage loses one.

``UsageWriter.submit()`` appends the record here (one ``write()`` of one JSON line, before the
reply's last bytes go out) and tells the journal once the store has taken it. A process that
dies leaves its segments behind; the next process to start on the same store and directory
*adopts* them: it copies their records into its own journal, removes them, and its writer
settles the records. The store ignores a record it already holds (Redis by ``ZADD NX`` on the
record, SQLite by request id), so a record settled just before the crash is not billed twice.

Files are ``<dir>/<store tag>-<pid>-<random>-<n>.journal``; the store tag (a hash of the store
URL) keeps a journal from being replayed into another store. A live process holds an
exclusive ``flock`` on every segment it writes, so another worker never adopts them. A segment
is rotated at ``SEGMENT_BYTES`` and removed once none of its records is pending; records the
store keeps refusing (parked by the writer) are carried into the current segment so old ones
can go.

Durability: ``write()`` hands the line to the kernel, so it survives the process being killed
at any instant. A power cut or kernel crash can lose what the kernel had not written to disk
yet: ``sync()``, which the writer calls about once a second off the event loop, bounds that.

A journal that cannot be written (a full or read-only disk) keeps the records in memory only,
and a crash then loses them: ``writable`` says so, for readiness, the metrics and the admin
API, and ``check()`` tries again with a blank line (which a reader skips), so that the journal
is seen writable again once the disk is, even with no request coming (a drained instance).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gateway.store import UsageRecord
from gateway.store.records import journal_line, journal_record

log = logging.getLogger("gateway.store.journal")

SEGMENT_BYTES = 8 * 1024 * 1024
# a segment whose records are all in the store is replaced once it is this large, so that a
# crash leaves little already settled for the next process to read
SETTLED_ROTATE_BYTES = 64 * 1024
SUFFIX = ".journal"


def store_tag(store_url: str) -> str:
    """A short name for the store a journal belongs to (its URL without a password; a SQLite
    path made absolute)."""
    url = re.sub(r"//[^/@]*@", "//", store_url)
    if url.startswith("sqlite:///"):
        url = "sqlite:///" + os.path.abspath(url[len("sqlite:///") :])
    return hashlib.sha256(url.encode()).hexdigest()[:12]


@dataclass(slots=True)
class _Segment:
    path: Path
    fd: int
    size: int = 0
    pending: int = 0  # records appended here and not yet in the store


class Journal:
    def __init__(
        self,
        directory: str | os.PathLike[str],
        store_url: str,
        segment_bytes: int = SEGMENT_BYTES,
        settled_rotate_bytes: int = SETTLED_ROTATE_BYTES,
    ) -> None:
        self._dir = Path(directory)
        self._tag = store_tag(store_url)
        self._segment_bytes = segment_bytes
        self._settled_rotate_bytes = settled_rotate_bytes
        self._prefix = f"{self._tag}-{os.getpid()}-{os.urandom(3).hex()}-"
        self._count = 0  # segments opened by this process
        self._segments: dict[int, _Segment] = {}
        self._current: _Segment | None = None
        self._segment_of: dict[str, int] = {}  # request id -> the segment holding it
        self._unsynced = False
        self._failing = False

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def unsynced(self) -> bool:
        """Something was written since the last ``sync()``."""
        return self._unsynced

    @property
    def pending(self) -> int:
        """Records in this process's journal that the store does not hold yet."""
        return len(self._segment_of)

    def open(self) -> list[UsageRecord]:
        """Create the directory and the first segment; adopt the segments of processes that
        died (their records are returned, already appended to this journal)."""
        self._dir.mkdir(parents=True, exist_ok=True)
        self._current = self._new_segment()
        adopted: list[UsageRecord] = []
        for path in sorted(self._dir.glob(f"{self._tag}-*{SUFFIX}")):
            if path.name.startswith(self._prefix):
                continue
            records = self._adopt(path)
            if records is None:
                continue
            fresh = [r for r in records if r.request_id not in self._segment_of]
            for rec in fresh:  # a carried record is in two segments of its process
                self.append(rec)
            self.sync()
            path.unlink(missing_ok=True)
            adopted.extend(fresh)
            log.warning("journal.adopted file=%s records=%d", path.name, len(fresh))
        return adopted

    @property
    def writable(self) -> bool:
        """The last write (or sync) succeeded: a record submitted now survives a crash."""
        return not self._failing

    def check(self) -> bool:
        """Whether the journal can be written, trying a blank line when the last write
        failed (off the hot path: readiness probes, metrics, the admin API)."""
        seg = self._current
        if self._failing and seg is not None:
            try:
                _write_all(seg.fd, b"\n")
            except OSError:
                return False
            seg.size += 1
            self._recovered()
        return not self._failing

    def append(self, rec: UsageRecord) -> None:
        """Write one record (sync: one ``write()``). A disk that refuses it is logged, once
        per spell, and the journal is not ``writable`` until a write succeeds again; the
        record still goes to the store from memory."""
        seg = self._current
        if seg is None:
            return
        line = journal_line(rec)
        try:
            _write_all(seg.fd, line)
        except OSError as exc:
            self._failed("write", exc)
            return
        if self._failing:
            self._recovered()
        self._unsynced = True
        seg.size += len(line)
        seg.pending += 1
        n = self._count
        self._segment_of[rec.request_id] = n
        if seg.size >= self._segment_bytes:
            try:
                self._current = self._new_segment()
            except OSError as exc:  # no room for a new file: this one goes on
                self._failed("rotate", exc)

    def _failed(self, what: str, exc: OSError) -> None:
        if not self._failing:
            log.error(
                "journal.%s_failed error=%s directory=%s: usage records are not crash-safe",
                what,
                errno.errorcode.get(exc.errno or 0, exc.errno),
                self._dir,
            )
        self._failing = True

    def _recovered(self) -> None:
        log.info("journal.write_recovered")
        self._failing = False

    def settled(self, records: Iterable[UsageRecord]) -> None:
        """The store holds these records: a segment left with none pending is removed."""
        for rec in records:
            n = self._segment_of.pop(rec.request_id, None)
            if n is not None:
                self._release(n)

    def carry(self, records: Iterable[UsageRecord]) -> None:
        """Append records still pending in older segments (parked ones) to the current one,
        so that the old segments can be removed."""
        current = self._count
        for rec in records:
            n = self._segment_of.get(rec.request_id)
            if n is None or n == current:
                continue
            self.append(rec)
            if self._segment_of.get(rec.request_id) != n:
                self._release(n)

    def _release(self, n: int) -> None:
        """One record of segment ``n`` is no longer pending there."""
        seg = self._segments.get(n)
        if seg is None:
            return
        seg.pending -= 1
        if seg.pending:
            return
        if seg is not self._current:
            self._remove(n)
        elif seg.size >= self._settled_rotate_bytes:
            self._current = self._new_segment()  # removes this one

    def sync(self) -> None:
        """Ask the kernel to put what was written on the disk (blocking: call it off the
        event loop, or at start-up and shutdown)."""
        if not self._unsynced or self._current is None:
            return
        self._unsynced = False
        for seg in list(self._segments.values()):
            try:
                os.fdatasync(seg.fd)
            except OSError as exc:  # what was written may not reach the disk
                self._unsynced = True
                self._failed("sync", exc)

    def close(self) -> int:
        """Stop journaling. Segments with nothing pending are removed; the others are left
        for the next process to adopt. Returns how many records were left."""
        left = self.pending
        if left:
            self.sync()
        for n in list(self._segments):
            if self._segments[n].pending == 0:
                self._remove(n)
            else:
                os.close(self._segments.pop(n).fd)
        self._current = None
        if left:
            log.warning("journal.left records=%d directory=%s", left, self._dir)
        return left

    def _new_segment(self) -> _Segment:
        self._count += 1
        path = self._dir / f"{self._prefix}{self._count}{SUFFIX}"
        # made under another name, locked, then renamed: another process starting now never
        # sees the segment unlocked (it would take it for a dead process's and remove it)
        making = path.with_suffix(".new")
        fd = os.open(making, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(making, path)
        seg = _Segment(path, fd)
        old = self._current
        self._segments[self._count] = seg
        if old is not None and old.pending == 0:
            self._remove(self._count - 1)
        return seg

    def _remove(self, n: int) -> None:
        seg = self._segments.pop(n)
        seg.path.unlink(missing_ok=True)
        os.close(seg.fd)

    @staticmethod
    def _adopt(path: Path) -> list[UsageRecord] | None:
        """The records of a dead process's segment, or None when a live process holds it."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None  # its process is alive
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
        finally:
            os.close(fd)
        records: list[UsageRecord] = []
        unreadable = 0
        for line in data.split(b"\n"):
            if not line:
                continue
            try:
                records.append(journal_record(line))
            except Exception:
                unreadable += 1  # a line cut short by a power cut: its reply was never sent
        if unreadable:
            log.error("journal.unreadable_lines file=%s lines=%d", path.name, unreadable)
        return records


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
