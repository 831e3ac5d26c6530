"""The pipeline in process (``tests/plugins/inprocess.py``): what a client gets and what is
billed, for admission, conversion, failover and in-stream errors, with the upstream scripted
and no socket anywhere. Each case runs on both stores."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import UpstreamError
from gateway.store import MICRO
from tests.plugins.inprocess import KEYS, InProcess, Scripted, running

CHAT = {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}]}
# the test config's price: 1 micro-unit per prompt token, 2 per completion token
START_BALANCE = 10 * MICRO


def openai_reply(text: str, prompt: int = 7, completion: int = 3) -> dict[str, Any]:
    return {
        "id": "chatcmpl-up",
        "object": "chat.completion",
        "created": 1,
        "model": "up-small",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def anthropic_events(
    texts: list[str], prompt: int = 11, completion: int = 5
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_up",
                "type": "message",
                "role": "assistant",
                "model": "claude-up",
                "content": [],
                "stop_reason": None,
                "usage": {"input_tokens": prompt, "output_tokens": 1},
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ]
    events += [
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}
        for t in texts
    ]
    events += [
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": completion},
        },
        {"type": "message_stop"},
    ]
    return events


def sse_data(body: bytes) -> list[Any]:
    """The JSON of each ``data:`` line of an SSE body, ``[DONE]`` as the string."""
    out: list[Any] = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: "):
            data = line[6:]
            out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out


async def balance(app: InProcess, account: str = "alice") -> int:
    found = await app.services.store.get_account(account)
    assert found is not None
    return found.balance


async def test_a_reply_is_relayed_with_the_asked_name_and_billed_once(inproc: InProcess) -> None:
    inproc.upstream.answer("oa", Scripted.json(openai_reply("hello there")))
    reply = await inproc.post("/v1/chat/completions", CHAT)
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["choices"][0]["message"]["content"] == "hello there"
    assert body["model"] == "chat-small"  # the client's name, not the upstream's
    [sent] = inproc.upstream.sent
    assert sent.url == "http://oa.test/v1/chat/completions"
    assert sent.body["model"] == "up-small"
    assert sent.headers["Authorization"] == "Bearer upstream-key"
    await inproc.settled()
    [record] = await inproc.services.store.usage("alice", 10)
    assert (record.status, record.channel, record.model) == (200, "oa", "chat-small")
    assert (record.prompt_tokens, record.completion_tokens) == (7, 3)
    assert record.cost == 7 * 1 + 3 * 2
    assert await balance(inproc) == START_BALANCE - record.cost


async def test_an_anthropic_stream_reaches_an_openai_client_converted(inproc: InProcess) -> None:
    inproc.upstream.answer("an", Scripted.sse(anthropic_events(["Hel", "lo"]), False, True))
    payload = {**CHAT, "model": "claude-small", "stream": True}
    payload["stream_options"] = {"include_usage": True}
    reply = await inproc.post("/v1/chat/completions", payload)
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = sse_data(reply.body)
    assert events[-1] == "[DONE]"
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in events[:-1] if c.get("choices")
    )
    assert text == "Hello"
    usage = next(c["usage"] for c in events[:-1] if c.get("usage"))
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (11, 5)
    [sent] = inproc.upstream.sent
    assert sent.url == "http://an.test/v1/messages" and sent.body["stream"] is True
    await inproc.settled()
    [record] = await inproc.services.store.usage("alice", 10)
    assert (record.status, record.channel, record.cost) == (200, "an", 11 + 5 * 2)


async def test_a_failing_channel_is_left_for_the_next_before_anything_was_sent(
    store_url: str,
) -> None:
    second = {
        "name": "ob",
        "type": "openai",
        "base_url": "http://ob.test/v1",
        "api_key": "second-key",
        "groups": ["default"],
        "models": ["chat-small"],
        "priority": 1,
    }
    async with running(store_url, channels=[*_channels(store_url), second]) as app:
        app.upstream.answer("oa", Scripted.json({"error": {"message": "boom"}}, 500))
        app.upstream.answer("ob", Scripted.json(openai_reply("from the second")))
        reply = await app.post("/v1/chat/completions", CHAT)
        assert reply.status == 200
        assert reply.json()["choices"][0]["message"]["content"] == "from the second"
        assert [s.url.split("/")[2] for s in app.upstream.sent] == ["oa.test", "ob.test"]
        assert app.upstream.sent[1].headers["Authorization"] == "Bearer second-key"
        await app.settled()
        [record] = await app.services.store.usage("alice", 10)
        assert (record.channel, record.status) == ("ob", 200)
        assert app.services.health.failures_total.get("oa") == 1


def _channels(store_url: str) -> list[dict[str, Any]]:
    from tests.plugins.inprocess import inprocess_config

    return list(inprocess_config(store_url)["channels"])


@pytest.mark.parametrize(
    ("path", "key", "payload", "status", "shape"),
    [
        ("/v1/chat/completions", "sk-nobody-0000000000000", CHAT, 401, "openai"),
        ("/v1/chat/completions", KEYS["broke"], CHAT, 402, "openai"),
        ("/v1/chat/completions", KEYS["alice"], {**CHAT, "model": "nope"}, 404, "openai"),
        ("/v1/chat/completions", KEYS["alice"], ["not", "an", "object"], 400, "openai"),
        ("/v1/messages", "sk-nobody-0000000000000", {"model": "claude-small"}, 401, "anthropic"),
        ("/v1/messages", KEYS["broke"], {"model": "claude-small", "max_tokens": 5,
                                         "messages": [{"role": "user", "content": "x"}]},
         402, "anthropic"),
        ("/v1beta/models/gemini-small:generateContent", KEYS["disabled"],
         {"contents": [{"role": "user", "parts": [{"text": "x"}]}]}, 401, "gemini"),
    ],
)  # fmt: skip
async def test_refusals_come_in_the_protocol_of_the_path_and_reach_no_upstream(
    inproc: InProcess, path: str, key: str, payload: Any, status: int, shape: str
) -> None:
    reply = await inproc.post(path, payload, key=key)
    assert reply.status == status, reply.body
    body = reply.json()
    if shape == "anthropic":
        assert body["type"] == "error" and body["error"]["message"]
    elif shape == "gemini":
        assert body["error"]["code"] == status and body["error"]["status"]
    else:
        assert body["error"]["message"] and body["error"]["type"]
    assert inproc.upstream.sent == []
    assert reply.headers["x-request-id"]


@pytest.mark.parametrize("status", [429, 503])
async def test_an_upstream_rate_limit_or_overload_comes_back_with_its_wait(
    inproc: InProcess, status: int
) -> None:
    limited = Scripted.json({"error": {"message": "slow down", "type": "rate_limit"}}, status)
    limited.headers["retry-after"] = "7"
    inproc.upstream.answer("oa", limited, limited, limited)
    reply = await inproc.post("/v1/chat/completions", CHAT)
    assert reply.status == status
    assert reply.headers["retry-after"] == "7"
    await inproc.settled()
    [record] = await inproc.services.store.usage("alice", 10)
    assert (record.status, record.cost) == (status, 0)
    assert await balance(inproc) == START_BALANCE


async def test_an_unreachable_upstream_is_a_502_billed_nothing(inproc: InProcess) -> None:
    down = Scripted(fail=UpstreamError("cannot reach the upstream: ClientConnectorError"))
    inproc.upstream.answer("oa", down, down, down)
    reply = await inproc.post("/v1/chat/completions", CHAT)
    assert reply.status == 502
    assert reply.json()["error"]["type"]
    await inproc.settled()
    [record] = await inproc.services.store.usage("alice", 10)
    assert (record.status, record.cost, record.channel) == (502, 0, "oa")


async def test_an_error_mid_stream_is_sent_in_the_stream_and_what_came_is_billed(
    inproc: InProcess,
) -> None:
    events = anthropic_events(["partial"])[:3]  # start, block, one delta: then an error
    events.append({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    inproc.upstream.answer("an", Scripted.sse(events, False, True))
    payload = {**CHAT, "model": "claude-small", "stream": True}
    reply = await inproc.post("/v1/chat/completions", payload)
    assert reply.status == 200  # the stream had started
    data = sse_data(reply.body)
    assert any(
        c.get("choices") and c["choices"][0]["delta"].get("content") == "partial"
        for c in data
        if isinstance(c, dict)
    )
    error = next(c for c in data if isinstance(c, dict) and "error" in c)
    assert "busy" in error["error"]["message"]
    await inproc.settled()
    [record] = await inproc.services.store.usage("alice", 10)
    assert record.status != 200 and record.cost > 0  # the prompt and what was generated
    assert await balance(inproc) == START_BALANCE - record.cost


async def test_an_overloaded_anthropic_upstream_s_wait_reaches_a_messages_client(
    inproc: InProcess,
) -> None:
    busy = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    overloaded = Scripted.json(busy, 529)
    overloaded.headers["retry-after"] = "12"
    inproc.upstream.answer("an", overloaded, overloaded, overloaded)
    body = {"model": "claude-small", "max_tokens": 5, "messages": CHAT["messages"]}
    reply = await inproc.post("/v1/messages", body)
    assert reply.status == 503
    assert reply.json()["error"]["type"] == "overloaded_error"
    assert reply.headers["retry-after"] == "12"


@pytest.mark.parametrize(
    ("given", "expected"),
    [("3", 3.0), ("0.5", 0.5), ("-1", None), ("nan", None), ("inf", None), ("soon", None),
     ("", None), (None, None), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0)],
)  # fmt: skip
def test_an_upstream_s_retry_after_is_read_as_seconds_or_a_date(
    given: str | None, expected: float | None
) -> None:
    from gateway.relay.attempt import retry_after

    assert retry_after(given) == expected
