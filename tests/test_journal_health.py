"""A settlement journal that cannot be written (a full or read-only disk) is not silent: the
instance stops being ready, ``gateway_journal_writable`` says 0 and the admin API's daily
totals (the console's overview) say so, until the disk takes a write again, with no request
needed to find out. Simulated with ``os.write`` failing with ENOSPC (in process)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from gateway.store.journal import Journal
from tests.plugins.inprocess import ADMIN_TOKEN, InProcess, Scripted
from tests.test_journal import URL
from tests.test_pipeline import CHAT, openai_reply
from tests.test_store import usage_rec

REAL_WRITE = os.write


def full_disk(fd: int, data: Any) -> int:
    raise OSError(errno.ENOSPC, "No space left on device")


async def journal_state(app: InProcess) -> tuple[int, Any, str, bool]:
    """(/readyz status, its body, the metric's line, the admin API's journal.writable)."""
    ready = await app.get("/readyz")
    metrics = (await app.get("/metrics")).body.decode()
    [line] = [x for x in metrics.splitlines() if x.startswith("gateway_journal_writable ")]
    daily = await app.get("/admin/usage/daily", authorization=f"Bearer {ADMIN_TOKEN}")
    assert daily.status == 200, daily.body
    return ready.status, ready.json(), line, daily.json()["journal"]["writable"]


async def test_a_journal_that_cannot_be_written_makes_the_instance_unready(
    inproc: InProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    inproc.upstream.answer("oa", *[Scripted.json(openai_reply("fine"))] * 2)
    assert (await inproc.post("/v1/chat/completions", CHAT)).status == 200
    status, body, metric, writable = await journal_state(inproc)
    assert (status, metric, writable) == (200, "gateway_journal_writable 1.0", True)

    monkeypatch.setattr("gateway.store.journal.os.write", full_disk)
    reply = await inproc.post("/v1/chat/completions", CHAT)
    assert reply.status == 200  # served all the same: the record goes to the store from memory
    status, body, metric, writable = await journal_state(inproc)
    assert status == 503 and body["journal"] == "not writable"
    assert (metric, writable) == ("gateway_journal_writable 0.0", False)
    await inproc.settled()
    assert len(await inproc.services.store.usage("alice", 10)) == 2  # nothing was lost

    monkeypatch.setattr("gateway.store.journal.os.write", REAL_WRITE)  # room again
    status, body, metric, writable = await journal_state(inproc)  # no request in between
    assert (status, metric, writable) == (200, "gateway_journal_writable 1.0", True)


def test_a_journal_is_unwritable_from_a_failed_write_until_one_succeeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path, URL)
    journal.open()
    a, b, c = usage_rec(1), usage_rec(2), usage_rec(3)
    journal.append(a)
    assert journal.writable and journal.check()
    monkeypatch.setattr("gateway.store.journal.os.write", full_disk)
    journal.append(b)
    assert not journal.writable and not journal.check()
    monkeypatch.setattr("gateway.store.journal.os.write", REAL_WRITE)
    assert journal.check() and journal.writable  # a blank line, which readers skip
    journal.append(c)
    os.close(journal._current.fd)  # type: ignore[union-attr]  # dies: its lock goes
    adopted = Journal(tmp_path, URL)
    found = adopted.open()
    assert sorted(r.request_id for r in found) == sorted([a.request_id, c.request_id])
    adopted.close()


def test_a_segment_that_cannot_be_made_leaves_the_journal_unwritable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal(tmp_path, URL, segment_bytes=1)  # a new segment after every record
    journal.open()

    def no_room(*args: Any, **kwargs: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("gateway.store.journal.os.open", no_room)
    journal.append(usage_rec(1))  # written, then no new segment: no exception for the request
    assert not journal.writable
    monkeypatch.undo()
    journal.close()
