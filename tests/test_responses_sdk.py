"""The official openai SDK's Responses API (``client.responses``) against every channel type
over real sockets, plain and streamed: text with instructions, usage and its bill, a function
call round trip, reasoning, the token limit, what is refused, and errors as the SDK's types."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from bench.fake_upstream import FakeUpstream
from tests.plugins.servers import KEYS, ServedGateway, make_config
from tests.test_sdk_matrix import (
    WEATHER_TOOL_SCHEMA,
    Target,
    chat_request,
    check_billed,
    check_tool_results,
    stream_param,
    target_param,
    usage_record,
)

TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather now",
        "parameters": WEATHER_TOOL_SCHEMA,
    }
]


def client(gw: ServedGateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.v1, api_key=KEYS["alice"], max_retries=0)


async def respond(gw: ServedGateway, stream: bool, **kwargs: Any) -> Any:
    """The final Response object, built by the SDK from the stream's events when streamed."""
    async with client(gw) as c:
        if not stream:
            return await c.responses.create(**kwargs)
        async with c.responses.stream(**kwargs) as events:
            seen = []
            async for event in events:
                seen.append(event.type)
                last = event
            assert seen[:2] == ["response.created", "response.in_progress"]
            if seen[-1] == "response.incomplete":  # as OpenAI ends a stream cut by the limit
                return last.response  # (the SDK's final response is for completed ones)
            assert seen[-1] == "response.completed"
            return await events.get_final_response()


@target_param
@stream_param
async def test_text_with_instructions_and_its_bill(
    gateway: ServedGateway, fake: FakeUpstream, target: Target, stream: bool
) -> None:
    resp = await respond(
        gateway,
        stream,
        model=target.model,
        instructions="Answer briefly.",
        input="[[fake text='Hello from the channel']] hi",
    )
    assert resp.output_text == "Hello from the channel"
    assert resp.status == "completed"
    assert resp.model == target.model
    assert resp.usage.input_tokens > 0 and resp.usage.output_tokens > 0
    sent = chat_request(fake, target, stream)
    assert sent.system == "Answer briefly."
    await check_billed(
        gateway, target, "responses", resp.usage.input_tokens, resp.usage.output_tokens
    )


@target_param
@stream_param
async def test_a_function_call_round_trip(
    gateway: ServedGateway, fake: FakeUpstream, target: Target, stream: bool
) -> None:
    history: list[Any] = [{"role": "user", "content": "[[fake tools=2]] weather?"}]
    first = await respond(gateway, stream, model=target.model, input=history, tools=TOOLS)
    calls = [item for item in first.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather", "get_weather"]
    history += [item.model_dump(exclude_none=True) for item in first.output]
    import json

    for call in calls:
        city = json.loads(call.arguments)["city"]
        history.append(
            {"type": "function_call_output", "call_id": call.call_id, "output": f"sunny in {city}"}
        )
    second = await respond(gateway, stream, model=target.model, input=history, tools=TOOLS)
    assert second.output_text
    sent = chat_request(fake, target, stream)
    check_tool_results(target, sent, [(c.call_id, c.name, json.loads(c.arguments)) for c in calls])


@target_param
@stream_param
async def test_the_token_limit_makes_an_incomplete_response(
    gateway: ServedGateway, target: Target, stream: bool
) -> None:
    resp = await respond(
        gateway, stream, model=target.model, input="[[fake finish=length]] go", max_output_tokens=5
    )
    assert resp.status == "incomplete"
    assert resp.incomplete_details.reason == "max_output_tokens"


@target_param
@stream_param
async def test_reasoning_arrives_as_a_reasoning_item(
    gateway: ServedGateway, target: Target, stream: bool
) -> None:
    resp = await respond(
        gateway,
        stream,
        model=target.model,
        input="[[fake reasoning='let me see']] think",
        reasoning={"effort": "low"},
    )
    kinds = [item.type for item in resp.output]
    assert kinds[0] == "reasoning" and "message" in kinds
    assert resp.output[0].summary[0].text == "let me see"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"tools": [{"type": "custom", "name": "grammar"}]}, "custom"),
        ({"background": True}, "background"),
    ],
)
async def test_what_needs_a_kept_response_or_a_tool_no_provider_has_is_refused(
    gateway: ServedGateway, extra: dict[str, Any], says: str
) -> None:
    async with client(gateway) as c:
        with pytest.raises(openai.BadRequestError) as caught:
            await c.responses.create(model="chat-small", input="hi", **extra)
    assert says in str(caught.value)
    rec = await usage_record(gateway)
    assert (rec["protocol"], rec["status"]) == ("responses", 400)


async def test_errors_are_the_sdk_s_typed_errors(gateway: ServedGateway) -> None:
    async with client(gateway) as c:
        with pytest.raises(openai.NotFoundError):
            await c.responses.create(model="no-such-model", input="hi")
        with pytest.raises(openai.NotFoundError):
            await c.responses.retrieve("resp_123")  # nothing is kept
    async with openai.AsyncOpenAI(base_url=gateway.v1, api_key="sk-wrong", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            await c.responses.create(model="chat-small", input="hi")


@stream_param
async def test_a_channel_that_serves_responses_gets_them_unconverted(
    gateway_factory: Any, fake: FakeUpstream, store_url: str, stream: bool
) -> None:
    """An openai channel with ``responses: true``: the body goes to its /responses as the
    client sent it (model renamed, store false), the reply comes back as it came."""
    cfg = make_config(fake.url, store_url)
    for channel in cfg["channels"]:
        if channel["name"] == "oa":
            channel["responses"] = True
    async with gateway_factory(channels=cfg["channels"]) as gw:
        resp = await respond(
            gw, stream, model="chat-small", input="[[fake text='straight through']] hi", store=True
        )
        assert resp.output_text == "straight through"
        assert resp.model == "chat-small"
        (sent,) = [r for r in fake.requests if r.path == "/v1/responses"]
        assert sent.json["model"] == "up-small" and sent.json["store"] is False
        assert sent.json["input"] == "[[fake text='straight through']] hi"
        rec = await usage_record(gw)
        assert (rec["protocol"], rec["channel"], rec["status"]) == ("responses", "oa", 200)
        assert rec["prompt_tokens"] == resp.usage.input_tokens > 0
        assert rec["completion_tokens"] == resp.usage.output_tokens > 0


def test_namespace_tools_are_flattened_and_hosted_tools_left_out() -> None:
    """As Codex CLI sends them: a namespace of functions, and OpenAI's own web search."""
    from gateway.protocols.base import Ctx
    from gateway.protocols.responses import ResponsesAdapter

    adapter = ResponsesAdapter()
    payload = {
        "model": "chat-small",
        "input": [
            {"role": "user", "content": "go"},
            {
                "type": "function_call",
                "call_id": "c1",
                "namespace": "agents",
                "name": "spawn",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": "c1", "output": "spawned"},
        ],
        "tools": [
            {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
            {
                "type": "namespace",
                "name": "agents",
                "tools": [{"type": "function", "name": "spawn"}],
            },  # noqa: E501
            {"type": "web_search", "external_web_access": True},
        ],
    }
    route = adapter.match("chat", payload, None, b"", None)
    req = adapter.decode_request(payload, route)
    assert [t["function"]["name"] for t in req["tools"]] == ["exec_command", "agents__spawn"]
    assert req["messages"][1]["tool_calls"][0]["function"]["name"] == "agents__spawn"
    ctx = Ctx("r1", "chat-small", 0, tool_namespaces=route.tool_namespaces)
    function = {"name": "agents__spawn", "arguments": "{}"}
    call = {"id": "c2", "type": "function", "function": function}
    reply = adapter.encode_response(
        {"choices": [{"message": {"role": "assistant", "tool_calls": [call]}}]}, ctx
    )
    (item,) = reply["output"]
    assert (item["namespace"], item["name"], item["call_id"]) == ("agents", "spawn", "c2")
