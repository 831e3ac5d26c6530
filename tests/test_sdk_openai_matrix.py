"""The official openai SDK (AsyncOpenAI) against every channel type over real sockets, stream
and not: text with a system prompt, usage and its bill, tool-call round trips, an image part,
and the SDK's typed errors. The table and the upstream readers live in test_sdk_matrix.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import openai
import orjson
import pytest

from bench.fake_upstream import FakeUpstream, Reply
from tests.plugins.servers import KEYS, ServedGateway
from tests.test_sdk_matrix import (
    BY_TYPE,
    PNG_B64,
    WEATHER_TOOL_SCHEMA,
    Target,
    chat_request,
    check_billed,
    check_tool_results,
    fake_signature,
    signature_sent_back,
    stream_param,
    target_param,
    usage_record,
)

TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather now",
            "parameters": WEATHER_TOOL_SCHEMA,
        },
    }
]


@dataclass
class Answer:
    text: str = ""
    calls: list[tuple[str | None, str, dict[str, Any]]] = field(default_factory=list)
    finish: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    models: set[str] = field(default_factory=set)


def client(gw: ServedGateway, key: str = KEYS["alice"]) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.v1, api_key=key, max_retries=0)


async def ask(
    gw: ServedGateway, model: str, messages: list[Any], stream: bool, **kw: Any
) -> Answer:
    out = Answer()
    async with client(gw) as c:
        if not stream:
            r = await c.chat.completions.create(model=model, messages=messages, **kw)
            msg = r.choices[0].message
            out.text = msg.content or ""
            for call in msg.tool_calls or ():
                out.calls.append(
                    (call.id, call.function.name, orjson.loads(call.function.arguments))
                )
            out.finish = r.choices[0].finish_reason
            assert r.usage is not None
            out.prompt_tokens, out.completion_tokens = (
                r.usage.prompt_tokens,
                r.usage.completion_tokens,
            )
            out.models.add(r.model)
            return out
        chunks = await c.chat.completions.create(
            model=model,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            **kw,
        )
        texts: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        async for chunk in chunks:
            out.models.add(chunk.model)
            if chunk.usage is not None:
                assert chunk.choices == []  # the usage chunk comes alone, last
                out.prompt_tokens = chunk.usage.prompt_tokens
                out.completion_tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                texts.append(choice.delta.content or "")
                for d in choice.delta.tool_calls or ():
                    slot = calls.setdefault(d.index, {"id": None, "name": "", "args": ""})
                    if d.id:
                        assert slot["id"] is None, "a call's id is sent once"
                        slot["id"] = d.id
                    if d.function and d.function.name:
                        slot["name"] += d.function.name
                    if d.function and d.function.arguments:
                        slot["args"] += d.function.arguments
                out.finish = choice.finish_reason or out.finish
    out.text = "".join(texts)
    out.calls = [(s["id"], s["name"], orjson.loads(s["args"])) for _, s in sorted(calls.items())]
    return out


@target_param
@stream_param
async def test_text_with_system_prompt_usage_and_bill(
    gateway: ServedGateway, fake: FakeUpstream, target: Target, stream: bool
) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "[[fake text='hello from upstream' chunks=3]] greet me"},
    ]
    answer = await ask(gateway, target.model, messages, stream)
    assert answer.text == "hello from upstream"
    assert answer.finish == "stop"
    assert answer.models == {target.model}
    sent = chat_request(fake, target, stream)
    assert sent.system == "You are terse."
    assert "greet me" in sent.last_user_text
    await check_billed(gateway, target, "openai", answer.prompt_tokens, answer.completion_tokens)


@target_param
@stream_param
@pytest.mark.parametrize("n", [1, 2], ids=["one_call", "parallel"])
async def test_tool_call_round_trip(
    gateway: ServedGateway, fake: FakeUpstream, target: Target, stream: bool, n: int
) -> None:
    messages: list[Any] = [{"role": "user", "content": f"[[fake tools={n}]] weather?"}]
    first = await ask(gateway, target.model, messages, stream, tools=TOOLS)
    assert first.finish == "tool_calls"
    assert [name for _, name, _ in first.calls] == ["get_weather"] * n
    assert [args for _, _, args in first.calls] == [{"city": c} for c in ("Paris", "London")[:n]]
    ids = [cid for cid, _, _ in first.calls]
    assert all(ids) and len(set(ids)) == n
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": name, "arguments": orjson.dumps(args).decode()},
                }
                for cid, name, args in first.calls
            ],
        }
    )
    for cid, _, args in first.calls:
        messages.append(
            {"role": "tool", "tool_call_id": cid, "content": f"sunny in {args['city']}"}
        )
    fake.queue(Reply(text="Sunny everywhere."))
    second = await ask(gateway, target.model, messages, stream, tools=TOOLS)
    assert second.text == "Sunny everywhere."
    sent = chat_request(fake, target, stream)
    check_tool_results(target, sent, first.calls)
    if target.type != "gemini":  # the ids the client saw are the upstream's own
        assert [cid for cid, _, _ in sent.calls] == ids


@target_param
@stream_param
async def test_base64_image_part_reaches_the_upstream(
    gateway: ServedGateway, fake: FakeUpstream, target: Target, stream: bool
) -> None:
    content = [
        {"type": "text", "text": "[[fake image]] what is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}},
    ]
    answer = await ask(gateway, target.model, [{"role": "user", "content": content}], stream)
    assert answer.text == "I received 1 image part: image/png."
    assert chat_request(fake, target, stream).images == [("image/png", PNG_B64)]


@stream_param
@pytest.mark.parametrize(
    ("key", "model", "error", "status"),
    [
        ("sk-unknown-000000000000", "chat-small", openai.AuthenticationError, 401),
        (KEYS["alice"], "vip-model", openai.NotFoundError, 404),
    ],
    ids=["bad_key", "model_outside_group"],
)
async def test_client_errors_are_typed(
    gateway: ServedGateway, key: str, model: str, error: type[Exception], status: int, stream: bool
) -> None:
    async with client(gateway, key) as c:
        with pytest.raises(error) as exc:
            await c.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], stream=stream
            )
    assert isinstance(exc.value, openai.APIStatusError) and exc.value.status_code == status


@target_param
@stream_param
async def test_upstream_rate_limit_is_rate_limit_error(
    gateway: ServedGateway, target: Target, stream: bool
) -> None:
    async with client(gateway) as c:
        with pytest.raises(openai.RateLimitError) as exc:
            await c.chat.completions.create(
                model=target.model,
                messages=[{"role": "user", "content": "[[fake status=429]]"}],
                stream=stream,
            )
    assert exc.value.status_code == 429


@pytest.mark.parametrize(
    "target", [BY_TYPE["anthropic"], BY_TYPE["gemini"]], ids=["anthropic", "gemini"]
)
async def test_reasoning_signature_survives_a_tool_round_trip(
    gateway: ServedGateway, fake: FakeUpstream, target: Target
) -> None:
    """The reply's message object appended to the history as it is (the SDK's usual loop)
    carries the upstream's signature back, in the extension fields the gateway added."""
    messages: list[Any] = [{"role": "user", "content": "[[fake reasoning='let me see' tools=1]]"}]
    async with client(gateway) as c:
        r = await c.chat.completions.create(
            model=target.model, messages=messages, tools=TOOLS, reasoning_effort="low"
        )
        msg = r.choices[0].message
        assert msg.tool_calls
        messages.append(msg)
        call_id = msg.tool_calls[0].id
        messages.append({"role": "tool", "tool_call_id": call_id, "content": "sunny in Paris"})
        fake.queue(Reply(text="Sunny."))
        await c.chat.completions.create(
            model=target.model, messages=messages, tools=TOOLS, reasoning_effort="low"
        )
    assert signature_sent_back(fake, target, False) == fake_signature("let me see")


@target_param
async def test_error_mid_stream_raises_after_the_text_so_far(
    gateway: ServedGateway, target: Target
) -> None:
    texts: list[str] = []
    async with client(gateway) as c:
        stream = await c.chat.completions.create(
            model=target.model,
            messages=[
                {
                    "role": "user",
                    "content": "[[fake text='one two three four' chunks=4 error_after=2]]",
                }
            ],
            stream=True,
        )
        with pytest.raises(openai.APIError):
            async for chunk in stream:
                texts.extend(ch.delta.content or "" for ch in chunk.choices)
    assert "".join(texts) == "one two "
    assert (await usage_record(gateway))["status"] >= 500
