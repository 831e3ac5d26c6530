"""The anthropic adapter beyond the fixtures: stream invariants, the official SDK reading what
the gateway writes, error mapping, headers, token counting and passthrough usage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest

from gateway.errors import (
    GatewayError,
    InsufficientBalanceError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from gateway.protocols.anthropic import AnthropicAdapter
from gateway.protocols.base import Ctx, RouteMatch, UpstreamTarget
from gateway.protocols.sse import SSEEvent, SSEParser
from tests.fixture_tree import CONVERSION_TREE, FixtureCase, load
from tests.test_conversion import Case, run_stream

try:  # the anthropic SDK's HTTP client package (renamed in recent releases)
    import httpx2 as httpx
except ModuleNotFoundError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]

ADAPTER = AnthropicAdapter()
CHAT = RouteMatch(protocol="anthropic", capability="chat")
COUNT = RouteMatch(protocol="anthropic", capability="count_tokens")


def ctx(**kw: Any) -> Ctx:
    return Ctx(request_id="req-1", model="chat-small", created=1700000000, **kw)


def target(**kw: Any) -> UpstreamTarget:
    values: dict[str, Any] = {
        "channel": "c",
        "base_url": "http://up.test",
        "api_key": "up-key",
        "model": "claude-up",
        "default_max_tokens": 4096,
        "stream": False,
    }
    values.update(kw)
    return UpstreamTarget(**values)


def events(raw: bytes) -> list[tuple[str | None, Any]]:
    parser = SSEParser()
    return [(e.event, orjson.loads(e.data)) for e in parser.feed(raw) + parser.close()]


def anthropic_client_dirs(kind: str) -> list[Path]:
    return sorted(
        p.parent
        for p in CONVERSION_TREE.glob(f"anthropic__*/*/{kind}")
        if p.parent.parent.name.startswith("anthropic__")
    )


def live_stream(case: Path) -> bytes:
    """What the gateway writes now for the fixture's upstream bytes (not the golden file)."""
    return run_stream(Case(case), FixtureCase(case).reply(".sse").read_bytes())[0]


def sdk(handler: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="sk-test",
        base_url="http://gateway.test",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )


# the event stream written for anthropic clients ---------------------------------------------
@pytest.mark.parametrize(
    "case", anthropic_client_dirs("client_response.sse"), ids=lambda p: p.parent.name + "/" + p.name
)
def test_stream_obeys_messages_event_grammar(case: Path) -> None:
    evs = events(live_stream(case))
    assert evs[0][0] == "message_start"
    assert all(name == data["type"] for name, data in evs)
    open_index: int | None = None
    next_index = 0
    for name, data in evs:
        if name == "content_block_start":
            assert open_index is None, "a block started before the previous one stopped"
            assert data["index"] == next_index
            open_index = data["index"]
            next_index += 1
        elif name == "content_block_delta":
            assert data["index"] == open_index
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index = None
    if evs[-1][0] == "error":
        return
    assert open_index is None
    assert [n for n, _ in evs[-2:]] == ["message_delta", "message_stop"]
    usage = evs[-2][1]["usage"]
    assert isinstance(usage["input_tokens"], int) and isinstance(usage["output_tokens"], int)


@pytest.mark.parametrize(
    "case", anthropic_client_dirs("client_response.sse"), ids=lambda p: p.parent.name + "/" + p.name
)
def test_official_sdk_reads_every_stream(case: Path) -> None:
    raw = live_stream(case)
    request = FixtureCase(case).request

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=raw)

    client = sdk(handler)
    if events(raw)[-1][0] == "error":
        with pytest.raises(anthropic.APIStatusError):
            with client.messages.stream(
                model=request["model"], max_tokens=10, messages=request["messages"]
            ) as stream:
                stream.get_final_message()
        return
    with client.messages.stream(
        model=request["model"], max_tokens=10, messages=request["messages"]
    ) as stream:
        message = stream.get_final_message()
    assert message.model == request["model"]
    final = events(raw)[-2][1]
    assert message.stop_reason == final["delta"]["stop_reason"]
    assert message.usage.output_tokens == final["usage"]["output_tokens"]
    for block in message.content:
        if block.type == "tool_use":
            assert isinstance(block.input, dict) and block.input  # arguments parsed whole


@pytest.mark.parametrize(
    "case",
    [
        p
        for p in anthropic_client_dirs("client_response.json")
        if Case(p).route.capability == "chat"
    ],
    ids=lambda p: p.parent.name + "/" + p.name,
)
def test_official_sdk_reads_every_message(case: Path) -> None:
    request = FixtureCase(case).request
    c = Case(case)
    body = c.attempt().reply(c.files.reply(".json").read_bytes(), {}).body

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "application/json"}, content=body)

    message = sdk(handler).messages.create(
        model=request["model"], max_tokens=10, messages=request["messages"]
    )
    assert message.model == request["model"]
    assert message.usage.input_tokens >= 0


@pytest.mark.parametrize(
    "case", anthropic_client_dirs("client_error.json"), ids=lambda p: p.parent.name + "/" + p.name
)
def test_official_sdk_raises_its_typed_error(case: Path) -> None:
    c = Case(case)
    up = c.files.upstream_error
    status, body = c.client.encode_error(
        c.attempt().decode_error(up["status"], orjson.dumps(up["body"]))
    )
    expected = {"status": status, "body": body}
    classes = {
        400: anthropic.BadRequestError,
        429: anthropic.RateLimitError,
        502: anthropic.InternalServerError,
        503: anthropic.InternalServerError,
    }

    def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(expected["status"], json=expected["body"])

    with pytest.raises(classes[expected["status"]]) as info:
        sdk(handler).messages.create(
            model="chat-small", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.body["error"]["type"] == expected["body"]["error"]["type"]  # type: ignore[index]


def encode_stream(chunks: list[dict[str, Any]], usage: Any = None, **kw: Any) -> list[Any]:
    enc = ADAPTER.stream_encoder(ctx(**kw), CHAT)
    raw = b"".join(enc.encode(c) for c in chunks) + enc.finish(usage)  # type: ignore[arg-type]
    return events(raw)


def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        out["usage"] = usage
    return out


def test_message_start_uses_the_estimate_until_the_upstream_reports_prompt_tokens() -> None:
    evs = encode_stream([chunk({"content": "hi"})], prompt_tokens_estimate=33)
    assert evs[0][1]["message"]["usage"]["input_tokens"] == 33
    early = {"prompt_tokens": 50, "completion_tokens": 0, "total_tokens": 50}
    evs = encode_stream([chunk({"content": "hi"}, usage=early)], prompt_tokens_estimate=33)
    assert evs[0][1]["message"]["usage"]["input_tokens"] == 50
    assert evs[1][0] == "ping"


def test_tool_calls_without_ids_get_ids_from_the_request_id() -> None:
    evs = encode_stream(
        [
            chunk({"tool_calls": [{"index": 0, "function": {"name": "a", "arguments": "{}"}}]}),
            chunk({"tool_calls": [{"index": 1, "function": {"name": "b", "arguments": "{}"}}]}),
            chunk({}, "tool_calls"),
        ]
    )
    starts = [d["content_block"] for n, d in evs if n == "content_block_start"]
    assert [(b["id"], b["name"]) for b in starts] == [
        ("toolu_req-1_0", "a"),
        ("toolu_req-1_1", "b"),
    ]
    assert evs[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_a_signature_alone_opens_a_thinking_block() -> None:
    evs = encode_stream([chunk({"content": "x"}), chunk({"reasoning_signature": "sig"})])
    starts = [d["content_block"]["type"] for n, d in evs if n == "content_block_start"]
    assert starts == ["text", "thinking"]
    assert ("content_block_delta", {"type": "content_block_delta", "index": 1,
            "delta": {"type": "signature_delta", "signature": "sig"}}) in evs  # fmt: skip


def test_an_empty_stream_still_starts_and_stops_with_usage() -> None:
    evs = encode_stream([], prompt_tokens_estimate=7)
    assert [n for n, _ in evs] == ["message_start", "ping", "message_delta", "message_stop"]
    assert evs[2][1]["usage"]["input_tokens"] == 7
    assert evs[2][1]["usage"]["output_tokens"] == 0


def test_arguments_for_a_closed_tool_block_are_rejected() -> None:
    enc = ADAPTER.stream_encoder(ctx(), CHAT)
    enc.encode(chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f"}}]}))  # type: ignore[arg-type]
    enc.encode(chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g"}}]}))  # type: ignore[arg-type]
    with pytest.raises(UpstreamError):
        enc.encode(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}))  # type: ignore[arg-type]


# errors -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("err", "status", "etype"),
    [
        (InvalidRequestError("x"), 400, "invalid_request_error"),
        (InsufficientBalanceError("x"), 402, "billing_error"),
        (PermissionDeniedError("x"), 403, "permission_error"),
        (NotFoundError("x"), 404, "not_found_error"),
        (PayloadTooLargeError("x"), 413, "request_too_large"),
        (RateLimitError("x"), 429, "rate_limit_error"),
        (UpstreamError("x"), 502, "api_error"),
        (UpstreamUnavailableError("x"), 503, "overloaded_error"),
        (UpstreamTimeoutError("x"), 504, "timeout_error"),
        (GatewayError("x", status=500), 500, "api_error"),
    ],
)
def test_encode_error_uses_anthropic_error_types(
    err: GatewayError, status: int, etype: str
) -> None:
    assert ADAPTER.encode_error(err) == (
        status,
        {"type": "error", "error": {"type": etype, "message": "x"}},
    )
    raw = ADAPTER.stream_encoder(ctx(), CHAT).error(err)
    assert events(raw) == [("error", {"type": "error", "error": {"type": etype, "message": "x"}})]


def error_raw(etype: str, message: str = "m") -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": etype, "message": message}})


@pytest.mark.parametrize(
    ("status", "etype", "cls", "mapped", "fault"),
    [
        (529, "overloaded_error", UpstreamUnavailableError, 503, False),
        (500, "overloaded_error", UpstreamUnavailableError, 503, False),
        (504, "timeout_error", UpstreamTimeoutError, 504, False),
        (401, "authentication_error", UpstreamError, 502, True),
        (403, "permission_error", UpstreamError, 502, True),
        (402, "billing_error", UpstreamError, 502, True),
        (413, "request_too_large", PayloadTooLargeError, 413, False),
        (404, "not_found_error", NotFoundError, 404, False),
        (400, "invalid_request_error", InvalidRequestError, 400, False),
    ],
)
def test_decode_error_by_status_and_type(
    status: int, etype: str, cls: type[GatewayError], mapped: int, fault: bool
) -> None:
    err = ADAPTER.decode_error(status, error_raw(etype, "credit balance is too low overloaded"))
    assert type(err) is cls and err.status == mapped and err.channel_fault is fault


def test_decode_error_never_reads_the_message_and_survives_non_json() -> None:
    assert type(ADAPTER.decode_error(400, error_raw("invalid_request_error", "Overloaded"))) is (
        InvalidRequestError
    )
    err = ADAPTER.decode_error(502, b"<html>bad gateway</html>")
    assert type(err) is UpstreamError and "502" in err.message


def test_stream_error_event_raises_mapped_error_and_is_not_retryable() -> None:
    dec = ADAPTER.stream_decoder(ctx())
    with pytest.raises(RateLimitError) as info:
        dec.feed(SSEEvent("error", error_raw("rate_limit_error")))
    assert info.value.retryable is False


def test_decoder_rejects_malformed_events_and_ignores_unknown_ones() -> None:
    dec = ADAPTER.stream_decoder(ctx())
    assert dec.feed(SSEEvent("some_future_event", b'{"type":"some_future_event"}')) == []
    with pytest.raises(UpstreamError):
        dec.feed(SSEEvent("content_block_delta", b"{not json"))
    with pytest.raises(UpstreamError):
        dec.close()


# requests ---------------------------------------------------------------------------------------
def test_headers_carry_the_clients_version_and_beta() -> None:
    req = ADAPTER.decode_request(
        {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}, CHAT
    )
    call = ADAPTER.encode_request(req, target())
    assert call.headers == {
        "x-api-key": "up-key",
        "anthropic-version": "2023-06-01",
        "content-type": "application/json",
    }
    headers = {"anthropic-version": "2024-01-01", "anthropic-beta": "token-efficient-tools"}
    call = ADAPTER.encode_request(req, target(client_headers=headers))
    assert call.headers["anthropic-version"] == "2024-01-01"
    assert call.headers["anthropic-beta"] == "token-efficient-tools"


@pytest.mark.parametrize(
    ("effort", "max_tokens", "thinking"),
    [
        ("low", 4096, {"type": "enabled", "budget_tokens": 1024}),
        ("medium", 4096, {"type": "enabled", "budget_tokens": 4095}),
        ("high", 100000, {"type": "enabled", "budget_tokens": 16384}),
        ("high", 1024, None),  # no room left for the minimum budget
        ("none", 4096, None),
    ],
)
def test_reasoning_effort_becomes_a_budget_below_max_tokens(
    effort: str, max_tokens: int, thinking: Any
) -> None:
    req: Any = {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": effort,
                "max_tokens": max_tokens}  # fmt: skip
    body = orjson.loads(ADAPTER.encode_request(req, target()).body)
    assert body.get("thinking") == thinking


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]},
            "messages.0.role",
        ),  # fmt: skip
        ({"max_tokens": 5, "messages": []}, "model"),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
                    }
                ],
            },  # fmt: skip
            "messages.0.content.0.source.type",
        ),
    ],
)
def test_bad_requests_are_rejected_naming_the_field(payload: Any, where: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        ADAPTER.decode_request(payload, CHAT)
    assert info.value.message.startswith(where)


def test_token_count_goes_to_count_tokens_with_only_its_fields() -> None:
    payload = {
        "model": "m",
        "system": "be brief",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    }
    req = ADAPTER.decode_request(payload, COUNT)
    call = ADAPTER.count_request(req, target(stream=False))
    assert call is not None
    assert call.url == "http://up.test/v1/messages/count_tokens"
    assert orjson.loads(call.body) == {
        "model": "claude-up",
        "system": "be brief",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    }
    assert ADAPTER.decode_count({"input_tokens": 17}) == 17
    assert ADAPTER.encode_count(17, ctx()) == {"input_tokens": 17}
    with pytest.raises(UpstreamError):
        ADAPTER.decode_count({"tokens": 1})


# passthrough ------------------------------------------------------------------------------------
PASSTHROUGH_STREAM = CONVERSION_TREE / "anthropic__anthropic" / "stream_parallel_tools"


def test_passthrough_stream_reads_usage_and_forwards_deltas_byte_for_byte() -> None:
    raw = FixtureCase(PASSTHROUGH_STREAM).reply(".sse").read_bytes()
    ps = ADAPTER.passthrough_stream(ctx(), CHAT, target(stream=True))
    out = ps.feed(raw) + ps.finish()
    assert ps.usage == {
        "prompt_tokens": 141,
        "completion_tokens": 12,
        "total_tokens": 153,
        "prompt_tokens_details": {"cached_tokens": 100},
        "cache_creation_tokens": 20,
    }
    first_delta = raw[raw.index(b"event: content_block_delta") :]
    first_delta = first_delta[: first_delta.index(b"\n\n") + 2]
    assert first_delta in out


def test_passthrough_stream_cut_before_message_stop_raises() -> None:
    ps = ADAPTER.passthrough_stream(ctx(), CHAT, target(stream=True))
    start = b'{"type":"message_start","message":{"model":"chat-small",'
    start += b'"usage":{"input_tokens":3,"output_tokens":1}}}'
    ps.feed_event(SSEEvent("message_start", start))
    assert ps.usage is not None and ps.usage["prompt_tokens"] == 3
    with pytest.raises(UpstreamError):
        ps.finish()


def test_passthrough_response_maps_the_model_back_and_reports_usage() -> None:
    payload = load(FixtureCase(CONVERSION_TREE / "anthropic__anthropic" / "usage").reply(".json"))
    out, usage = ADAPTER.passthrough_response(payload, ctx())
    assert out["model"] == "chat-small"
    assert usage == {
        "prompt_tokens": 2068,
        "completion_tokens": 3,
        "total_tokens": 2071,
        "prompt_tokens_details": {"cached_tokens": 1536},
        "cache_creation_tokens": 512,
    }


def test_server_tools_are_left_out_and_take_tool_choice_with_them() -> None:
    payload = {
        "model": "m",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "news?"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
        "tool_choice": {"type": "any"},
    }
    req = ADAPTER.decode_request(payload, CHAT)
    assert "tools" not in req and "tool_choice" not in req


def test_unsigned_reasoning_is_not_sent_to_an_anthropic_channel() -> None:
    req: Any = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning_content": "thought"},
            {"role": "user", "content": "q2"},
        ]
    }
    body = orjson.loads(ADAPTER.encode_request(req, target()).body)
    assert body["messages"][1] == {"role": "assistant", "content": "a"}
