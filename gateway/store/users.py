"""The shapes a user record takes outside memory, written once for both backends: a row of
``USER_FIELDS`` in SQLite (its groups as JSON text, its time in microseconds since the epoch),
a JSON object in Redis (its time as RFC 3339 text). ``apply_user_changes`` is the one way a
stored user is changed. Nothing here does I/O.

Usernames are unique regardless of case: both stores index a user by ``username_key``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any

import orjson

from gateway.store import UserRecord
from gateway.store.records import from_micros, parse_time_text, time_text, to_micros

USER_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(UserRecord))
USER_STATUSES = ("enabled", "disabled")
# what a username may be (``operator/users.py`` checks it; ``operator/lockout.py`` counts a
# failed sign-in against a name only when it could be one)
USERNAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{2,63}$")
USER_CHANGES = frozenset({"password_hash", "groups", "status"})


def username_key(username: str) -> str:
    """What makes two usernames the same one (usernames are ASCII: ``operator/users.py``)."""
    return username.lower()


def user_row(rec: UserRecord) -> tuple[object, ...]:
    return (
        rec.id,
        rec.username,
        rec.password_hash,
        rec.account,
        orjson.dumps(rec.groups).decode(),
        rec.status,
        None if rec.created_at is None else to_micros(rec.created_at),
    )


def user_from_row(row: tuple[Any, ...]) -> UserRecord:
    d = dict(zip(USER_FIELDS, row, strict=True))
    created = d["created_at"]
    return UserRecord(
        id=d["id"],
        username=d["username"],
        password_hash=d["password_hash"],
        account=d["account"],
        groups=tuple(orjson.loads(d["groups"])),
        status=d["status"],
        created_at=None if created is None else from_micros(created),
    )


def encode_user(rec: UserRecord) -> bytes:
    """The record as Redis stores it."""
    return orjson.dumps(
        {
            "id": rec.id,
            "username": rec.username,
            "password_hash": rec.password_hash,
            "account": rec.account,
            "groups": list(rec.groups),
            "status": rec.status,
            "created_at": None if rec.created_at is None else time_text(rec.created_at),
        }
    )


def decode_user(raw: bytes | str) -> UserRecord:
    d = orjson.loads(raw)
    created = d.get("created_at")
    return UserRecord(
        id=d["id"],
        username=d["username"],
        password_hash=d["password_hash"],
        account=d["account"],
        groups=tuple(d.get("groups", ())),
        status=d.get("status", "enabled"),
        created_at=None if created is None else parse_time_text(created),
    )


def apply_user_changes(rec: UserRecord, changes: Mapping[str, object]) -> UserRecord:
    """The user after ``changes`` (any of password_hash, groups, status, already checked by
    ``operator/users.py``). Raises ValueError on what no user can hold."""
    unknown = set(changes) - USER_CHANGES
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: cannot be changed")
    updates: dict[str, Any] = {}
    if "status" in changes:
        if changes["status"] not in USER_STATUSES:
            raise ValueError("status: must be enabled or disabled")
        updates["status"] = changes["status"]
    if "password_hash" in changes:
        value = changes["password_hash"]
        if not isinstance(value, str) or not value:
            raise ValueError("password_hash: must be a non-empty string")
        updates["password_hash"] = value
    if "groups" in changes:
        groups = changes["groups"]
        if not isinstance(groups, tuple | list) or not all(isinstance(g, str) for g in groups):
            raise ValueError("groups: must be a list of group names")
        updates["groups"] = tuple(groups)
    return replace(rec, **updates)
