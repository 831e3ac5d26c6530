"""Users, their keys and redemption codes in the store (CONTRACT §5b), one suite over every
backend (SQLite, Redis, Redis Cluster): a username is unique in any case; deleting a user
deletes its keys; a code credits its amount exactly once however many redeem it at once, on
one store object or several (several instances); a used, expired or unknown code changes
nothing; on Redis, a claim whose credit never came (a process died between the two steps) is
finished later, once. Also the cache (a disabled user's keys held disabled; a user's sessions
ended) and a SQLite file made by the schema before users, opened by this version."""

from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.store import (
    MICRO,
    CodeRefusedError,
    ConflictError,
    KeyRecord,
    MissingError,
    RedemptionRecord,
    Store,
    UserRecord,
    hash_key,
    key_hint,
)
from gateway.store.backends import open_store
from gateway.store.cache import USER_SESSIONS, Cache
from gateway.store.records import to_micros
from gateway.store.redemptions import claim_text
from gateway.store.redis import CLAIMS_KEY, CODES_KEY, PENDING_KEY, RedisStore
from gateway.store.sqlite import SQLiteStore
from tests.plugins.stores import ALL_BACKENDS, backend_url, sqlite_url

T0 = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
OLD_SCHEMA = Path(__file__).parent / "fixtures" / "sqlite" / "schema_before_users.sql"


@pytest.fixture(params=ALL_BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """This suite runs on a Redis Cluster too."""
    return backend_url(request, tmp_path)


def user(uid: str, username: str, account: str = "alice", created_at: datetime = T0) -> UserRecord:
    return UserRecord(
        id=uid,
        username=username,
        password_hash="$argon2id$not-a-real-hash",
        account=account,
        groups=("default",),
        created_at=created_at,
    )


def key(kid: str, owner: str | None, account: str = "alice") -> KeyRecord:
    secret = f"sk-{kid}-0000000000"
    return KeyRecord(
        id=kid,
        key_hash=hash_key(secret),
        account=account,
        group="default",
        hint=key_hint(secret),
        created_at=T0,
        owner=owner,
    )


def code(n: int, amount: int = 5 * MICRO, expires_at: datetime | None = None) -> RedemptionRecord:
    return RedemptionRecord(
        id=f"r_{n}",
        code_hash=hash_key(f"GW-CODE-{n}"),
        hint=f"GW-…{n:04d}",
        amount=amount,
        created_at=T0 + timedelta(seconds=n),
        expires_at=expires_at,
    )


async def test_users_are_kept_found_in_any_case_changed_and_listed(store: Store) -> None:
    await store.create_account("alice", 0)
    before = await store.version()
    await store.create_user(user("u_1", "Alice.W"))
    assert await store.version() != before  # every cache reloads its users
    assert await store.get_user("u_1") == user("u_1", "Alice.W")
    found = await store.find_user("alice.w")
    assert found is not None and found.id == "u_1" and found.username == "Alice.W"
    with pytest.raises(ConflictError):
        await store.create_user(user("u_2", "ALICE.W"))  # the same name in another case
    with pytest.raises(ConflictError):
        await store.create_user(user("u_1", "someone-else"))
    with pytest.raises(MissingError):
        await store.create_user(user("u_3", "carol", account="nobody"))
    assert await store.find_user("carol") is None

    changed = await store.update_user("u_1", {"status": "disabled", "groups": ["default", "vip"]})
    assert (changed.status, changed.groups) == ("disabled", ("default", "vip"))
    assert await store.get_user("u_1") == changed
    with pytest.raises(MissingError):
        await store.update_user("u_9", {"status": "disabled"})
    with pytest.raises(ValueError):
        await store.update_user("u_1", {"username": "bob"})
    await store.create_user(user("u_0", "bob", created_at=T0 - timedelta(days=1)))
    assert [u.id for u in await store.list_users()] == ["u_0", "u_1"]


async def test_a_user_with_an_account_of_its_own(store: Store) -> None:
    await store.create_user(user("u_1", "dana", account="u_1"), balance=0)
    account = await store.get_account("u_1")
    assert account is not None and account.balance == 0
    assert "u_1" in await store.load_balances()
    # the username is taken: nothing is created, the new account neither
    with pytest.raises(ConflictError):
        await store.create_user(user("u_2", "DANA", account="u_2"), balance=0)
    assert await store.get_account("u_2") is None
    assert "u_2" not in await store.load_balances()
    with pytest.raises(ConflictError):  # an account that exists is not taken over
        await store.create_user(user("u_3", "erin", account="u_1"), balance=0)


async def test_deleting_a_user_deletes_its_keys_and_only_those(store: Store) -> None:
    await store.create_account("alice", 0)
    await store.create_user(user("u_1", "alice"))
    await store.create_user(user("u_2", "bob"))
    for rec in (key("k-a1", "u_1"), key("k-a2", "u_1"), key("k-b", "u_2"), key("k-admin", None)):
        await store.create_key(rec)
    with pytest.raises(MissingError):  # a key of no such user
        await store.create_key(key("k-ghost", "u_9"))
    assert (await store.get_key("k-a1")) == key("k-a1", "u_1")  # the owner is kept
    assert await store.delete_key("k-a2")
    await store.create_key(key("k-a3", "u_1"))

    before = await store.version()
    assert await store.delete_user("u_1") == ["k-a1", "k-a3"]
    assert await store.version() != before
    assert sorted(k.id for k in await store.load_keys()) == ["k-admin", "k-b"]
    assert await store.get_user("u_1") is None and await store.find_user("alice") is None
    with pytest.raises(MissingError):
        await store.delete_user("u_1")
    # the name is free again, and the deleted keys' secrets too
    await store.create_user(user("u_3", "alice"))
    await store.create_key(replace(key("k-a1", "u_3"), id="k-again"))


async def test_a_code_credits_once_and_a_used_expired_or_unknown_one_changes_nothing(
    store: Store,
) -> None:
    await store.create_account("alice", 1 * MICRO)
    await store.create_account("bob", 0)
    soon = T0 + timedelta(hours=1)
    await store.create_redemptions([code(1), code(2, expires_at=soon), code(3, amount=7)])
    with pytest.raises(ConflictError):  # a batch with a code taken adds nothing
        await store.create_redemptions([code(4), code(1)])
    assert [r.id for r in await store.list_redemptions()] == ["r_1", "r_2", "r_3"]

    rec, account = await store.redeem(code(1).code_hash, "alice", "u_1", T0)
    assert account.balance == 6 * MICRO
    assert (rec.used_at, rec.account, rec.user, rec.amount) == (T0, "alice", "u_1", 5 * MICRO)
    version = await store.version()
    for who, at, number, reason in (
        ("bob", T0, 1, "used"),  # by anyone, again
        ("alice", T0, 1, "used"),
        ("bob", soon, 2, "expired"),  # its expiry is over at that moment
        ("bob", T0, 9, "unknown"),
    ):
        with pytest.raises(CodeRefusedError) as refused:
            await store.redeem(hash_key(f"GW-CODE-{number}"), who, "u_2", at)
        assert refused.value.reason == reason
    with pytest.raises(MissingError):
        await store.redeem(code(3).code_hash, "nobody", "u_2", T0)
    assert await store.version() == version  # nothing changed
    assert await store.load_balances() == {"alice": 6 * MICRO, "bob": 0}
    listed = {r.id: r for r in await store.list_redemptions()}
    assert listed["r_1"] == rec
    assert listed["r_2"].used_at is None and listed["r_3"].used_at is None  # still usable
    _, account = await store.redeem(code(2).code_hash, "bob", "u_2", soon - timedelta(seconds=1))
    assert account.balance == 5 * MICRO


async def test_twenty_redeem_one_code_at_once_from_two_stores_and_one_is_credited(
    store_url: str,
) -> None:
    """Two store objects on one store: two instances, each with its own connections."""
    a, b = open_store(store_url), open_store(store_url)
    await a.open()
    await b.open()
    try:
        await a.create_account("alice", 0)
        for i in range(20):
            await a.create_account(f"acct-{i}", 0)
        await a.create_redemptions([code(1, amount=3 * MICRO)])
        stores = [a, b]

        async def attempt(i: int) -> str:
            try:
                await stores[i % 2].redeem(code(1).code_hash, f"acct-{i}", f"u_{i}", T0)
            except CodeRefusedError as refused:
                return refused.reason
            return "credited"

        outcomes = await asyncio.gather(*(attempt(i) for i in range(20)))
        assert sorted(outcomes) == ["credited"] + ["used"] * 19
        balances = await b.load_balances()
        winner = f"acct-{outcomes.index('credited')}"
        assert balances[winner] == 3 * MICRO
        assert sum(balances.values()) == 3 * MICRO
        (rec,) = await a.list_redemptions()
        assert rec.account == winner and rec.used_at == T0
    finally:
        await a.close()
        await b.close()


async def test_redis_finishes_a_claim_whose_credit_never_came_once(store: Store) -> None:
    """A process that died between the claim and the credit: the code is used, its account
    not credited yet; the next listing (or a redeem that finds the code used) credits it, and
    finishing it again credits nothing more."""
    if not isinstance(store, RedisStore):
        pytest.skip("SQLite redeems in one transaction")
    await store.create_account("alice", 0)
    await store.create_redemptions([code(1, amount=2 * MICRO)])
    h = code(1).code_hash
    claim = claim_text("alice", "u_1", T0)
    raw = await store._scripts.claim_code(
        keys=[CODES_KEY, CLAIMS_KEY, PENDING_KEY], args=[h, claim, to_micros(T0)]
    )
    assert isinstance(raw, bytes)  # claimed; then the process died
    assert (await store.load_balances())["alice"] == 0
    with pytest.raises(CodeRefusedError):  # someone else tries it: used, and finished
        await store.redeem(h, "alice", "u_2", T0)
    assert (await store.load_balances())["alice"] == 2 * MICRO
    await store.client.sadd(PENDING_KEY, h)  # as if finished twice at once
    (rec,) = await store.list_redemptions()
    assert (rec.account, rec.user) == ("alice", "u_1")
    assert (await store.load_balances())["alice"] == 2 * MICRO
    assert not await store.client.smembers(PENDING_KEY)


async def test_the_cache_holds_a_disabled_users_keys_disabled_and_ends_its_sessions(
    store: Store,
) -> None:
    await store.create_account("alice", MICRO)
    await store.create_user(user("u_1", "alice"))
    await store.create_key(key("k-mine", "u_1"))
    await store.create_key(key("k-admin", None))
    cache = Cache(store)
    await cache.start()
    try:
        mine, admins = key("k-mine", "u_1").key_hash, key("k-admin", None).key_hash
        assert cache.key(mine).status == "enabled"  # type: ignore[union-attr]
        assert cache.user_session_ok("u_1", 1000)
        await store.update_user("u_1", {"status": "disabled"})
        await cache.refresh()
        assert cache.key(mine).status == "disabled"  # type: ignore[union-attr]
        assert cache.key(admins).status == "enabled"  # type: ignore[union-attr]
        assert not cache.user_session_ok("u_1", 1000)
        assert (await store.get_key("k-mine")).status == "enabled"  # type: ignore[union-attr]
        # enabled again: its keys with it, but sessions ended before stay ended
        now = int(datetime.now(UTC).timestamp())
        await store.revoke_session(USER_SESSIONS + "u_1", now + 100, now)
        await store.update_user("u_1", {"status": "enabled"})
        await cache.refresh()
        assert cache.key(mine).status == "enabled"  # type: ignore[union-attr]
        assert not cache.user_session_ok("u_1", now + 100)  # began before the end
        assert cache.user_session_ok("u_1", now + 101)  # began after
        await store.delete_user("u_1")
        await cache.refresh()
        assert cache.key(mine) is None and not cache.user_session_ok("u_1", now + 101)
    finally:
        await cache.stop()


async def test_a_sqlite_file_made_before_users_opens_with_them(tmp_path: Path) -> None:
    """The schema before users and codes, with a key in it: opened by this version, the key
    keeps working (no owner), and users, owned keys and codes work."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_SCHEMA.read_text())
        conn.execute("INSERT INTO accounts (id, balance) VALUES ('alice', 1000000)")
        conn.execute(
            "INSERT INTO keys (id, key_hash, account, grp, hint) VALUES (?, ?, 'alice', "
            "'default', 'sk-…old0')",
            ("k-old", hash_key("sk-old-key")),
        )
    conn.close()
    store = SQLiteStore(sqlite_url(path))
    await store.open()
    try:
        (old,) = await store.load_keys()
        assert (old.id, old.owner, old.status) == ("k-old", None, "enabled")
        await store.create_user(user("u_1", "alice"))
        await store.create_key(key("k-new", "u_1"))
        await store.create_redemptions([code(1)])
        _, account = await store.redeem(code(1).code_hash, "alice", "u_1", T0)
        assert account.balance == 6 * MICRO
        assert await store.delete_user("u_1") == ["k-new"]
        assert [k.id for k in await store.load_keys()] == ["k-old"]
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    conn.close()
    assert "keys_owner" in indexes
