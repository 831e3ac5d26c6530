"""Probes: /healthz while the process serves, /readyz only while the store answers (a Redis
the test starts and stops itself)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from bench import procs
from bench.fake_upstream import FakeUpstream
from tests.plugins.servers import make_config, serve_app

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server")


class OwnRedis:
    """A redis-server of the test's own on a free port, that can be stopped and started."""

    def __init__(self, tmp: Path) -> None:
        self.port = procs.free_port()
        self.tmp = tmp
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.tmp)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert procs.wait_port(self.port, self.proc, 10)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    redis = OwnRedis(tmp_path)
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()


async def status(s: aiohttp.ClientSession, url: str) -> int:
    async with s.get(url) as r:
        return r.status


async def until(s: aiohttp.ClientSession, url: str, wanted: int, within: float) -> float:
    """Seconds until ``url`` answers ``wanted``; fails past ``within``."""
    began = time.monotonic()
    while (await status(s, url)) != wanted:
        assert time.monotonic() - began < within, f"{url} never answered {wanted}"
        await asyncio.sleep(0.1)
    return time.monotonic() - began


async def test_readyz_follows_the_store(fake: FakeUpstream, own_redis: OwnRedis) -> None:
    from gateway.config import parse_settings

    async with serve_app(parse_settings(make_config(fake.url, own_redis.url))) as gw:
        async with aiohttp.ClientSession() as s:
            assert await status(s, gw.url + "/readyz") == 200
            own_redis.stop()
            assert await until(s, gw.url + "/readyz", 503, within=5.0) < 5.0
            assert await status(s, gw.url + "/healthz") == 200  # alive, only not ready
            own_redis.start()
            assert await until(s, gw.url + "/readyz", 200, within=10.0) < 10.0
