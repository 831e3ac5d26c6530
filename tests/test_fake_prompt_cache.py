"""The fake upstream's prompt caches (``bench/fake/prompt_cache.py``), through real HTTP: a
conversation's second turn reads what its first wrote, in each provider's usage fields, per
upstream key; a short prompt, or one sent once, reports no cache (what every other test of the
fake's usage relies on)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from bench.fake.prompt_cache import MIN_TOKENS, PromptCache
from bench.fake_upstream import FakeUpstream

SYSTEM = "You are a careful coding agent. Follow the rules of the repository. " * 80  # ~1360 t
EPHEMERAL = {"type": "ephemeral"}


def anthropic_body(turns: int) -> dict[str, Any]:
    """Claude Code's shape: a marked system prompt and tools, the last block marked."""
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"step {i} " * 40}]})
        if i < turns - 1:
            messages.append({"role": "assistant", "content": f"done {i} " * 40})
    messages[-1]["content"][-1]["cache_control"] = EPHEMERAL
    return {
        "model": "claude-x",
        "max_tokens": 64,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}],
        "tools": [{"name": "read_file", "input_schema": {"type": "object"}}],
        "messages": messages,
    }


def chat_messages(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"step {i} " * 40})
        if i < turns - 1:
            messages.append({"role": "assistant", "content": f"done {i} " * 40})
    return messages


def openai_body(turns: int) -> dict[str, Any]:
    return {"model": "gpt-x", "messages": chat_messages(turns)}


def responses_body(turns: int) -> dict[str, Any]:
    items = chat_messages(turns)
    return {"model": "gpt-x", "instructions": items[0]["content"], "input": items[1:]}


def gemini_body(turns: int) -> dict[str, Any]:
    contents = [
        {"role": "model" if m["role"] == "assistant" else "user", "parts": [{"text": m["content"]}]}
        for m in chat_messages(turns)[1:]
    ]
    return {"systemInstruction": {"parts": [{"text": SYSTEM}]}, "contents": contents}


def anthropic_usage(payload: Any) -> tuple[int, int, int]:
    """(prompt tokens in all, read, written)"""
    u = payload["usage"]
    read, written = u["cache_read_input_tokens"], u["cache_creation_input_tokens"]
    return u["input_tokens"] + read + written, read, written


def openai_usage(payload: Any) -> tuple[int, int, int]:
    u = payload["usage"]
    return u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"], 0


def responses_usage(payload: Any) -> tuple[int, int, int]:
    u = payload["usage"]
    return u["input_tokens"], u["input_tokens_details"]["cached_tokens"], 0


def gemini_usage(payload: Any) -> tuple[int, int, int]:
    u = payload["usageMetadata"]
    return u["promptTokenCount"], u.get("cachedContentTokenCount", 0), 0


Usage = Callable[[Any], tuple[int, int, int]]
# (path, the header that carries the key, body of a conversation of n turns, usage reader)
CASES: dict[str, tuple[str, str, Callable[[int], dict[str, Any]], Usage]] = {
    "anthropic": ("/v1/messages", "x-api-key", anthropic_body, anthropic_usage),
    "openai": ("/v1/chat/completions", "Authorization", openai_body, openai_usage),
    "responses": ("/v1/responses", "Authorization", responses_body, responses_usage),
    "gemini": (
        "/v1beta/models/gemini-x:generateContent",
        "x-goog-api-key",
        gemini_body,
        gemini_usage,
    ),
}


@pytest.fixture
async def up() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as fake:
        yield fake


async def usage_of(fake: FakeUpstream, case: str, turns: int, key: str) -> tuple[int, int, int]:
    path, header, body, read = CASES[case]
    headers = {header: f"Bearer {key}" if header == "Authorization" else key}
    headers["anthropic-version"] = "2023-06-01"
    async with aiohttp.ClientSession() as s:
        async with s.post(fake.url + path, json=body(turns), headers=headers) as r:
            assert r.status == 200, await r.text()
            return read(orjson.loads(await r.read()))


@pytest.mark.parametrize("case", list(CASES))
async def test_a_second_turn_reads_the_prefix_the_first_left(up: FakeUpstream, case: str) -> None:
    total1, read1, written1 = await usage_of(up, case, 1, "sk-one")
    assert read1 == 0
    if case == "anthropic":  # written up to the last breakpoint: the whole prompt here
        assert written1 == total1 >= MIN_TOKENS
    else:
        assert written1 == 0
    total2, read2, written2 = await usage_of(up, case, 2, "sk-one")
    assert total2 > total1
    if case == "anthropic":
        assert (read2, written2) == (total1, total2 - total1)
    elif case in ("openai", "responses"):  # in steps of 128 past the minimum
        assert read2 == MIN_TOKENS + (total1 - MIN_TOKENS) // 128 * 128
        assert total1 - 128 < read2 <= total1
    else:
        assert read2 == total1
    _, read3, written3 = await usage_of(up, case, 2, "sk-two")  # another key's cache
    assert read3 == 0 and written3 == written1 + (total2 - total1) * (case == "anthropic")


@pytest.mark.parametrize("case", list(CASES))
async def test_a_short_prompt_repeated_reports_no_cache(up: FakeUpstream, case: str) -> None:
    path, header, _, read = CASES[case]
    body = {
        "anthropic": {"model": "c", "max_tokens": 8, "system": [
            {"type": "text", "text": "short", "cache_control": EPHEMERAL}],
            "messages": [{"role": "user", "content": "hi"}]},
        "openai": {"model": "g", "messages": [{"role": "user", "content": "hi"}]},
        "responses": {"model": "g", "input": "hi"},
        "gemini": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    }[case]  # fmt: skip
    headers = {header: "Bearer k" if header == "Authorization" else "k"}
    headers["anthropic-version"] = "2023-06-01"
    async with aiohttp.ClientSession() as s:
        for _ in range(2):
            async with s.post(up.url + path, json=body, headers=headers) as r:
                assert read(orjson.loads(await r.read()))[1:] == (0, 0)


def test_converse_cache_points_and_the_bound() -> None:
    """Bedrock Converse: a ``cachePoint`` marks the block before it; the cache keeps at most
    its bound, the least recently used dropped."""

    def body(turns: int) -> dict[str, Any]:
        messages = []
        for i in range(turns):
            messages.append({"role": "user", "content": [{"text": f"step {i} " * 40}]})
            if i < turns - 1:
                messages.append({"role": "assistant", "content": [{"text": f"done {i} " * 40}]})
        messages[-1]["content"].append({"cachePoint": {"type": "default"}})
        system = [{"text": SYSTEM}, {"cachePoint": {"type": "default"}}]
        return {"system": system, "messages": messages}

    cache = PromptCache(max_entries=2)
    first = cache.use("converse", body(1), "k:nova")
    assert first.read == 0 and first.written >= MIN_TOKENS
    second = cache.use("converse", body(2), "k:nova")
    assert second.read == first.written and second.written > 0
    assert len(cache) == 2
    cache.use("converse", {**body(1), "system": [{"text": SYSTEM + "!"}]}, "k:nova")
    assert len(cache) == 2  # bounded


async def test_an_hour_long_breakpoint_writes_its_prefix_for_an_hour(up: FakeUpstream) -> None:
    """Claude Code's 1-hour shape: the system prompt marked ``ttl: "1h"``, the last block
    5 minutes. The writes up to the hour-long breakpoint are told apart in ``cache_creation``;
    a second turn reads them back and writes only its new turn, for 5 minutes."""

    def body(turns: int) -> dict[str, Any]:
        marked = anthropic_body(turns)
        marked["system"][0]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
        return marked

    async def usage(turns: int) -> dict[str, Any]:
        headers = {"x-api-key": "sk-hour", "anthropic-version": "2023-06-01"}
        async with aiohttp.ClientSession() as s:
            async with s.post(up.url + "/v1/messages", json=body(turns), headers=headers) as r:
                return dict(orjson.loads(await r.read())["usage"])

    first = await usage(1)
    by_ttl = first["cache_creation"]
    written = first["cache_creation_input_tokens"]
    assert first["cache_read_input_tokens"] == 0 and written >= MIN_TOKENS
    assert MIN_TOKENS <= by_ttl["ephemeral_1h_input_tokens"] < written  # the system prompt
    assert by_ttl["ephemeral_5m_input_tokens"] == written - by_ttl["ephemeral_1h_input_tokens"]
    second = await usage(2)
    assert second["cache_read_input_tokens"] == written
    assert second["cache_creation"] == {
        "ephemeral_5m_input_tokens": second["cache_creation_input_tokens"],
        "ephemeral_1h_input_tokens": 0,
    }
    assert second["cache_creation_input_tokens"] > 0
