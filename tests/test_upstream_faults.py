"""Upstreams that misbehave, in process (``tests/plugins/inprocess.py``): what the client gets,
what is billed, and what the channel's health makes of it."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config import UpstreamSettings
from gateway.errors import UpstreamError
from gateway.policy.health import FAILURES_BEFORE_COOLDOWN
from gateway.upstream.pool import read_error
from tests.plugins.inprocess import InProcess, Scripted, inprocess_config, running
from tests.test_pipeline import CHAT, openai_reply

MESSAGES = {"model": "claude-small", "max_tokens": 50, "messages": CHAT["messages"]}
GEMINI = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


def with_second(store_url: str) -> list[dict[str, Any]]:
    """The test config's channels, each model with a second channel of its type behind the
    first (priority 1): ``ob`` for chat-small, ``ab`` for claude-small, ``gb`` for
    gemini-small."""
    channels = list(inprocess_config(store_url)["channels"])
    second = []
    for name, first in (("ob", "oa"), ("ab", "an"), ("gb", "gm")):
        base = next(c for c in channels if c["name"] == first)
        host = f"http://{name}.test"
        url = host + "/v1" if base["type"] == "openai" else host
        second.append({**base, "name": name, "base_url": url, "priority": 1})
    return channels + second


def anthropic_message(text: str) -> dict[str, Any]:
    return {
        "id": "msg_up",
        "type": "message",
        "role": "assistant",
        "model": "claude-up",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 7, "output_tokens": 3},
    }


def gemini_reply(text: str) -> dict[str, Any]:
    return {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP"}
        ],
        "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 3},
    }


SHAPELESS = [
    ("/v1/chat/completions", CHAT, "oa", "ob", {}, openai_reply("fine")),
    ("/v1/chat/completions", CHAT, "oa", "ob", {"id": "x", "object": "chat.completion"},
     openai_reply("fine")),
    ("/v1/messages", MESSAGES, "an", "ab", {}, anthropic_message("fine")),
    ("/v1/messages", MESSAGES, "an", "ab", {"type": "message", "usage": {}},
     anthropic_message("fine")),
    ("/v1beta/models/gemini-small:generateContent", GEMINI, "gm", "gb", {},
     gemini_reply("fine")),
    ("/v1/chat/completions", {**CHAT, "model": "gemini-small"}, "gm", "gb", {},
     gemini_reply("fine")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "first", "second", "shapeless", "good"),
    SHAPELESS,
    ids=["openai-empty", "openai-no-choices", "anthropic-empty", "anthropic-no-content",
         "gemini-empty", "gemini-converted-empty"],
)  # fmt: skip
async def test_a_shapeless_200_fails_over_and_counts_against_its_channel(
    store_url: str,
    path: str,
    body: dict[str, Any],
    first: str,
    second: str,
    shapeless: dict[str, Any],
    good: dict[str, Any],
) -> None:
    async with running(store_url, channels=with_second(store_url)) as app:
        app.upstream.answer(first, Scripted.json(shapeless))
        app.upstream.answer(second, Scripted.json(good))
        reply = await app.post(path, body, **{"anthropic-version": "2023-06-01"})
        assert reply.status == 200, reply.body
        assert b"fine" in reply.body
        hosts = [s.url.split("/")[2] for s in app.upstream.sent]
        assert hosts == [f"{first}.test", f"{second}.test"]
        assert app.services.health.failures_total.get(first) == 1
        await app.settled()
        [record] = await app.services.store.usage("alice", 10)
        assert (record.channel, record.status) == (second, 200)
        assert (record.prompt_tokens, record.completion_tokens) == (7, 3)


async def test_a_shapeless_200_from_the_only_channel_is_a_502_billed_nothing(
    inproc: InProcess,
) -> None:
    inproc.upstream.answer("oa", Scripted.json({}), Scripted.json({}), Scripted.json({}))
    reply = await inproc.post("/v1/chat/completions", CHAT)
    assert reply.status == 502
    assert reply.json()["error"]["type"] == "upstream_error"
    await inproc.settled()
    [record] = await inproc.services.store.usage("alice", 10)
    assert (record.status, record.cost) == (502, 0)


@pytest.mark.parametrize(
    ("path", "body", "shapeless"),
    [
        ("/v1/embeddings", {"model": "emb-small", "input": "hi"}, {"object": "list"}),
        ("/v1beta/models/emb-small:embedContent",
         {"content": {"parts": [{"text": "hi"}]}}, {}),
    ],
    ids=["openai", "gemini"],
)  # fmt: skip
async def test_a_shapeless_embeddings_200_is_a_502_not_a_billed_estimate(
    store_url: str, path: str, body: dict[str, Any], shapeless: dict[str, Any]
) -> None:
    cfg = inprocess_config(store_url)
    models = [*cfg["models"], {"name": "emb-small", "capabilities": ["embeddings"],
                                "price": {"input": 1.0}}]  # fmt: skip
    channel = "oa" if path.startswith("/v1/") else "gm"  # the one channel that serves it
    channels = [{**c, "models": [*c["models"], "emb-small"]} if c["name"] == channel else c
                for c in cfg["channels"]]  # fmt: skip
    async with running(store_url, models=models, channels=channels) as app:
        app.upstream.answer(channel, *[Scripted.json(shapeless)] * 3)
        reply = await app.post(path, body)
        assert reply.status == 502, reply.body
        await app.settled()
        [record] = await app.services.store.usage("alice", 10)
        assert (record.status, record.cost) == (502, 0)


# a stream cut short: billed from the upstream's own prompt count where it sent one ---------
UPSTREAM_PROMPT = 1234  # far from the local estimate of a two-letter prompt


def anthropic_start(prompt: int) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_start",
            "message": {
                "id": "msg_up", "type": "message", "role": "assistant", "model": "claude-up",
                "content": [], "stop_reason": None,
                "usage": {"input_tokens": prompt, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0,
         "delta": {"type": "text_delta", "text": "a few words before the cut"}},
    ]  # fmt: skip


def gemini_start(prompt: int) -> list[dict[str, Any]]:
    return [
        {
            "candidates": [{"content": {"role": "model", "parts": [{"text": "a few words"}]}}],
            "usageMetadata": {"promptTokenCount": prompt, "candidatesTokenCount": 3},
        }
    ]


CUT_STREAMS = [
    ("/v1/chat/completions", {**CHAT, "model": "claude-small", "stream": True}, "an",
     Scripted.sse(anthropic_start(UPSTREAM_PROMPT), False, True)),
    ("/v1/responses", {"model": "claude-small", "input": "hi", "stream": True}, "an",
     Scripted.sse(anthropic_start(UPSTREAM_PROMPT), False, True)),
    ("/v1/chat/completions", {**CHAT, "model": "gemini-small", "stream": True}, "gm",
     Scripted.sse(gemini_start(UPSTREAM_PROMPT), False)),
    ("/v1/messages", {**MESSAGES, "model": "gemini-small", "stream": True}, "gm",
     Scripted.sse(gemini_start(UPSTREAM_PROMPT), False)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "channel", "scripted"),
    CUT_STREAMS,
    ids=["anthropic-to-openai", "anthropic-to-responses", "gemini-to-openai",
         "gemini-to-anthropic"],
)  # fmt: skip
async def test_a_converted_stream_cut_short_bills_the_prompt_the_upstream_reported(
    inproc: InProcess, path: str, body: dict[str, Any], channel: str, scripted: Scripted
) -> None:
    scripted.cut = UpstreamError("the upstream connection failed: ServerDisconnectedError")
    inproc.upstream.answer(channel, scripted)
    reply = await inproc.post(path, body, **{"anthropic-version": "2023-06-01"})
    assert reply.status == 200  # the stream had started; the failure is inside it
    assert b"a few words" in reply.body
    await inproc.settled()
    [record] = await inproc.services.store.usage("alice", 10)
    assert record.status == 502
    assert record.prompt_tokens == UPSTREAM_PROMPT  # not the local estimate
    assert record.completion_tokens >= 1


# a stream that stalls mid-way counts against its channel ------------------------------------
def stalling() -> Scripted:
    """Headers and a first chunk, then silence past the channel's idle timeout, as the pool
    reports it (aiohttp's sock_read: ``read_error(TimeoutError())``)."""
    events = [openai_chunk("first words")]
    stalled = Scripted.sse(events, done=False)
    stalled.cut = read_error(TimeoutError())
    return stalled


def openai_chunk(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-up",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "up-small",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }


def openai_stream(text: str) -> Scripted:
    end = {**openai_chunk(""), "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    usage = {**openai_chunk(""), "choices": [],
             "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}  # fmt: skip
    return Scripted.sse([openai_chunk(text), end, usage])


async def test_streams_that_stall_mid_way_cool_their_channel(store_url: str) -> None:
    """Three streams in a row stall after their first words: each client gets its words and
    a timeout inside the stream, and the channel cools down, so the next stream goes to the
    healthy channel behind it instead of stalling too."""
    async with running(store_url, channels=with_second(store_url)) as app:
        app.upstream.answer("oa", *[stalling() for _ in range(4)])
        app.upstream.answer("ob", openai_stream("from the healthy one"))
        for _ in range(FAILURES_BEFORE_COOLDOWN):
            reply = await app.post("/v1/chat/completions", {**CHAT, "stream": True})
            assert reply.status == 200
            assert b"first words" in reply.body
            assert b"the upstream stopped sending" in reply.body  # inside the stream
        assert "oa" in app.services.health.cooling
        assert app.services.health.failures_total.get("oa") == FAILURES_BEFORE_COOLDOWN
        reply = await app.post("/v1/chat/completions", {**CHAT, "stream": True})
        assert b"from the healthy one" in reply.body
        await app.settled()
        records = await app.services.store.usage("alice", 10)
        assert [r.status for r in reversed(records)] == [504, 504, 504, 200]


async def test_a_stream_that_completes_clears_its_channels_failures(store_url: str) -> None:
    """The count is of failures in a row: a stream that ends well between two stalls clears
    it, as a whole reply does."""
    async with running(store_url, channels=with_second(store_url)) as app:
        app.upstream.answer("oa", stalling(), stalling(), openai_stream("fine"), stalling())
        for _ in range(4):
            reply = await app.post("/v1/chat/completions", {**CHAT, "stream": True})
            assert reply.status == 200
        assert "oa" not in app.services.health.cooling
        assert app.services.health.failures_total.get("oa") == 3


def test_the_default_idle_timeout_outlasts_a_model_thinking() -> None:
    """A live model's longest silence (a reasoning model thinking before its first token) must
    never count as a stall: the default is what the providers' own SDKs wait, 600 s."""
    assert UpstreamSettings().read_timeout >= 600
