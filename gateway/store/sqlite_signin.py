"""What console sessions and sign-in keep in SQLite (``SQLiteStore`` takes these methods
from ``SignInTables``; the tables are in ``sqlite_schema.py``).

- ``secrets`` holds the secret every worker signs console sessions with under the name
  ``console_session``: random, made by the first that asks (``INSERT OR IGNORE``, so two
  starting at once agree), replaced by a rotation, which bumps the version so that every
  cache loads the new one.
- ``sign_in_failures`` counts the failed sign-ins (and admin-token attempts) of one client
  address range or account name in a window that starts at its first failure; a window that
  is over is forgotten at the next failure of any name.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from gateway.store.sqlite_schema import BUMP_VERSION

T = TypeVar("T")
SESSION_SECRET = "console_session"  # its name in ``secrets``
SECRET_BYTES = 32


class SignInTables:
    """The session secret and the sign-in failures of ``SQLiteStore`` (see the module
    docstring)."""

    if TYPE_CHECKING:

        async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...
        async def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def session_secret(self) -> bytes:
        def read(conn: sqlite3.Connection) -> bytes | None:
            row = conn.execute("SELECT value FROM secrets WHERE name = ?", (SESSION_SECRET,))
            found = row.fetchone()
            return None if found is None else bytes(found[0])

        def make(conn: sqlite3.Connection) -> bytes | None:
            conn.execute(
                "INSERT OR IGNORE INTO secrets (name, value) VALUES (?, ?)",
                (SESSION_SECRET, os.urandom(SECRET_BYTES)),
            )
            return read(conn)

        secret = await self._run(read)
        if secret is None:
            secret = await self._tx(make)
        assert secret is not None  # made just now, by this process or another
        return secret

    async def rotate_session_secret(self) -> None:
        def run(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO secrets (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (SESSION_SECRET, os.urandom(SECRET_BYTES)),
            )
            conn.execute(BUMP_VERSION)

        await self._tx(run)

    async def count_failure(
        self, names: Sequence[str], window: int, now: int
    ) -> list[tuple[int, int]]:
        def run(conn: sqlite3.Connection) -> list[tuple[int, int]]:
            conn.execute("DELETE FROM sign_in_failures WHERE until <= ?", (now,))
            out: list[tuple[int, int]] = []
            for name in names:
                conn.execute(
                    "INSERT INTO sign_in_failures (name, failures, until) VALUES (?, 1, ?) "
                    "ON CONFLICT (name) DO UPDATE SET failures = failures + 1",
                    (name, now + window),
                )
                row = conn.execute(
                    "SELECT failures, until FROM sign_in_failures WHERE name = ?", (name,)
                ).fetchone()
                out.append((int(row[0]), int(row[1])))
            return out

        return await self._tx(run)
