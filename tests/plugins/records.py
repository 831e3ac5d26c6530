"""One usage record for tests: every field a plausible default, the ones a test is about
given by name (the record factories of the store, admin, CLI and console tests build on it)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gateway.store import UsageRecord

DEFAULTS: dict[str, Any] = {
    "time": datetime(2025, 3, 4, 5, 6, 7, 123456, tzinfo=UTC),
    "request_id": "req-1",
    "account": "alice",
    "key_id": "k-1",
    "model": "chat-small",
    "channel": "oa-1",
    "protocol": "openai",
    "endpoint": "chat",
    "prompt_tokens": 1,
    "completion_tokens": 1,
    "cost": 0,
    "status": 200,
    "latency_ms": 10,
    "ip_range": "203.0.113.0/24",
}


def usage_record(**fields: Any) -> UsageRecord:
    """A settled-looking record: ``DEFAULTS`` with ``fields`` in their place."""
    return UsageRecord(**{**DEFAULTS, **fields})
