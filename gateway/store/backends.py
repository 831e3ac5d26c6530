"""The store backends by URL: SQLite (embedded, the default) or Redis (single node or
Cluster). Apart from the records and the ``Store`` protocol (``gateway.store``), which the
backends import."""

from __future__ import annotations

from gateway.store import Store
from gateway.store.redis import RedisStore
from gateway.store.sqlite import SQLiteStore


def open_store(url: str) -> Store:
    """The backend for a store URL (not yet opened)."""
    if url.startswith("sqlite:///"):
        return SQLiteStore(url)
    if url.startswith(("redis://", "rediss://", "unix://", "redis+cluster://")):
        return RedisStore(url)
    raise ValueError(f"unsupported store URL: {url}")
