"""Redemption codes (CONTRACT §5b): the operator makes codes worth an amount, hands them out,
and a user signed in to the console redeems one to top up its account.

A code is ``GW-`` and 16 characters of Crockford's base 32 in four groups (80 random bits):
``GW-7K2M-Q9XD-4HRT-B1NV``. It is shown once, in the reply that made it (and the CSV the
console and the command line make of that reply); the store keeps only the SHA-256 of its
normalised form (upper case, no dashes or spaces: typed either way it is the same code) and a
hint (``GW-…B1NV``). Redeeming credits the code's amount to the user's account exactly once
(``Store.redeem``: how each backend makes it so is in ``store/sqlite_people.py`` and
``store/redis_people.py``); a code used, expired or unknown is a 400 and changes nothing.

Who redeemed what and when (account, user, time, amount; never the code) is in the codes'
listing and in the log (``redemptions.redeemed``).
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from gateway.errors import InvalidRequestError
from gateway.operator.accounts import MAX_AMOUNT, format_time, only_fields, to_micro
from gateway.store import (
    MICRO,
    Account,
    CodeRefusedError,
    ConflictError,
    RedemptionRecord,
    Store,
    UserRecord,
)
from gateway.store.records import from_micro, parse_expiry
from gateway.store.redemptions import CODE_STATUSES, code_status
from gateway.types import JSON

log = logging.getLogger("gateway.redemptions")

ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford's base 32: no I, L, O, U
PREFIX = "GW"
GROUPS, GROUP_LEN = 4, 4
MAX_COUNT = 1000  # codes one request makes
MAX_CODE_LEN = 64  # characters a code as typed may have
REFUSED = {
    "used": "this code has been used",
    "expired": "this code has expired",
    "unknown": "this is not a redemption code",
}


def new_code() -> str:
    parts = ["".join(secrets.choice(ALPHABET) for _ in range(GROUP_LEN)) for _ in range(GROUPS)]
    return "-".join([PREFIX, *parts])


def normalised(code: str) -> str:
    return "".join(code.split()).replace("-", "").upper()


def code_hash(code: str) -> str:
    return hashlib.sha256(normalised(code).encode()).hexdigest()


def code_hint(code: str) -> str:
    return f"{PREFIX}-…{normalised(code)[-4:]}"


def code_json(rec: RedemptionRecord, now: datetime) -> dict[str, JSON]:
    """A code as the admin sees it: never the code."""
    return {
        "id": rec.id,
        "hint": rec.hint,
        "amount": from_micro(rec.amount),
        "status": code_status(rec, now),
        "created_at": format_time(rec.created_at),
        "expires_at": format_time(rec.expires_at),
        "account": rec.account,
        "user": rec.user,
        "used_at": format_time(rec.used_at),
    }


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_COUNT:
        raise InvalidRequestError(f"count: must be an integer from 1 to {MAX_COUNT}")
    return value


def _expiry(value: object, now: datetime) -> datetime | None:
    try:
        expires = parse_expiry(value)
    except ValueError:
        raise InvalidRequestError("expires_at: must be an RFC 3339 time or null") from None
    if expires is not None and expires <= now:
        raise InvalidRequestError("expires_at: must be in the future")
    return expires


async def create_codes(
    store: Store, amount: object, count: object = 1, expires_at: object = None
) -> list[tuple[str, RedemptionRecord]]:
    """Make ``count`` codes worth ``amount`` each; the codes (shown only now) and records."""
    micro = to_micro(amount, "amount")
    if not 0 < micro <= MAX_AMOUNT * MICRO:
        raise InvalidRequestError(f"amount: must be above 0 and at most {MAX_AMOUNT}")
    n = _count(count)
    now = datetime.now(UTC)
    expires = _expiry(expires_at, now)
    for _ in range(3):
        made = []
        for i in range(n):
            code = new_code()
            rec = RedemptionRecord(
                id="r_" + secrets.token_hex(6),
                code_hash=code_hash(code),
                hint=code_hint(code),
                amount=micro,
                created_at=now + timedelta(microseconds=i),  # listed in the order made
                expires_at=expires,
            )
            made.append((code, rec))
        try:
            await store.create_redemptions([rec for _, rec in made])
        except ConflictError:
            continue  # 80 random bits collided (or an id): draw them all again
        return made
    raise InvalidRequestError("could not make unique codes; try again")


def made_json(made: Sequence[tuple[str, RedemptionRecord]]) -> dict[str, JSON]:
    """The reply that made codes: the only place they are shown."""
    return {"data": [{"code": code, "amount": from_micro(rec.amount)} for code, rec in made]}


def made_csv(made: Sequence[tuple[str, RedemptionRecord]]) -> str:
    """The codes just made, as CSV to hand out: code, amount, expires_at."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["code", "amount", "expires_at"])
    for code, rec in made:
        writer.writerow([code, from_micro(rec.amount), format_time(rec.expires_at) or ""])
    return out.getvalue()


async def list_codes(store: Store, status: str | None = None) -> list[RedemptionRecord]:
    if status is not None and status not in CODE_STATUSES:
        raise InvalidRequestError(f"status: one of {', '.join(CODE_STATUSES)}")
    now = datetime.now(UTC)
    codes = await store.list_redemptions()
    return [c for c in codes if status is None or code_status(c, now) == status]


async def redeem(store: Store, user: UserRecord, body: dict[str, JSON]) -> Account:
    """The user's ``{code}``: its amount added to the user's account, once. 400 (nothing
    changes) for a code used, expired or unknown."""
    only_fields(body, {"code"})
    code = body.get("code")
    if not isinstance(code, str) or not code.strip() or len(code) > MAX_CODE_LEN:
        raise InvalidRequestError("code: give the redemption code")
    try:
        rec, account = await store.redeem(code_hash(code), user.account, user.id, datetime.now(UTC))
    except CodeRefusedError as refused:
        err = InvalidRequestError(REFUSED[refused.reason])
        err.code = f"code_{refused.reason}"  # code_used | code_expired | code_unknown
        raise err from None
    log.info(
        "redemptions.redeemed code_id=%s user=%s account=%s amount=%s",
        rec.id,
        user.id,
        account.id,
        from_micro(rec.amount),
    )
    return account
