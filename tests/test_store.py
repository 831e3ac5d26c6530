"""One suite over every store backend (SQLite, Redis, Redis Cluster), plus the cache and the
usage writer."""

from __future__ import annotations

import asyncio
import logging
import random
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from gateway.config import Settings, parse_settings
from gateway.policy import health as health_module
from gateway.policy.health import ChannelHealth
from gateway.store import (
    MICRO,
    ConflictError,
    KeyRecord,
    MissingError,
    Store,
    UsageRecord,
    hash_key,
    key_hint,
)
from gateway.store import redis as rstore
from gateway.store import writer as writer_module
from gateway.store.backends import open_store
from gateway.store.cache import Cache
from gateway.store.cancellation import cancel_and_wait
from gateway.store.sqlite import SQLiteStore
from gateway.store.writer import UsageWriter
from tests.plugins.records import usage_record
from tests.plugins.stores import ALL_BACKENDS, backend_url, sqlite_url

T0 = datetime(2025, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)


@pytest.fixture(params=ALL_BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """This suite runs on a Redis Cluster too."""
    return backend_url(request, tmp_path)


SECRET = "sk-test-secret-4f1c9a7e2b"
UPSTREAM_SECRET = "upstream-secret-9d8e7f"
REPO_ROOT = str(Path(__file__).resolve().parents[1])


def usage_rec(
    i: int, account: str = "alice", cost: int = 1_000, time: datetime | None = None
) -> UsageRecord:
    return usage_record(
        time=time or T0 + timedelta(milliseconds=i),
        request_id=f"req-{account}-{i}",
        account=account,
        channel=None if i % 3 == 0 else "oa-1",
        prompt_tokens=10 + i,
        completion_tokens=20 + i,
        cost=cost,
        latency_ms=15,
    )


def key_rec(key_id: str, secret: str, account: str = "alice", **kw: Any) -> KeyRecord:
    return KeyRecord(
        id=key_id,
        key_hash=hash_key(secret),
        account=account,
        group=kw.pop("group", "default"),
        hint=key_hint(secret),
        **kw,
    )


def settings(**overrides: Any) -> Settings:
    raw: dict[str, Any] = {
        "store": "sqlite:///unused.db",
        "groups": ["default", "vip"],
        "models": [{"name": "chat-small", "price": {"input": 0.5, "output": 1.5}}],
        "channels": [
            {
                "name": "oa-1",
                "type": "openai",
                "base_url": "http://127.0.0.1:9001/v1",
                "api_key": UPSTREAM_SECRET,
                "models": ["chat-small"],
            }
        ],
        "accounts": [{"id": "alice", "balance": 10.0}, {"id": "bob", "balance": 2.5}],
        "keys": [{"id": "k-alice", "key": SECRET, "account": "alice", "group": "default"}],
    }
    raw.update(overrides)
    return parse_settings(raw)


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll until ``check()`` holds; fail only after a generous deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.02)


@pytest.fixture
async def second_store(store_url: str) -> AsyncIterator[Store]:
    """Another instance on the same store, as another gateway process would open it."""
    s = open_store(store_url)
    await s.open()
    try:
        yield s
    finally:
        await s.close()


# -- accounts ------------------------------------------------------------------------------


async def test_accounts_create_get_topup(store: Store) -> None:
    acct = await store.create_account("alice", 5 * MICRO)
    assert (acct.id, acct.balance) == ("alice", 5 * MICRO)
    assert await store.get_account("alice") == acct
    assert await store.get_account("nobody") is None

    assert (await store.topup("alice", 250)).balance == 5 * MICRO + 250
    assert (await store.topup("alice", -1_000)).balance == 5 * MICRO - 750
    got = await store.get_account("alice")
    assert got is not None and got.balance == 5 * MICRO - 750
    assert await store.load_balances() == {"alice": 5 * MICRO - 750}

    with pytest.raises(ConflictError):
        await store.create_account("alice", 1)
    with pytest.raises(MissingError):
        await store.topup("nobody", 1)
    got = await store.get_account("alice")
    assert got is not None and got.balance == 5 * MICRO - 750  # the conflict changed nothing


# -- keys ----------------------------------------------------------------------------------


async def test_keys_create_get_list_update_delete(store: Store) -> None:
    await store.create_account("alice", MICRO)
    await store.create_account("bob", MICRO)
    expiry = datetime(2030, 1, 1, tzinfo=UTC)
    k1 = key_rec("k-1", "sk-one-111111", name="laptop", expires_at=expiry, created_at=T0)
    k2 = key_rec("k-2", "sk-two-222222", created_at=T0 + timedelta(seconds=1))
    k3 = key_rec("k-3", "sk-three-3333", account="bob", created_at=T0 + timedelta(seconds=2))
    for k in (k1, k2, k3):
        await store.create_key(k)

    assert await store.get_key("k-1") == k1
    assert await store.get_key("nope") is None
    assert [k.id for k in await store.list_keys()] == ["k-1", "k-2", "k-3"]
    assert [k.id for k in await store.list_keys("alice")] == ["k-1", "k-2"]
    assert await store.list_keys("carol") == []

    disabled = await store.update_key("k-1", {"status": "disabled", "group": "vip"})
    assert (disabled.status, disabled.group, disabled.expires_at) == ("disabled", "vip", expiry)
    assert await store.get_key("k-1") == disabled

    later = datetime(2031, 6, 1, 12, 0, tzinfo=UTC)
    assert (await store.update_key("k-2", {"expires_at": later})).expires_at == later
    got = await store.get_key("k-2")
    assert got is not None and got.expires_at == later
    assert (await store.update_key("k-1", {"expires_at": None})).expires_at is None
    got = await store.get_key("k-1")
    assert got is not None and got.expires_at is None and got.status == "disabled"

    with pytest.raises(MissingError):
        await store.update_key("nope", {"status": "disabled"})
    with pytest.raises(ValueError):
        await store.update_key("k-2", {"status": "paused"})

    assert await store.delete_key("k-2") is True
    assert await store.get_key("k-2") is None
    assert await store.delete_key("k-2") is False
    assert [k.id for k in await store.list_keys()] == ["k-1", "k-3"]


async def test_key_conflicts_and_unknown_account(store: Store) -> None:
    await store.create_account("alice", MICRO)
    await store.create_key(key_rec("k-1", "sk-one-111111"))
    with pytest.raises(ConflictError):
        await store.create_key(key_rec("k-1", "sk-other-9999"))  # same id
    with pytest.raises(ConflictError):
        await store.create_key(key_rec("k-9", "sk-one-111111"))  # same secret
    with pytest.raises(MissingError):
        await store.create_key(key_rec("k-2", "sk-two-222222", account="nobody"))
    assert [k.id for k in await store.list_keys()] == ["k-1"]


async def test_deleted_key_frees_its_secret(store: Store) -> None:
    await store.create_account("alice", MICRO)
    await store.create_key(key_rec("k-1", "sk-one-111111"))
    assert await store.delete_key("k-1")
    await store.create_key(key_rec("k-2", "sk-one-111111"))
    assert [k.id for k in await store.load_keys()] == ["k-2"]


async def test_load_keys_finds_a_key_by_the_hash_of_its_secret(store: Store) -> None:
    await store.create_account("alice", MICRO)
    await store.create_key(key_rec("k-1", "sk-one-111111", created_at=T0))
    await store.create_key(key_rec("k-2", "sk-two-222222", group="vip", created_at=T0))
    by_hash = {k.key_hash: k for k in await store.load_keys()}
    found = by_hash[hash_key("sk-two-222222")]
    assert (found.id, found.group, found.hint) == ("k-2", "vip", "sk-…2222")
    assert hash_key("sk-unknown-0000") not in by_hash
    assert found.created_at == T0
    assert found.created_at is not None and found.created_at.tzinfo is not None


async def test_created_at_is_filled_in_when_missing(store: Store) -> None:
    await store.create_account("alice", MICRO)
    before = datetime.now(UTC) - timedelta(seconds=1)
    await store.create_key(key_rec("k-1", "sk-one-111111"))
    got = await store.get_key("k-1")
    assert got is not None and got.created_at is not None and got.created_at >= before


# -- settle and usage ----------------------------------------------------------------------


async def test_settle_debits_exactly_and_lists_usage_newest_first(store: Store) -> None:
    await store.create_account("alice", 10 * MICRO)
    await store.create_account("bob", 10 * MICRO)
    records = [usage_rec(i, "alice", cost=1_234_567) for i in range(6)]
    records += [usage_rec(i, "bob", cost=3) for i in range(6, 10)]
    shuffled = records[:]
    random.Random(7).shuffle(shuffled)  # settled out of time order: listing still sorts by time
    await store.settle(shuffled[:5])
    await store.settle(shuffled[5:])

    assert await store.load_balances() == {
        "alice": 10 * MICRO - 6 * 1_234_567,
        "bob": 10 * MICRO - 12,
    }
    newest_first = sorted(records, key=lambda r: r.time, reverse=True)
    assert await store.usage() == newest_first
    assert await store.usage(limit=3) == newest_first[:3]
    assert await store.usage("alice") == [r for r in newest_first if r.account == "alice"]
    assert (
        await store.usage("alice", limit=2) == [r for r in newest_first if r.account == "alice"][:2]
    )
    assert await store.usage("carol") == []


@pytest.mark.parametrize("size", [1, 37, 130])
async def test_a_batch_of_any_size_keeps_every_record_in_order_once(
    store: Store, size: int
) -> None:
    await store.create_account("alice", 10 * MICRO)
    # the SQLite store writes a batch 32 rows per statement, the rest in powers of two (130:
    # 32 x 4 and 2; 37: 32, 4 and 1), same times included (listed newest first, then last
    # settled first); settled again (a journal replayed), nothing is written twice
    records = [usage_rec(i // 2, cost=7) for i in range(size)]
    for i, rec in enumerate(records):
        rec.request_id = f"req-{i}"
    await store.settle(records)
    await store.settle(records)

    assert await store.load_balances() == {"alice": 10 * MICRO - size * 7}
    assert await store.usage(limit=500) == records[::-1]


async def test_usage_record_round_trips_every_field(store: Store) -> None:
    await store.create_account("alice", MICRO)
    rec = UsageRecord(
        time=datetime(2025, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        request_id="req-x",
        account="alice",
        key_id="k-7",
        model="chat-small",
        channel=None,
        protocol="anthropic",
        endpoint="count_tokens",
        prompt_tokens=0,
        completion_tokens=0,
        cost=0,
        status=499,
        latency_ms=123456,
        ip_range="2001:db8:1234::/48",
    )
    await store.settle([rec])
    assert await store.usage() == [rec]
    got = await store.get_account("alice")
    assert got is not None and got.balance == MICRO
    # every token class, the 1-hour writes among them, and the cost's pico-units
    classes = replace(
        rec,
        request_id="req-y",
        prompt_tokens=900,
        completion_tokens=30,
        cost=2,
        cache_read_tokens=100,
        cache_write_tokens=600,
        reasoning_tokens=20,
        cost_pico=5,
        cache_write_1h_tokens=400,
    )
    await store.settle([classes])
    assert await store.usage() == [classes, rec]


async def test_settle_of_an_unknown_account_keeps_the_record(store: Store) -> None:
    await store.settle([usage_rec(1, "ghost", cost=5)])
    assert [r.request_id for r in await store.usage()] == ["req-ghost-1"]
    assert await store.get_account("ghost") is None


async def test_fifty_concurrent_settles_bill_exactly(store: Store) -> None:
    await store.create_account("alice", 100 * MICRO)
    cost = 777_777
    await asyncio.gather(*(store.settle([usage_rec(i, cost=cost)]) for i in range(50)))
    got = await store.get_account("alice")
    assert got is not None and got.balance == 100 * MICRO - 50 * cost
    assert len(await store.usage(limit=1000)) == 50


async def test_sqlite_two_instances_on_one_file_lose_nothing(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "shared.db")
    a, b = SQLiteStore(url), SQLiteStore(url)
    await a.open()
    await b.open()
    try:
        await a.create_account("alice", 100 * MICRO)
        jobs = []
        for i in range(100):
            target = a if i % 2 else b
            jobs.append(target.settle([usage_rec(2 * i, cost=1_001), usage_rec(2 * i + 1, cost=1)]))
        await asyncio.gather(*jobs)
        for s in (a, b):
            got = await s.get_account("alice")
            assert got is not None and got.balance == 100 * MICRO - 100 * 1_002
        assert len(await b.usage(limit=1_000)) == 200
    finally:
        await a.close()
        await b.close()


WORKER_SCRIPT = """
import asyncio, sys
from datetime import UTC, datetime
from gateway.store import UsageRecord
from gateway.store.sqlite import SQLiteStore

async def main(url, tag, n):
    store = SQLiteStore(url)
    await store.open()
    now = datetime.now(UTC)
    records = [
        UsageRecord(now, f"{tag}-{i}", "alice", "k-1", "chat-small", "oa-1", "openai", "chat",
                    1, 1, 3, 200, 1, "198.51.100.0/24")
        for i in range(n)
    ]
    await asyncio.gather(*(store.settle([r]) for r in records))
    await store.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def test_sqlite_worker_processes_settling_at_once_lose_nothing(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "workers.db")
    main = SQLiteStore(url)
    await main.open()
    try:
        await main.create_account("alice", 100 * MICRO)
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable, "-c", WORKER_SCRIPT, url, f"w{n}", "100", cwd=REPO_ROOT
            )
            for n in range(3)
        ]
        await asyncio.gather(*(main.settle([usage_rec(i, cost=3)]) for i in range(100)))
        assert [await p.wait() for p in procs] == [0, 0, 0]
        got = await main.get_account("alice")
        assert got is not None and got.balance == 100 * MICRO - 400 * 3
        assert len(await main.usage(limit=1_000)) == 400
    finally:
        await main.close()


def test_redis_keys_one_script_touches_share_a_cluster_slot() -> None:
    for account in ("alice", "team.a@example", "x:y/z"):
        bal = key_slot(rstore.balance_key(account).encode())
        assert bal == key_slot(rstore.usage_key(account).encode())
    assert key_slot(rstore.KEY_RECORDS_KEY.encode()) == key_slot(rstore.KEY_HASHES_KEY.encode())
    assert key_slot(rstore.balance_key("alice").encode()) != key_slot(
        rstore.balance_key("bob").encode()
    )  # accounts spread over the cluster


# -- seed ----------------------------------------------------------------------------------


async def test_seed_creates_absent_and_keeps_runtime_changes(store: Store) -> None:
    await store.seed(settings())
    assert await store.load_balances() == {"alice": 10 * MICRO, "bob": 2_500_000}
    key = await store.get_key("k-alice")
    assert key is not None
    assert (key.key_hash, key.account, key.group, key.status) == (
        hash_key(SECRET),
        "alice",
        "default",
        "enabled",
    )
    assert key.hint == key_hint(SECRET)

    await store.topup("alice", -3 * MICRO)
    await store.update_key("k-alice", {"status": "disabled"})
    more = settings(
        accounts=[
            {"id": "alice", "balance": 10.0},
            {"id": "bob", "balance": 2.5},
            {"id": "carol", "balance": 0.000001},
        ]
    )
    await store.seed(more)
    assert await store.load_balances() == {"alice": 7 * MICRO, "bob": 2_500_000, "carol": 1}
    key = await store.get_key("k-alice")
    assert key is not None and key.status == "disabled"
    assert len(await store.list_keys()) == 1


# -- persistence and paths (SQLite) ---------------------------------------------------------


async def test_sqlite_persists_across_close_and_reopen(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "a" / "b" / "gateway.db")  # missing folders are created
    s = SQLiteStore(url)
    await s.open()
    await s.create_account("alice", 10 * MICRO)
    await s.create_key(key_rec("k-1", "sk-one-111111", created_at=T0))
    await s.settle([usage_rec(1, cost=500)])
    version = await s.version()
    await s.close()

    s = SQLiteStore(url)
    await s.open()
    try:
        assert await s.load_balances() == {"alice": 10 * MICRO - 500}
        assert [k.id for k in await s.load_keys()] == ["k-1"]
        assert [r.request_id for r in await s.usage()] == ["req-alice-1"]
        assert await s.version() == version
    finally:
        await s.close()


async def test_sqlite_file_of_an_earlier_version_gets_ascending_usage_indexes(
    tmp_path: Path,
) -> None:
    """Earlier versions indexed usage descending; the file opens with the ascending indexes
    instead, keeps its rows, and lists them newest first without sorting."""
    path = tmp_path / "old.db"
    s = SQLiteStore(sqlite_url(path))
    await s.open()
    await s.create_account("alice", 10 * MICRO)
    await s.settle([usage_rec(i) for i in range(5)])
    await s.close()
    with sqlite3.connect(path) as conn:  # as an earlier version left it
        conn.execute("DROP INDEX usage_by_account")
        conn.execute("DROP INDEX usage_by_time")
        conn.execute("CREATE INDEX usage_account_time ON usage (account, time DESC, seq DESC)")
        conn.execute("CREATE INDEX usage_time ON usage (time DESC, seq DESC)")
    conn.close()

    s = SQLiteStore(sqlite_url(path))
    await s.open()
    try:
        assert [r.request_id for r in await s.usage("alice", limit=3)] == [
            "req-alice-4", "req-alice-3", "req-alice-2"
        ]  # fmt: skip
        assert len(await s.usage(limit=100)) == 5
    finally:
        await s.close()
    with sqlite3.connect(path) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        plans = [
            " ".join(str(c) for c in row)
            for sql in (
                "SELECT * FROM usage ORDER BY time DESC, seq DESC LIMIT 3",
                "SELECT * FROM usage WHERE account = 'alice' ORDER BY time DESC, seq DESC",
            )
            for row in conn.execute("EXPLAIN QUERY PLAN " + sql)
        ]
    conn.close()
    assert {"usage_by_account", "usage_by_time"} <= names
    assert not {"usage_account_time", "usage_time"} & names
    assert plans and not any("TEMP B-TREE" in p for p in plans)


async def test_sqlite_url_with_three_slashes_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    s = open_store("sqlite:///data/gateway.db")
    await s.open()
    try:
        await s.create_account("alice", 1)
    finally:
        await s.close()
    assert (tmp_path / "data" / "gateway.db").is_file()


# -- version -------------------------------------------------------------------------------


async def test_version_changes_with_keys_and_accounts_but_not_debits(store: Store) -> None:
    seen = [await store.version()]

    async def changed() -> None:
        v = await store.version()
        assert v != seen[-1]
        seen.append(v)

    await store.create_account("alice", MICRO)
    await changed()
    await store.topup("alice", 5)
    await changed()
    await store.create_key(key_rec("k-1", "sk-one-111111"))
    await changed()
    await store.update_key("k-1", {"status": "disabled"})
    await changed()
    await store.delete_key("k-1")
    await changed()
    await store.settle([usage_rec(1)])
    assert await store.version() == seen[-1]
    await store.seed(settings())
    await changed()


# -- cache ---------------------------------------------------------------------------------


async def test_cache_sees_changes_made_through_another_instance(
    store: Store, second_store: Store
) -> None:
    await store.create_account("alice", 10 * MICRO)
    cache = Cache(store)
    await cache.start()
    try:
        h = hash_key(SECRET)
        assert cache.key(h) is None
        assert cache.balance("alice") == 10 * MICRO
        assert cache.balance("bob") is None

        await second_store.create_key(key_rec("k-1", SECRET))
        await eventually(lambda: cache.key(h) is not None)

        await second_store.update_key("k-1", {"status": "disabled"})
        await eventually(lambda: (k := cache.key(h)) is not None and k.status == "disabled")

        await second_store.settle([usage_rec(1, cost=4_000)])  # a debit: no version bump
        await eventually(lambda: cache.balance("alice") == 10 * MICRO - 4_000)

        await second_store.create_account("bob", 7)
        await eventually(lambda: cache.balance("bob") == 7)

        await second_store.delete_key("k-1")
        await eventually(lambda: cache.key(h) is None)
    finally:
        await cache.stop()


async def test_cache_refresh_shows_a_change_at_once(store: Store) -> None:
    await store.create_account("alice", MICRO)
    cache = Cache(store, interval=3600)  # the background task will not get there first
    await cache.start()
    try:
        await store.create_key(key_rec("k-1", SECRET))
        await store.topup("alice", 9)
        await cache.refresh()
        assert cache.key(hash_key(SECRET)) is not None
        assert cache.balance("alice") == MICRO + 9
    finally:
        await cache.stop()


async def test_cache_keeps_its_snapshot_while_the_store_is_down(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    await store.create_account("alice", MICRO)
    await store.create_key(key_rec("k-1", SECRET))
    counting = CountingStore(store)
    cache = Cache(counting, interval=0.05)  # type: ignore[arg-type]
    await cache.start()

    def failures() -> int:
        return sum("cache.refresh_failed" in r.getMessage() for r in caplog.records)

    try:
        await store.close()
        with caplog.at_level(logging.WARNING, logger="gateway.store.cache"):
            await cache.refresh()
            asked = counting.versions
            # every tick asks for the version first: three more asks, two whole failing ticks
            await eventually(lambda: counting.versions >= asked + 3)
        assert failures() == 2  # the explicit refresh, and one line for the whole streak
        assert cache.key(hash_key(SECRET)) is not None
        assert cache.balance("alice") == MICRO

        await store.open()  # back: the same background task picks the changes up
        await store.topup("alice", 1)
        await eventually(lambda: cache.balance("alice") == MICRO + 1)
    finally:
        await cache.stop()


class CountingStore:
    """A store that counts the ``version()`` calls made on it (a cache asks on every tick)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.versions = 0

    async def version(self) -> int:
        self.versions += 1
        return await self.inner.version()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_cache_balance_counts_writer_debits_before_and_after_flush(store: Store) -> None:
    await store.create_account("alice", 1_000)
    cache = Cache(store, interval=3600)
    await cache.start()
    writer = UsageWriter(store, cache)
    try:
        for i in range(3):
            writer.submit(usage_rec(i, cost=100))
        assert cache.balance("alice") == 700  # at once, before anything is written
        got = await store.get_account("alice")
        assert got is not None and got.balance == 1_000

        await cache.refresh()  # a reload must not forget the unwritten debits
        assert cache.balance("alice") == 700

        await writer.start()
        await writer.flush()
        got = await store.get_account("alice")
        assert got is not None and got.balance == 700
        assert cache.balance("alice") == 700  # not counted twice after the write
        await cache.refresh()
        assert cache.balance("alice") == 700
        await store.topup("alice", 50)
        await cache.refresh()
        assert cache.balance("alice") == 750
    finally:
        await writer.stop()
        await cache.stop()


class PausingStore:
    """A store whose ``settle`` commits, then waits for ``resume`` before it returns: the
    moment a reload reading the store would see a debit the cache still holds as pending."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.committed = asyncio.Event()
        self.resume = asyncio.Event()

    async def settle(self, batch: Sequence[UsageRecord]) -> None:
        await self.inner.settle(batch)
        self.committed.set()
        await self.resume.wait()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_reload_during_a_settle_never_counts_its_debits_twice(store: Store) -> None:
    """A key with quota left was refused (402) after a burst: a reload that read the store
    while the writer's settle returned counted the burst's debits twice for a tick."""
    await store.create_account("alice", 1_000)
    pausing = PausingStore(store)
    cache = Cache(pausing, interval=3600)  # type: ignore[arg-type]
    await cache.start()
    writer = UsageWriter(pausing, cache)  # type: ignore[arg-type]
    await writer.start()
    try:
        for i in range(3):
            writer.submit(usage_rec(i, cost=100))
        flushed = asyncio.create_task(writer.flush())
        await pausing.committed.wait()  # in the store, not yet known to the cache as settled
        reload = asyncio.create_task(cache.refresh())
        for _ in range(20):
            await asyncio.sleep(0)  # a reload that could read the store has read it now
        pausing.resume.set()
        await asyncio.gather(flushed, reload)
        assert cache.balance("alice") == 700
    finally:
        pausing.resume.set()
        await writer.stop()
        await cache.stop()


# -- writer --------------------------------------------------------------------------------


async def test_writer_flush_returns_once_everything_submitted_is_stored(store: Store) -> None:
    await store.create_account("alice", 10 * MICRO)
    writer = UsageWriter(store, batch=16)
    await writer.start()
    try:
        await writer.flush()  # nothing pending: returns at once
        for i in range(100):
            writer.submit(usage_rec(i, cost=10))
        await writer.flush()
        assert len(await store.usage(limit=1_000)) == 100
        got = await store.get_account("alice")
        assert got is not None and got.balance == 10 * MICRO - 1_000
    finally:
        await writer.stop()


@pytest.mark.parametrize("lingering", [False, True], ids=["before-linger", "mid-linger"])
async def test_writer_flush_cuts_the_linger_short(
    store: Store, monkeypatch: pytest.MonkeyPatch, lingering: bool
) -> None:
    """A batch waits LINGER seconds for company, unless someone flushes: with an hour-long
    linger, flush() still returns (an admin reading usage must not wait for the linger)."""
    monkeypatch.setattr(writer_module, "LINGER", 3600.0)
    await store.create_account("alice", 10 * MICRO)
    writer = UsageWriter(store)
    await writer.start()
    try:
        writer.submit(usage_rec(1, cost=10))
        if lingering:  # while this read awaits, the writer takes the record and lingers
            assert await store.usage(limit=10) == []
        await asyncio.wait_for(writer.flush(), 30)
        assert [r.request_id for r in await store.usage(limit=10)] == ["req-alice-1"]
        writer.submit(usage_rec(2, cost=10))  # the next batch lingers, and is flushed, too
        await asyncio.wait_for(writer.flush(), 30)
        assert len(await store.usage(limit=10)) == 2
    finally:
        await writer.stop()


async def test_writer_stop_drains_the_queue(store: Store) -> None:
    await store.create_account("alice", 10 * MICRO)
    writer = UsageWriter(store)
    await writer.start()
    for i in range(20):
        writer.submit(usage_rec(i, cost=1))
    await writer.stop()
    assert len(await store.usage(limit=1_000)) == 20


async def test_writer_flush_without_a_task_writes_inline(store: Store) -> None:
    await store.create_account("alice", 10)
    writer = UsageWriter(store)
    writer.submit(usage_rec(1, cost=4))
    await writer.flush()
    got = await store.get_account("alice")
    assert got is not None and got.balance == 6


class FlakyStore:
    """A store whose first ``failures`` settle calls fail (as when the store is briefly down)."""

    def __init__(self, inner: Store, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.calls = 0

    async def settle(self, records: Sequence[UsageRecord]) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("store unreachable")
        await self.inner.settle(records)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_writer_retries_a_failed_settle_without_losing_or_doubling(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    await store.create_account("alice", 10 * MICRO)
    flaky = FlakyStore(store, failures=2)
    writer = UsageWriter(flaky)  # type: ignore[arg-type]
    await writer.start()
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.store.writer"):
            for i in range(5):
                writer.submit(usage_rec(i, cost=1_000))
            await writer.flush()
        assert flaky.calls >= 3
        got = await store.get_account("alice")
        assert got is not None and got.balance == 10 * MICRO - 5_000
        assert len(await store.usage(limit=100)) == 5
        failures = [r.getMessage() for r in caplog.records if "settle_failed" in r.getMessage()]
        assert len(failures) == 2
        for line in failures:  # ids and counts only, no record contents
            assert "203.0.113" not in line and "chat-small" not in line
    finally:
        await writer.stop()


class HangingStore:
    """A store that never answers a settle; ``swallow`` mimics clients that swallow a
    cancellation landing mid-command (redis-py's pipelines do)."""

    def __init__(self, swallow: bool) -> None:
        self.swallow = swallow

    async def settle(self, records: Sequence[UsageRecord]) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if not self.swallow:
                raise


@pytest.mark.parametrize("swallow", [False, True])
async def test_writer_stop_gives_up_on_a_store_that_never_answers(
    swallow: bool, caplog: pytest.LogCaptureFixture
) -> None:
    writer = UsageWriter(HangingStore(swallow))  # type: ignore[arg-type]
    await writer.start()
    writer.submit(usage_rec(1))
    writer.submit(usage_rec(2))
    await asyncio.sleep(0.05)  # the task is inside settle now
    writer.submit(usage_rec(3))
    with caplog.at_level(logging.ERROR, logger="gateway.store.writer"):
        await asyncio.wait_for(writer.stop(timeout=0.2), 30)  # returns instead of hanging
    if not swallow:
        assert "writer.stop_undelivered records=3" in caplog.text


class SwallowingCoolingStore:
    """A store whose ``share_cooling`` swallows a cancellation landing mid-command and
    answers as if nothing happened (redis-py's pipelines do this)."""

    def __init__(self) -> None:
        self.calls = 0
        self.swallow = True

    async def share_cooling(self, cooling: object, now: int) -> dict[str, int]:
        self.calls += 1
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if not self.swallow:
                raise
        return {}


async def test_channel_health_sharing_stops_when_the_cancel_lands_in_the_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lifespan's shutdown waits for this task: before the fix a swallowed cancel left
    it looping forever and the shutdown hung (seen as a teardown timeout in the suite)."""
    monkeypatch.setattr(health_module, "SHARE_INTERVAL", 0.001)
    store = SwallowingCoolingStore()
    task = asyncio.create_task(ChannelHealth(1.0).share_forever(store))  # type: ignore[arg-type]
    deadline = asyncio.get_running_loop().time() + 10
    while store.calls == 0:  # inside share_cooling now, or about to be
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)  # the store call is in flight
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=10)
    store.swallow = False  # let a task that ran on be stopped, then fail
    if not done:
        await cancel_and_wait(task)
    assert done, "share_forever ran on after its cancel"


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_module, "RETRY_FIRST", 0.001)
    monkeypatch.setattr(writer_module, "RETRY_MAX", 0.005)


@pytest.mark.parametrize(
    "refused", [{7}, {0, 39}, set(range(40))], ids=["one", "first-and-last", "every"]
)
async def test_writer_parks_the_records_the_store_refuses_and_writes_the_rest(
    store: Store, quick_retries: None, caplog: pytest.LogCaptureFixture, refused: set[int]
) -> None:
    """A record the store itself refuses (a cost past 64 bits, which no path now makes)
    must not hold back the records after it, nor hang flush(), which every admin call runs."""
    await store.create_account("alice", 10 * MICRO)
    cache = Cache(store)
    await cache.start()
    writer = UsageWriter(store, cache, batch=16)
    await writer.start()
    try:
        with caplog.at_level(logging.WARNING, logger="gateway.store.writer"):
            for i in range(40):
                writer.submit(usage_rec(i, cost=2**70 if i in refused else 1_000))
            await asyncio.wait_for(writer.flush(), 30)
        stored = {r.request_id for r in await store.usage(limit=100)}
        assert stored == {f"req-alice-{i}" for i in range(40) if i not in refused}
        got = await store.get_account("alice")
        assert got is not None and got.balance == 10 * MICRO - 1_000 * (40 - len(refused))
        assert writer.parked == writer.pending == len(refused)
        parked = [r.getMessage() for r in caplog.records if "writer.parked" in r.getMessage()]
        assert sorted(line.split()[1] for line in parked) == sorted(
            f"request_id=req-alice-{i}" for i in refused
        )
        assert all("203.0.113" not in line and "chat-small" not in line for line in parked)
        # the cache still holds the parked debits: the balance the gateway sees is honest
        assert cache.balance("alice") == 10 * MICRO - 1_000 * (40 - len(refused)) - sum(
            2**70 for _ in refused
        )
    finally:
        with caplog.at_level(logging.ERROR, logger="gateway.store.writer"):
            await writer.stop(timeout=5)
        await cache.stop()
    assert f"writer.stop_undelivered records={len(refused)}" in caplog.text


class RefusingStore:
    """A store that refuses any batch holding one of ``refused`` (by request id), and is
    wholly down (reads included) while ``down`` is set."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.refused: set[str] = set()
        self.down = False
        self.settles = 0

    async def settle(self, records: Sequence[UsageRecord]) -> None:
        self.settles += 1
        if self.down:
            raise ConnectionError("store unreachable")
        if any(r.request_id in self.refused for r in records):
            raise ValueError("refused")
        await self.inner.settle(records)

    async def version(self) -> int:
        if self.down:
            raise ConnectionError("store unreachable")
        return await self.inner.version()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_parked_record_is_written_once_the_store_takes_it(
    store: Store, quick_retries: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "PARK_RETRY", 0.02)
    await store.create_account("alice", 10 * MICRO)
    refusing = RefusingStore(store)
    refusing.refused = {"req-alice-2"}
    writer = UsageWriter(refusing, batch=8)  # type: ignore[arg-type]
    await writer.start()
    try:
        for i in range(5):
            writer.submit(usage_rec(i, cost=1_000))
        await asyncio.wait_for(writer.flush(), 30)
        assert writer.parked == 1 and len(await store.usage(limit=10)) == 4
        for i in range(5, 8):  # later records go straight in, not behind the parked one
            writer.submit(usage_rec(i, cost=1_000))
        await asyncio.wait_for(writer.flush(), 30)
        assert len(await store.usage(limit=10)) == 7
        refusing.refused = set()
        await eventually(lambda: not writer.pending)
        assert writer.pending == writer.parked == 0
        assert len(await store.usage(limit=10)) == 8
        got = await store.get_account("alice")
        assert got is not None and got.balance == 10 * MICRO - 8_000
    finally:
        await writer.stop()


async def test_stop_gives_a_parked_record_one_last_try(store: Store, quick_retries: None) -> None:
    await store.create_account("alice", 10 * MICRO)
    refusing = RefusingStore(store)
    refusing.refused = {"req-alice-1"}
    writer = UsageWriter(refusing)  # type: ignore[arg-type]
    await writer.start()
    writer.submit(usage_rec(1, cost=1_000))
    await asyncio.wait_for(writer.flush(), 30)
    assert writer.parked == 1  # its own retry is PARK_RETRY (30 s) away
    refusing.refused = set()
    await asyncio.wait_for(writer.stop(), 30)
    assert writer.pending == 0
    assert [r.request_id for r in await store.usage(limit=10)] == ["req-alice-1"]


async def test_a_store_that_is_down_is_waited_for_not_parked_around(
    store: Store, quick_retries: None
) -> None:
    """When the store answers nothing, a refusal says nothing about the batch: the writer
    keeps the batch whole and waits, and flush() waits with it."""
    await store.create_account("alice", 10 * MICRO)
    refusing = RefusingStore(store)
    refusing.down = True
    writer = UsageWriter(refusing)  # type: ignore[arg-type]
    await writer.start()
    try:
        for i in range(3):
            writer.submit(usage_rec(i, cost=1_000))
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(writer.flush(), 0.5)
        assert refusing.settles > writer_module.ISOLATE_AFTER  # it did keep trying
        assert writer.parked == 0 and writer.pending == 3
        refusing.down = False
        await asyncio.wait_for(writer.flush(), 30)
        assert writer.parked == writer.pending == 0
        assert len(await store.usage(limit=10)) == 3
    finally:
        await writer.stop()


async def test_redis_batch_resent_after_a_partial_failure_never_doubles(redis_url: str) -> None:
    # SQLite settles a batch in one transaction; Redis one record at a time, so a batch can
    # half-succeed before a connection drops, and the writer then re-sends all of it.
    store = open_store(redis_url)
    await store.open()
    try:
        await store.create_account("alice", 10 * MICRO)
        batch = [usage_rec(i, cost=100) for i in range(4)]
        await store.settle(batch[:2])
        await store.settle(batch)
        got = await store.get_account("alice")
        assert got is not None and got.balance == 10 * MICRO - 400
        assert len(await store.usage()) == 4
    finally:
        await store.close()


# -- secrets -------------------------------------------------------------------------------


async def _everything_in_redis(url: str) -> bytes:
    if url.startswith(rstore.CLUSTER_SCHEME):  # each node's own keys
        nodes, _ = rstore.cluster_nodes(url)
        dumps = [await _everything_in_redis(f"redis://{n.host}:{n.port}/0") for n in nodes]
        return b"\n".join(dumps)
    client = aioredis.from_url(url)
    parts: list[bytes] = []
    try:
        async for name in client.scan_iter(match="*"):
            parts.append(name)
            kind = (await client.type(name)).decode()
            if kind == "string":
                parts.append(await client.get(name))
            elif kind == "hash":
                for k, v in (await client.hgetall(name)).items():
                    parts += [k, v]
            elif kind == "set":
                parts += list(await client.smembers(name))
            elif kind == "zset":
                parts += list(await client.zrange(name, 0, -1))
            elif kind == "list":
                parts += list(await client.lrange(name, 0, -1))
            else:
                raise AssertionError(f"unexpected Redis type {kind} at {name!r}")
    finally:
        await client.aclose()
    return b"\n".join(parts)


async def test_secrets_never_reach_the_store(store: Store, store_url: str) -> None:
    await store.seed(settings())
    other = "sk-admin-made-77aa55cc33"
    await store.create_key(key_rec("k-2", other))
    await store.settle([usage_rec(1)])
    assert await store.get_key("k-2") is not None

    if isinstance(store, SQLiteStore):
        folder = Path(store.path).parent
        dump = b"".join(p.read_bytes() for p in folder.iterdir() if p.is_file())
        assert b"k-alice" in dump  # the scan does see the data
    else:
        dump = await _everything_in_redis(store_url)
        assert b"k-alice" in dump
    for secret in (SECRET, other, UPSTREAM_SECRET):
        assert secret.encode() not in dump
