"""The billing endpoints chat UIs read (CONTRACT §3), and the daily totals they come from
(``Store.usage_daily``, kept by settlement), on both stores: what a UI shows as left is the
balance, the usage is what the requests cost, a key with a quota sees its own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.store import MICRO, UsageRecord
from tests.plugins.servers import ADMIN_TOKEN, KEYS, ServedGateway
from tests.plugins.stores import ALL_BACKENDS, backend_url

ALICE = {"Authorization": f"Bearer {KEYS['alice']}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CHAT = {"model": "chat-small", "messages": [{"role": "user", "content": "hello there"}]}
MESSAGES = {"model": "claude-small", "max_tokens": 16, "messages": CHAT["messages"]}


@pytest.fixture(params=ALL_BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """These run on a Redis Cluster too."""
    return backend_url(request, tmp_path)


async def get(s: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> tuple[int, Any]:
    async with s.get(url, headers=headers) as r:
        return r.status, await r.json()


async def spend(s: aiohttp.ClientSession, gw: ServedGateway, headers: dict[str, str]) -> None:
    for path, body in (("/chat/completions", CHAT), ("/messages", MESSAGES)):
        async with s.post(gw.v1 + path, json=body, headers=headers) as r:
            assert r.status == 200, await r.text()


async def alice_records(gw: ServedGateway) -> list[UsageRecord]:
    await gw.state.writer.flush()
    return await gw.state.store.usage("alice", 1_000)


async def test_what_a_chat_ui_shows_left_is_the_balance(gateway: ServedGateway) -> None:
    async with aiohttp.ClientSession() as s:
        await spend(s, gateway, ALICE)
        records = await alice_records(gateway)
        spent = sum(r.cost for r in records)
        assert spent > 0
        status, sub = await get(s, gateway.v1 + "/dashboard/billing/subscription", ALICE)
        assert status == 200
        assert sub["object"] == "billing_subscription"
        assert sub["access_until"] == 0
        status, usage = await get(s, gateway.v1 + "/dashboard/billing/usage", ALICE)
        assert status == 200
        assert usage["object"] == "list"
        assert round(usage["total_usage"] / 100 * MICRO) == spent
        balance = (await gateway.state.store.get_account("alice")).balance  # type: ignore[union-attr]
        left = sub["hard_limit_usd"] - usage["total_usage"] / 100
        assert round(left * MICRO) == balance
        (day,) = usage["daily_costs"]
        costs = {item["name"]: round(item["cost"] / 100 * MICRO) for item in day["line_items"]}
        by_model: dict[str, int] = {}
        for r in records:
            by_model[r.model] = by_model.get(r.model, 0) + r.cost
        assert costs == by_model


async def test_usage_dates_bound_the_total(gateway: ServedGateway) -> None:
    async with aiohttp.ClientSession() as s:
        await spend(s, gateway, ALICE)
        await gateway.state.writer.flush()
        today = datetime.now(UTC).date()
        url = gateway.v1 + "/dashboard/billing/usage"
        tomorrow = (today + timedelta(days=1)).isoformat()
        yesterday = (today - timedelta(days=1)).isoformat()
        _, past = await get(s, f"{url}?start_date={yesterday}&end_date={today}", ALICE)
        assert past["total_usage"] == 0
        _, now = await get(s, f"{url}?start_date={today}&end_date={tomorrow}", ALICE)
        assert now["total_usage"] > 0
        status, err = await get(s, f"{url}?start_date=soon", ALICE)
        assert status == 400
        assert err["error"]["message"].startswith("start_date")
        status, err = await get(s, f"{url}?start_date={today}&end_date={yesterday}", ALICE)
        assert status == 400
        status, err = await get(s, url, {})
        assert status == 401


async def test_a_key_with_a_quota_sees_its_own(gateway: ServedGateway) -> None:
    async with aiohttp.ClientSession() as s:
        await spend(s, gateway, ALICE)  # the account's other spending is not the key's
        body = {"account": "alice", "group": "default", "quota": 0.01}
        async with s.post(gateway.url + "/admin/keys", json=body, headers=ADMIN) as r:
            made = await r.json()
        mine = {"Authorization": f"Bearer {made['key']}"}
        await spend(s, gateway, mine)
        records = [r for r in await alice_records(gateway) if r.key_id == made["id"]]
        spent = sum(r.cost for r in records)
        _, sub = await get(s, gateway.v1 + "/dashboard/billing/subscription", mine)
        _, usage = await get(s, gateway.v1 + "/dashboard/billing/usage", mine)
        assert round(usage["total_usage"] / 100 * MICRO) == spent
        assert round(sub["hard_limit_usd"] * MICRO) == 10_000  # the quota: what is left + spent


async def test_daily_totals_sum_the_records_once(gateway: ServedGateway) -> None:
    async with aiohttp.ClientSession() as s:
        await spend(s, gateway, ALICE)
        await spend(s, gateway, ALICE)
    records = await alice_records(gateway)
    store = gateway.state.store
    await store.settle(records)  # a batch settled again (a journal replayed) counts once
    today = datetime.now(UTC).date().isoformat()
    rows = await store.usage_daily(today, today, "alice")
    assert sum(r.requests for r in rows) == len(records)
    assert sum(r.cost for r in rows) == sum(r.cost for r in records)
    assert sum(r.prompt_tokens for r in rows) == sum(r.prompt_tokens for r in records)
    assert sum(r.completion_tokens for r in rows) == sum(r.completion_tokens for r in records)
    assert {r.model for r in rows} == {"chat-small", "claude-small"}
    assert await store.usage_daily("2000-01-01", "2000-01-31") == []


async def test_a_sqlite_file_from_before_the_daily_totals_gets_them_from_its_records(
    tmp_path: Any,
) -> None:
    import sqlite3

    from gateway.store.sqlite import SQLiteStore

    url = f"sqlite:///{tmp_path / 'old.db'}"
    when = datetime(2026, 3, 4, 23, 59, tzinfo=UTC)
    records = [
        UsageRecord(when, f"r{i}", "a", "k", "m", "c", "openai", "chat", 3, 4, 10, 200, 5, "")
        for i in range(3)
    ]
    store = SQLiteStore(url)
    await store.open()
    await store.settle(records)
    await store.close()
    conn = sqlite3.connect(tmp_path / "old.db")
    conn.execute("DROP TABLE usage_daily")
    conn.commit()
    conn.close()
    store = SQLiteStore(url)
    await store.open()
    try:
        (row,) = await store.usage_daily("2026-03-04", "2026-03-04")
        assert (row.requests, row.prompt_tokens, row.completion_tokens, row.cost) == (3, 9, 12, 30)
    finally:
        await store.close()


def cached(i: int, read: int, write: int, when: datetime) -> UsageRecord:
    return UsageRecord(when, f"c{i}", "alice", "k-alice", "claude-small", "an", "anthropic",
                       "chat", 1000, 4, 10, 200, 5, "", cache_read_tokens=read,
                       cache_write_tokens=write)  # fmt: skip


async def test_daily_totals_keep_the_cache_classes(gateway: ServedGateway) -> None:
    """The overview's cache hit rates come from the days' totals, never from every record."""
    when = datetime(2026, 3, 4, 12, tzinfo=UTC)
    await gateway.state.store.settle([cached(0, 0, 900, when), cached(1, 900, 50, when),
                                      cached(2, 950, 0, when)])  # fmt: skip
    (row,) = await gateway.state.store.usage_daily("2026-03-04", "2026-03-04", "alice")
    assert (row.requests, row.prompt_tokens) == (3, 3000)
    assert (row.cache_read_tokens, row.cache_write_tokens) == (1850, 950)
    async with aiohttp.ClientSession() as s:
        url = gateway.url + "/admin/usage/daily?since=2026-03-04&until=2026-03-04"
        status, body = await get(s, url, ADMIN)
    assert status == 200
    (day,) = body["data"]
    assert (day["cache_read_tokens"], day["cache_write_tokens"]) == (1850, 950)


async def test_a_sqlite_file_from_before_the_daily_cache_classes_gets_them(
    tmp_path: Any,
) -> None:
    import sqlite3

    from gateway.store.sqlite import SQLiteStore

    url = f"sqlite:///{tmp_path / 'old.db'}"
    when = datetime(2026, 3, 4, 12, tzinfo=UTC)
    store = SQLiteStore(url)
    await store.open()
    await store.settle([cached(0, 0, 900, when)])
    await store.close()
    conn = sqlite3.connect(tmp_path / "old.db")
    for column in ("cache_read_tokens", "cache_write_tokens"):
        conn.execute(f"ALTER TABLE usage_daily DROP COLUMN {column}")
    conn.commit()
    conn.close()
    store = SQLiteStore(url)
    await store.open()
    try:
        (row,) = await store.usage_daily("2026-03-04", "2026-03-04")
        assert (row.requests, row.cache_read_tokens, row.cache_write_tokens) == (1, 0, 0)
        await store.settle([cached(1, 900, 50, when)])
        (row,) = await store.usage_daily("2026-03-04", "2026-03-04")
        assert (row.requests, row.cache_read_tokens, row.cache_write_tokens) == (2, 900, 50)
    finally:
        await store.close()
