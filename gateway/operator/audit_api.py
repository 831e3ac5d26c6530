"""``GET /admin/audit`` and ``GET /admin/audit.csv``: the audit log (``operator/audit.py``),
newest first, filtered and paged as ``GET /admin/usage`` is.

- ``actor``: ``admin``, ``user:<username>``, ``key:<hint>``, ``cli:<OS user>``, or a kind
  alone (``user``: every user); ``action``: ``key.create``, or a type of object alone
  (``key``: every action on keys); ``object``: a type (``channel``) or ``type:id``
  (``channel:oa-1``); ``status``: an HTTP status, ``ok`` (below 400) or ``error``
  (400 and up); ``since`` (included), ``until`` (not): RFC 3339 times or days;
  ``limit``: 1 to 1000 (default 100); ``cursor``: the ``next_cursor`` of the page before.
- The JSON reply is ``{"data": [...], "next_cursor"}``, the cursor in ``x-next-cursor`` too.
- The CSV holds every matching entry, up to ``CSV_MAX`` (``x-next-cursor`` names the rest),
  its cells safe to open in a spreadsheet (``spreadsheet.py``); ``fields`` is a JSON cell.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import InvalidRequestError
from gateway.operator.accounts import usage_limit
from gateway.operator.audit import entry_json
from gateway.operator.replies import json_response
from gateway.operator.spreadsheet import csv_text
from gateway.operator.usage_query import CURSOR_HEADER, cursor_text, listing_params
from gateway.store import CursorError, Store
from gateway.store.audit import AuditEntry, AuditPage, AuditQuery
from gateway.types import JSON

CSV_MAX = 10_000  # entries one CSV export holds
CSV_FIELDS = ("time", "actor", "action", "object_type", "object_id", "fields", "ip_range",
              "status", "via", "request_id")  # fmt: skip
MAX_PARAM = 256  # characters of a filter's value


class HasStore(Protocol):
    @property
    def store(self) -> Store: ...


def query_of(params: Mapping[str, str]) -> AuditQuery:
    """The query of a request's parameters; a bad value is a 400 naming it."""

    def given(name: str) -> str | None:
        value = params.get(name) or None
        if value is not None and len(value) > MAX_PARAM:
            raise InvalidRequestError(f"{name}: at most {MAX_PARAM} characters")
        return value

    kind, _, obj_id = (given("object") or "").partition(":")
    listing = listing_params(given)
    return AuditQuery(
        actor=given("actor"),
        action=given("action"),
        object_type=kind or None,
        object_id=obj_id or None,
        status=listing.status,
        since=listing.since,
        until=listing.until,
        after=listing.after,
    )


async def read(store: Store, query: AuditQuery, limit: int) -> AuditPage:
    try:
        return await store.audit_page(query, limit)
    except CursorError:
        raise InvalidRequestError("cursor: not a cursor of this gateway's store") from None


async def list_entries(request: Request, state: HasStore) -> Response:
    params = request.query_params
    limit = usage_limit(params.get("limit"))
    page = await read(state.store, query_of(params), limit)
    cursor = None if page.next is None else cursor_text(page.next)
    body: dict[str, JSON] = {"data": [entry_json(e) for e in page.entries], "next_cursor": cursor}
    resp = json_response(body)
    if cursor is not None:
        resp.headers[CURSOR_HEADER] = cursor
    return resp


def _csv_row(e: AuditEntry) -> dict[str, JSON]:
    row = entry_json(e)
    row["fields"] = orjson.dumps(e.fields).decode()
    return row


async def export_csv(request: Request, state: HasStore) -> Response:
    """Every matching entry (up to ``CSV_MAX``) as CSV, read a page at a time."""
    query = query_of(request.query_params)
    rows: list[dict[str, JSON]] = []
    while True:
        page = await read(state.store, query, min(1000, CSV_MAX - len(rows)))
        rows += [_csv_row(e) for e in page.entries]
        query = replace(query, after=page.next)
        if page.next is None or len(rows) >= CSV_MAX:
            break
    resp = Response(
        csv_text(rows, CSV_FIELDS),
        media_type="text/csv",
        headers={
            "cache-control": "no-store",
            "content-disposition": 'attachment; filename="audit.csv"',
        },
    )
    if page.next is not None:
        resp.headers[CURSOR_HEADER] = cursor_text(page.next)
    return resp
