"""Money across a crash: the gateway served by its own command in a process of its own, killed
with SIGKILL under mixed load (stream and non-stream, every client protocol, on each store),
then started again; and stopped with SIGTERM while its Redis is down, then started again with
Redis back. Every request whose client received a complete reply has exactly one usage record,
and the balance dropped by exactly the sum of the records' costs."""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from bench.fake_upstream import FakeUpstream
from tests.plugins.processes import (
    REQUESTS,
    WORKERS,
    Gateway,
    OwnRedis,
    assert_billed_once,
    balance,
    free_port,
    load,
    one_request,
    opened,
    settled,
    write_config,
)


async def test_sigkill_mid_load_loses_no_complete_reply(
    fake: FakeUpstream, store_url: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path, fake.url, store_url)
    gw = Gateway(config, free_port(), tmp_path / "gateway.log")
    await gw.start()
    async with opened(store_url) as store:
        before = await balance(store)
        completed: list[str] = []
        stop = asyncio.Event()
        running = asyncio.create_task(load(gw.url, completed, stop))
        deadline = time.monotonic() + 60
        while len(completed) < 300 and time.monotonic() < deadline and not running.done():
            await asyncio.sleep(0.01)
        gw.kill(signal.SIGKILL)  # mid-load: replies in flight, records in the writer's batch
        assert await gw.exit_code() == -signal.SIGKILL
        await running
        assert len(completed) >= 300

        await gw.start()  # adopts what the dead process journaled
        try:
            records = await settled(store, set(completed))
            assert_billed_once(records, completed, before - await balance(store))
            # at most the requests in flight at the kill were recorded beyond those completed
            assert len(records) - len(completed) <= WORKERS
        finally:
            gw.kill(signal.SIGTERM)
            assert await gw.exit_code() == 0
    assert list((tmp_path / "journal").iterdir()) == []  # everything settled, nothing left


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
async def test_sigterm_with_redis_down_keeps_every_record_for_the_next_start(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    redis = OwnRedis(tmp_path / "redis")
    await redis.start()
    config = write_config(tmp_path, fake.url, redis.url)
    gw = Gateway(config, free_port(), tmp_path / "gateway.log")
    await gw.start()
    try:
        async with opened(redis.url) as store:
            before = await balance(store)
        await redis.stop()  # the store is away; the gateway serves from its cache
        completed: list[str] = []
        async with aiohttp.ClientSession() as s:
            for i in range(30):
                got = await one_request(s, gw.url, REQUESTS[i % len(REQUESTS)])
                assert got is not None
                completed.append(got)
        gw.kill(signal.SIGTERM)
        assert await gw.exit_code() == 0  # nothing lost: it is all in the journal
        assert "writer.stop_journaled records=30" in gw.log.read_text()

        await redis.start()
        await gw.start()
        async with opened(redis.url) as store:
            records = await settled(store, set(completed))
            assert len(records) == 30
            assert_billed_once(records, completed, before - await balance(store))
        gw.kill(signal.SIGTERM)
        assert await gw.exit_code() == 0
        assert list((tmp_path / "journal").iterdir()) == []
    finally:
        for proc in (gw.proc, redis.proc):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
