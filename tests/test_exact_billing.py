"""Costs exact below the micro-unit, against the store layer on every backend (SQLite, Redis,
Redis Cluster): a record keeps its cost's pico-units, settlement carries them per account and
debits a micro-unit each time they make one, so what an account is debited stays within one
micro-unit of the exact sum of its records' costs, the records' costs add up to the balance's
drop (with what the carry holds), and a record settles once however often it is sent.

Also: stores made by the version before the token classes and exact costs (an SQLite file of
the old schema, Redis records and balances as it wrote them, journal lines of its shape) open,
read their old records with the new fields 0, and bill exactly from then on.
"""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import orjson
import pytest
import redis.asyncio as aioredis

from gateway.config import Price
from gateway.policy.billing import PICO_PER_MICRO, Metered, Rate
from gateway.store import MICRO, KeyRecord, Store, UsageRecord, hash_key
from gateway.store import redis as rstore
from gateway.store.backends import open_store
from gateway.store.records import (
    ADDED_USAGE_FIELDS,
    FIRST_USAGE_FIELDS,
    decode_usage,
    encode_usage,
    journal_line,
    journal_record,
    time_text,
    usage_json,
)
from gateway.store.sqlite import SQLiteStore
from tests.plugins.records import usage_record
from tests.plugins.stores import ALL_BACKENDS, backend_url, sqlite_url

T0 = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
BATCH = 256  # records per settle, as the usage writer sends them


@pytest.fixture(params=ALL_BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, tmp_path)


def billed_records(
    n: int, used: Metered, price: Price, account: str = "alice", first: int = 0
) -> list[UsageRecord]:
    """``n`` records of requests that used ``used`` at ``price``, as ``Call.bill`` fills them."""
    charge = Rate.from_price(price).charge(used)
    return [
        usage_record(
            time=T0 + timedelta(microseconds=i),
            request_id=f"req-{account}-{i}",
            account=account,
            key_id=f"k-{account}",
            prompt_tokens=used.prompt_tokens,
            completion_tokens=used.completion_tokens,
            cache_read_tokens=used.cache_read_tokens,
            cost=charge.micro,
            cost_pico=charge.pico,
        )
        for i in range(first, first + n)
    ]


async def open_account(store: Store, account: str, balance: int) -> None:
    """An account with a key of its own (``k-<account>``), whose spent settlement counts."""
    await store.create_account(account, balance)
    secret = f"sk-{account}-secret"
    await store.create_key(KeyRecord(f"k-{account}", hash_key(secret), account, "default"))


async def settle_in_batches(store: Store, records: list[UsageRecord]) -> None:
    for i in range(0, len(records), BATCH):
        await store.settle(records[i : i + BATCH])


def pico(rec: UsageRecord) -> int:
    return rec.cost * PICO_PER_MICRO + rec.cost_pico


async def exact_drop(store: Store, account: str, before: int) -> tuple[int, int]:
    """(what the balance dropped by, in micro-units; the same in pico-units, the carry in)."""
    acct = await store.get_account(account)
    assert acct is not None and 0 <= acct.carry < PICO_PER_MICRO
    drop = before - acct.balance
    return drop, drop * PICO_PER_MICRO + acct.carry


async def test_ten_thousand_one_token_requests_at_a_hundredth_per_million(store: Store) -> None:
    """The target: 1 token at 0.01 per million costs 0.01 micro-units, which rounding per
    request billed as 0. Σ billed is the exact sum within one micro-unit, and the records'
    costs add up to the balance's drop."""
    await open_account(store, "alice", 10 * MICRO)
    records = billed_records(10_000, Metered(prompt_tokens=1), Price(input=0.01))
    assert {(r.cost, r.cost_pico) for r in records} == {(0, 10_000)}  # never billed 0
    await settle_in_batches(store, records)

    exact = Decimal("0.01") * 10_000  # micro-units: 0.01 per million tokens per token
    drop, drop_pico = await exact_drop(store, "alice", 10 * MICRO)
    assert abs(drop - exact) <= 1 and drop == 100
    stored = await store.usage("alice", limit=10_000)
    assert len(stored) == 10_000
    assert sum(pico(r) for r in stored) == drop_pico == exact * PICO_PER_MICRO
    # the key's spent and the day's totals count what was debited
    assert (await store.load_spent())["k-alice"] == drop
    days = await store.usage_daily("2025-03-04", "2025-03-04", "alice")
    assert sum(d.cost for d in days) == drop and sum(d.requests for d in days) == 10_000


async def test_a_remainder_stays_carried_and_whole_costs_are_debited_whole(store: Store) -> None:
    await open_account(store, "alice", 10 * MICRO)
    await open_account(store, "bob", 10 * MICRO)
    used = Metered(prompt_tokens=3, completion_tokens=0)  # 3 x 0.013 = 0.039 micro-units
    alice = billed_records(777, used, Price(input=0.013))
    # bob: 1.5 micro-units a request (the half used to round up to 2 every time)
    bob = billed_records(9, Metered(prompt_tokens=3), Price(input=0.5), account="bob")
    mixed = [r for pair in zip(alice, bob, strict=False) for r in pair] + alice[len(bob) :]
    await settle_in_batches(store, mixed)

    drop, drop_pico = await exact_drop(store, "alice", 10 * MICRO)
    exact = Decimal(777 * 39_000) / PICO_PER_MICRO  # 30.303 micro-units
    assert drop == 30 and abs(drop - exact) < 1
    assert drop_pico == sum(pico(r) for r in alice)
    bob_drop, bob_pico = await exact_drop(store, "bob", 10 * MICRO)
    assert (bob_drop, bob_pico) == (13, 13_500_000)  # 9 x 1.5 = 13.5: 13 debited, .5 carried
    assert (await store.load_spent()) == {"k-alice": 30, "k-bob": 13}


async def test_a_record_sent_again_is_neither_stored_nor_carried_twice(store: Store) -> None:
    """The writer re-sends a batch after a failure, the journal replays what a crash left:
    the carry moves once per record, like the balance."""
    await store.create_account("alice", MICRO)
    records = billed_records(150, Metered(prompt_tokens=7), Price(input=0.1))  # 0.7 each
    await store.settle(records[:100])
    first = await store.get_account("alice")
    await store.settle(records[:100])  # the same batch again
    assert await store.get_account("alice") == first
    await store.settle(records)  # 100 held, 50 new
    drop, drop_pico = await exact_drop(store, "alice", MICRO)
    assert drop_pico == 150 * 700_000 and drop == 105
    assert len(await store.usage("alice", limit=1000)) == 150


async def test_records_keep_their_classes_and_pico_units(store: Store) -> None:
    await store.create_account("alice", MICRO)
    rec = usage_record(
        prompt_tokens=2006,
        completion_tokens=320,
        cache_read_tokens=1536,
        cache_write_tokens=400,
        reasoning_tokens=256,
        cost=5,
        cost_pico=123_456,
    )
    await store.settle([rec])
    assert await store.usage("alice") == [rec]
    shown = usage_json(rec)
    assert (shown["cache_read_tokens"], shown["cache_write_tokens"]) == (1536, 400)
    assert shown["reasoning_tokens"] == 256 and shown["cost"] == 0.000005123456
    assert "cost_pico" not in shown  # in ``cost``, not apart


async def test_a_record_of_an_account_that_does_not_exist_carries_nothing(store: Store) -> None:
    rec = usage_record(account="ghost", request_id="req-ghost", cost=0, cost_pico=999_999)
    await store.settle([rec])
    assert await store.get_account("ghost") is None
    assert [r.cost_pico for r in await store.usage("ghost")] == [999_999]


# -- stores of the version before ------------------------------------------------------------

OLD_SQLITE = """
CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
CREATE TABLE usage (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, time INTEGER NOT NULL, request_id TEXT NOT NULL,
    account TEXT NOT NULL, key_id TEXT NOT NULL, model TEXT NOT NULL, channel TEXT,
    protocol TEXT NOT NULL, endpoint TEXT NOT NULL, prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL, cost INTEGER NOT NULL, status INTEGER NOT NULL,
    latency_ms INTEGER NOT NULL, ip_range TEXT NOT NULL
);
INSERT INTO accounts VALUES ('alice', 5000000);
INSERT INTO usage (time, request_id, account, key_id, model, channel, protocol, endpoint,
    prompt_tokens, completion_tokens, cost, status, latency_ms, ip_range)
VALUES (1741064767000000, 'req-old', 'alice', 'k-alice', 'chat-small', 'oa-1', 'openai', 'chat',
    12, 3, 42, 200, 10, '203.0.113.0/24');
"""


async def test_an_sqlite_file_of_the_old_schema_gets_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SQLITE)
    conn.close()

    s = SQLiteStore(sqlite_url(path))
    await s.open()
    try:
        [old] = await s.usage("alice")
        assert (old.request_id, old.cost, old.prompt_tokens) == ("req-old", 42, 12)
        assert (old.cache_read_tokens, old.reasoning_tokens, old.cost_pico) == (0, 0, 0)
        got = await s.get_account("alice")
        assert got is not None and (got.balance, got.carry) == (5_000_000, 0)
        # summed into the daily totals the file lacked
        days = await s.usage_daily("2025-03-04", "2025-03-04")
        assert [(d.requests, d.cost) for d in days] == [(1, 42)]
        await s.settle(billed_records(3, Metered(prompt_tokens=5), Price(input=0.1)))
    finally:
        await s.close()

    s = SQLiteStore(sqlite_url(path))  # and again: nothing is added twice
    await s.open()
    try:
        got = await s.get_account("alice")
        assert got is not None and (got.balance, got.carry) == (5_000_000 - 1, 500_000)
        assert sorted(r.cost_pico for r in await s.usage("alice")) == [0, *[500_000] * 3]
    finally:
        await s.close()


def old_redis_record(rec: UsageRecord) -> bytes:
    """A record as the version before wrote it in Redis: its first fields only."""
    fields = {name: getattr(rec, name) for name in FIRST_USAGE_FIELDS}
    fields["time"] = time_text(rec.time)
    return orjson.dumps(fields)


async def test_redis_as_the_old_version_left_it(redis_url: str) -> None:
    old = usage_record(request_id="req-old", account="alice", key_id="k-alice", cost=42)
    client = aioredis.from_url(redis_url)
    try:
        await client.set(rstore.balance_key("alice"), 5_000_000)
        await client.sadd(rstore.ACCOUNTS_KEY, "alice")
        await client.sadd(rstore.USAGE_ACCOUNTS_KEY, "alice")
        at = int((old.time - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))
        await client.zadd(rstore.usage_key("alice"), {old_redis_record(old): at})
    finally:
        await client.aclose()
    # a record without the new fields is encoded as the old version encoded it: the one it
    # stored is recognised when a journal it left is replayed
    assert encode_usage(old) == old_redis_record(old)

    s = open_store(redis_url)
    await s.open()
    try:
        assert await s.usage("alice") == [old]
        got = await s.get_account("alice")
        assert got is not None and (got.balance, got.carry) == (5_000_000, 0)
        await s.settle([old])  # replayed: not debited again
        new = billed_records(3, Metered(prompt_tokens=5), Price(input=0.1))  # 0.5 each
        await s.settle(new)
        got = await s.get_account("alice")
        assert got is not None and (got.balance, got.carry) == (5_000_000 - 1, 500_000)
        assert len(await s.usage("alice")) == 4
    finally:
        await s.close()


def test_a_journal_line_of_the_old_version_reads_with_the_new_fields_zero() -> None:
    rec = usage_record(cost=7)
    line = journal_line(rec)
    old_line = orjson.dumps(orjson.loads(line)[: len(FIRST_USAGE_FIELDS)]) + b"\n"
    assert journal_record(old_line) == rec
    full = usage_record(cache_read_tokens=3, reasoning_tokens=1, cost_pico=5)
    assert journal_record(journal_line(full)) == full


def test_the_one_hour_writes_change_no_record_without_them() -> None:
    """A record with the token classes and no 1-hour writes has the bytes the version before
    them gave it in Redis (so a journal it left is recognised when replayed), and a journal
    line of that version reads; a record with them keeps them both ways."""
    rec = usage_record(cache_read_tokens=3, cache_write_tokens=9, reasoning_tokens=1, cost_pico=5)
    before = {name: getattr(rec, name) for name in FIRST_USAGE_FIELDS + ADDED_USAGE_FIELDS}
    before["time"] = time_text(rec.time)
    assert encode_usage(rec) == orjson.dumps(before)
    assert decode_usage(orjson.dumps(before)) == rec
    previous_line = orjson.dumps(orjson.loads(journal_line(rec))[:-1]) + b"\n"
    assert journal_record(previous_line) == rec
    hour = replace(rec, cache_write_1h_tokens=4)
    assert orjson.loads(encode_usage(hour))["cache_write_1h_tokens"] == 4
    assert decode_usage(encode_usage(hour)) == hour
    assert journal_record(journal_line(hour)) == hour
    assert usage_json(hour)["cache_write_1h_tokens"] == 4
    with pytest.raises(ValueError, match="not a usage record"):
        journal_record(orjson.dumps(orjson.loads(journal_line(rec))[:-2]) + b"\n")
