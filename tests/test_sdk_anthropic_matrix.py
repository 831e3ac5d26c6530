"""The official anthropic SDK (AsyncAnthropic) against every channel type over real sockets,
stream and not: text with a system prompt, usage and its bill, tool-use round trips, an image
block, and the SDK's typed errors. The table and the upstream readers live in
test_sdk_matrix.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import anthropic
import pytest

from bench.fake_upstream import FakeUpstream, Reply
from tests.plugins.servers import KEYS, ServedGateway
from tests.test_sdk_matrix import (
    BY_TYPE,
    PNG_B64,
    WEATHER_TOOL_SCHEMA,
    Target,
    anthropic_client,
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
    {"name": "get_weather", "description": "Weather now", "input_schema": WEATHER_TOOL_SCHEMA}
]


@dataclass
class Answer:
    text: str = ""
    calls: list[tuple[str | None, str, dict[str, Any]]] = field(default_factory=list)
    content: list[Any] = field(default_factory=list)  # the reply's blocks, to send back
    stop_reason: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    text_deltas: int = 0


async def ask(
    gw: ServedGateway,
    model: str,
    messages: list[Any],
    stream: bool,
    max_tokens: int = 256,
    **kw: Any,
) -> Answer:
    out = Answer()
    async with anthropic_client(gw) as c:
        if stream:
            async with c.messages.stream(
                model=model, max_tokens=max_tokens, messages=messages, **kw
            ) as events:
                async for event in events:
                    if event.type == "content_block_delta" and event.delta.type == "text_delta":
                        out.text_deltas += 1
                msg = await events.get_final_message()
        else:
            msg = await c.messages.create(
                model=model, max_tokens=max_tokens, messages=messages, **kw
            )
    out.model = msg.model
    out.stop_reason = msg.stop_reason
    out.input_tokens, out.output_tokens = msg.usage.input_tokens, msg.usage.output_tokens
    out.content = [block.model_dump(exclude_none=True) for block in msg.content]
    out.text = "".join(b.text for b in msg.content if b.type == "text")
    out.calls = [(b.id, b.name, dict(b.input)) for b in msg.content if b.type == "tool_use"]
    return out


@target_param
@stream_param
async def test_text_with_system_prompt_usage_and_bill(
    gateway: ServedGateway, fake: FakeUpstream, target: Target, stream: bool
) -> None:
    messages = [{"role": "user", "content": "[[fake text='hello from upstream' chunks=3]] hi"}]
    answer = await ask(gateway, target.model, messages, stream, system="You are terse.")
    assert answer.text == "hello from upstream"
    assert answer.stop_reason == "end_turn"
    assert answer.model == target.model
    if stream:
        assert answer.text_deltas == 3
    sent = chat_request(fake, target, stream)
    assert sent.system == "You are terse."
    assert sent.last_user_text.endswith("hi")
    await check_billed(gateway, target, "anthropic", answer.input_tokens, answer.output_tokens)


@target_param
@stream_param
@pytest.mark.parametrize("n", [1, 2], ids=["one_call", "parallel"])
async def test_tool_use_round_trip(
    gateway: ServedGateway, fake: FakeUpstream, target: Target, stream: bool, n: int
) -> None:
    messages: list[Any] = [{"role": "user", "content": f"[[fake tools={n}]] weather?"}]
    first = await ask(gateway, target.model, messages, stream, tools=TOOLS)
    assert first.stop_reason == "tool_use"
    assert [name for _, name, _ in first.calls] == ["get_weather"] * n
    assert [args for _, _, args in first.calls] == [{"city": c} for c in ("Paris", "London")[:n]]
    ids = [cid for cid, _, _ in first.calls]
    assert all(ids) and len(set(ids)) == n
    messages.append({"role": "assistant", "content": first.content})
    results = [
        {"type": "tool_result", "tool_use_id": cid, "content": f"sunny in {args['city']}"}
        for cid, _, args in first.calls
    ]
    messages.append({"role": "user", "content": results})
    fake.queue(Reply(text="Sunny everywhere."))
    second = await ask(gateway, target.model, messages, stream, tools=TOOLS)
    assert second.text == "Sunny everywhere."
    sent = chat_request(fake, target, stream)
    check_tool_results(target, sent, first.calls)
    if target.type != "gemini":  # the ids the client saw are the upstream's own
        assert [cid for cid, _, _ in sent.calls] == ids


@target_param
@stream_param
async def test_base64_image_block_reaches_the_upstream(
    gateway: ServedGateway, fake: FakeUpstream, target: Target, stream: bool
) -> None:
    content = [
        {"type": "text", "text": "[[fake image]] what is this?"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64},
        },
    ]
    answer = await ask(gateway, target.model, [{"role": "user", "content": content}], stream)
    assert answer.text == "I received 1 image part: image/png."
    assert chat_request(fake, target, stream).images == [("image/png", PNG_B64)]


@stream_param
@pytest.mark.parametrize(
    ("key", "model", "error", "status"),
    [
        ("sk-unknown-000000000000", "claude-small", anthropic.AuthenticationError, 401),
        (KEYS["alice"], "vip-model", anthropic.NotFoundError, 404),
    ],
    ids=["bad_key", "model_outside_group"],
)
async def test_client_errors_are_typed(
    gateway: ServedGateway, key: str, model: str, error: type[Exception], status: int, stream: bool
) -> None:
    async with anthropic_client(gateway, key) as c:
        with pytest.raises(error) as exc:
            await c.messages.create(
                model=model,
                max_tokens=16,
                messages=[{"role": "user", "content": "hi"}],
                stream=stream,
            )
    assert isinstance(exc.value, anthropic.APIStatusError) and exc.value.status_code == status


@target_param
@stream_param
async def test_upstream_rate_limit_is_rate_limit_error(
    gateway: ServedGateway, target: Target, stream: bool
) -> None:
    async with anthropic_client(gateway) as c:
        with pytest.raises(anthropic.RateLimitError) as exc:
            await c.messages.create(
                model=target.model,
                max_tokens=16,
                messages=[{"role": "user", "content": "[[fake status=429]]"}],
                stream=stream,
            )
    assert exc.value.status_code == 429


@pytest.mark.parametrize(
    "target", [BY_TYPE["anthropic"], BY_TYPE["gemini"]], ids=["anthropic", "gemini"]
)
@stream_param
async def test_thinking_signature_survives_a_tool_round_trip(
    gateway: ServedGateway, fake: FakeUpstream, target: Target, stream: bool
) -> None:
    """What Claude Code does on every turn: thinking on, a tool call, the whole assistant turn
    sent back with the result; the upstream must get its signature back where it checks it."""
    messages: list[Any] = [{"role": "user", "content": "[[fake reasoning='let me see' tools=1]]"}]
    kw: dict[str, Any] = {
        "tools": TOOLS,
        "max_tokens": 4096,
        "thinking": {"type": "enabled", "budget_tokens": 2048},
    }
    first = await ask(gateway, target.model, messages, stream, **kw)
    assert [b["type"] for b in first.content] == ["thinking", "tool_use"]
    assert first.content[0]["thinking"] == "let me see" and first.content[0]["signature"]
    messages.append({"role": "assistant", "content": first.content})
    result = {"type": "tool_result", "tool_use_id": first.calls[0][0], "content": "sunny in Paris"}
    messages.append({"role": "user", "content": [result]})
    fake.queue(Reply(text="Sunny."))
    await ask(gateway, target.model, messages, stream, **kw)
    assert signature_sent_back(fake, target, stream) == fake_signature("let me see")


@target_param
async def test_error_mid_stream_raises_after_the_text_so_far(
    gateway: ServedGateway, target: Target
) -> None:
    texts: list[str] = []
    async with anthropic_client(gateway) as c:
        stream = await c.messages.create(
            model=target.model,
            max_tokens=64,
            messages=[
                {
                    "role": "user",
                    "content": "[[fake text='one two three four' chunks=4 error_after=2]]",
                }
            ],
            stream=True,
        )
        with pytest.raises(anthropic.APIStatusError) as exc:
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    texts.append(event.delta.text)
    assert "".join(texts) == "one two "
    assert exc.value.body["error"]["type"] in ("overloaded_error", "api_error")  # type: ignore[index]
    assert (await usage_record(gateway))["status"] >= 500


@target_param
@stream_param
async def test_system_message_mid_conversation(
    gateway: ServedGateway, fake: FakeUpstream, target: Target, stream: bool
) -> None:
    """Claude Code sends ``role: "system"`` messages inside ``messages``: a chat-completions
    channel gets a system message where it stood, a Gemini channel the text in its
    systemInstruction (its one place for system text), an anthropic channel the body as sent."""
    note = "The user switched to plan mode."
    messages: list[Any] = [
        {"role": "user", "content": "List the files."},
        {"role": "assistant", "content": "a.py and b.py."},
        {"role": "system", "content": [{"type": "text", "text": note}]},
        {"role": "user", "content": "[[fake text='a plan' chunks=2]] Plan the change."},
    ]
    answer = await ask(gateway, target.model, messages, stream, system="You code.")
    assert answer.text == "a plan"
    sent = chat_request(fake, target, stream)
    assert sent.last_user_text.endswith("Plan the change.")
    body = fake.requests[-1].json
    if target.type == "openai":
        assert sent.system == "You code." + note
        assert [m["role"] for m in body["messages"]] == [
            "system", "user", "assistant", "system", "user"
        ]  # fmt: skip
        assert body["messages"][3]["content"] == note
    elif target.type == "gemini":
        assert [p["text"] for p in body["systemInstruction"]["parts"]] == ["You code.", note]
        assert [c["role"] for c in body["contents"]] == ["user", "model", "user"]
    else:
        assert body["messages"] == messages and body["system"] == "You code."
