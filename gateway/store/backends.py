"""The store backends by URL: SQLite (embedded, the default) or Redis (single node or
Cluster). Apart from the records and the ``Store`` protocol (``gateway.store``), which the
backends import.

A store that does not answer may answer later (the gateway serves 503 and retries); one whose
URL names what cannot exist never will: ``permanent_problem`` tells the two apart, so that
start-up fails with one line (exit code 2, as for any configuration error) instead of
retrying for ever: a Redis database number past the server's ``databases``, or credentials
the server refuses (a refused password does not pass by itself, as an unreachable host may).

The Redis backend, and the redis library with it, is imported only for a Redis URL: a SQLite
gateway never loads it (several MB of a process's idle RSS). So the errors a store may raise
(``store_failures``) name Redis's only once redis is loaded: until then none can be raised.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from urllib.parse import urlsplit

from gateway.store import Store, StoreError
from gateway.store.sqlite import SQLiteStore

PROBE_TIMEOUT = 3.0  # seconds start-up waits for the store to say whether it can ever work

# what a store that is away or hung raises: its own errors, its connection's, the time out
# (and Redis's, once loaded: ``store_failures``)
_FAILURES: tuple[type[BaseException], ...] = (StoreError, sqlite3.Error, OSError, TimeoutError)
_REDIS_ERRORS = "redis.exceptions"


def store_failures() -> tuple[type[BaseException], ...]:
    """What a store that is away or hung raises, for an ``except``: Redis's errors too once
    the redis library is loaded (never for a SQLite store, which cannot raise them)."""
    errors = sys.modules.get(_REDIS_ERRORS)
    if errors is None:
        return _FAILURES
    return (*_FAILURES, errors.RedisError, errors.RedisClusterException)


def open_store(url: str) -> Store:
    """The backend for a store URL (not yet opened)."""
    if url.startswith("sqlite:///"):
        return SQLiteStore(url)
    if url.startswith(("redis://", "rediss://", "unix://", "redis+cluster://")):
        from gateway.store.redis import RedisStore  # loaded for a Redis store only

        return RedisStore(url)
    raise ValueError(f"unsupported store URL: {url}")


def permanent_problem(exc: BaseException, url: str) -> str | None:
    """What makes the store of ``url`` never work, from what opening it raised; None when
    the failure may pass (not reachable, not answering in time: keep retrying)."""
    errors = sys.modules.get(_REDIS_ERRORS)
    if errors is None:  # not a Redis store: nothing it raised is known to last
        return None
    parts = urlsplit(url)  # named without its password
    where = f"{parts.hostname}:{parts.port or 6379}"
    if isinstance(exc, errors.ResponseError) and "DB index is out of range" in str(exc):
        db = parts.path.lstrip("/") or "0"
        return (
            f"redis database {db} does not exist on {where} (a Redis server has the "
            f"databases 0 to its 'databases' setting less one: 0-15 by default)"
        )
    if isinstance(exc, errors.AuthenticationError):
        # the server's own words name no secret: "invalid username-password pair", "AUTH
        # <password> called without any password configured", "Authentication required"
        return f"redis on {where} refused the store URL's credentials ({exc})"
    return None


async def store_problem(url: str, timeout: float = PROBE_TIMEOUT) -> str | None:
    """Open the store once: what makes it never work (``permanent_problem``), or None when it
    answered, or did not but may later."""
    store = open_store(url)
    try:
        async with asyncio.timeout(timeout):
            await store.open()
    except Exception as exc:  # noqa: BLE001 - anything else is the retry's to see
        return permanent_problem(exc, url)
    await store.close()
    return None
