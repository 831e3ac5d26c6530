"""The shapes records take outside memory, written once for both backends and the admin API.

- A usage record is a row of ``USAGE_FIELDS`` in SQLite (its time in microseconds since the
  epoch), a JSON object with the same fields in Redis (its time as exact RFC 3339 text; the
  fields added since the first release, ``ADDED_USAGE_FIELDS``, only when one is not 0, and
  each of ``LATER_USAGE_FIELDS`` only when it is not 0, so a record without them has the
  bytes an earlier version gave it, and one an earlier version wrote reads with them 0), and
  a JSON object for the admin API and the command line (time in RFC 3339 UTC, to the
  millisecond at most; cost in balance units, its pico-units included, instead of
  micro-units; every field).
- A key record is a row of ``KEY_FIELDS`` in SQLite and a JSON object in Redis, its times
  converted the same ways. (What the admin API shows of a key lives in ``accounts.key_json``:
  it never shows the hash and shows the secret once.)
- ``apply_key_changes`` and ``seed_keys`` are the two ways a key record is made from input,
  the same for both backends.

Nothing here does I/O.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields, replace
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson

from gateway.store import MICRO, KeyRecord, UsageRecord, hash_key, key_hint
from gateway.types import JSON

if TYPE_CHECKING:
    from gateway.config import Settings

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ONE_MICROSECOND = timedelta(microseconds=1)
USAGE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(UsageRecord))  # time comes first
# the record's fields since the token classes and exact costs: 0 in a record written before;
# in Redis written together, when one is not 0
ADDED_USAGE_FIELDS = ("cache_read_tokens", "cache_write_tokens", "reasoning_tokens", "cost_pico")
# the fields added after those, last: each written alone in Redis, only when it is not 0 (so
# that a record without it has the bytes the version before it gave it)
LATER_USAGE_FIELDS = ("cache_write_1h_tokens",)
_OPTIONAL_USAGE_FIELDS = ADDED_USAGE_FIELDS + LATER_USAGE_FIELDS  # 0 where a record lacks them
FIRST_USAGE_FIELDS = USAGE_FIELDS[: -len(ADDED_USAGE_FIELDS) - len(LATER_USAGE_FIELDS)]
# the lengths of a journal's array lines: this version's, and each earlier version's
JOURNAL_ROW_LENGTHS = frozenset(
    {len(USAGE_FIELDS), len(USAGE_FIELDS) - len(LATER_USAGE_FIELDS), len(FIRST_USAGE_FIELDS)}
)
KEY_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(KeyRecord))
# a record's fields after its time, in order, read in C
_AFTER_TIME = operator.attrgetter(*USAGE_FIELDS[1:])
KEY_STATUSES = ("enabled", "disabled")
KEY_CHANGES = frozenset({"status", "group", "expires_at", "name", "quota", "models", "allowed_ips"})


# -- times and money -------------------------------------------------------------------------


def to_micros(dt: datetime) -> int:
    """Microseconds since the epoch, exactly (a naive time is taken as UTC)."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - EPOCH) // ONE_MICROSECOND


def from_micros(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


def time_text(dt: datetime) -> str:
    """Exact RFC 3339 text in UTC with a Z (microseconds kept), as Redis stores times."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_time_text(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def format_time(dt: datetime | None) -> str | None:
    """RFC 3339 in UTC with a Z, as people and the admin API see times; milliseconds only when
    the time has them."""
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    dt = dt.astimezone(UTC)
    spec = "seconds" if dt.microsecond == 0 else "milliseconds"
    return dt.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def from_micro(micro: int) -> float:
    """Micro-units -> a JSON number in balance units (300000 -> 0.3, the nearest double)."""
    return micro / MICRO


def from_pico(micro: int, pico: int) -> float:
    """Micro-units and the pico-units below them -> a JSON number in balance units, the
    nearest double (1 micro-unit and 500,000 pico-units -> 0.0000015)."""
    if not pico:
        return micro / MICRO
    return (micro * MICRO + pico) / (MICRO * MICRO)


# -- usage records ---------------------------------------------------------------------------


def _usage_fields(rec: UsageRecord, time: str | datetime | None, cost: float) -> dict[str, Any]:
    """The record's first fields (``FIRST_USAGE_FIELDS``) in order, with its time and cost as
    given."""
    return {
        "time": time,
        "request_id": rec.request_id,
        "account": rec.account,
        "key_id": rec.key_id,
        "model": rec.model,
        "channel": rec.channel,
        "protocol": rec.protocol,
        "endpoint": rec.endpoint,
        "prompt_tokens": rec.prompt_tokens,
        "completion_tokens": rec.completion_tokens,
        "cost": cost,
        "status": rec.status,
        "latency_ms": rec.latency_ms,
        "ip_range": rec.ip_range,
    }


def usage_row(rec: UsageRecord) -> tuple[object, ...]:
    """The record as a row of ``USAGE_FIELDS``, its time in microseconds since the epoch.
    (Taken with one ``attrgetter`` rather than from ``_usage_fields``: every record settled
    goes through here.)"""
    return (to_micros(rec.time), *_AFTER_TIME(rec))


def usage_from_row(row: tuple[Any, ...]) -> UsageRecord:
    return UsageRecord(from_micros(row[0]), *row[1:])


def _added_fields(rec: UsageRecord) -> dict[str, int]:
    return {
        "cache_read_tokens": rec.cache_read_tokens,
        "cache_write_tokens": rec.cache_write_tokens,
        "reasoning_tokens": rec.reasoning_tokens,
        "cost_pico": rec.cost_pico,
    }


def _time_value(dt: datetime) -> str | datetime:
    """The time as orjson is given it: a UTC time as it is (``OPT_UTC_Z`` writes exactly
    ``time_text``'s text, for a fifth of the cost of ``isoformat``), any other as that text."""
    return dt if dt.tzinfo is UTC else time_text(dt)


def encode_usage(rec: UsageRecord) -> bytes:
    """The record as Redis stores it. The same record always gives the same bytes, which is
    what lets Redis recognise a record it already holds: the fields added since the first
    release are written only when one is not 0, so a record without them (one a journal of an
    earlier version holds) has the bytes that version gave it."""
    fields = _usage_fields(rec, _time_value(rec.time), rec.cost)
    if rec.cache_read_tokens or rec.cache_write_tokens or rec.reasoning_tokens or rec.cost_pico:
        fields.update(_added_fields(rec))
    if rec.cache_write_1h_tokens:
        fields["cache_write_1h_tokens"] = rec.cache_write_1h_tokens
    return orjson.dumps(fields, option=orjson.OPT_UTC_Z)


def decode_usage(raw: bytes | str) -> UsageRecord:
    """A record Redis stores; one without the added fields (``encode_usage``) has them 0."""
    d = orjson.loads(raw)
    first = [d[name] for name in FIRST_USAGE_FIELDS[1:]]
    added = [d.get(name, 0) for name in _OPTIONAL_USAGE_FIELDS]
    return UsageRecord(parse_time_text(d["time"]), *first, *added)


def journal_line(rec: UsageRecord) -> bytes:
    """The record as a line of the settlement journal: a JSON array of ``USAGE_FIELDS``,
    the time as ``time_text``. An array, not an object: every request writes one, and an
    array costs a third of an object to make and encode."""
    row = (_time_value(rec.time), *_AFTER_TIME(rec))
    return orjson.dumps(row, option=orjson.OPT_UTC_Z | orjson.OPT_APPEND_NEWLINE)


def journal_record(line: bytes) -> UsageRecord:
    """A journal line read back: an array (``journal_line``; one an earlier version wrote
    ends before ``LATER_USAGE_FIELDS``, or before ``ADDED_USAGE_FIELDS``: those read 0), or an
    object as journals written before the arrays were (``encode_usage``). Raises on anything
    else."""
    if not line.startswith(b"["):
        return decode_usage(line)
    row = orjson.loads(line)
    if not isinstance(row, list) or len(row) not in JOURNAL_ROW_LENGTHS:
        raise ValueError("not a usage record")
    return UsageRecord(parse_time_text(row[0]), *row[1:])


PICO_PER_MICRO = 1_000_000


def debits(records: Iterable[UsageRecord], carry: dict[str, int]) -> list[int]:
    """What settling each record debits, in the records' order: its whole micro-units, and
    one more when its pico-units bring its account's carry to a micro-unit. ``carry`` (account
    -> pico-units, as the store holds them) is updated in place; an account not in it (no such
    account) carries nothing. Redis's settle script does the same per record."""
    out: list[int] = []
    for r in records:
        debit = r.cost
        if r.cost_pico:
            held = carry.get(r.account)
            if held is not None:
                held += r.cost_pico
                if held >= PICO_PER_MICRO:
                    held -= PICO_PER_MICRO
                    debit += 1
                carry[r.account] = held
        out.append(debit)
    return out


def daily_rows(
    records: Iterable[UsageRecord], debits: Iterable[int]
) -> list[tuple[str, str, str, str, int, int, int, int, int, int]]:
    """The records summed per (day, account, key, model): the rows of ``DailyUsage``, their
    cost what settlement debited for each record (``debits``, in the records' order)."""
    # grouped by the date of ``day_of``, made text once per group (a text per record costs
    # more than the rest of its share here)
    sums: dict[tuple[date, str, str, str], list[int]] = {}
    for r, debit in zip(records, debits, strict=True):
        group = (r.time.date(), r.account, r.key_id, r.model)
        found = sums.get(group)
        if found is None:
            sums[group] = [1, r.prompt_tokens, r.completion_tokens, debit,
                           r.cache_read_tokens, r.cache_write_tokens]  # fmt: skip
        else:
            found[0] += 1
            found[1] += r.prompt_tokens
            found[2] += r.completion_tokens
            found[3] += debit
            found[4] += r.cache_read_tokens
            found[5] += r.cache_write_tokens
    return [
        (day.isoformat(), account, key_id, model, *totals)  # type: ignore[misc]
        for (day, account, key_id, model), totals in sums.items()
    ]


def usage_json(rec: UsageRecord) -> dict[str, JSON]:
    """The record as the admin API and the command line show it: its token classes too, its
    cost in balance units, its pico-units included (not apart)."""
    out = _usage_fields(rec, format_time(rec.time), from_pico(rec.cost, rec.cost_pico))
    out["cache_read_tokens"] = rec.cache_read_tokens
    out["cache_write_tokens"] = rec.cache_write_tokens
    out["cache_write_1h_tokens"] = rec.cache_write_1h_tokens
    out["reasoning_tokens"] = rec.reasoning_tokens
    return out


# -- key records -----------------------------------------------------------------------------


def _key_fields(
    rec: KeyRecord, time: Callable[[datetime], object], names: Callable[[tuple[str, ...]], object]
) -> dict[str, object]:
    """The record's fields in ``KEY_FIELDS`` order, its times written by ``time`` and its
    lists of names by ``names``."""
    return {
        "id": rec.id,
        "key_hash": rec.key_hash,
        "account": rec.account,
        "group": rec.group,
        "name": rec.name,
        "status": rec.status,
        "expires_at": None if rec.expires_at is None else time(rec.expires_at),
        "created_at": None if rec.created_at is None else time(rec.created_at),
        "hint": rec.hint,
        "quota": rec.quota,
        "models": None if rec.models is None else names(rec.models),
        "allowed_ips": None if rec.allowed_ips is None else names(rec.allowed_ips),
        "owner": rec.owner,
    }


def _json_list(value: tuple[str, ...]) -> str:
    return orjson.dumps(value).decode()


def _names(value: Any) -> tuple[str, ...] | None:
    """A list of names as stored: a JSON list (Redis) or its text (SQLite); None: no limit."""
    if value is None:
        return None
    if isinstance(value, str):
        value = orjson.loads(value)
    return tuple(value)


def _key_from_fields(d: Mapping[str, Any], time: Callable[[Any], datetime]) -> KeyRecord:
    expires_at, created_at = d.get("expires_at"), d.get("created_at")
    return KeyRecord(
        id=d["id"],
        key_hash=d["key_hash"],
        account=d["account"],
        group=d["group"],
        name=d.get("name", ""),
        status=d.get("status", "enabled"),
        expires_at=None if expires_at is None else time(expires_at),
        created_at=None if created_at is None else time(created_at),
        hint=d.get("hint", ""),
        quota=d.get("quota"),
        models=_names(d.get("models")),
        allowed_ips=_names(d.get("allowed_ips")),
        owner=d.get("owner"),
    )


def key_row(rec: KeyRecord) -> tuple[object, ...]:
    """The record as a row of ``KEY_FIELDS``, its times in microseconds since the epoch."""
    return tuple(_key_fields(rec, to_micros, _json_list).values())


def key_from_row(row: tuple[Any, ...]) -> KeyRecord:
    return _key_from_fields(dict(zip(KEY_FIELDS, row, strict=True)), from_micros)


def encode_key(rec: KeyRecord) -> bytes:
    """The record as Redis stores it."""
    return orjson.dumps(_key_fields(rec, time_text, list))


def decode_key(raw: bytes | str) -> KeyRecord:
    """A record Redis stores; one written before ``name``, ``status``, ``hint``, the limits
    or ``owner`` existed gets their defaults."""
    return _key_from_fields(orjson.loads(raw), parse_time_text)


# -- key records made from input -------------------------------------------------------------


def parse_expiry(value: object) -> datetime | None:
    """``expires_at`` as given to ``update_key``: a datetime, an RFC 3339 string or None."""
    if value is None or isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        dt = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    else:
        raise ValueError("expires_at: must be an RFC 3339 time or null")
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def apply_key_changes(rec: KeyRecord, changes: Mapping[str, object]) -> KeyRecord:
    """The key after ``changes`` (any of status, group, expires_at, name, and the limits
    quota, models, allowed_ips, already checked by ``accounts``). Raises ValueError."""
    unknown = set(changes) - KEY_CHANGES
    if unknown:
        raise ValueError(f"{sorted(unknown)[0]}: cannot be changed")
    updates: dict[str, Any] = {}
    if "status" in changes:
        if changes["status"] not in KEY_STATUSES:
            raise ValueError("status: must be enabled or disabled")
        updates["status"] = changes["status"]
    for name in ("group", "name"):
        if name in changes:
            value = changes[name]
            if not isinstance(value, str) or (name == "group" and not value):
                raise ValueError(f"{name}: must be a non-empty string")
            updates[name] = value
    if "expires_at" in changes:
        updates["expires_at"] = parse_expiry(changes["expires_at"])
    for name in ("quota", "models", "allowed_ips"):
        if name in changes:
            updates[name] = changes[name]
    return replace(rec, **updates)


def seed_keys(settings: Settings, now: datetime) -> list[KeyRecord]:
    """The config file's keys, as ``seed`` creates those that are absent."""
    return [
        KeyRecord(
            id=k.id,
            key_hash=hash_key(k.key),
            account=k.account,
            group=k.group,
            name=k.name,
            status=k.status,
            expires_at=k.expires_at,
            created_at=now,
            hint=key_hint(k.key),
        )
        for k in settings.keys
    ]
