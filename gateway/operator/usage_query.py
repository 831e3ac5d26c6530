"""The usage listing's query, as ``GET /admin/usage`` and the console's key view take it:
its parameters read into a ``store.UsageQuery``, and the cursor that carries a page's
``UsagePage.next`` to the request for the page after it.

- ``account``, ``key`` (a key id), ``model``: exact matches; ``status``: an HTTP status
  (``200``, ``429``, ...), ``ok`` (below 400) or ``error`` (400 and up, 499 included);
  ``since`` (included) and ``until`` (not included): RFC 3339 times, or days (``2025-03-04``,
  midnight UTC); a time without an offset is UTC.
- ``cursor``: opaque text (base64url of a JSON pair: the position's time in microseconds and
  the store's tiebreaker). It names a position, not the filters: the page after it with the
  filters of the request that carries it.

A bad value is a 400 naming the parameter.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import NamedTuple

import orjson

from gateway.errors import InvalidRequestError
from gateway.store import (
    STATUS_CLASSES,
    CursorError,
    Position,
    Store,
    UsagePage,
    UsageQuery,
)

# the parameters that came with pages: a request that gives one of them gets ``next_cursor``
# in its body (one with only ``account`` and ``limit`` gets the reply it always got; the
# cursor is in its ``x-next-cursor`` header)
PAGE_PARAMS = ("key", "model", "status", "since", "until", "cursor")
CURSOR_HEADER = "x-next-cursor"
MAX_CURSOR_LEN = 1024


def cursor_text(pos: Position) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(list(pos))).rstrip(b"=").decode()


def parse_cursor(text: str) -> Position:
    """A cursor made by ``cursor_text``; raises InvalidRequestError."""
    bad = InvalidRequestError("cursor: not a cursor this gateway made (use next_cursor as given)")
    if not text or len(text) > MAX_CURSOR_LEN:
        raise bad
    try:
        value = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except ValueError:  # binascii.Error and orjson.JSONDecodeError are ValueErrors
        raise bad from None
    if not isinstance(value, list) or len(value) != 2:
        raise bad
    time, tiebreak = value
    if type(time) is not int or type(tiebreak) not in (int, str):
        raise bad
    return time, tiebreak


def parse_time(value: str, name: str) -> datetime:
    """An RFC 3339 time or a day (midnight UTC); a time without an offset is UTC."""
    try:
        dt = datetime.fromisoformat(value)
        return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: an offset past year 1 or 9999
        raise InvalidRequestError(
            f"{name}: must be an RFC 3339 time (2025-03-04T05:06:07Z) or a day (2025-03-04)"
        ) from None


def parse_status(value: str) -> int | str:
    if value in STATUS_CLASSES:
        return value
    if value.isascii() and value.isdigit() and len(value) == 3 and 100 <= int(value) <= 599:
        return int(value)
    raise InvalidRequestError("status: must be an HTTP status (100-599), ok or error")


class Listing(NamedTuple):
    """What every paged listing's query (usage records, the audit log) filters on."""

    status: int | str | None
    since: datetime | None
    until: datetime | None
    after: Position | None


def listing_params(given: Callable[[str], str | None]) -> Listing:
    """``status``, ``since``, ``until`` and ``cursor`` of a listing's parameters (``given``:
    a parameter's value, or None), each parsed, a bad one a 400 naming it; until after since."""
    status, since, until, cursor = given("status"), given("since"), given("until"), given("cursor")
    listing = Listing(
        status=None if status is None else parse_status(status),
        since=None if since is None else parse_time(since, "since"),
        until=None if until is None else parse_time(until, "until"),
        after=None if cursor is None else parse_cursor(cursor),
    )
    if listing.since is not None and listing.until is not None and listing.since >= listing.until:
        raise InvalidRequestError("until: must be after since")
    return listing


def from_params(
    params: Mapping[str, str], account: str | None = None, key_id: str | None = None
) -> UsageQuery:
    """The query of these parameters (an empty one is not given). ``account``, ``key_id``:
    those the caller is held to (a key holder's), in place of the parameters."""

    def given(name: str) -> str | None:
        value = params.get(name)
        return value if value else None

    listing = listing_params(given)
    return UsageQuery(
        account=account if account is not None else given("account"),
        key_id=key_id if key_id is not None else given("key"),
        model=given("model"),
        status=listing.status,
        since=listing.since,
        until=listing.until,
        after=listing.after,
    )


def asks_for_pages(params: Mapping[str, str]) -> bool:
    return any(params.get(name) for name in PAGE_PARAMS)


async def read(store: Store, query: UsageQuery, limit: int) -> UsagePage:
    try:
        return await store.usage_page(query, limit)
    except CursorError:
        raise InvalidRequestError("cursor: not a cursor of this gateway's store") from None
