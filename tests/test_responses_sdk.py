"""The official openai SDK's Responses API (``client.responses``) against every channel type
over real sockets, plain and streamed: text with instructions, usage and its bill, a function
call round trip, reasoning and the signatures the next turn needs, the token limit, what is
refused, errors as the SDK's types, and the pass-through's events as the upstream sent them.
Every Responses object and event the conversion fixtures hold validates strictly against the
SDK's own types."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel

from bench.fake_upstream import FakeUpstream
from gateway.protocols.sse import SSEParser
from tests.fixture_tree import CONVERSION_TREE, case_dirs
from tests.plugins.servers import KEYS, ServedGateway, make_config
from tests.test_sdk_matrix import (
    BY_TYPE,
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
        ({"conversation": "conv_123"}, "conversation"),
        ({"tools": [{"type": "local_shell"}]}, "local_shell"),
        (
            {
                "tools": [
                    {
                        "type": "computer_use_preview",
                        "display_width": 1024,
                        "display_height": 768,
                        "environment": "linux",
                    }
                ]
            },
            "computer_use_preview",
        ),
        (
            {"tools": [{"type": "web_search"}], "tool_choice": {"type": "function", "name": "f"}},
            "'f'",
        ),
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


def passthrough_channels(fake: FakeUpstream, store_url: str) -> list[Any]:
    """The test config's channels, the openai one serving the Responses API itself."""
    cfg = make_config(fake.url, store_url)
    for channel in cfg["channels"]:
        if channel["name"] == "oa":
            channel["responses"] = True
    channels: list[Any] = cfg["channels"]
    return channels


@stream_param
async def test_a_channel_that_serves_responses_gets_them_unconverted(
    gateway_factory: Any, fake: FakeUpstream, store_url: str, stream: bool
) -> None:
    """An openai channel with ``responses: true``: the body goes to its /responses as the
    client sent it (model renamed, store false), the reply comes back as it came."""
    async with gateway_factory(channels=passthrough_channels(fake, store_url)) as gw:
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


async def raw_stream(gw: ServedGateway, body: dict[str, Any]) -> list[tuple[str | None, bytes]]:
    """A streamed /v1/responses as the client receives it: (event name, data) in order."""
    headers = {"Authorization": f"Bearer {KEYS['alice']}"}
    async with (
        aiohttp.ClientSession() as s,
        s.post(gw.v1 + "/responses", json={**body, "stream": True}, headers=headers) as r,
    ):
        assert r.status == 200, await r.text()
        return events_of(await r.read())


def events_of(raw: bytes) -> list[tuple[str | None, bytes]]:
    parser = SSEParser()
    return [(e.event, e.data) for e in parser.feed(raw) + parser.close()]


async def test_the_pass_through_stream_is_the_upstream_s_event_for_event(
    gateway_factory: Any, fake: FakeUpstream, store_url: str
) -> None:
    """Every event of the fake's spec-exact stream (reasoning summary parts, content parts,
    logprobs, the echoed tools) reaches the client unchanged; the lifecycle events differ only
    in the model's name."""
    tool = {**TOOLS[0], "strict": False}
    async with gateway_factory(channels=passthrough_channels(fake, store_url)) as gw:
        got = await raw_stream(
            gw,
            {
                "model": "chat-small",
                "input": "[[fake reasoning='think first' text='then answer' tools=1]] go",
                "tools": [tool],
                "tool_choice": "auto",
            },
        )
    sent = events_of(fake.streamed[-1])
    assert [name for name, _ in got] == [name for name, _ in sent]
    kinds = [orjson.loads(data)["type"] for _, data in sent]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    for kind in (
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_part.done",
        "response.content_part.added",
        "response.content_part.done",
        "response.function_call_arguments.done",
    ):
        assert kind in kinds
    for (_, data), (_, upstream) in zip(got, sent, strict=True):
        event = check_event(orjson.loads(data))
        if "response" not in event:
            assert data == upstream  # byte for byte
            continue
        expected = orjson.loads(upstream)
        assert expected["response"]["model"] == "up-small"
        expected["response"]["model"] = "chat-small"
        assert event == expected
        assert event["response"]["tools"] == [tool]


@pytest.mark.parametrize("cut", ["error_after=2", "drop_after=2"])
async def test_a_pass_through_stream_that_fails_ends_with_one_error_event(
    gateway_factory: Any, fake: FakeUpstream, store_url: str, cut: str
) -> None:
    """The upstream's own ``error`` event is the last the client gets (no second one from the
    gateway); when the upstream just stops, the gateway's ``error`` event continues its
    sequence numbers."""
    async with gateway_factory(channels=passthrough_channels(fake, store_url)) as gw:
        got = await raw_stream(
            gw, {"model": "chat-small", "input": f"[[fake text='a b c d e' {cut}]] go"}
        )
        rec = await usage_record(gw)
    errors = [n for n, data in got if orjson.loads(data)["type"] == "error"]
    assert errors == ["error"] and got[-1][0] == "error"
    events = [check_event(orjson.loads(data)) for _, data in got]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    if cut.startswith("error"):
        assert got[-1][1] == events_of(fake.streamed[-1])[-1][1]  # the upstream's, unchanged
    assert rec["status"] >= 500


@stream_param
async def test_a_gemini_call_signature_goes_back_with_its_call(
    gateway: ServedGateway, fake: FakeUpstream, stream: bool
) -> None:
    """Gemini signs a function call on its part (Gemini 3 rejects an unsigned one sent back):
    the signature arrives as a reasoning item before the call, and the call the client sends
    back with it goes upstream signed."""
    target = BY_TYPE["gemini"]
    signature = "c2lnbmVkIGNhbGw="
    history: list[Any] = [
        {"role": "user", "content": f"[[fake tools=1 call_signature={signature}]] weather?"}
    ]
    first = await respond(gateway, stream, model=target.model, input=history, tools=TOOLS)
    kinds = [item.type for item in first.output]
    assert kinds == ["reasoning", "function_call"]
    assert first.output[0].encrypted_content == signature and first.output[0].summary == []
    history += [item.model_dump(exclude_none=True) for item in first.output]
    call = first.output[1]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny"})
    await respond(gateway, stream, model=target.model, input=history, tools=TOOLS)
    assert signature_sent_back(fake, target, stream) == signature


@stream_param
async def test_anthropic_redacted_thinking_goes_back_as_it_came(
    gateway: ServedGateway, fake: FakeUpstream, stream: bool
) -> None:
    """A redacted_thinking block (which Anthropic requires back on the next tool turn) is a
    reasoning item of its own, and goes back as that block with its data."""
    target = BY_TYPE["anthropic"]
    data = "UmVkYWN0ZWQgdGhpbmtpbmc="
    history: list[Any] = [
        {"role": "user", "content": f"[[fake reasoning='hmm' redacted={data} tools=1]] weather?"}
    ]
    first = await respond(gateway, stream, model=target.model, input=history, tools=TOOLS)
    assert [item.type for item in first.output] == ["reasoning", "reasoning", "function_call"]
    assert first.output[0].summary[0].text == "hmm"
    history += [item.model_dump(exclude_none=True) for item in first.output]
    call = first.output[2]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny"})
    await respond(gateway, stream, model=target.model, input=history, tools=TOOLS)
    body = [r for r in fake.requests if r.path == target.chat_path(stream)][-1].json
    (turn,) = [m for m in body["messages"] if m["role"] == "assistant"]
    assert [b["type"] for b in turn["content"]] == ["thinking", "redacted_thinking", "tool_use"]
    assert turn["content"][0]["signature"] == fake_signature("hmm")
    assert turn["content"][1]["data"] == data


# every Responses object and event the gateway writes, checked against the SDK's types --------
EVENT_TYPES: dict[str, type[BaseModel]] = {
    typing.get_args(cls.model_fields["type"].annotation)[0]: cls
    for cls in typing.get_args(typing.get_args(ResponseStreamEvent)[0])
}


def check_event(event: dict[str, Any]) -> dict[str, Any]:
    """A stream event, validated strictly as the SDK's model of its type."""
    EVENT_TYPES[event["type"]].model_validate(event, strict=True)
    return event


def check_stream(events: list[dict[str, Any]]) -> None:
    """Sequence numbers count from 0; each item is closed before the next is announced; a
    reasoning item has summary part events exactly when it ends with a summary."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    open_item = None
    parts: set[str] = set()
    for event in events:
        check_event(event)
        kind = event["type"]
        if kind == "response.output_item.added":
            assert open_item is None, f"{event['item']['id']} announced before {open_item} closed"
            open_item = event["item"]["id"]
        elif kind == "response.output_item.done":
            assert open_item == event["item"]["id"]
            open_item = None
            if event["item"]["type"] == "reasoning":
                assert bool(event["item"]["summary"]) == (event["item"]["id"] in parts)
        elif kind == "response.reasoning_summary_part.added":
            parts.add(event["item_id"])
        elif "item_id" in event:
            assert event["item_id"] == open_item, kind
    assert open_item is None or events[-1]["type"] == "response.failed"


def responses_cases() -> list[Any]:
    return [
        pytest.param(case, id=f"{case.parent.name}/{case.name}")
        for case in case_dirs(CONVERSION_TREE)
        if case.parent.name.startswith("responses__")
    ]


@pytest.mark.parametrize("case", responses_cases())
def test_what_the_fixtures_show_a_responses_client_is_the_sdk_s_types(case: Path) -> None:
    if (case / "client_response.json").exists():
        body = orjson.loads((case / "client_response.json").read_bytes())
        Response.model_validate(body, strict=True)
    if (case / "client_response.sse").exists():
        raw = (case / "client_response.sse").read_bytes()
        events = [orjson.loads(data) for _, data in events_of(raw)]
        assert [n for n, _ in events_of(raw)] == [e["type"] for e in events]
        check_stream(events)
        Response.model_validate(events[-1]["response"], strict=True)


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
    namespaces, custom = route.tool_namespaces, route.custom_tools
    ctx = Ctx("r1", "chat-small", 0, tool_namespaces=namespaces, custom_tools=custom)
    function = {"name": "agents__spawn", "arguments": "{}"}
    call = {"id": "c2", "type": "function", "function": function}
    reply = adapter.encode_response(
        {"choices": [{"message": {"role": "assistant", "tool_calls": [call]}}]}, ctx
    )
    (item,) = reply["output"]
    assert (item["namespace"], item["name"], item["call_id"]) == ("agents", "spawn", "c2")
