"""The embedded store: one SQLite file in WAL mode, shared by every worker process.

Every statement runs on one dedicated thread per store (a single-thread executor), so the event
loop never blocks on the file and the connection is never shared between threads. Writes are
``BEGIN IMMEDIATE`` transactions; the busy timeout makes the other worker processes wait their
turn instead of failing. Money is integer micro-units; times are integer microseconds since the
Unix epoch (UTC), which sort and compare exactly.

Schema (its text and the upgrade of older files: ``store/sqlite_schema.py``): ``accounts``,
``keys`` (by SHA-256 of the secret, never the secret), ``users`` and ``redemptions``
(``store/sqlite_people.py``), ``usage`` (newest first through indexes
by account, by key and by time), ``catalogue_entries`` (groups, models and channels, one row per
entry: ``store/catalogue.py``), ``revoked_sessions`` (console sessions signed out, until they
would have ended), ``secrets`` (the console's session-signing secret), ``audit`` (the
operators' changes: ``store/sqlite_audit.py``) and ``meta`` (the
``version`` the caches poll: bumped by every key change, account creation, top-up, catalogue
change, sign-out and session-secret rotation, never by a debit).
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import orjson

from gateway.store import (
    MICRO,
    Account,
    ConflictError,
    CursorError,
    DailyUsage,
    KeyRecord,
    MissingError,
    StoreClosedError,
    UsagePage,
    UsageQuery,
    UsageRecord,
)
from gateway.store.catalogue import CatalogueRecords, Editor, seed_edit
from gateway.store.records import (
    KEY_CHANGES,
    KEY_FIELDS,
    USAGE_FIELDS,
    apply_key_changes,
    daily_rows,
    debits,
    key_from_row,
    key_row,
    seed_keys,
    usage_from_row,
    usage_row,
)
from gateway.store.sqlite_audit import AuditTable
from gateway.store.sqlite_filters import status_and_period
from gateway.store.sqlite_people import SQLitePeople
from gateway.store.sqlite_schema import BUMP_VERSION, create_schema
from gateway.store.sqlite_signin import SignInTables

if TYPE_CHECKING:
    from gateway.config import Settings

URL_PREFIX = "sqlite:///"
BUSY_TIMEOUT_MS = 30_000

ADD_DAILY = """
INSERT INTO usage_daily (day, account, key_id, model, requests, prompt_tokens,
                         completion_tokens, cost, cache_read_tokens, cache_write_tokens)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (day, account, key_id, model) DO UPDATE SET
    requests = requests + excluded.requests,
    prompt_tokens = prompt_tokens + excluded.prompt_tokens,
    completion_tokens = completion_tokens + excluded.completion_tokens,
    cost = cost + excluded.cost,
    cache_read_tokens = cache_read_tokens + excluded.cache_read_tokens,
    cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens
"""

# the columns of records.key_row and records.usage_row, in their order (``group`` is a keyword
# of SQL: its column is ``grp``)
KEY_COLUMNS = ", ".join("grp" if name == "group" else name for name in KEY_FIELDS)
KEY_VALUES = ", ".join("?" for _ in KEY_FIELDS)
USAGE_COLUMNS = ", ".join(USAGE_FIELDS)
# usage rows per INSERT statement: a batch goes in as a few statements of many rows, not
# through executemany, which steps and resets a statement once per row. The statements come in
# a few sizes only (``insert_sizes``): each text is parsed once and then found in the
# connection's statement cache, where a text per batch size (and per size of each IN list)
# was parsed anew for most batches, some 20k instructions a record
ROWS_PER_INSERT = 32  # a power of two; 32 x 19 values stays under SQLite's oldest limit of 999
IDS_PER_LOOKUP = 512  # request ids per SELECT ... IN (...), a power of two under the same limit

T = TypeVar("T")


def db_path(url: str) -> str:
    """``sqlite:///rel/path`` is relative to the working directory, ``sqlite:////abs`` absolute."""
    if not url.startswith(URL_PREFIX) or len(url) == len(URL_PREFIX):
        raise ValueError(f"not a sqlite:/// URL: {url}")
    return url[len(URL_PREFIX) :]


@functools.cache
def _insert_usage(rows: int) -> str:
    """One INSERT of ``rows`` usage rows."""
    one = "(" + ",".join("?" * USAGE_COLUMNS.count(",")) + ",?)"
    return f"INSERT INTO usage ({USAGE_COLUMNS}) VALUES " + ",".join([one] * rows)


def insert_sizes(rows: int) -> list[int]:
    """``rows`` as the sizes of the INSERTs that write them: ``ROWS_PER_INSERT`` at a time,
    the rest in powers of two (37 -> 32, 4, 1), so that a few texts serve every batch."""
    sizes = [ROWS_PER_INSERT] * (rows // ROWS_PER_INSERT)
    rest = rows % ROWS_PER_INSERT
    while rest:
        size = 1 << (rest.bit_length() - 1)
        sizes.append(size)
        rest -= size
    return sizes


def _id_lists(ids: list[str]) -> Iterator[tuple[str, list[str]]]:
    """``ids`` as the marks and values of IN lists of ``IDS_PER_LOOKUP`` at most, each padded
    to a power of two with its last id (a repeated id changes nothing in an IN list), so a
    few texts serve every batch."""
    for i in range(0, len(ids), IDS_PER_LOOKUP):
        part = ids[i : i + IDS_PER_LOOKUP]
        size = 1 << (len(part) - 1).bit_length()
        yield _marks(size), part + part[-1:] * (size - len(part))


@functools.cache
def _marks(size: int) -> str:
    return ",".join("?" * size)


def _carries(conn: sqlite3.Connection, records: Sequence[UsageRecord]) -> dict[str, int]:
    """The carry of each account that a record with pico-units bills (an account that does
    not exist is left out)."""
    accounts = sorted({r.account for r in records if r.cost_pico})
    carry: dict[str, int] = {}
    for marks, part in _id_lists(accounts):
        rows = conn.execute(f"SELECT id, carry FROM accounts WHERE id IN ({marks})", part)
        carry.update((r[0], int(r[1])) for r in rows)
    return carry


def _held_ids(conn: sqlite3.Connection, ids: list[str]) -> set[str]:
    """Which of these request ids the usage table holds already."""
    held: set[str] = set()
    for marks, part in _id_lists(ids):
        rows = conn.execute(f"SELECT request_id FROM usage WHERE request_id IN ({marks})", part)
        held.update(r[0] for r in rows)
    return held


def _load_catalogue(conn: sqlite3.Connection) -> CatalogueRecords:
    rows = conn.execute("SELECT kind, name, payload FROM catalogue_entries").fetchall()
    return CatalogueRecords.decode((f"{kind}:{name}", payload) for kind, name, payload in rows)


def _edit_catalogue(conn: sqlite3.Connection, edit: Editor) -> bool:
    """Apply ``edit`` to the catalogue inside the caller's transaction; whether it changed."""
    change = edit(_load_catalogue(conn))
    if not change:
        return False
    conn.executemany(
        "INSERT INTO catalogue_entries (kind, name, payload) VALUES (?, ?, ?) "
        "ON CONFLICT (kind, name) DO UPDATE SET payload = excluded.payload",
        [(kind, name, orjson.dumps(rec).decode()) for (kind, name), rec in change.put.items()],
    )
    conn.executemany(
        "DELETE FROM catalogue_entries WHERE kind = ? AND name = ?", sorted(change.delete)
    )
    return True


def _usage_where(query: UsageQuery) -> tuple[str, list[object]]:
    """The WHERE clause (and its arguments) of a usage query."""
    clauses: list[str] = []
    args: list[object] = []
    for column, value in (
        ("account", query.account),
        ("key_id", query.key_id),
        ("model", query.model),
    ):
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    shared, shared_args = status_and_period(query.status, query.since, query.until)
    clauses += shared
    args += shared_args
    if query.after is not None:
        time, seq = query.after
        if not isinstance(seq, int):
            raise CursorError("not a cursor of this store")
        clauses.append("(time, seq) < (?, ?)")
        args += [time, seq]
    return ("WHERE " + " AND ".join(clauses) if clauses else ""), args


class SQLiteStore(SQLitePeople, SignInTables, AuditTable):
    """The ``Store`` over one SQLite file (see the module docstring; users and redemption
    codes: ``sqlite_people.py``; the session secret and sign-in failures:
    ``sqlite_signin.py``; the audit log: ``sqlite_audit.py``)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.path = db_path(url)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None

    # -- plumbing ---------------------------------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._executor is None or self._conn is None:
            raise StoreClosedError("SQLiteStore is not open")
        conn = self._conn
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, conn)

    async def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` inside one write transaction, on the store's thread."""

        def run(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        return await self._run(run)

    def _connect(self) -> sqlite3.Connection:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path,
            timeout=BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,  # transactions are explicit
            check_same_thread=False,  # created here, then only used on the store's thread
        )
        try:
            had_daily = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'usage_daily'"
            ).fetchone()
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            create_schema(conn, backfill_daily=not had_daily)
        except BaseException:
            conn.close()
            raise
        return conn

    async def open(self) -> None:
        if self._conn is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gw-sqlite")
        try:
            loop = asyncio.get_running_loop()
            self._conn = await loop.run_in_executor(self._executor, self._connect)
        except BaseException:
            self._executor.shutdown(wait=False)
            self._executor = None
            raise

    async def close(self) -> None:
        executor, conn = self._executor, self._conn
        if executor is None:
            return
        self._conn = None
        self._executor = None
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(executor, conn.close)
        executor.shutdown(wait=True)

    # -- seed, version, snapshot ------------------------------------------------------------

    async def seed(self, settings: Settings) -> None:
        accounts = [(a.id, round(a.balance * MICRO)) for a in settings.accounts]
        keys = [key_row(k) for k in seed_keys(settings, datetime.now(UTC))]
        catalogue = seed_edit(settings)

        def run(conn: sqlite3.Connection) -> None:
            changed = 0
            for row in accounts:
                changed += conn.execute(
                    "INSERT OR IGNORE INTO accounts (id, balance) VALUES (?, ?)", row
                ).rowcount
            for krow in keys:
                changed += conn.execute(
                    f"INSERT OR IGNORE INTO keys ({KEY_COLUMNS}) VALUES ({KEY_VALUES})", krow
                ).rowcount
            if _edit_catalogue(conn, catalogue):
                changed += 1
            if changed:
                conn.execute(BUMP_VERSION)

        await self._tx(run)

    async def version(self) -> int:
        def run(conn: sqlite3.Connection) -> int:
            row = conn.execute("SELECT version FROM meta WHERE id = 1").fetchone()
            return 0 if row is None else int(row[0])

        return await self._run(run)

    async def load_keys(self) -> list[KeyRecord]:
        def run(conn: sqlite3.Connection) -> list[KeyRecord]:
            rows = conn.execute(f"SELECT {KEY_COLUMNS} FROM keys").fetchall()
            return [key_from_row(r) for r in rows]

        return await self._run(run)

    async def load_balances(self) -> dict[str, int]:
        def run(conn: sqlite3.Connection) -> dict[str, int]:
            return {r[0]: int(r[1]) for r in conn.execute("SELECT id, balance FROM accounts")}

        return await self._run(run)

    async def load_spent(self) -> dict[str, int]:
        def run(conn: sqlite3.Connection) -> dict[str, int]:
            rows = conn.execute("SELECT id, spent FROM keys WHERE spent != 0")
            return {r[0]: int(r[1]) for r in rows}

        return await self._run(run)

    async def load_revoked(self, now: int) -> dict[str, int]:
        def run(conn: sqlite3.Connection) -> dict[str, int]:
            rows = conn.execute(
                "SELECT nonce, expires FROM revoked_sessions WHERE expires > ?", (now,)
            )
            return {r[0]: int(r[1]) for r in rows}

        return await self._run(run)

    async def revoke_session(self, nonce: str, expires: int, now: int) -> None:
        def run(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM revoked_sessions WHERE expires <= ?", (now,))
            conn.execute(
                "INSERT INTO revoked_sessions (nonce, expires) VALUES (?, ?) "
                "ON CONFLICT (nonce) DO UPDATE SET expires = max(expires + 1, excluded.expires)",
                (nonce, expires),
            )
            conn.execute(BUMP_VERSION)

        await self._tx(run)

    # -- accounts ---------------------------------------------------------------------------

    async def create_account(self, account_id: str, balance: int) -> Account:
        def run(conn: sqlite3.Connection) -> Account:
            try:
                conn.execute(
                    "INSERT INTO accounts (id, balance) VALUES (?, ?)", (account_id, balance)
                )
            except sqlite3.IntegrityError:
                raise ConflictError(f"account {account_id!r} already exists") from None
            conn.execute(BUMP_VERSION)
            return Account(account_id, balance)

        return await self._tx(run)

    async def get_account(self, account_id: str) -> Account | None:
        def run(conn: sqlite3.Connection) -> Account | None:
            row = conn.execute(
                "SELECT id, balance, carry FROM accounts WHERE id = ?", (account_id,)
            ).fetchone()
            return None if row is None else Account(row[0], int(row[1]), int(row[2]))

        return await self._run(run)

    async def topup(self, account_id: str, amount: int) -> Account:
        def run(conn: sqlite3.Connection) -> Account:
            row = conn.execute(
                "UPDATE accounts SET balance = balance + ? WHERE id = ? RETURNING balance, carry",
                (amount, account_id),
            ).fetchone()
            if row is None:
                raise MissingError(f"no account {account_id!r}")
            conn.execute(BUMP_VERSION)
            return Account(account_id, int(row[0]), int(row[1]))

        return await self._tx(run)

    # -- keys -------------------------------------------------------------------------------

    async def create_key(self, rec: KeyRecord) -> None:
        if rec.created_at is None:
            rec = replace(rec, created_at=datetime.now(UTC))
        row = key_row(rec)

        def run(conn: sqlite3.Connection) -> None:
            if (
                conn.execute("SELECT 1 FROM accounts WHERE id = ?", (rec.account,)).fetchone()
                is None
            ):
                raise MissingError(f"no account {rec.account!r}")
            if (
                rec.owner is not None
                and conn.execute("SELECT 1 FROM users WHERE id = ?", (rec.owner,)).fetchone()
                is None
            ):
                raise MissingError(f"no user {rec.owner!r}")
            try:
                conn.execute(f"INSERT INTO keys ({KEY_COLUMNS}) VALUES ({KEY_VALUES})", row)
            except sqlite3.IntegrityError:
                raise ConflictError(f"key {rec.id!r} (or its secret) already exists") from None
            conn.execute(BUMP_VERSION)

        await self._tx(run)

    async def get_key(self, key_id: str) -> KeyRecord | None:
        def run(conn: sqlite3.Connection) -> KeyRecord | None:
            row = conn.execute(f"SELECT {KEY_COLUMNS} FROM keys WHERE id = ?", (key_id,)).fetchone()
            return None if row is None else key_from_row(row)

        return await self._run(run)

    async def list_keys(self, account: str | None = None) -> list[KeyRecord]:
        def run(conn: sqlite3.Connection) -> list[KeyRecord]:
            order = "ORDER BY created_at, id"
            if account is None:
                rows = conn.execute(f"SELECT {KEY_COLUMNS} FROM keys {order}").fetchall()
            else:
                rows = conn.execute(
                    f"SELECT {KEY_COLUMNS} FROM keys WHERE account = ? {order}", (account,)
                ).fetchall()
            return [key_from_row(r) for r in rows]

        return await self._run(run)

    async def update_key(self, key_id: str, changes: dict[str, object]) -> KeyRecord:
        def run(conn: sqlite3.Connection) -> KeyRecord:
            row = conn.execute(f"SELECT {KEY_COLUMNS} FROM keys WHERE id = ?", (key_id,)).fetchone()
            if row is None:
                raise MissingError(f"no key {key_id!r}")
            new = apply_key_changes(key_from_row(row), changes)
            values = dict(zip(KEY_FIELDS, key_row(new), strict=True))
            columns = [name for name in KEY_FIELDS if name in KEY_CHANGES]
            conn.execute(
                "UPDATE keys SET "
                + ", ".join(f"{'grp' if n == 'group' else n} = ?" for n in columns)
                + " WHERE id = ?",
                [*(values[n] for n in columns), key_id],
            )
            conn.execute(BUMP_VERSION)
            return new

        return await self._tx(run)

    async def delete_key(self, key_id: str) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            if conn.execute("DELETE FROM keys WHERE id = ?", (key_id,)).rowcount == 0:
                return False
            conn.execute(BUMP_VERSION)
            return True

        return await self._tx(run)

    # -- usage ------------------------------------------------------------------------------

    async def settle(self, records: Sequence[UsageRecord]) -> None:
        """Each record once: one already held (by request id: a journal replayed after a
        crash re-sends what was settled just before it) is neither inserted nor debited. The
        accounts' carries are read and written in the same transaction (``records.debits``)."""
        if not records:
            return

        def run(conn: sqlite3.Connection) -> None:
            held = _held_ids(conn, [r.request_id for r in records])
            fresh = [r for r in records if r.request_id not in held] if held else records
            carry = _carries(conn, fresh)
            carried = dict(carry)
            debited = debits(fresh, carry)
            totals: dict[str, int] = {}
            by_key: dict[str, int] = {}
            for r, debit in zip(fresh, debited, strict=True):
                if debit:  # one UPDATE per account (and key) and batch, not one per record
                    totals[r.account] = totals.get(r.account, 0) + debit
                    by_key[r.key_id] = by_key.get(r.key_id, 0) + debit
            conn.executemany(
                "UPDATE accounts SET balance = balance - ? WHERE id = ?",
                [(cost, account) for account, cost in totals.items()],
            )
            conn.executemany(
                "UPDATE accounts SET carry = ? WHERE id = ?",
                [(pico, account) for account, pico in carry.items() if pico != carried[account]],
            )
            conn.executemany(
                "UPDATE keys SET spent = spent + ? WHERE id = ?",
                [(cost, key_id) for key_id, cost in by_key.items()],
            )
            conn.executemany(ADD_DAILY, daily_rows(fresh, debited))
            i = 0
            for size in insert_sizes(len(fresh)):
                part = fresh[i : i + size]
                rows = list(chain.from_iterable(map(usage_row, part)))  # in C, not a loop
                conn.execute(_insert_usage(size), rows)
                i += size

        await self._tx(run)

    async def usage_daily(
        self, since: str, until: str, account: str | None = None
    ) -> list[DailyUsage]:
        def run(conn: sqlite3.Connection) -> list[DailyUsage]:
            query = (
                "SELECT day, account, key_id, model, requests, prompt_tokens, completion_tokens,"
                " cost, cache_read_tokens, cache_write_tokens FROM usage_daily"
                " WHERE day BETWEEN ? AND ?"
            )
            args: list[str] = [since, until]
            if account is not None:
                query += " AND account = ?"
                args.append(account)
            return [DailyUsage(*row) for row in conn.execute(query, args)]

        return await self._run(run)

    async def share_holds(
        self, instance: str, holds: Mapping[str, int], ttl_ms: int, now: int
    ) -> dict[str, int]:
        def run(conn: sqlite3.Connection) -> dict[str, int]:
            conn.execute("DELETE FROM holds WHERE instance = ? OR expires <= ?", (instance, now))
            conn.executemany(
                "INSERT INTO holds (instance, account, amount, expires) VALUES (?, ?, ?, ?)",
                [(instance, account, amount, now + ttl_ms) for account, amount in holds.items()],
            )
            rows = conn.execute(
                "SELECT account, SUM(amount) FROM holds WHERE instance != ? GROUP BY account",
                (instance,),
            )
            return {account: int(total) for account, total in rows.fetchall()}

        return await self._tx(run)

    async def share_cooling(self, cooling: Mapping[str, int], now: int) -> dict[str, int]:
        def run(conn: sqlite3.Connection) -> dict[str, int]:
            conn.executemany(
                "INSERT INTO cooling (channel, until) VALUES (?, ?) ON CONFLICT (channel) "
                "DO UPDATE SET until = max(until, excluded.until)",
                list(cooling.items()),
            )
            conn.execute("DELETE FROM cooling WHERE until <= ?", (now,))
            return dict(conn.execute("SELECT channel, until FROM cooling").fetchall())

        return await self._tx(run)

    async def usage(self, account: str | None = None, limit: int = 100) -> list[UsageRecord]:
        return (await self.usage_page(UsageQuery(account=account), limit)).records

    async def usage_page(self, query: UsageQuery, limit: int) -> UsagePage:
        """One SELECT: the filters in its WHERE, newest first by ``(time, seq)`` along the
        index of the key (when the query names one), else of the account, else of time;
        model and status are checked on the rows that index walks, up to the limit."""
        if limit <= 0:
            return UsagePage([], None)
        where, args = _usage_where(query)

        def run(conn: sqlite3.Connection) -> UsagePage:
            rows = conn.execute(
                f"SELECT seq, {USAGE_COLUMNS} FROM usage {where} "
                "ORDER BY time DESC, seq DESC LIMIT ?",
                [*args, limit + 1],
            ).fetchall()
            page = rows[:limit]
            after = (page[-1][1], page[-1][0]) if len(rows) > limit else None
            return UsagePage([usage_from_row(r[1:]) for r in page], after)

        return await self._run(run)

    # -- catalogue --------------------------------------------------------------------------

    async def load_catalogue(self) -> CatalogueRecords:
        return await self._run(_load_catalogue)

    async def edit_catalogue(self, edit: Editor) -> None:
        """``edit`` runs on the store's thread inside the write transaction; what it raises
        rolls everything back and reaches the caller."""

        def run(conn: sqlite3.Connection) -> None:
            if _edit_catalogue(conn, edit):
                conn.execute(BUMP_VERSION)

        await self._tx(run)
