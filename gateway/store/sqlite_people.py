"""Users and redemption codes in the SQLite store (mixed into ``sqlite.SQLiteStore``, whose
thread and transactions they use): tables ``users`` and ``redemptions``
(``sqlite_schema.py``).

A code credits once because redeeming is one ``BEGIN IMMEDIATE`` transaction: the UPDATE
that marks the code used matches only while it is unused and unexpired, and the account is
credited in the same transaction; another redeemer, in this process or any other on the
file, waits for the lock and then finds the code used.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from gateway.store import (
    Account,
    CodeRefusedError,
    ConflictError,
    MissingError,
    RedemptionRecord,
    UserRecord,
)
from gateway.store.records import to_micros
from gateway.store.redemptions import (
    REDEMPTION_FIELDS,
    code_status,
    redemption_from_row,
    redemption_row,
)
from gateway.store.sqlite_schema import BUMP_VERSION
from gateway.store.users import USER_FIELDS, apply_user_changes, user_from_row, user_row

T = TypeVar("T")

# the columns of users.user_row, in its order (``groups`` is a keyword of SQL: ``grps``)
USER_COLUMNS = ", ".join("grps" if name == "groups" else name for name in USER_FIELDS)
USER_VALUES = ", ".join("?" for _ in USER_FIELDS)
CODE_COLUMNS = ", ".join(REDEMPTION_FIELDS)
CODE_VALUES = ", ".join("?" for _ in REDEMPTION_FIELDS)


def _user(conn: sqlite3.Connection, where: str, value: str) -> UserRecord | None:
    row = conn.execute(f"SELECT {USER_COLUMNS} FROM users WHERE {where} = ?", (value,)).fetchone()
    return None if row is None else user_from_row(row)


def _code(conn: sqlite3.Connection, code_hash: str) -> RedemptionRecord | None:
    row = conn.execute(
        f"SELECT {CODE_COLUMNS} FROM redemptions WHERE code_hash = ?", (code_hash,)
    ).fetchone()
    return None if row is None else redemption_from_row(row)


class SQLitePeople:
    """The ``Store``'s user and redemption methods over the store's one connection."""

    if TYPE_CHECKING:

        async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...
        async def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    # -- users ------------------------------------------------------------------------------

    async def list_users(self) -> list[UserRecord]:
        def run(conn: sqlite3.Connection) -> list[UserRecord]:
            rows = conn.execute(f"SELECT {USER_COLUMNS} FROM users ORDER BY created_at, id")
            return [user_from_row(r) for r in rows.fetchall()]

        return await self._run(run)

    async def create_user(self, rec: UserRecord, balance: int | None = None) -> None:
        row = user_row(rec)

        def run(conn: sqlite3.Connection) -> None:
            if balance is not None:
                try:
                    conn.execute(
                        "INSERT INTO accounts (id, balance) VALUES (?, ?)", (rec.account, balance)
                    )
                except sqlite3.IntegrityError:
                    raise ConflictError(f"account {rec.account!r} already exists") from None
            else:
                exists = conn.execute("SELECT 1 FROM accounts WHERE id = ?", (rec.account,))
                if exists.fetchone() is None:
                    raise MissingError(f"no account {rec.account!r}")
            try:
                conn.execute(f"INSERT INTO users ({USER_COLUMNS}) VALUES ({USER_VALUES})", row)
            except sqlite3.IntegrityError:
                raise ConflictError(f"user {rec.id!r} or {rec.username!r} exists") from None
            conn.execute(BUMP_VERSION)

        await self._tx(run)

    async def get_user(self, user_id: str) -> UserRecord | None:
        return await self._run(lambda conn: _user(conn, "id", user_id))

    async def find_user(self, username: str) -> UserRecord | None:
        # the column's NOCASE collation: any case finds it
        return await self._run(lambda conn: _user(conn, "username", username))

    async def update_user(self, user_id: str, changes: Mapping[str, object]) -> UserRecord:
        def run(conn: sqlite3.Connection) -> UserRecord:
            found = _user(conn, "id", user_id)
            if found is None:
                raise MissingError(f"no user {user_id!r}")
            new = apply_user_changes(found, changes)
            row = dict(zip(USER_FIELDS, user_row(new), strict=True))
            conn.execute(
                "UPDATE users SET password_hash = ?, grps = ?, status = ? WHERE id = ?",
                (row["password_hash"], row["groups"], row["status"], user_id),
            )
            conn.execute(BUMP_VERSION)
            return new

        return await self._tx(run)

    async def delete_user(self, user_id: str) -> list[str]:
        def run(conn: sqlite3.Connection) -> list[str]:
            if conn.execute("DELETE FROM users WHERE id = ?", (user_id,)).rowcount == 0:
                raise MissingError(f"no user {user_id!r}")
            rows = conn.execute("DELETE FROM keys WHERE owner = ? RETURNING id", (user_id,))
            deleted = sorted(r[0] for r in rows.fetchall())
            conn.execute(BUMP_VERSION)
            return deleted

        return await self._tx(run)

    # -- redemption codes -------------------------------------------------------------------

    async def create_redemptions(self, recs: Sequence[RedemptionRecord]) -> None:
        rows = [redemption_row(r) for r in recs]

        def run(conn: sqlite3.Connection) -> None:
            try:
                conn.executemany(
                    f"INSERT INTO redemptions ({CODE_COLUMNS}) VALUES ({CODE_VALUES})", rows
                )
            except sqlite3.IntegrityError:
                raise ConflictError("a redemption code (or its id) already exists") from None

        await self._tx(run)

    async def list_redemptions(self) -> list[RedemptionRecord]:
        def run(conn: sqlite3.Connection) -> list[RedemptionRecord]:
            rows = conn.execute(
                f"SELECT {CODE_COLUMNS} FROM redemptions ORDER BY created_at, id"
            ).fetchall()
            return [redemption_from_row(r) for r in rows]

        return await self._run(run)

    async def redeem(
        self, code_hash: str, account: str, user: str, now: datetime
    ) -> tuple[RedemptionRecord, Account]:
        at = to_micros(now)

        def run(conn: sqlite3.Connection) -> tuple[RedemptionRecord, Account]:
            found = conn.execute(
                "UPDATE redemptions SET used_at = ?, account = ?, user = ? "
                "WHERE code_hash = ? AND used_at IS NULL "
                "AND (expires_at IS NULL OR expires_at > ?) RETURNING amount",
                (at, account, user, code_hash, at),
            ).fetchone()
            if found is None:
                rec = _code(conn, code_hash)
                raise CodeRefusedError("unknown" if rec is None else code_status(rec, now))
            credited = conn.execute(
                "UPDATE accounts SET balance = balance + ? WHERE id = ? RETURNING balance, carry",
                (int(found[0]), account),
            ).fetchone()
            if credited is None:  # raising rolls the code's mark back too
                raise MissingError(f"no account {account!r}")
            conn.execute(BUMP_VERSION)
            rec = _code(conn, code_hash)
            assert rec is not None
            return rec, Account(account, int(credited[0]), int(credited[1]))

        return await self._tx(run)
