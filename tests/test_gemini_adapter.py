"""Gemini adapter behaviour the conversion fixtures do not show: error mapping details,
countTokens, id pairing, signature round trips, incremental streaming, and that what we send
a Gemini client parses with the official google-genai types."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import pytest
from google.genai import types as genai_types

from gateway.errors import (
    GatewayError,
    InsufficientBalanceError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from gateway.protocols.base import Ctx, RouteMatch, UpstreamTarget
from gateway.protocols.gemini import GeminiAdapter
from gateway.protocols.sse import SSEEvent, SSEParser
from tests.fixture_tree import CONVERSION_TREE, FixtureCase

G = GeminiAdapter()
CTX = Ctx(request_id="req-1", model="chat-small", created=1700000000)
CHAT = RouteMatch(protocol="gemini", capability="chat", model="chat-small", stream=False)
COUNT = RouteMatch(protocol="gemini", capability="count_tokens", model="chat-small")


def target(stream: bool = False) -> UpstreamTarget:
    return UpstreamTarget(
        channel="g",
        base_url="https://gl.test/",
        api_key="up-key",
        model="gemini-2.5-flash",
        default_max_tokens=4096,
        stream=stream,
    )


def event(obj: Any) -> SSEEvent:
    return SSEEvent(None, orjson.dumps(obj))


def body_of(call: Any) -> Any:
    return orjson.loads(call.body)


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("err", "code", "name"),
    [
        (InvalidRequestError("x"), 400, "INVALID_ARGUMENT"),
        (GatewayError("x", status=401), 401, "UNAUTHENTICATED"),
        (InsufficientBalanceError("x"), 402, "FAILED_PRECONDITION"),
        (NotFoundError("x"), 404, "NOT_FOUND"),
        (PayloadTooLargeError("x"), 413, "INVALID_ARGUMENT"),
        (RateLimitError("x"), 429, "RESOURCE_EXHAUSTED"),
        (UpstreamError("x"), 502, "UNAVAILABLE"),
        (UpstreamUnavailableError("x"), 503, "UNAVAILABLE"),
        (UpstreamTimeoutError("x"), 504, "DEADLINE_EXCEEDED"),
    ],
)
def test_error_body_uses_google_status_names(err: GatewayError, code: int, name: str) -> None:
    status, body = G.encode_error(err)
    assert status == code
    assert body == {"error": {"code": code, "message": "x", "status": name}}


def test_rate_limit_keeps_the_retry_delay() -> None:
    raw = orjson.dumps(
        {
            "error": {
                "code": 429,
                "message": "quota",
                "status": "RESOURCE_EXHAUSTED",
                "details": [
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "27s"}
                ],
            }
        }
    )
    err = G.decode_error(429, raw)
    assert isinstance(err, RateLimitError)
    assert err.retry_after == 27.0 and err.retryable


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (
            400,
            {
                "error": {
                    "code": 400,
                    "message": "API key not valid. Please pass a valid API key.",
                    "status": "INVALID_ARGUMENT",
                    "details": [
                        {
                            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                            "reason": "API_KEY_INVALID",
                            "domain": "googleapis.com",
                        }
                    ],
                }
            },
        ),
        (
            400,
            {
                "error": {
                    "code": 400,
                    "message": "User location is not supported for the API use.",
                    "status": "FAILED_PRECONDITION",
                }
            },
        ),
        (403, {"error": {"code": 403, "message": "denied", "status": "PERMISSION_DENIED"}}),
    ],
)
def test_channel_credential_failures_fail_over(status: int, body: Any) -> None:
    err = G.decode_error(status, orjson.dumps(body))
    assert err.channel_fault and err.retryable and err.status == 502
    assert "API key" not in err.message  # the upstream's words about our key stay inside


def test_client_mistake_is_not_a_channel_fault() -> None:
    body = {"error": {"code": 400, "message": "bad schema", "status": "INVALID_ARGUMENT"}}
    err = G.decode_error(400, orjson.dumps(body))
    assert isinstance(err, InvalidRequestError)
    assert not err.channel_fault and err.message == "bad schema"


def test_non_json_error_body() -> None:
    assert isinstance(G.decode_error(503, b"<html>busy</html>"), UpstreamUnavailableError)


# --- countTokens ----------------------------------------------------------------------------


def test_count_tokens_round_trip() -> None:
    payload = {
        "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        "systemInstruction": {"parts": [{"text": "terse"}]},
    }
    req = G.decode_request(payload, COUNT)
    call = G.count_request(req, target())
    assert call is not None
    assert call.url == "https://gl.test/v1beta/models/gemini-2.5-flash:countTokens"
    assert call.headers["x-goog-api-key"] == "up-key"
    assert body_of(call) == {
        "generateContentRequest": {
            "model": "models/gemini-2.5-flash",
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "systemInstruction": {"parts": [{"text": "terse"}]},
        }
    }
    assert G.decode_count({"totalTokens": 7, "promptTokensDetails": []}) == 7
    assert G.encode_count(7, CTX) == {"totalTokens": 7}
    with pytest.raises(UpstreamError):
        G.decode_count({"error": "x"})


def test_count_tokens_accepts_a_wrapped_request() -> None:
    payload = {
        "generateContentRequest": {
            "model": "models/chat-small",
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
        }
    }
    req = G.decode_request(payload, COUNT)
    assert req["messages"] == [{"role": "user", "content": "hi"}]
    call = G.passthrough_request(payload, COUNT, target())
    assert call.url.endswith(":countTokens")
    assert body_of(call)["generateContentRequest"]["model"] == "models/gemini-2.5-flash"
    assert payload["generateContentRequest"]["model"] == "models/chat-small"  # not mutated


def test_passthrough_stream_always_asks_for_sse() -> None:
    route = RouteMatch(protocol="gemini", capability="chat", model="m", stream=True, sse=False)
    call = G.passthrough_request({"contents": []}, route, target(stream=True))
    assert call.url == (
        "https://gl.test/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    )


# --- requests -------------------------------------------------------------------------------


def test_function_responses_pair_by_id_then_by_name_order() -> None:
    payload = {
        "contents": [
            {"role": "user", "parts": [{"text": "go"}]},
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "a", "args": {}}},
                    {"functionCall": {"name": "b", "args": {}, "id": "fc-b"}},
                    {"functionCall": {"name": "a", "args": {"n": 2}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "b", "id": "fc-b", "response": {"v": "b"}}},
                    {"functionResponse": {"name": "a", "response": {"v": 1}}},
                    {"functionResponse": {"name": "a", "response": {"v": 2}}},
                ],
            },
        ]
    }
    messages = G.decode_request(payload, CHAT)["messages"]
    ids = [c["id"] for c in messages[1]["tool_calls"]]
    assert ids == ["call_0", "fc-b", "call_2"]
    assert [(m["tool_call_id"], m["content"]) for m in messages[2:]] == [
        ("fc-b", '{"v":"b"}'),
        ("call_0", '{"v":1}'),
        ("call_2", '{"v":2}'),
    ]


def test_tool_message_without_its_call_is_rejected() -> None:
    req: Any = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "tool", "tool_call_id": "nope", "content": "1"},
        ],
    }
    with pytest.raises(InvalidRequestError):
        G.encode_request(req, target())


@pytest.mark.parametrize(
    "payload",
    [
        {"contents": "hi"},
        {"contents": [{"role": "robot", "parts": [{"text": "x"}]}]},
        {"contents": [{"role": "user", "parts": "x"}]},
        [],
    ],
)
def test_malformed_requests_are_400(payload: Any) -> None:
    with pytest.raises(InvalidRequestError):
        G.decode_request(payload, CHAT)


def test_schemas_are_reduced_for_gemini_unless_they_use_refs() -> None:
    nested = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "const": "x", "$comment": "c"}},
            "when": {"oneOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]},
        },
    }
    refs = {"type": "object", "properties": {"p": {"$ref": "#/$defs/p"}}, "$defs": {"p": {}}}
    req: Any = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "tools": [
            {"type": "function", "function": {"name": "a", "parameters": nested}},
            {"type": "function", "function": {"name": "b", "parameters": refs}},
        ],
    }
    decls = body_of(G.encode_request(req, target()))["tools"][0]["functionDeclarations"]
    assert decls[0]["parameters"] == {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string", "enum": ["x"]}},
            "when": {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]},
        },
    }
    assert decls[1] == {"name": "b", "parametersJsonSchema": refs}


@pytest.mark.parametrize(
    ("effort", "config"),
    [
        ("none", {"thinkingBudget": 0}),
        ("high", {"includeThoughts": True, "thinkingBudget": 24576}),
    ],
)
def test_reasoning_effort_becomes_a_thinking_budget(effort: str, config: Any) -> None:
    req: Any = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    req["reasoning_effort"] = effort
    assert body_of(G.encode_request(req, target()))["generationConfig"]["thinkingConfig"] == config


@pytest.mark.parametrize(
    ("thinking", "effort"),
    [
        ({"thinkingBudget": 0}, "none"),
        ({"thinkingBudget": -1}, "medium"),
        ({"thinkingBudget": 512}, "low"),
        ({"thinkingBudget": 32768}, "high"),
        ({"thinkingLevel": "HIGH"}, "high"),
    ],
)
def test_thinking_config_becomes_reasoning_effort(thinking: Any, effort: str) -> None:
    payload = {
        "contents": [{"role": "user", "parts": [{"text": "x"}]}],
        "generationConfig": {"thinkingConfig": thinking},
    }
    assert G.decode_request(payload, CHAT)["reasoning_effort"] == effort


def test_signatures_survive_a_round_trip_through_another_client() -> None:
    """A Gemini reply shown to a chat client, echoed back as history, reaches Gemini again with
    each signature on the part that carried it (Gemini rejects a functionCall without it)."""
    parts = [
        {"text": "plan", "thought": True},
        {"text": "Checking.", "thoughtSignature": "SIG-TEXT"},
        {"functionCall": {"name": "f", "args": {"x": 1}}, "thoughtSignature": "SIG-CALL"},
        {"functionCall": {"name": "f", "args": {"x": 2}}},
    ]
    reply = {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}],
        "responseId": "r1",
    }
    msg = G.decode_response(reply)["choices"][0]["message"]
    assert msg["reasoning_signature"] == "SIG-TEXT"
    req: Any = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "go"},
            msg,
            {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "1"},
            {"role": "tool", "tool_call_id": msg["tool_calls"][1]["id"], "content": "2"},
        ],
    }
    contents = body_of(G.encode_request(req, target()))["contents"]
    assert contents[1]["parts"] == [
        {"text": "plan", "thought": True},
        {"text": "Checking.", "thoughtSignature": "SIG-TEXT"},
        {"functionCall": {"name": "f", "args": {"x": 1}}, "thoughtSignature": "SIG-CALL"},
        {"functionCall": {"name": "f", "args": {"x": 2}}},
    ]
    assert [p["functionResponse"]["response"] for p in contents[2]["parts"]] == [
        {"result": "1"},
        {"result": "2"},
    ]


# --- streams --------------------------------------------------------------------------------


def test_decoder_yields_each_event_as_it_arrives() -> None:
    dec = G.stream_decoder(CTX)
    first = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}}]}
    chunks = dec.feed(event(first))
    assert [c["choices"][0]["delta"] for c in chunks] == [{"role": "assistant", "content": "Hel"}]
    with pytest.raises(UpstreamError):
        dec.close()  # no finishReason yet: the stream was cut


def test_decoder_rejects_a_malformed_event() -> None:
    with pytest.raises(UpstreamError):
        G.stream_decoder(CTX).feed(SSEEvent(None, b"{not json"))


def chunk(delta: Any, finish: str | None = None, usage: Any = None) -> Any:
    out: Any = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        out = {"choices": [], "usage": usage}
    return out


def test_encoder_holds_tool_arguments_until_the_call_is_complete() -> None:
    route = RouteMatch(protocol="gemini", capability="chat", model="m", stream=True, sse=False)
    enc = G.stream_encoder(CTX, route)
    start = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
    out = enc.encode(chunk({"role": "assistant", "tool_calls": [start]}))
    for piece in ('{"ci', 'ty":', ' "Paris"}'):
        out += enc.encode(chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}))
    assert out == b""  # nothing whole to show yet
    out += enc.encode(chunk({}, "tool_calls"))
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    out += enc.encode(chunk(None, usage=usage)) + enc.finish(usage)
    (only,) = orjson.loads(out)
    sdk = genai_types.GenerateContentResponse.model_validate(only)
    assert sdk.function_calls is not None
    assert [(c.name, c.args, c.id) for c in sdk.function_calls] == [("f", {"city": "Paris"}, "c1")]
    assert sdk.usage_metadata is not None and sdk.usage_metadata.total_token_count == 7


def test_encoder_error_before_any_chunk_is_still_a_json_array() -> None:
    route = RouteMatch(protocol="gemini", capability="chat", model="m", stream=True, sse=False)
    enc = G.stream_encoder(CTX, route)
    assert orjson.loads(enc.error(RateLimitError("slow down"))) == [
        {"error": {"code": 429, "message": "slow down", "status": "RESOURCE_EXHAUSTED"}}
    ]


def test_passthrough_stream_reads_usage_and_maps_the_model() -> None:
    case = FixtureCase(CONVERSION_TREE / "gemini__gemini" / "stream_thinking_signature")
    raw = case.reply(".sse")
    route = RouteMatch(protocol="gemini", capability="chat", model="m", stream=True)
    ps = G.passthrough_stream(CTX, route, target(stream=True))
    out = ps.feed(raw.read_bytes()) + ps.finish()
    assert ps.usage == {
        "prompt_tokens": 8,
        "completion_tokens": 33,
        "total_tokens": 41,
        "completion_tokens_details": {"reasoning_tokens": 30},
    }
    assert b"gemini-2.5-flash" not in out and out.count(b'"modelVersion":"chat-small"') == 3


# --- what a Gemini client receives parses with google-genai ------------------------------


def gemini_client_outputs() -> list[Any]:
    out = []
    for pair in ("gemini__openai", "gemini__gemini", "gemini__anthropic"):
        for path in sorted((CONVERSION_TREE / pair).glob("*/client_response.*")):
            out.append(pytest.param(path, id=f"{pair}/{path.parent.name}"))
    return out


@pytest.mark.parametrize("path", gemini_client_outputs())
def test_client_output_parses_with_google_genai(path: Path) -> None:
    if path.suffix == ".sse":
        parser = SSEParser()
        objects = [orjson.loads(e.data) for e in parser.feed(path.read_bytes()) + parser.close()]
    else:
        loaded = orjson.loads(path.read_bytes())
        objects = loaded if isinstance(loaded, list) else [loaded]
    for obj in objects:
        if "error" in obj:
            assert set(obj["error"]) == {"code", "message", "status"}
            continue
        sdk = genai_types.GenerateContentResponse.model_validate(obj)
        assert sdk.model_version is not None and sdk.response_id is not None


def test_tool_config_without_tools_is_not_sent_on() -> None:
    payload = {
        "contents": [{"role": "user", "parts": [{"text": "x"}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "NONE"}},
    }
    assert "tool_choice" not in G.decode_request(payload, CHAT)


def test_any_with_several_allowed_names_narrows_the_tools() -> None:
    decls = [{"name": n, "parameters": {"type": "OBJECT", "properties": {}}} for n in "abc"]
    payload = {
        "contents": [{"role": "user", "parts": [{"text": "x"}]}],
        "tools": [{"functionDeclarations": decls}],
        "toolConfig": {
            "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["a", "c"]}
        },
    }
    req = G.decode_request(payload, CHAT)
    assert req["tool_choice"] == "required"
    assert [t["function"]["name"] for t in req["tools"]] == ["a", "c"]


# --- base64 as google-genai writes it -------------------------------------------------------

IMAGE = bytes(range(200, 256)) + b"\xf8\xf8\xfb\xf8\x00"  # both changed characters, a pad
URLSAFE = base64.urlsafe_b64encode(IMAGE).decode().rstrip("=")
STANDARD = base64.b64encode(IMAGE).decode()


@pytest.mark.parametrize(
    ("mime", "where"),
    [("image/png", "image_url"), ("audio/wav", "input_audio"), ("application/pdf", "file")],
)
def test_inline_data_is_decoded_to_standard_base64(mime: str, where: str) -> None:
    """google-genai sends bytes URL-safe, maybe unpadded; the chat shape (and with it every
    other channel) gets the standard alphabet, padded."""
    payload = {"contents": [{"parts": [{"inline_data": {"mime_type": mime, "data": URLSAFE}}]}]}
    part = G.decode_request(payload, CHAT)["messages"][0]["content"][0]
    assert STANDARD in orjson.dumps(part[where]).decode()


def test_thought_signatures_are_decoded_to_standard_base64() -> None:
    """A signature another upstream issued (standard base64) comes back from google-genai
    URL-safe: restored, so that upstream recognises it."""
    payload = {
        "contents": [
            {"role": "user", "parts": [{"text": "hi"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "ok", "thought_signature": URLSAFE},
                    {"function_call": {"name": "f", "args": {}}, "thoughtSignature": URLSAFE},
                ],
            },
        ]
    }
    msg = G.decode_request(payload, CHAT)["messages"][1]
    assert msg["reasoning_signature"] == STANDARD
    assert msg["tool_calls"][0]["thought_signature"] == STANDARD


def test_standard_base64_goes_to_gemini_unchanged() -> None:
    """From other clients (data URLs, standard already) the bytes reach Gemini as they were;
    a pass-through body's URL-safe inline data is made standard too."""
    req: Any = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{STANDARD}"}}
                ],
            }
        ],
    }
    parts = body_of(G.encode_request(req, target()))["contents"][0]["parts"]
    assert parts == [{"inlineData": {"mimeType": "image/png", "data": STANDARD}}]
    payload = {
        "contents": [{"parts": [{"inlineData": {"mimeType": "image/png", "data": URLSAFE}}]}]
    }
    sent = body_of(G.passthrough_request(payload, CHAT, target()))
    assert sent["contents"][0]["parts"][0]["inlineData"]["data"] == STANDARD
