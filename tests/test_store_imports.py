"""The redis library is loaded with a Redis store only: a gateway on SQLite, built, started
and stopped as ``gateway serve`` does it, never imports it (several MB of its idle RSS), and
the errors an ``except`` takes for a store's failure name Redis's once it is loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import redis.exceptions

from gateway.store.backends import store_failures

REPO = Path(__file__).resolve().parent.parent
SCRIPT = """
import asyncio, sys
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
print(sorted(m for m in sys.modules if m.partition(".")[0] == "redis"
             or m.startswith("gateway.store.redis")))
"""


def test_a_sqlite_gateway_never_imports_redis(tmp_path: Path) -> None:
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
    assert done.stdout.split("\n")[-2] == "[]"


def test_store_failures_name_redis_errors_once_redis_is_loaded() -> None:
    failures = store_failures()  # redis is loaded in this process (the test imports it)
    assert issubclass(redis.exceptions.ConnectionError, failures)
    assert issubclass(redis.exceptions.RedisClusterException, failures)
    assert issubclass(OSError, failures) and issubclass(TimeoutError, failures)
