"""Reading usage from the Redis store (``store/redis.py``, which names the keys): one
account's records newest first, a window at a time (``scan_usage``), and the daily totals of
the days' hashes (``daily_totals``)."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import cast

import redis.asyncio as aioredis

from gateway.store import DailyUsage, Position, UsageQuery, UsageRecord
from gateway.store.records import decode_usage, to_micros


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


@dataclass(slots=True)
class Scan:
    """What reading one account's usage found: matches (with their positions), whether
    records are left past the last match, and where the reading stopped short (its budget
    spent) when it did."""

    found: list[tuple[Position, UsageRecord]] = dataclass_field(default_factory=list)
    more: bool = False
    stopped: Position | None = None


def daily_totals(
    pairs: list[tuple[str, str]], tables: list[dict[bytes, bytes]]
) -> list[DailyUsage]:
    """The daily totals of each (account, day) from its day's hash (``DAY_KEY``)."""
    out: list[DailyUsage] = []
    for (a, d), table in zip(pairs, tables, strict=True):
        sums: dict[tuple[str, str], dict[str, int]] = {}
        for field, value in table.items():
            key_id, model, metric = _text(field).split("\t")
            sums.setdefault((key_id, model), {})[metric] = int(value)
        for (key_id, model), m in sums.items():
            counts = (m.get(f, 0) for f in "rpc$hw")  # requests ... cost, cache read, write
            out.append(DailyUsage(d, a, key_id, model, *counts))
    return out


async def scan_usage(
    client: aioredis.Redis, key: str, query: UsageQuery, limit: int, budget: int, batch_size: int
) -> Scan:
    """One account's records that match, newest first, from ``query.after`` on: at most
    ``limit`` of them, having read at most ``budget`` records (a microsecond's records are
    read whole, however many); ``batch_size``: records a window of a filtered listing reads."""
    hi = None if query.until is None else to_micros(query.until) - 1
    after = query.after
    if after is not None:
        hi = after[0] if hi is None else min(hi, after[0])
    lo = "-inf" if query.since is None else to_micros(query.since)
    batch = limit + 1 if not query.filtered else max(limit + 1, batch_size)
    out = Scan()
    read = 0
    while True:
        raw = cast(
            "list[tuple[bytes, float]]",
            await client.zrevrangebyscore(
                key, "+inf" if hi is None else hi, lo, start=0, num=batch, withscores=True
            ),
        )
        if not raw:
            return out
        last = int(raw[-1][1])
        if len(raw) < batch:
            hi = None  # the last window
        elif int(raw[0][1]) == last:  # a whole window of one microsecond: read it all
            raw = cast(
                "list[tuple[bytes, float]]",
                await client.zrevrangebyscore(key, last, last, withscores=True),
            )
            hi = last - 1
        else:  # the last microsecond may go on past the window: read it with the next one
            raw = [item for item in raw if int(item[1]) != last]
            hi = last
        window = [
            ((int(score), rec.request_id), rec)
            for rec, score in ((decode_usage(member), score) for member, score in raw)
        ]
        window.sort(key=lambda item: item[0], reverse=True)
        for i, (pos, rec) in enumerate(window):
            if after is not None and pos >= after:
                continue
            read += 1
            if query.matches(rec):
                out.found.append((pos, rec))
                if len(out.found) == limit:
                    out.more = i + 1 < len(window) or hi is not None
                    return out
            if read >= budget:
                out.stopped = pos if (i + 1 < len(window) or hi is not None) else None
                return out
        if hi is None:
            return out
