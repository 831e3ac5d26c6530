"""Reservations: a request holds its expected cost against the balance while it runs, so many
concurrent requests overdraw an account by at most the error of their estimates, not by how
many there are (CONTRACT §4); a refused request gets 402 before anything goes upstream."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest

from bench.fake_upstream import FakeUpstream
from gateway.config import parse_settings
from gateway.kinds.chat import max_output
from gateway.store import MICRO
from tests.plugins.servers import KEYS, ServedGateway, make_config, serve_app

POOR = "sk-poor-0000000000000006"
MAX_TOKENS = 100
# the upstream thinks 300 ms, then reports 20 prompt and 100 completion tokens: 220 micro-units
SLOW = "[[fake first_ms=300 prompt_tokens=20 completion_tokens=100]] hello"
COST = 20 * 1 + 100 * 2
BODY = {
    "model": "chat-small",
    "max_tokens": MAX_TOKENS,
    "messages": [{"role": "user", "content": SLOW}],
}
# what one request holds: its body's bytes as prompt tokens (1 micro-unit each), its maximum
# output (2 micro-units a token)
HOLD = -(-len(orjson.dumps(BODY)) // 4) * 1 + MAX_TOKENS * 2


def poor_config(fake: FakeUpstream, store_url: str, balance: int, **limits: Any) -> Any:
    cfg = make_config(fake.url, store_url)
    cfg["accounts"].append({"id": "poor", "balance": balance / MICRO})
    cfg["keys"].append({"id": "k-poor", "key": POOR, "account": "poor", "group": "default"})
    if limits:
        cfg["limits"] = limits
    return parse_settings(cfg)


async def post_all(url: str, n: int, body: dict[str, Any] = BODY) -> list[tuple[int, Any]]:
    headers = {"Authorization": f"Bearer {POOR}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def one() -> tuple[int, Any]:
            async with s.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                return r.status, await r.json()

        return await asyncio.gather(*(one() for _ in range(n)))


async def balance_of(gw: ServedGateway) -> int:
    await gw.state.writer.flush()
    account = await gw.state.store.get_account("poor")
    assert account is not None
    return account.balance


async def test_100_concurrent_requests_on_a_balance_for_5(
    fake: FakeUpstream, store_url: str
) -> None:
    assert COST < HOLD  # the estimate errs on the safe side for this request
    async with serve_app(poor_config(fake, store_url, 5 * HOLD)) as gw:
        results = await post_all(gw.url, 100)
        served = [body for status, body in results if status == 200]
        refused = [body for status, body in results if status != 200]
        assert {status for status, _ in results} <= {200, 402}
        assert len(served) == 5  # the five holds fill the balance while they run
        assert all(b["error"]["code"] == "insufficient_quota" for b in refused)
        assert len(fake.requests) == 5  # nothing refused went upstream
        after = await balance_of(gw)
        assert after == 5 * HOLD - 5 * COST >= 0
        records = await gw.state.store.usage("poor", 1_000)
        assert sum(r.cost for r in records) == 5 * COST
        assert sorted(r.status for r in records) == [200] * 5 + [402] * 95
        assert gw.state.cache.held("poor") == 0  # every hold let go


async def test_a_request_may_overdraw_by_its_own_estimate_error_only(
    fake: FakeUpstream, store_url: str
) -> None:
    """An estimate below the real cost: the requests admitted overdraw the account, by at
    most what each cost beyond its hold, not by their number."""
    body = {**BODY, "messages": [{"role": "user", "content": SLOW.replace("20", "1000")}]}
    hold = -(-len(orjson.dumps(body)) // 4) + MAX_TOKENS * 2
    cost = 1000 + 200
    async with serve_app(poor_config(fake, store_url, 2 * hold)) as gw:
        results = await post_all(gw.url, 50, body)
        served = sum(1 for status, _ in results if status == 200)
        assert served == 2
        assert await balance_of(gw) >= -served * (cost - hold)


async def test_the_hold_floor(fake: FakeUpstream, store_url: str) -> None:
    """``limits.hold_floor``: each request holds at least this much."""
    async with serve_app(poor_config(fake, store_url, 5 * HOLD, hold_floor=5 * HOLD / MICRO)) as gw:
        results = await post_all(gw.url, 20)
        assert sum(1 for status, _ in results if status == 200) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_hold_is_let_go_when_the_request_fails_or_the_client_leaves(
    gateway_factory: Callable[..., contextlib.AbstractAsyncContextManager[ServedGateway]],
    stream: bool,
) -> None:
    async with gateway_factory() as gw:
        headers = {"Authorization": f"Bearer {KEYS['alice']}"}
        failing = {
            **BODY,
            "stream": stream,
            "messages": [{"role": "user", "content": "[[fake status=500]]"}],
        }
        async with aiohttp.ClientSession() as s:
            async with s.post(gw.url + "/v1/chat/completions", json=failing, headers=headers) as r:
                assert r.status >= 500
            slow = {
                **BODY,
                "stream": stream,
                "messages": [{"role": "user", "content": "[[fake first_ms=5000]] hi"}],
            }
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.3):
                    async with s.post(
                        gw.url + "/v1/chat/completions", json=slow, headers=headers
                    ) as r:
                        await r.read()
        await gw.state.writer.flush()
        for _ in range(100):
            if gw.state.cache.held("alice") == 0:
                break
            await asyncio.sleep(0.05)
        assert gw.state.cache.held("alice") == 0


@pytest.mark.parametrize(
    ("payload", "tokens"),
    [
        ({"max_tokens": 64}, 64),  # chat-completions (old name), messages
        ({"max_completion_tokens": 32, "max_tokens": 64}, 32),  # chat-completions
        ({"max_output_tokens": 16}, 16),  # Responses
        ({"generationConfig": {"maxOutputTokens": 8}}, 8),  # generate-content
        ({"max_tokens": "many"}, 0),  # not a count: the model's default applies
        ({"max_tokens": -5}, 0),
        ({}, 0),
        ([], 0),
    ],
)
def test_max_output_is_read_from_each_protocol_s_field(payload: Any, tokens: int) -> None:
    assert max_output(payload) == tokens


async def test_instances_on_one_store_refuse_together(fake: FakeUpstream, store_url: str) -> None:
    """Holds are shared through the store: what runs on the first instance counts on the
    second, which then admits only what the balance has left."""
    settings = poor_config(fake, store_url, 5 * HOLD)
    slow = {**BODY, "messages": [{"role": "user", "content": SLOW.replace("300", "3000")}]}
    async with serve_app(settings) as first, serve_app(settings) as second:
        running = asyncio.create_task(post_all(first.url, 3, slow))
        deadline = asyncio.get_running_loop().time() + 10
        while second.state.cache.held("poor") < 3 * HOLD:  # published twice a second
            assert asyncio.get_running_loop().time() < deadline, "the holds never arrived"
            await asyncio.sleep(0.05)
        results = await post_all(second.url, 50)
        assert sum(1 for status, _ in results if status == 200) == 2
        assert all(status == 200 for status, _ in await running)
        assert len(fake.requests) == 5
    # stopped instances let go of their holds at once
    async with serve_app(settings) as third:
        assert third.state.cache.held("poor") == 0
