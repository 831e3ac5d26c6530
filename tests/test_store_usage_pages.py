"""``Store.usage_page`` on every backend (SQLite, Redis, Redis Cluster): each filter (key,
model, status, since, until) in the store, pages that follow their cursor without skipping or
repeating records of the same microsecond, and Redis's bounded reading (a short page with a
cursor, never a skipped record)."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.store import (
    MICRO,
    CursorError,
    Store,
    UsagePage,
    UsageQuery,
    UsageRecord,
)
from gateway.store import redis as rstore
from gateway.store.sqlite import USAGE_COLUMNS, SQLiteStore, _usage_where
from tests.plugins.records import usage_record
from tests.plugins.stores import ALL_BACKENDS, backend_url

T0 = datetime(2025, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)


@pytest.fixture(params=ALL_BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, tmp_path)


def rec(
    n: int,
    *,
    account: str = "alice",
    key_id: str = "k-1",
    model: str = "chat-small",
    status: int = 200,
    time: datetime | None = None,
) -> UsageRecord:
    return usage_record(
        time=time or T0 + timedelta(seconds=n),
        request_id=f"req-{account}-{n:04d}",
        account=account,
        key_id=key_id,
        model=model,
        prompt_tokens=n,
        completion_tokens=n,
        cost=1,
        status=status,
    )


def ids(records: list[UsageRecord]) -> list[str]:
    return [r.request_id for r in records]


async def every_page(store: Store, query: UsageQuery, limit: int) -> list[UsagePage]:
    """Page after page from ``query`` until a page has no ``next``."""
    pages = [await store.usage_page(query, limit)]
    while pages[-1].next is not None:
        assert len(pages) < 1000, "pages never end"
        after = UsageQuery(**{**_fields(query), "after": pages[-1].next})
        pages.append(await store.usage_page(after, limit))
    return pages


def _fields(query: UsageQuery) -> dict[str, object]:
    return {name: getattr(query, name) for name in UsageQuery.__slots__}


def newest_first(records: list[UsageRecord]) -> list[str]:
    return ids(sorted(records, key=lambda r: r.time, reverse=True))


@pytest.fixture
async def mixed(store: Store) -> list[UsageRecord]:
    """40 records of two accounts, two keys, two models and four statuses, a second apart."""
    await store.create_account("alice", 10 * MICRO)
    await store.create_account("bob", 10 * MICRO)
    records = [
        rec(
            n,
            account="alice" if n % 4 else "bob",
            key_id="k-1" if n % 3 else "k-2",
            model="chat-small" if n % 2 else "embed-small",
            status=(200, 200, 429, 499, 500)[n % 5],
        )
        for n in range(40)
    ]
    await store.settle(records)
    return records


A_K2 = ("alice", "k-2")


@pytest.mark.parametrize(
    ("query", "keep"),
    [
        (UsageQuery(), lambda r: True),
        (UsageQuery(account="alice"), lambda r: r.account == "alice"),
        (UsageQuery(key_id="k-2"), lambda r: r.key_id == "k-2"),
        (UsageQuery(account="alice", key_id="k-2"), lambda r: (r.account, r.key_id) == A_K2),
        (UsageQuery(model="embed-small"), lambda r: r.model == "embed-small"),
        (UsageQuery(status=429), lambda r: r.status == 429),
        (UsageQuery(status="ok"), lambda r: r.status < 400),
        (UsageQuery(status="error"), lambda r: r.status >= 400),
        (UsageQuery(since=T0 + timedelta(seconds=30)), lambda r: r.prompt_tokens >= 30),
        (UsageQuery(until=T0 + timedelta(seconds=5)), lambda r: r.prompt_tokens < 5),
        (
            UsageQuery(
                account="bob",
                model="embed-small",
                status="error",
                since=T0 + timedelta(seconds=3),
                until=T0 + timedelta(seconds=36),
            ),
            lambda r: r.account == "bob" and r.model == "embed-small" and r.status >= 400
            and 3 <= r.prompt_tokens < 36,
        ),
    ],
    ids=["none", "account", "key", "account+key", "model", "status", "ok", "error", "since",
         "until", "all"],
)  # fmt: skip
async def test_each_filter_selects_in_the_store(
    store: Store, mixed: list[UsageRecord], query: UsageQuery, keep: object
) -> None:
    assert callable(keep)
    want = newest_first([r for r in mixed if keep(r)])
    assert want  # each case selects something
    page = await store.usage_page(query, 1000)
    assert ids(page.records) == want
    assert page.next is None
    # the same, a few at a time
    pages = await every_page(store, query, 3)
    assert [r for p in pages for r in ids(p.records)] == want
    assert all(len(p.records) == 3 for p in pages[:-1])


async def test_pages_never_skip_or_repeat_records_of_one_microsecond(store: Store) -> None:
    await store.create_account("alice", 10 * MICRO)
    await store.create_account("bob", 10 * MICRO)
    same = T0 + timedelta(seconds=10)
    records = [rec(n, time=same, account="alice" if n % 2 else "bob") for n in range(9)]
    records += [rec(n, account="alice") for n in range(20, 25)]  # before and after: none
    records += [rec(n, time=T0 + timedelta(seconds=20), account="alice") for n in range(30, 34)]
    await store.settle(records)
    for query in (UsageQuery(), UsageQuery(account="alice"), UsageQuery(status=200)):
        everything = (await store.usage_page(query, 1000)).records
        assert sorted(ids(everything)) == sorted(
            r.request_id for r in records if query.account in (None, r.account)
        )
        for limit in (1, 2, 4, 5):
            pages = await every_page(store, query, limit)
            listed = [r for p in pages for r in ids(p.records)]
            assert listed == ids(everything), (query, limit)
    # pages of two end inside a microsecond's records, and the next page goes on from there
    pages = await every_page(store, UsageQuery(), 2)
    assert any(
        a.records[-1].time == b.records[0].time for a, b in zip(pages, pages[1:], strict=False)
    )


async def test_a_cursor_from_another_store_kind_is_refused(store: Store) -> None:
    other: tuple[int, int | str] = (1, 5) if not isinstance(store, SQLiteStore) else (1, "req-1")
    with pytest.raises(CursorError):
        await store.usage_page(UsageQuery(after=other), 10)


async def test_records_past_the_newest_page_reach_the_key_filter(store: Store) -> None:
    """A key with few records on a busy account: the key filter finds them all (the console's
    key view read only the account's newest 1,000 records before)."""
    await store.create_account("alice", 10 * MICRO)
    busy = [rec(n, key_id="k-busy") for n in range(1500)]
    quiet = [rec(n, key_id="k-quiet") for n in (3, 7)]
    for r in quiet:
        r.request_id += "-quiet"
    await store.settle(busy + quiet)
    pages = await every_page(store, UsageQuery(account="alice", key_id="k-quiet"), 100)
    assert [r for p in pages for r in ids(p.records)] == newest_first(quiet)


async def test_redis_reads_a_bounded_number_of_records_per_page(
    store: Store, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rare matches: each call reads at most USAGE_SCAN records and comes back short with a
    cursor where it stopped; following it finds every match once. A window of one
    microsecond is read whole."""
    if isinstance(store, SQLiteStore):
        pytest.skip("SQLite reads along its indexes; Redis bounds its reading")
    monkeypatch.setattr(rstore, "USAGE_SCAN", 10)
    monkeypatch.setattr(rstore, "USAGE_BATCH", 4)
    await store.create_account("alice", 10 * MICRO)
    await store.create_account("bob", 10 * MICRO)
    same = T0 + timedelta(seconds=50)
    records = [rec(n, account="alice") for n in range(60)]
    records += [rec(n, account="alice", time=same) for n in range(100, 109)]
    records += [rec(n, account="bob") for n in range(200, 230)]
    rare = [r for r in records if r.prompt_tokens % 13 == 0]
    for r in rare:
        r.model = "rare"
    await store.settle(records)
    reads: list[int] = []
    real = store.client.zrevrangebyscore  # type: ignore[attr-defined]

    async def counting(*args: object, **kw: object) -> object:
        got = await real(*args, **kw)
        reads.append(len(got))
        return got

    monkeypatch.setattr(store.client, "zrevrangebyscore", counting)  # type: ignore[attr-defined]
    for query in (UsageQuery(model="rare"), UsageQuery(account="alice", model="rare")):
        pages = await every_page(store, query, 5)
        want = newest_first([r for r in rare if query.account in (None, r.account)])
        assert [r for p in pages for r in ids(p.records)] == want
        assert any(len(p.records) < 5 and p.next is not None for p in pages)  # short, not last
    # a window at a time: the batch (6: the page and one more), or one microsecond's ten
    # records (rec(50) and the nine at ``same``) read whole
    assert max(reads) == 10 and sorted(set(reads))[-2] <= 6
    page = await store.usage_page(UsageQuery(account="alice"), 5)  # unfiltered: a full page
    assert len(page.records) == 5 and page.next is not None


async def test_sqlite_filters_walk_an_index_newest_first(tmp_path: Path) -> None:
    """The key filter has an index of its own; no listing sorts."""
    s = SQLiteStore(f"sqlite:///{tmp_path / 'u.db'}")
    await s.open()
    await s.close()
    since = T0
    queries = {
        UsageQuery(key_id="k"): "usage_by_key",
        UsageQuery(account="a", key_id="k", after=(1, 2)): "usage_by_key",
        UsageQuery(account="a", model="m", status="ok", after=(1, 2)): "usage_by_account",
        UsageQuery(model="m", since=since, until=since + timedelta(days=1)): "usage_by_time",
    }
    with sqlite3.connect(tmp_path / "u.db") as conn:
        for query, index in queries.items():
            where, args = _usage_where(query)
            sql = f"SELECT seq, {USAGE_COLUMNS} FROM usage {where} ORDER BY time DESC, seq DESC"
            plan = " ".join(str(row[3]) for row in conn.execute("EXPLAIN QUERY PLAN " + sql, args))
            assert index in plan and "TEMP B-TREE" not in plan, (query, plan)
    conn.close()
