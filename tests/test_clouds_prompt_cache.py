"""Prompt caching on the clouds, served (the matrix of tests/test_clouds_served.py): a request
converted to Claude on Bedrock (invoke) and on Vertex (rawPredict) gets the cache breakpoints an
anthropic channel's would, in the cloud's body; the cloud's cache usage (the Messages usage
fields, Bedrock Converse's ``cacheReadInputTokens`` / ``cacheWriteInputTokens``) comes back
in the record's classes, each at its price, whole and streamed."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from decimal import Decimal
from typing import Any

import aiohttp
import pytest

from bench.fake import FakeUpstream
from gateway.store import UsageRecord
from tests.plugins.servers import KEYS, ServedGateway
from tests.test_clouds_served import MODELS, cloud_config

Factory = Callable[..., AbstractAsyncContextManager[ServedGateway]]
PRICE = {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75}
SYSTEM = "You are a coding agent working in a large repository. Keep every change small. " * 80
MILLION = Decimal(1_000_000)
HEADERS = {"Authorization": f"Bearer {KEYS['alice']}", "x-session-id": "s-1"}


def priced_config(fake: FakeUpstream) -> dict[str, Any]:
    cfg = cloud_config(fake)
    for model in cfg["models"]:
        model["price"] = PRICE
    return cfg


def exact(rec: UsageRecord) -> Decimal:
    return Decimal(rec.cost) / MILLION + Decimal(rec.cost_pico) / MILLION / MILLION


def priced(rec: UsageRecord) -> Decimal:
    fresh = rec.prompt_tokens - rec.cache_read_tokens - rec.cache_write_tokens
    return (
        fresh * Decimal("3")
        + rec.cache_read_tokens * Decimal("0.3")
        + rec.cache_write_tokens * Decimal("3.75")
        + rec.completion_tokens * Decimal("15")
    ) / MILLION


def chat(model: str, turns: int, stream: bool) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Step {i}: run the tests. " * 20})
        if i < turns - 1:
            messages.append({"role": "assistant", "content": f"Step {i} is done. " * 20})
    body: dict[str, Any] = {"model": model, "messages": messages, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def marks(body: Any) -> int:
    return str(body).count("'cache_control'")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", ["bed-claude", "vx-claude"])
async def test_claude_on_a_cloud_gets_breakpoints_and_bills_its_cache(
    fake: FakeUpstream, gateway_factory: Factory, model: str, stream: bool
) -> None:
    async with gateway_factory(**priced_config(fake)) as gw, aiohttp.ClientSession() as s:
        for turns in (1, 2):
            async with s.post(gw.v1 + "/chat/completions", json=chat(model, turns, stream),
                              headers=HEADERS) as r:  # fmt: skip
                assert r.status == 200, await r.text()
                await r.read()
        await gw.state.writer.flush()
        first, second = sorted(await gw.state.store.usage("alice", limit=5), key=lambda r: r.time)
    sent = [q for q in fake.requests if q.path != "/token"]
    assert [q.path for q in sent] == [MODELS[model][2 if stream else 1]] * 2
    for q in sent:  # the cloud's Messages body, marked as an anthropic channel's would be
        version = "bedrock-2023-05-31" if model == "bed-claude" else "vertex-2023-10-16"
        assert q.json["anthropic_version"] == version and "model" not in q.json
        assert q.json["system"][-1]["cache_control"] == {"type": "ephemeral"}
        assert q.json["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert marks(sent[0].json) == 2 and marks(sent[1].json) == 3  # + the previous user turn
    assert (first.cache_read_tokens, first.channel) == (0, MODELS[model][0])
    assert first.cache_write_tokens > 1000
    assert second.cache_read_tokens == first.cache_write_tokens  # the first turn's prefix
    assert second.cache_write_tokens > 0
    for rec in (first, second):
        assert exact(rec) == priced(rec) > 0


@pytest.mark.parametrize("stream", [False, True])
async def test_converse_cache_usage_is_read_into_the_classes(
    fake: FakeUpstream, gateway_factory: Factory, stream: bool
) -> None:
    directive = "[[fake prompt_tokens=3000 cached_tokens=2000 cache_write_tokens=600 " \
        "completion_tokens=10]]"  # fmt: skip
    body = {"model": "bed-nova", "messages": [{"role": "user", "content": directive}],
            "stream": stream}  # fmt: skip
    async with gateway_factory(**priced_config(fake)) as gw, aiohttp.ClientSession() as s:
        async with s.post(gw.v1 + "/chat/completions", json=body, headers=HEADERS) as r:
            assert r.status == 200, await r.text()
            await r.read()
        await gw.state.writer.flush()
        [rec] = await gw.state.store.usage("alice", limit=5)
    assert fake.requests[-1].path == MODELS["bed-nova"][2 if stream else 1]
    assert (rec.prompt_tokens, rec.cache_read_tokens, rec.cache_write_tokens) == (3000, 2000, 600)
    assert exact(rec) == priced(rec) == Decimal("0.0042")  # 400x3 + 2000x0.3 + 600x3.75 + 10x15


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", ["bed-nova", "bed-claude", "vx-claude"])
async def test_writes_of_an_hour_are_billed_at_their_price_on_every_cloud(
    fake: FakeUpstream, gateway_factory: Factory, model: str, stream: bool
) -> None:
    """Writes the cloud reports as written for an hour (Converse's ``cacheDetails``, the
    Messages usage's ``cache_creation``) at the model's ``cache_write_1h``, the rest of the
    writes at ``cache_write``."""
    directive = "[[fake prompt_tokens=3000 cached_tokens=2000 cache_write_tokens=600 " \
        "cache_write_1h_tokens=400 completion_tokens=10]]"  # fmt: skip
    body = {"model": model, "messages": [{"role": "user", "content": directive}],
            "stream": stream}  # fmt: skip
    cfg = priced_config(fake)
    for each in cfg["models"]:
        each["price"] = {**PRICE, "cache_write_1h": 6}
    async with gateway_factory(**cfg) as gw, aiohttp.ClientSession() as s:
        async with s.post(gw.v1 + "/chat/completions", json=body, headers=HEADERS) as r:
            assert r.status == 200, await r.text()
            await r.read()
        await gw.state.writer.flush()
        [rec] = await gw.state.store.usage("alice", limit=5)
    assert (rec.prompt_tokens, rec.cache_read_tokens, rec.cache_write_tokens) == (3000, 2000, 600)
    # 400 x 3 + 2000 x 0.3 + 200 x 3.75 + 400 x 6 + 10 x 15
    assert exact(rec) == Decimal("0.0051")


def messages(model: str, turns: int, stream: bool) -> dict[str, Any]:
    """Claude Code's shape: its own marks on the system prompt and the last block."""
    body = chat(model, turns, stream)
    history = body["messages"][1:]
    history[-1] = {
        "role": "user",
        "content": [
            {"type": "text", "text": history[-1]["content"], "cache_control": {"type": "ephemeral"}}
        ],
    }
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    return {"model": model, "max_tokens": 256, "system": system, "messages": history,
            "stream": stream}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("model", ["bed-claude", "vx-claude"])
async def test_a_messages_client_on_a_cloud_keeps_its_marks_and_is_billed_its_cache(
    fake: FakeUpstream, gateway_factory: Factory, model: str, stream: bool
) -> None:
    headers = {**HEADERS, "anthropic-version": "2023-06-01"}
    async with gateway_factory(**priced_config(fake)) as gw, aiohttp.ClientSession() as s:
        for turns in (1, 2):
            async with s.post(gw.v1 + "/messages", json=messages(model, turns, stream),
                              headers=headers) as r:  # fmt: skip
                assert r.status == 200, await r.text()
                await r.read()
        await gw.state.writer.flush()
        first, second = sorted(await gw.state.store.usage("alice", limit=5), key=lambda r: r.time)
    sent = [q.json for q in fake.requests if q.path != "/token"]
    assert [marks(body) for body in sent] == [2, 2]  # the client's own, passed through
    assert first.cache_read_tokens == 0 and first.cache_write_tokens > 1000
    assert second.cache_read_tokens == first.cache_write_tokens and second.cache_write_tokens > 0
    for rec in (first, second):
        assert rec.protocol == "anthropic" and exact(rec) == priced(rec) > 0
