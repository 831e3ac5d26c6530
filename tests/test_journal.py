"""The settlement journal: records survive a process that dies or stops with the store away,
are adopted and settled once by the next process, and never billed twice."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.store import MICRO, Store, UsageRecord
from gateway.store import writer as writer_module
from gateway.store.journal import SUFFIX, Journal, store_tag
from gateway.store.records import (
    encode_usage,
    journal_line,
    journal_record,
    parse_time_text,
    time_text,
)
from gateway.store.writer import UsageWriter
from tests.test_store import usage_rec

URL = "sqlite:///tmp/x.db"


def files(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"*{SUFFIX}"))


def lines(directory: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in files(directory))


def test_a_settled_segment_is_removed_and_a_pending_one_kept(tmp_path: Path) -> None:
    journal = Journal(tmp_path, URL, segment_bytes=800, settled_rotate_bytes=1)
    assert journal.open() == []
    recs = [usage_rec(i) for i in range(30)]  # ~130 bytes each: several segments
    for rec in recs:
        journal.append(rec)
    assert len(files(tmp_path)) > 3
    assert lines(tmp_path) == 30
    journal.settled(recs[:25])
    # the segments holding only settled records are gone; the rest hold the last five
    assert 5 <= lines(tmp_path) < 15
    assert journal.pending == 5
    journal.settled(recs[25:])
    assert lines(tmp_path) == 0  # the current segment, too, was replaced by an empty one
    assert journal.close() == 0
    assert files(tmp_path) == []


def test_the_current_segment_is_kept_until_it_is_worth_replacing(tmp_path: Path) -> None:
    journal = Journal(tmp_path, URL, settled_rotate_bytes=400)
    journal.open()
    journal.append(first := usage_rec(1))
    journal.settled([first])
    assert lines(tmp_path) == 1  # one settled line: not worth a new file yet
    recs = [usage_rec(i) for i in range(2, 6)]
    for rec in recs:
        journal.append(rec)
    journal.settled(recs)
    assert lines(tmp_path) == 0
    journal.close()


def test_a_dead_process_s_records_are_adopted_once(tmp_path: Path) -> None:
    dead = Journal(tmp_path, URL, segment_bytes=800)
    dead.open()
    recs = [usage_rec(i) for i in range(12)]
    for rec in recs:
        dead.append(rec)
    dead.settled(recs[:2])
    assert dead.close() == 10  # what a crash leaves (the files stay, unlocked)

    heir = Journal(tmp_path, URL)
    adopted = heir.open()
    ids = [r.request_id for r in adopted]
    # every pending record, once; settled ones sharing a segment with them may come along
    # (the store ignores a record it holds)
    assert len(ids) == len(set(ids))
    assert {r.request_id for r in recs[2:]} <= set(ids) <= {r.request_id for r in recs}
    assert adopted[ids.index("req-alice-5")] == recs[5]  # every field, exactly
    assert lines(tmp_path) == len(ids)  # now in the heir's own segment only
    other = Journal(tmp_path, URL)
    assert other.open() == []  # held by the live heir: not adopted again
    other.close()
    heir.settled(adopted)
    heir.close()
    assert files(tmp_path) == []


def test_another_store_s_journal_is_left_alone(tmp_path: Path) -> None:
    other = Journal(tmp_path, "redis://127.0.0.1:6379/5")
    other.open()
    other.append(usage_rec(1))
    other.close()
    assert Journal(tmp_path, URL).open() == []
    assert store_tag("redis://:secret@h:1/0") == store_tag("redis://h:1/0")
    assert store_tag("redis://h:1/0") != store_tag("redis://h:1/1")


def test_a_line_cut_short_is_skipped(tmp_path: Path) -> None:
    dead = Journal(tmp_path, URL)
    dead.open()
    dead.append(usage_rec(1))
    dead.close()
    (path,) = files(tmp_path)
    with path.open("ab") as f:
        f.write(b'["2026-11-')  # a power cut in the middle of a write
    adopted = Journal(tmp_path, URL).open()
    assert [r.request_id for r in adopted] == ["req-alice-1"]


def test_a_journal_of_json_objects_from_an_older_version_is_adopted(tmp_path: Path) -> None:
    """Before the journal wrote arrays, it wrote each record as Redis stores it: a journal
    left by that version at a crash is still settled after an upgrade."""
    recs = [usage_rec(i) for i in range(3)]
    old = tmp_path / f"{store_tag(URL)}-1-abcdef-1{SUFFIX}"
    old.write_bytes(b"".join(encode_usage(r) + b"\n" for r in recs))
    assert Journal(tmp_path, URL).open() == recs


@pytest.mark.parametrize(
    "at",
    [
        datetime(2026, 11, 25, 19, 49, 23, 823224, tzinfo=UTC),
        datetime(2026, 11, 25, 19, 49, 23, tzinfo=UTC),  # no microseconds: none written
        datetime(2026, 11, 25, 19, 49, 23, 5),  # naive: taken as UTC
        datetime(2026, 11, 25, 20, 49, 23, 5, tzinfo=timezone(timedelta(hours=1))),
    ],
)
def test_a_record_s_time_is_written_as_exact_utc_text(at: datetime) -> None:
    rec = replace(usage_rec(1), time=at)
    text = time_text(at)
    assert text.endswith("Z") and datetime.fromisoformat(text) == at.replace(
        tzinfo=at.tzinfo or UTC
    )
    # the bytes Redis recognises a record by: the time as time_text, every time
    assert orjson.loads(encode_usage(rec))["time"] == text
    assert encode_usage(rec) == encode_usage(replace(rec, time=parse_time_text(text)))
    line = journal_line(rec)
    assert orjson.loads(line)[0] == text and line.endswith(b"\n")
    assert journal_record(line) == replace(rec, time=parse_time_text(text))


def test_parked_records_are_carried_so_old_segments_go(tmp_path: Path) -> None:
    journal = Journal(tmp_path, URL, segment_bytes=1_000)
    journal.open()
    recs = [usage_rec(i) for i in range(10)]
    for rec in recs:
        journal.append(rec)
    journal.settled(recs[1:])  # recs[0] stays (parked): its old segment stays too
    assert len(files(tmp_path)) == 2
    journal.carry([recs[0]])
    (left,) = files(tmp_path)
    assert b'"req-alice-0"' in left.read_bytes()
    journal.close()
    heir = Journal(tmp_path, URL)
    assert "req-alice-0" in [r.request_id for r in heir.open()]
    heir.close()


class DownStore:
    """A store that refuses every settle and every read, as Redis when it is stopped."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    async def settle(self, records: Sequence[UsageRecord]) -> None:
        raise ConnectionError("store unreachable")

    async def version(self) -> int:
        raise ConnectionError("store unreachable")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_stop_with_the_store_down_keeps_records_for_the_next_start(
    store: Store, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM while the store is away: nothing is lost, the next start settles it all once."""
    monkeypatch.setattr(writer_module, "RETRY_MAX", 0.05)
    await store.create_account("alice", 10 * MICRO)
    first = UsageWriter(DownStore(store), journal=Journal(tmp_path, store_url))  # type: ignore[arg-type]
    await first.start()
    recs = [usage_rec(i, cost=1_000) for i in range(50)]
    for rec in recs:
        first.submit(rec)
    await first.stop(timeout=0.3)
    assert lines(tmp_path) == 50

    # a record or two made it to the store before the outage: the replay must not bill again
    await store.settle(recs[:2])
    second = UsageWriter(store, journal=Journal(tmp_path, store_url))
    await second.start()
    await second.flush()
    await second.stop()
    got = await store.get_account("alice")
    assert got is not None and got.balance == 10 * MICRO - 50 * 1_000
    stored = await store.usage(limit=1_000)
    assert sorted(r.request_id for r in stored) == sorted(r.request_id for r in recs)
    assert files(tmp_path) == []


async def test_settling_a_record_twice_bills_it_once(store: Store) -> None:
    await store.create_account("alice", 10 * MICRO)
    recs = [usage_rec(i, cost=1_000) for i in range(5)]
    await store.settle(recs[:3])
    await store.settle(recs)
    got = await store.get_account("alice")
    assert got is not None and got.balance == 10 * MICRO - 5_000
    assert len(await store.usage(limit=100)) == 5


async def test_the_journal_is_written_before_submit_returns(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    """What a SIGKILL the instant after submit() leaves: the record, on disk."""
    writer = UsageWriter(store, journal=Journal(tmp_path, store_url))
    await writer.start()
    try:
        writer.submit(usage_rec(1))
        assert lines(tmp_path) == 1  # no await in between
    finally:
        await writer.stop()
    assert files(tmp_path) == []


async def test_the_journal_is_synced_in_the_background(
    store: Store, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "SYNC_INTERVAL", 0.01)
    synced = asyncio.Event()
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        real(fd)
        synced.set()

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    writer = UsageWriter(store, journal=Journal(tmp_path, store_url))
    await writer.start()
    try:
        writer.submit(usage_rec(1))
        await asyncio.wait_for(synced.wait(), 10)
    finally:
        await writer.stop()
