"""The audit log in Redis (``RedisStore`` takes these methods from ``AuditStream``;
``redis.py`` has the rest of the store and its other key names).

- ``gw:{audit}:log`` is one stream (one slot, so it lives on one node of a cluster): an
  entry per change, its JSON in the field ``e``, capped near the newest ``AUDIT_KEEP``
  (``XADD MAXLEN ~``, which trims whole nodes of the stream: cheap, and never below it).
- A listing reads the stream newest first (``XREVRANGE``) in windows, filtering each entry
  by the query, and reads at most ``AUDIT_SCAN`` entries per call: a page of rare matches
  comes back short, with a cursor where the reading stopped. The stream's ids (Redis's
  clock) order the entries; ``since`` and ``until`` (the gateway's clocks) bound the ids
  read with ``CLOCK_SLACK_MS`` to spare, and each entry's own time decides.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, cast

from gateway.store import CursorError, Position
from gateway.store.audit import AUDIT_KEEP, AuditEntry, AuditPage, AuditQuery, decode_entry
from gateway.store.audit import encode_entry as encode_audit
from gateway.store.records import to_micros

if TYPE_CHECKING:
    import redis.asyncio as aioredis

AUDIT_KEY = "gw:{audit}:log"  # stream: one entry per change, its JSON in field "e"
AUDIT_FIELD = b"e"
AUDIT_SCAN = 10_000  # entries one listing reads at most
AUDIT_BATCH = 500  # entries per XREVRANGE
CLOCK_SLACK_MS = 60_000  # how far the gateway's clock and Redis's may disagree
STREAM_ID = re.compile(r"\A\d{1,20}-\d{1,20}\Z")


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _window(query: AuditQuery) -> tuple[str, str]:
    """The (max, min) stream ids a listing reads between."""
    top, bottom = "+", "-"
    if query.after is not None:
        after = query.after[1]
        if not isinstance(after, str) or not STREAM_ID.match(after):
            raise CursorError("not a cursor of this store")
        top = "(" + after
    elif query.until is not None:
        top = str(to_micros(query.until) // 1000 + CLOCK_SLACK_MS)
    if query.since is not None:
        bottom = str(max(to_micros(query.since) // 1000 - CLOCK_SLACK_MS, 0))
    return top, bottom


class AuditStream:
    """The audit log of ``RedisStore`` (see the module docstring)."""

    if TYPE_CHECKING:

        @property
        def client(self) -> aioredis.Redis: ...

    async def add_audit(self, entry: AuditEntry) -> None:
        await self.client.xadd(
            AUDIT_KEY, {AUDIT_FIELD: encode_audit(entry)}, maxlen=AUDIT_KEEP, approximate=True
        )

    async def audit_page(self, query: AuditQuery, limit: int) -> AuditPage:
        if limit <= 0:
            return AuditPage([], None)
        top, bottom = _window(query)
        found: list[tuple[Position, AuditEntry]] = []
        read = 0
        last: Position | None = None
        while read < AUDIT_SCAN:
            count = min(AUDIT_BATCH, AUDIT_SCAN - read)
            found_ids = await self.client.xrevrange(AUDIT_KEY, top, bottom, count=count)
            batch = cast(list[tuple[bytes, dict[bytes, bytes]]], found_ids or [])
            for stream_id, values in batch:
                entry = decode_entry(values[AUDIT_FIELD])
                last = (to_micros(entry.time), _text(stream_id))
                if query.matches(entry):
                    found.append((last, entry))
                    if len(found) > limit:
                        return AuditPage([e for _, e in found[:limit]], found[limit - 1][0])
            read += len(batch)
            if len(batch) < count:  # the stream's end (or the window's)
                return AuditPage([e for _, e in found], None)
            top = "(" + _text(batch[-1][0])
        return AuditPage([e for _, e in found], last)  # the budget spent: go on from here
