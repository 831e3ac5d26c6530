"""The store backends by URL: SQLite (embedded, the default) or Redis (single node or
Cluster). Apart from the records and the ``Store`` protocol (``gateway.store``), which the
backends import."""

from __future__ import annotations

import sqlite3

from redis.exceptions import RedisClusterException, RedisError

from gateway.store import Store, StoreError
from gateway.store.redis import RedisStore
from gateway.store.sqlite import SQLiteStore

# what a store that is away or hung raises: its own errors, its connection's, the time out
STORE_FAILURES = (
    StoreError,
    RedisError,
    RedisClusterException,
    sqlite3.Error,
    OSError,
    TimeoutError,
)


def open_store(url: str) -> Store:
    """The backend for a store URL (not yet opened)."""
    if url.startswith("sqlite:///"):
        return SQLiteStore(url)
    if url.startswith(("redis://", "rediss://", "unix://", "redis+cluster://")):
        return RedisStore(url)
    raise ValueError(f"unsupported store URL: {url}")
