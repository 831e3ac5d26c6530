"""The shapes a redemption code's record takes outside memory, written once for both backends.

- SQLite: a row of ``REDEMPTION_FIELDS``, times in microseconds since the epoch; redeeming is
  one write transaction that marks the row used (only while it is unused and unexpired) and
  adds its amount to the account.
- Redis: what never changes (id, hint, amount, creation, expiry) is one JSON object
  (``encode_code``: the expiry also as ``expires_us``, the number the claim script compares);
  the claim, written once by that script, is ``account TAB user TAB used_us`` (``claim_text``).

A code's status is worked out when it is read (``code_status``): ``used`` once claimed,
``expired`` past its expiry, else ``unused``. Nothing here does I/O.
"""

from __future__ import annotations

from dataclasses import fields, replace
from datetime import datetime
from typing import Any

import orjson

from gateway.store import RedemptionRecord
from gateway.store.records import from_micros, parse_time_text, time_text, to_micros

REDEMPTION_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RedemptionRecord))
CODE_STATUSES = ("unused", "used", "expired")


def code_status(rec: RedemptionRecord, now: datetime) -> str:
    if rec.used_at is not None:
        return "used"
    if rec.expires_at is not None and rec.expires_at <= now:
        return "expired"
    return "unused"


def _micros(dt: datetime | None) -> int | None:
    return None if dt is None else to_micros(dt)


def _time(us: int | None) -> datetime | None:
    return None if us is None else from_micros(us)


def redemption_row(rec: RedemptionRecord) -> tuple[object, ...]:
    return (
        rec.id,
        rec.code_hash,
        rec.hint,
        rec.amount,
        to_micros(rec.created_at),
        _micros(rec.expires_at),
        _micros(rec.used_at),
        rec.account,
        rec.user,
    )


def redemption_from_row(row: tuple[Any, ...]) -> RedemptionRecord:
    d = dict(zip(REDEMPTION_FIELDS, row, strict=True))
    return RedemptionRecord(
        id=d["id"],
        code_hash=d["code_hash"],
        hint=d["hint"],
        amount=int(d["amount"]),
        created_at=from_micros(d["created_at"]),
        expires_at=_time(d["expires_at"]),
        used_at=_time(d["used_at"]),
        account=d["account"],
        user=d["user"],
    )


def encode_code(rec: RedemptionRecord) -> bytes:
    """What Redis keeps of a code apart from its claim (it never changes)."""
    out: dict[str, object] = {
        "id": rec.id,
        "hint": rec.hint,
        "amount": rec.amount,
        "created_at": time_text(rec.created_at),
    }
    if rec.expires_at is not None:
        out["expires_at"] = time_text(rec.expires_at)
        out["expires_us"] = to_micros(rec.expires_at)  # what the claim script compares
    return orjson.dumps(out)


def claim_text(account: str, user: str, used_at: datetime) -> str:
    return f"{account}\t{user}\t{to_micros(used_at)}"


def decode_code(code_hash: str, raw: bytes | str, claim: bytes | str | None) -> RedemptionRecord:
    d = orjson.loads(raw)
    expires = d.get("expires_at")
    rec = RedemptionRecord(
        id=d["id"],
        code_hash=code_hash,
        hint=d["hint"],
        amount=int(d["amount"]),
        created_at=parse_time_text(d["created_at"]),
        expires_at=None if expires is None else parse_time_text(expires),
    )
    if claim is None:
        return rec
    text = claim.decode() if isinstance(claim, bytes) else claim
    account, user, used = text.split("\t")
    return replace(rec, used_at=from_micros(int(used)), account=account, user=user or None)
