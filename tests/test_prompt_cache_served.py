"""A coding agent's session through a served gateway to the bundled fake, whose usage models the
provider's prompt cache (``bench/fake/prompt_cache.py``): the same long system prompt and tools
every turn, the conversation growing. From the second turn on, the upstream reads the prefix
from its cache; the record carries the classes, each priced as the provider's price list prices
it (here the built-in table's ratios for the upstream model: reads 0.1x input, writes 1.25x),
and the balance drops by exactly the records' costs.

Two ways in: Claude Code's own shape (the messages protocol, marks set by the client, passed
through), and a chat-completions client on the same anthropic channel, whose request the gateway
converts and marks itself (``protocols/anthropic/cache.py``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from decimal import Decimal
from typing import Any

import aiohttp
import orjson
import pytest

from bench.fake import FakeUpstream
from gateway.store import UsageRecord
from tests.plugins.servers import KEYS, ServedGateway

Factory = Callable[..., AbstractAsyncContextManager[ServedGateway]]
SYSTEM = [
    {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
    {"type": "text", "text": "Follow the repository's conventions and keep changes small. " * 120},
]
TOOLS = [
    {"name": name, "description": f"{name} a file " * 20, "input_schema": {"type": "object"}}
    for name in ("Read", "Edit", "Bash", "Grep")
]
EPHEMERAL = {"type": "ephemeral"}
UPSTREAM = "claude-sonnet-4-5"  # the table's row: input 3, output 15, read 0.3, write 3.75
PRICE = {"input": 3, "output": 15}  # no cache prices: the table's ratios price them
MILLION = Decimal(1_000_000)
TURNS = 4


def messages_body(history: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    """Claude Code's request: the system blocks with a mark, the tools, the conversation with
    a mark on its last block."""
    marked = [dict(m) for m in history]
    last = marked[-1]
    last["content"] = [{"type": "text", "text": last["content"], "cache_control": EPHEMERAL}]
    system = [*SYSTEM[:-1], {**SYSTEM[-1], "cache_control": EPHEMERAL}]
    return {"model": "claude-small", "max_tokens": 1024, "system": system, "tools": TOOLS,
            "messages": marked, "stream": stream}  # fmt: skip


def chat_body(history: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    """The same session from a chat-completions client: no marks at all."""
    system = {"role": "system", "content": "\n".join(b["text"] for b in SYSTEM)}
    tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
              "parameters": t["input_schema"]}} for t in TOOLS]  # fmt: skip
    return {"model": "claude-small", "messages": [system, *history], "tools": tools,
            "stream": stream, "stream_options": {"include_usage": True}} if stream else {
            "model": "claude-small", "messages": [system, *history], "tools": tools}  # fmt: skip


def reply_text(protocol: str, stream: bool, raw: bytes) -> str:
    if not stream:
        payload = orjson.loads(raw)
        if protocol == "anthropic":
            return "".join(b["text"] for b in payload["content"] if b["type"] == "text")
        return str(payload["choices"][0]["message"]["content"])
    text = []
    for line in raw.decode().splitlines():
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        event = orjson.loads(line[5:])
        if protocol == "anthropic" and event["type"] == "content_block_delta":
            text.append(event["delta"].get("text", ""))
        elif protocol == "openai" and event["choices"]:
            text.append(event["choices"][0]["delta"].get("content") or "")
    return "".join(text)


def exact(rec: UsageRecord) -> Decimal:
    return Decimal(rec.cost) / MILLION + Decimal(rec.cost_pico) / MILLION / MILLION


def priced(rec: UsageRecord) -> Decimal:
    """What the provider's price list gives for the record's classes (per million tokens)."""
    fresh = rec.prompt_tokens - rec.cache_read_tokens - rec.cache_write_tokens
    return (
        fresh * Decimal("3")
        + rec.cache_read_tokens * Decimal("0.3")
        + rec.cache_write_tokens * Decimal("3.75")
        + rec.completion_tokens * Decimal("15")
    ) / MILLION


@pytest.mark.parametrize("protocol", ["anthropic", "openai"])
async def test_a_coding_session_reads_its_prefix_from_the_cache_and_pays_the_read_price(
    fake: FakeUpstream, gateway_factory: Factory, protocol: str
) -> None:
    models = [{"name": "claude-small", "capabilities": ["chat", "tools"], "price": PRICE}]
    channel = {"name": "an", "type": "anthropic", "base_url": fake.url, "api_key": "up-key",
               "models": ["claude-small"], "model_map": {"claude-small": UPSTREAM}}  # fmt: skip
    path = "/v1/messages" if protocol == "anthropic" else "/v1/chat/completions"
    build = messages_body if protocol == "anthropic" else chat_body
    headers = {"Authorization": f"Bearer {KEYS['alice']}", "anthropic-version": "2023-06-01",
               "x-claude-code-session-id": "session-1"}  # fmt: skip
    history: list[dict[str, Any]] = []
    async with gateway_factory(models=models, channels=[channel]) as gw:
        before = await gw.state.store.get_account("alice")
        assert before is not None
        async with aiohttp.ClientSession() as s:
            for turn in range(TURNS):
                history.append(
                    {"role": "user", "content": f"Turn {turn}: fix the next test. " * 30}
                )
                stream = turn % 2 == 1
                async with s.post(gw.url + path, json=build(history, stream), headers=headers) as r:
                    raw = await r.read()
                    assert r.status == 200, raw
                history.append({"role": "assistant", "content": reply_text(protocol, stream, raw)})
        await gw.state.writer.flush()
        records = sorted(await gw.state.store.usage("alice", limit=10), key=lambda r: r.time)
        after = await gw.state.store.get_account("alice")
    assert after is not None and len(records) == TURNS
    sent = [q.json for q in fake.requests]
    assert all(str(body).count("'cache_control'") >= 2 for body in sent)  # marked upstream
    first, *later = records
    assert first.cache_read_tokens == 0 and first.cache_write_tokens > 1000  # written
    for previous, rec in zip(records, later, strict=False):
        # all the previous turn left in the cache is read; what this turn added is written
        assert rec.cache_read_tokens == previous.cache_read_tokens + previous.cache_write_tokens
        assert rec.cache_write_tokens > 0
    for rec in records:
        assert rec.status == 200 and rec.channel == "an"
        assert exact(rec) == priced(rec) > 0
    # the balance dropped by exactly what the records cost (whole micro-units plus the carry)
    drop = (before.balance - after.balance) * 1_000_000 + after.carry - before.carry
    assert Decimal(drop) / MILLION / MILLION == sum(exact(r) for r in records)
