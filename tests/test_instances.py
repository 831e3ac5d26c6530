"""Several instances on one store (CONTRACT §5): a change made through one instance holds on
every instance within one second (the cache refreshes twice a second), on both backends.

``propagated`` measures how long a change took to show on another instance and asserts the
bound below; it polls for longer than that, so a failure says how late the change was rather
than only that it was late."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from gateway.config import parse_settings
from tests.plugins.servers import ADMIN_TOKEN, KEYS, make_config, serve_app

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CHAT = {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}]}
# The contract's "within one second": another instance's cache asks the store for its version
# every 0.5 s (cache.DEFAULT_INTERVAL), so a change shows there at most 0.5 s after it is made,
# plus one reload (a few queries: milliseconds) and the polling request that sees it. The
# bound adds a second for scheduling, as on a loaded 2-core machine a tick or a request can be
# a few hundred milliseconds late. Not derived from DEFAULT_INTERVAL: a slower refresh must
# fail here, not stretch the bound.
PROPAGATION_BOUND = 1.5
POLL_DEADLINE = 10.0  # how long a late change is waited for, to report its real latency
POLL_EVERY = 0.02


async def propagated(check: Callable[[], Awaitable[Any]], want: Any) -> float:
    """Seconds from now until ``check()`` gives ``want``; at most ``PROPAGATION_BOUND``."""
    start = time.monotonic()
    while True:
        got = await check()
        took = time.monotonic() - start
        if got == want:
            break
        assert took < POLL_DEADLINE, f"still {got!r}, not {want!r}, after {took:.2f} s"
        await asyncio.sleep(POLL_EVERY)
    assert took <= PROPAGATION_BOUND, f"took {took:.2f} s, over {PROPAGATION_BOUND} s"
    return took


async def status_of(s: aiohttp.ClientSession, url: str, key: str) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    async with s.post(url + "/v1/chat/completions", json=CHAT, headers=headers) as r:
        await r.read()
        return r.status


async def test_changes_through_one_instance_hold_on_another(fake: Any, store_url: str) -> None:
    settings = parse_settings(make_config(fake.url, store_url))
    async with serve_app(settings) as a, serve_app(settings) as b:
        async with aiohttp.ClientSession() as s:
            # a key made on A works on B
            async with s.post(
                a.url + "/admin/keys", json={"account": "alice", "group": "default"}, headers=ADMIN
            ) as r:
                made = await r.json()
            await propagated(lambda: status_of(s, b.url, made["key"]), 200)
            # a key disabled on A is refused by B
            async with s.patch(
                a.url + "/admin/keys/k-alice", json={"status": "disabled"}, headers=ADMIN
            ) as r:
                assert r.status == 200
            await propagated(lambda: status_of(s, b.url, KEYS["alice"]), 401)
            # an account emptied through A is refused by B; topped up again, served again
            async with s.post(
                a.url + "/admin/accounts", json={"id": "carol", "balance": 0}, headers=ADMIN
            ) as r:
                assert r.status == 201
            async with s.post(
                a.url + "/admin/keys", json={"account": "carol", "group": "default"}, headers=ADMIN
            ) as r:
                carol = (await r.json())["key"]
            await propagated(lambda: status_of(s, b.url, carol), 402)
            async with s.post(
                a.url + "/admin/accounts/carol/topup", json={"amount": 1}, headers=ADMIN
            ) as r:
                assert r.status == 200
            await propagated(lambda: status_of(s, b.url, carol), 200)
        # what B spent is what A's store shows: one ledger
        await b.state.writer.flush()
        records = await a.state.store.usage("carol", 10)
        spent = sum(r.cost for r in records)
        acct = await a.state.store.get_account("carol")
        assert acct is not None and acct.balance == 1_000_000 - spent and spent > 0
