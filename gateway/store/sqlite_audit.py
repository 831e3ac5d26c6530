"""The audit log in SQLite (``SQLiteStore`` takes these methods from ``AuditTable``; the
``audit`` table is in ``sqlite_schema.py``, made by the same ``CREATE TABLE IF NOT EXISTS``
in a file of an earlier version when it is next opened).

Entries are listed newest first by row number (``seq``: the order they were written, by
whichever worker process), which is also the cursor's tiebreaker. Each write trims the rows
more than ``AUDIT_KEEP`` behind it, one range delete along the primary key.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import orjson

from gateway.store import CursorError
from gateway.store.audit import (
    ACTOR_KINDS,
    AUDIT_KEEP,
    AuditEntry,
    AuditPage,
    AuditQuery,
)
from gateway.store.records import from_micros, to_micros
from gateway.store.sqlite_filters import status_and_period
from gateway.types import JSON

T = TypeVar("T")
COLUMNS = "time, actor, action, object_type, object_id, fields, ip_range, status, via, request_id"


def _row(e: AuditEntry) -> tuple[object, ...]:
    return (
        to_micros(e.time), e.actor, e.action, e.object_type, e.object_id,
        orjson.dumps(e.fields).decode(), e.ip_range, e.status, e.via, e.request_id,
    )  # fmt: skip


def _entry(row: tuple[JSON, ...]) -> AuditEntry:
    fields = orjson.loads(str(row[5]))
    return AuditEntry(
        time=from_micros(int(row[0])),
        actor=str(row[1]),
        action=str(row[2]),
        object_type=str(row[3]),
        object_id=str(row[4]),
        fields=fields if isinstance(fields, dict) else {},
        ip_range=str(row[6]),
        status=int(row[7]),
        via=str(row[8]),
        request_id=str(row[9]),
    )


def _where(query: AuditQuery) -> tuple[str, list[object]]:
    """The WHERE clause (and its arguments) of a query."""
    clauses: list[str] = []
    args: list[object] = []
    if query.actor is not None:
        if query.actor in ACTOR_KINDS:  # a kind: every actor of it
            clauses.append("(actor = ? OR substr(actor, 1, ?) = ?)")
            args += [query.actor, len(query.actor) + 1, query.actor + ":"]
        else:
            clauses.append("actor = ?")
            args.append(query.actor)
    if query.action is not None:
        if "." in query.action:
            clauses.append("action = ?")
            args.append(query.action)
        else:  # a type of object: every action on it
            clauses.append("substr(action, 1, ?) = ?")
            args += [len(query.action) + 1, query.action + "."]
    for column, value in (("object_type", query.object_type), ("object_id", query.object_id)):
        if value is not None:
            clauses.append(f"{column} = ?")
            args.append(value)
    shared, shared_args = status_and_period(query.status, query.since, query.until)
    clauses += shared
    args += shared_args
    if query.after is not None:
        seq = query.after[1]
        if not isinstance(seq, int):
            raise CursorError("not a cursor of this store")
        clauses.append("seq < ?")
        args.append(seq)
    return ("WHERE " + " AND ".join(clauses) if clauses else ""), args


class AuditTable:
    """The audit log of ``SQLiteStore`` (see the module docstring)."""

    if TYPE_CHECKING:

        async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...
        async def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def add_audit(self, entry: AuditEntry) -> None:
        row = _row(entry)

        def run(conn: sqlite3.Connection) -> None:
            cur = conn.execute(f"INSERT INTO audit ({COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)", row)
            if cur.lastrowid is not None and cur.lastrowid > AUDIT_KEEP:
                conn.execute("DELETE FROM audit WHERE seq <= ?", (cur.lastrowid - AUDIT_KEEP,))

        await self._tx(run)

    async def audit_page(self, query: AuditQuery, limit: int) -> AuditPage:
        if limit <= 0:
            return AuditPage([], None)
        where, args = _where(query)

        def run(conn: sqlite3.Connection) -> AuditPage:
            rows = conn.execute(
                f"SELECT seq, {COLUMNS} FROM audit {where} ORDER BY seq DESC LIMIT ?",
                [*args, limit + 1],
            ).fetchall()
            page = rows[:limit]
            after = (int(page[-1][1]), int(page[-1][0])) if len(rows) > limit else None
            return AuditPage([_entry(tuple(r[1:])) for r in page], after)

        return await self._run(run)
