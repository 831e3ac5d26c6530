"""Store fixtures: ``redis_url`` (a flushed test database), ``store_url`` (every backend) and
``store`` (an opened store on it); ``cluster_url``, a Redis Cluster of three masters that the
tests start on loopback (Debian's redis-server and ``redis-cli --cluster create``), flushed
before each test; a module adds it to its backends with ``ALL_BACKENDS``.

Redis is found at ``GATEWAY_TEST_REDIS`` (default ``redis://127.0.0.1:6379/10``;
``tests/ensure_redis.sh`` starts one). When it does not answer, Redis tests are skipped with the
reason locally and fail when ``CI`` is set.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import redis

from gateway.store import Store
from gateway.store.backends import open_store

REDIS_ENV = "GATEWAY_TEST_REDIS"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/10"
BACKENDS = ["sqlite", "redis"]
ALL_BACKENDS = [*BACKENDS, "cluster"]
CLUSTER_NODES = 3
CLUSTER_DEADLINE = 30.0


def sqlite_url(path: Path) -> str:
    """A store URL for a file (``sqlite:///`` + an absolute path gives the four slashes)."""
    return f"sqlite:///{path.resolve()}"


def worker_database(url: str) -> str:
    """The database of this test process: under pytest-xdist each worker (gw0, gw1, ...)
    takes the next number up from the configured one, so that one worker's FLUSHDB never
    empties a database another worker's test is using."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return url
    base, _, db = url.rpartition("/")
    return f"{base}/{int(db or 0) + int(worker[2:])}"


@pytest.fixture
def redis_url() -> str:
    """The test Redis database, emptied (FLUSHDB) before the test."""
    url = worker_database(os.environ.get(REDIS_ENV, DEFAULT_REDIS_URL))
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


def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of the backend named by ``request.param``."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "store" / "gateway.db")
    name = "cluster_url" if request.param == "cluster" else "redis_url"
    url: str = request.getfixturevalue(name)
    return url


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, tmp_path)


def _cluster_port(taken: list[int]) -> int:
    """A free port whose cluster bus port (10,000 above it; at most 65,535) is free too: the
    kernel's ephemeral ports are often too high for that."""
    rng = random.Random()
    while True:
        port = rng.randrange(20_000, 45_000)
        if port in taken:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10_000))
        except OSError:
            continue
        return port


def _until(ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + CLUSTER_DEADLINE
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the test cluster: {what}")
        time.sleep(0.05)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except (redis.exceptions.ConnectionError, OSError):
        return False


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    """Three masters on free loopback ports, started once for the session."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("redis-server or redis-cli is not installed")
    directory = tmp_path_factory.mktemp("redis-cluster")
    ports: list[int] = []
    for _ in range(CLUSTER_NODES):
        ports.append(_cluster_port(ports))
    procs = [
        subprocess.Popen(
            ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--cluster-enabled", "yes"]
            + ["--cluster-config-file", f"nodes-{p}.conf", "--save", "", "--appendonly", "no"]
            + ["--dir", str(directory), "--logfile", f"redis-{p}.log"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for p in ports
    ]

    def answers(client: redis.Redis, proc: subprocess.Popen[bytes], port: int) -> bool:
        if proc.poll() is not None:
            log = (directory / f"redis-{port}.log").read_text()[-500:]
            raise RuntimeError(f"the test cluster: node {port} exited: {log}")
        return _answers(client)

    clients = [
        redis.Redis(host="127.0.0.1", port=p, socket_connect_timeout=1, socket_timeout=5)
        for p in ports
    ]
    try:
        for client, proc, port in zip(clients, procs, ports, strict=True):
            _until(lambda: answers(client, proc, port), "a node does not answer")  # noqa: B023
        subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports]]
            + ["--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=CLUSTER_DEADLINE,
        )
        for client in clients:
            _until(
                lambda c=client: c.cluster("info")["cluster_state"] == "ok",  # type: ignore[misc]
                "cluster_state never ok",
            )
        yield ports
    finally:
        for client in clients:
            client.close()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


@pytest.fixture
def cluster_url(redis_cluster: list[int]) -> str:
    """The test cluster, every node emptied (FLUSHALL) before the test."""
    for port in redis_cluster:
        with redis.Redis(host="127.0.0.1", port=port, socket_timeout=5) as client:
            client.flushall()
    return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in redis_cluster)


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[Store]:
    s = open_store(store_url)
    await s.open()
    try:
        yield s
    finally:
        await s.close()
