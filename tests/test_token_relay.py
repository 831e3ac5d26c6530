"""Token classes through a served gateway: a channel that reports cache reads is billed for
them at the model's cache price, its usage record keeps them, and the client is told them in
its own protocol's fields (converted and passed through, whole and streamed)."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from bench.fake_upstream import FakeUpstream, Reply
from tests.plugins.servers import KEYS, make_config

HEADERS = {"Authorization": f"Bearer {KEYS['alice']}", "anthropic-version": "2023-06-01"}
# micro-units per token: fresh input 1, cache reads 0.1, output 2
PRICE = {"input": 1.0, "output": 2.0, "cache_read": 0.1}
HI = [{"role": "user", "content": "hello"}]


def priced(cfg_models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**m, "price": PRICE} for m in cfg_models]


async def last_record(gw: Any) -> Any:
    await gw.state.writer.flush()
    return (await gw.state.store.usage("alice", 1))[0]


def message_usage(raw: bytes) -> dict[str, Any]:
    """The usage a messages-protocol client reads from its stream."""
    usage: dict[str, Any] = {}
    for block in raw.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):
                event = orjson.loads(line[6:])
                if event.get("type") == "message_start":
                    usage.update(event["message"]["usage"])
                elif event.get("type") == "message_delta":
                    usage.update(event["usage"])
    return usage


async def test_cache_reads_are_billed_at_their_price_and_told_to_each_client(
    gateway_factory: Any, fake: FakeUpstream
) -> None:
    models = make_config(fake.url, "sqlite:///unused.db")["models"]
    async with gateway_factory(models=priced(models)) as gw, aiohttp.ClientSession() as s:
        # a messages client on an openai channel: converted, whole
        fake.queue(Reply(text="Hi.", prompt_tokens=2000, cached_tokens=1500, completion_tokens=10))
        body = {"model": "chat-small", "max_tokens": 64, "messages": HI}
        async with s.post(gw.v1 + "/messages", json=body, headers=HEADERS) as r:
            assert r.status == 200, await r.text()
            usage = (await r.json())["usage"]
        assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (500, 1500)
        assert (usage["cache_creation_input_tokens"], usage["output_tokens"]) == (0, 10)
        rec = await last_record(gw)
        assert (rec.prompt_tokens, rec.cache_read_tokens, rec.completion_tokens) == (2000, 1500, 10)
        assert (rec.cost, rec.cost_pico) == (500 + 150 + 20, 0)

        # a messages client on an anthropic channel: passed through, streamed
        fake.queue(Reply(text="Hi.", prompt_tokens=2000, cached_tokens=1999, completion_tokens=3))
        body = {"model": "claude-small", "max_tokens": 64, "messages": HI, "stream": True}
        async with s.post(gw.v1 + "/messages", json=body, headers=HEADERS) as r:
            assert r.status == 200
            usage = message_usage(await r.read())
        assert (usage["input_tokens"], usage["cache_read_input_tokens"]) == (1, 1999)
        rec = await last_record(gw)
        assert (rec.prompt_tokens, rec.cache_read_tokens, rec.completion_tokens) == (2000, 1999, 3)
        assert (rec.cost, rec.cost_pico) == (1 + 199 + 6, 900_000)  # 199.9 from the cache

        # a chat-completions client on a gemini channel: converted, streamed
        fake.queue(Reply(text="Hi.", prompt_tokens=40, cached_tokens=32, completion_tokens=2))
        body = {"model": "gemini-small", "messages": HI, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        async with s.post(gw.v1 + "/chat/completions", json=body, headers=HEADERS) as r:
            chunks = [
                orjson.loads(x[6:]) for x in (await r.read()).split(b"\n\n") if x[6:7] == b"{"
            ]
        usage = [c["usage"] for c in chunks if c.get("usage")][-1]
        assert (
            usage["prompt_tokens"] == 40 and usage["prompt_tokens_details"]["cached_tokens"] == 32
        )
        assert "cache_creation_tokens" not in usage  # the internal field stays inside
        rec = await last_record(gw)
        assert (rec.prompt_tokens, rec.cache_read_tokens, rec.cache_write_tokens) == (40, 32, 0)
        assert (rec.cost, rec.cost_pico) == (8 + 3 + 4, 200_000)


async def test_one_hour_cache_writes_are_billed_at_their_own_price(
    gateway_factory: Any, fake: FakeUpstream
) -> None:
    """An anthropic channel that reports writes of both lifetimes (``cache_creation``): the
    5-minute ones at ``cache_write``, the 1-hour ones at ``cache_write_1h``, converted for a
    chat client and passed through to a messages client; a model without a 1-hour price
    bills them as writes. The records' costs are what the balance lost."""
    # micro-units per token: fresh input 1, reads 0.1, writes 1.25, 1-hour writes 2, output 2
    hour_price = {**PRICE, "cache_write": 1.25, "cache_write_1h": 2.0}
    models = make_config(fake.url, "sqlite:///unused.db")["models"]
    models = [{**m, "price": hour_price if m["name"] == "claude-small" else PRICE} for m in models]
    used = dict(prompt_tokens=10_000, cached_tokens=1_000, cache_write_tokens=6_000,
                cache_write_1h_tokens=4_000, completion_tokens=10)  # fmt: skip
    # fresh 3,000 x 1 + reads 1,000 x 0.1 + 5-minute writes 2,000 x 1.25 + 1-hour writes
    # 4,000 x 2 + output 10 x 2
    cost = 3_000 + 100 + 2_500 + 8_000 + 20
    async with gateway_factory(models=models) as gw, aiohttp.ClientSession() as s:
        before = await gw.state.store.get_account("alice")
        fake.queue(Reply(text="Hi.", **used))
        body = {"model": "claude-small", "messages": HI}
        async with s.post(gw.v1 + "/chat/completions", json=body, headers=HEADERS) as r:
            assert r.status == 200, await r.text()
            usage = (await r.json())["usage"]
        assert usage["prompt_tokens"] == 10_000
        assert "cache_creation_1h_tokens" not in usage  # the internal field stays inside
        rec = await last_record(gw)
        assert (rec.prompt_tokens, rec.cache_read_tokens, rec.cache_write_tokens) == (
            10_000, 1_000, 6_000
        )  # fmt: skip
        assert rec.cache_write_1h_tokens == 4_000  # the record tells what its cost is of
        assert (rec.cost, rec.cost_pico) == (cost, 0)

        fake.queue(Reply(text="Hi.", **used))
        body = {"model": "claude-small", "max_tokens": 64, "messages": HI, "stream": True}
        async with s.post(gw.v1 + "/messages", json=body, headers=HEADERS) as r:
            assert r.status == 200
            usage = message_usage(await r.read())
        assert usage["cache_creation"] == {
            "ephemeral_5m_input_tokens": 2_000,
            "ephemeral_1h_input_tokens": 4_000,
        }  # the upstream's, as it came
        rec = await last_record(gw)
        assert (rec.cost, rec.cost_pico) == (cost, 0)
        after = await gw.state.store.get_account("alice")
        assert before is not None and after is not None
        assert before.balance - after.balance == 2 * cost

    # no 1-hour price and no price table row for the upstream's name: they cost what writes do
    models = [{**m, "price": {**PRICE, "cache_write": 1.25}} for m in models]
    async with gateway_factory(models=models) as gw, aiohttp.ClientSession() as s:
        fake.queue(Reply(text="Hi.", **used))
        body = {"model": "claude-small", "messages": HI}
        async with s.post(gw.v1 + "/chat/completions", json=body, headers=HEADERS) as r:
            assert r.status == 200
        rec = await last_record(gw)
        assert (rec.cost, rec.cost_pico) == (cost - 4_000 * 2 + 4_000 * 1.25, 0)
