"""Store fixtures: ``redis_url`` (a flushed test database), ``store_url`` (every backend) and
``store`` (an opened store on it).

Redis is found at ``GATEWAY_TEST_REDIS`` (default ``redis://127.0.0.1:6379/13``;
``tests/ensure_redis.sh`` starts one). When it does not answer, Redis tests are skipped with the
reason locally and fail when ``CI`` is set.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis

from gateway.store import Store, open_store

REDIS_ENV = "GATEWAY_TEST_REDIS"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/13"
BACKENDS = ["sqlite", "redis"]


def sqlite_url(path: Path) -> str:
    """A store URL for a file (``sqlite:///`` + an absolute path gives the four slashes)."""
    return f"sqlite:///{path.resolve()}"


@pytest.fixture
def redis_url() -> str:
    """The test Redis database, emptied (FLUSHDB) before the test."""
    url = os.environ.get(REDIS_ENV, DEFAULT_REDIS_URL)
    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
    try:
        client.ping()
        client.flushdb()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        reason = (
            f"Redis at {url} does not answer ({type(exc).__name__}); "
            f"run tests/ensure_redis.sh or set {REDIS_ENV}"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    finally:
        client.close()
    return url


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "store" / "gateway.db")
    url: str = request.getfixturevalue("redis_url")
    return url


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = open_store(store_url)
    await s.open()
    try:
        yield s
    finally:
        await s.close()
