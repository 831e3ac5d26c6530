"""The billing endpoints chat UIs read to show a key's balance (CONTRACT §3), in the shape of
OpenAI's old dashboard API as one-api-style gateways serve it (NextChat, LobeChat and others).

- ``GET /v1/dashboard/billing/subscription``: ``hard_limit_usd`` is what the key can still
  spend plus what it spent this month (UTC), so that a UI showing "used this month of limit"
  shows the balance as what is left. What it can spend is its account's balance, or, for a
  key with a ``quota``, the smaller of that and what is left of the quota; what it spent is
  its account's (its own, with a quota). ``access_until`` is the key's expiry (0: none).
- ``GET /v1/dashboard/billing/usage?start_date=&end_date=``: ``total_usage`` in hundredths of
  a balance unit from ``start_date`` up to, not including, ``end_date`` (OpenAI's convention;
  by default this month so far), with ``daily_costs`` per model.

Both read the daily totals the store keeps (``Store.usage_daily``), never every record.
"""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, timedelta
from urllib.parse import parse_qsl

from gateway.edge.asgi import REQUEST_ID, request_headers, send_error, send_json
from gateway.edge.routes import RouteSpec
from gateway.errors import GatewayError, InvalidRequestError, UpstreamUnavailableError
from gateway.policy.gate import Gate
from gateway.protocols import CLIENTS
from gateway.store import MICRO, DailyUsage, KeyRecord, Store
from gateway.store.cache import Cache
from gateway.types import JSON, Receive, Scope, Send

log = logging.getLogger("gateway.dashboard")
MAX_DAYS = 400  # the longest usage range one request may ask for


def _units(micro: int) -> float:
    return micro / MICRO


class Dashboard:
    """The handler of the ``billing_subscription`` and ``billing_usage`` routes."""

    __slots__ = ("gate", "store", "cache")

    def __init__(self, gate: Gate, store: Store, cache: Cache) -> None:
        self.gate = gate
        self.store = store
        self.cache = cache

    async def handle(
        self, spec: RouteSpec, path_model: str | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        try:
            now = datetime.now(UTC)
            key = self.gate.authenticate(spec, scope, request_headers(scope), now)
            if spec.kind == "billing_subscription":
                body = await self.subscription(key, now)
            else:
                body = await self.usage(key, now, scope.get("query_string", b""))
            await send_json(send, 200, body)
        except GatewayError as err:
            if isinstance(err, UpstreamUnavailableError) and err.__cause__ is not None:
                log.warning(
                    "dashboard.store_failed request_id=%s error=%s",
                    scope.get(REQUEST_ID, "-"),
                    type(err.__cause__).__name__,
                )
            await send_error(send, CLIENTS[spec.protocol], err)

    async def _days(self, key: KeyRecord, first: date, last: date) -> list[DailyUsage]:
        """The key's daily totals (its account's, for a key without a quota)."""
        try:
            rows = await self.store.usage_daily(first.isoformat(), last.isoformat(), key.account)
        except Exception as exc:  # the store is away: say so, in the protocol's shape
            raise UpstreamUnavailableError(
                "Usage cannot be read right now; try again shortly.", retry_after=2
            ) from exc  # logged by handle(), with the request's id
        if key.quota is not None:
            rows = [r for r in rows if r.key_id == key.id]
        return rows

    async def subscription(self, key: KeyRecord, now: datetime) -> JSON:
        cache = self.cache
        left = cache.balance(key.account) or 0
        if key.quota is not None:
            left = min(left, cache.quota_left(key))
        today = now.date()
        spent = sum(r.cost for r in await self._days(key, today.replace(day=1), today))
        limit = _units(max(left, 0) + spent)
        return {
            "object": "billing_subscription",
            "has_payment_method": True,
            "soft_limit_usd": limit,
            "hard_limit_usd": limit,
            "system_hard_limit_usd": limit,
            "access_until": 0 if key.expires_at is None else int(key.expires_at.timestamp()),
        }

    async def usage(self, key: KeyRecord, now: datetime, query: bytes) -> JSON:
        params = dict(parse_qsl(query.decode("latin-1")))
        today = now.date()
        first = _date(params.get("start_date"), "start_date", today.replace(day=1))
        end = _date(params.get("end_date"), "end_date", today + timedelta(days=1))
        if end <= first:
            raise InvalidRequestError("end_date: must be after start_date")
        if (end - first).days > MAX_DAYS:
            raise InvalidRequestError(f"end_date: at most {MAX_DAYS} days after start_date")
        rows = await self._days(key, first, end - timedelta(days=1))
        by_day: dict[str, dict[str, int]] = {}
        for r in rows:
            models = by_day.setdefault(r.day, {})
            models[r.model] = models.get(r.model, 0) + r.cost
        daily: list[JSON] = [
            {
                "timestamp": int(datetime.fromisoformat(day).replace(tzinfo=UTC).timestamp()),
                "line_items": [
                    {"name": model, "cost": _units(cost) * 100}
                    for model, cost in sorted(models.items())
                ],
            }
            for day, models in sorted(by_day.items())
        ]
        return {
            "object": "list",
            "daily_costs": daily,
            "total_usage": _units(sum(r.cost for r in rows)) * 100,
        }


def _date(value: str | None, name: str, default: date) -> date:
    if value is None or value == "":
        return default
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise InvalidRequestError(f"{name}: must be a date, YYYY-MM-DD") from None
