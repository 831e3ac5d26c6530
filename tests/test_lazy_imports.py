"""Libraries loaded only when the configuration needs them: a gateway on SQLite with the
example config's channels, built, started and stopped as ``gateway serve`` does it (its pool
started, its channels authorised), imports neither the redis library (several MB of its idle
RSS) nor the cloud channels' (botocore, PyJWT and the key loading: 17 MB, a third of its
import time); and the errors an ``except`` takes for a store's failure name Redis's once it is
loaded. tests/test_cloud_auth.py authorises bedrock and vertex channels with them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis.exceptions

from gateway.store.backends import store_failures

REPO = Path(__file__).resolve().parent.parent
SCRIPT = """
import asyncio, json, sys
import gateway.cli, gateway.server
from gateway.app import create_app
from gateway.config import load_settings
from gateway.store.backends import store_problem

settings = load_settings(sys.argv[1])
app = create_app(settings)

async def lifespan():
    assert await store_problem(settings.store) is None
    events = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent = []

    async def receive():
        return events.pop(0)

    async def send(message):
        sent.append(message["type"])

    await app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"], sent

asyncio.run(lifespan())
print(json.dumps({
    "redis": sorted(m for m in sys.modules if m.partition(".")[0] == "redis"
                    or m.startswith("gateway.store.redis")),
    "clouds": sorted(m for m in ("botocore", "jwt", "gateway.upstream.sigv4",
                                 "gateway.upstream.google_token") if m in sys.modules),
}))
"""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """What of the libraries above a gateway on the example config loaded, by library."""
    tmp_path = tmp_path_factory.mktemp("lazy")
    config = tmp_path / "gateway.yaml"
    config.write_text(
        (REPO / "config" / "gateway.yaml")
        .read_text()
        .replace("sqlite:///data/gateway.db", f"sqlite:///{tmp_path}/gw.db")
    )
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(config)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "GATEWAY_ADMIN_TOKEN": "admin-demo-token"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found: dict[str, list[str]] = json.loads(done.stdout.splitlines()[-1])
    return found


def test_a_sqlite_gateway_never_imports_redis(loaded: dict[str, list[str]]) -> None:
    assert loaded["redis"] == []


def test_a_gateway_without_cloud_channels_never_imports_the_cloud_libraries(
    loaded: dict[str, list[str]],
) -> None:
    assert loaded["clouds"] == []


def test_store_failures_name_redis_errors_once_redis_is_loaded() -> None:
    failures = store_failures()  # redis is loaded in this process (the test imports it)
    assert issubclass(redis.exceptions.ConnectionError, failures)
    assert issubclass(redis.exceptions.RedisClusterException, failures)
    assert issubclass(OSError, failures) and issubclass(TimeoutError, failures)
