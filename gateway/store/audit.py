"""The audit log's records: one ``AuditEntry`` per change an operator made (or tried) through
the admin API, the console or the command line (``operator/audit.py`` makes them), and the
``AuditQuery`` that lists them, newest first, a page at a time.

An entry holds who (``actor``), what (``action``, the object's type and id, the fields the
change named with their non-secret values), when, from where (the client's /24 or /48, never
the full address) and how it ended (the HTTP status; a command-line change is 200, or the
status the admin API would have given its error). Secrets never reach an entry: the operator
layer masks them before it is built, and the stores keep only what it holds.

Both stores keep the newest ``AUDIT_KEEP`` entries (SQLite: the ``audit`` table, trimmed by
row number on each write; Redis: a capped stream), so a flood of changes cannot fill the
disk or the memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import orjson

from gateway.store import STATUS_CLASSES, Position
from gateway.store.records import from_micros, to_micros
from gateway.types import JSON

AUDIT_KEEP = 100_000  # newest entries a store keeps
ACTOR_KINDS = ("admin", "user", "key", "cli")  # an actor is "admin" or "<kind>:<name>"


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One change (or refused attempt at one) by an operator."""

    time: datetime  # UTC, when the change was answered
    actor: str  # admin | user:<username> | key:<hint> | cli:<os user>
    action: str  # <object type>.<verb>: key.create, account.credit, channel.update, ...
    object_type: str  # account | key | channel | model | group | user | redemption | sessions
    object_id: str  # "" when the change has no single object (a batch of codes)
    fields: dict[str, JSON] = field(default_factory=dict)  # name -> value, secrets masked
    ip_range: str = ""  # a.b.c.0/24 or a /48; "" from the command line
    status: int = 0  # the HTTP status answered (a command-line change: 200, or its error's)
    via: str = "api"  # api | console | cli
    request_id: str = ""  # the request's x-request-id, as in the access log


@dataclass(frozen=True, slots=True)
class AuditQuery:
    """Which entries to list: each filter given must match. ``actor``: one actor, or a kind
    of them (``user``: every user); ``action``: one action, or every action on a type of
    object (``key``: ``key.create``, ``key.update``, ...); ``object_type``/``object_id``;
    ``status``: an HTTP status or one of ``STATUS_CLASSES``;
    ``since`` included, ``until`` not; ``after``: where the page starts."""

    actor: str | None = None
    action: str | None = None
    object_type: str | None = None
    object_id: str | None = None
    status: int | str | None = None
    since: datetime | None = None
    until: datetime | None = None
    after: Position | None = None

    def matches(self, e: AuditEntry) -> bool:
        """Whether the entry passes every filter (its time's too)."""
        if self.actor is not None and not actor_matches(self.actor, e.actor):
            return False
        if self.action is not None and not action_matches(self.action, e.action):
            return False
        if self.object_type is not None and e.object_type != self.object_type:
            return False
        if self.object_id is not None and e.object_id != self.object_id:
            return False
        if self.since is not None and e.time < self.since:
            return False
        if self.until is not None and e.time >= self.until:
            return False
        return status_matches(self.status, e.status)


@dataclass(frozen=True, slots=True)
class AuditPage:
    """A page of entries, newest first; ``next``: where the next page starts (None: the
    end). A page may be short and still have a ``next`` (a store reads a bounded number of
    entries per call)."""

    entries: list[AuditEntry]
    next: Position | None


def actor_matches(wanted: str, actor: str) -> bool:
    return actor == wanted or (wanted in ACTOR_KINDS and actor.startswith(wanted + ":"))


def action_matches(wanted: str, action: str) -> bool:
    return action == wanted or ("." not in wanted and action.startswith(wanted + "."))


def status_matches(wanted: int | str | None, status: int) -> bool:
    if wanted is None:
        return True
    if wanted == "ok":
        return status < 400
    if wanted == "error":
        return status >= 400
    assert wanted not in STATUS_CLASSES
    return status == wanted


def entry_dict(e: AuditEntry, time: JSON) -> dict[str, JSON]:
    """The entry's fields by name, its time as given (micro-seconds in the stores, RFC 3339
    in the admin API)."""
    return {
        "time": time,
        "actor": e.actor,
        "action": e.action,
        "object_type": e.object_type,
        "object_id": e.object_id,
        "fields": e.fields,
        "ip_range": e.ip_range,
        "status": e.status,
        "via": e.via,
        "request_id": e.request_id,
    }


def encode_entry(e: AuditEntry) -> bytes:
    """The entry as JSON (Redis keeps it whole; SQLite keeps ``fields`` this way)."""
    return orjson.dumps(entry_dict(e, to_micros(e.time)))


def decode_entry(raw: bytes | str) -> AuditEntry:
    d = orjson.loads(raw)
    return AuditEntry(
        time=from_micros(int(d["time"])),
        actor=str(d["actor"]),
        action=str(d["action"]),
        object_type=str(d["object_type"]),
        object_id=str(d["object_id"]),
        fields=d.get("fields") or {},
        ip_range=str(d.get("ip_range", "")),
        status=int(d.get("status", 0)),
        via=str(d.get("via", "api")),
        request_id=str(d.get("request_id", "")),
    )
