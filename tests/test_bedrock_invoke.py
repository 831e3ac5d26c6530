"""Claude on Bedrock through ``invoke`` (gateway.protocols.anthropic.bedrock): the body, the
URL, and the chunk events of invoke-with-response-stream unwrapped into the Messages stream,
beyond the fixtures of tests/fixtures/bedrock."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from gateway.errors import GatewayError, InvalidRequestError, UpstreamError
from gateway.protocols.anthropic.bedrock import (
    InvokeAdapter,
    InvokeStreamDecoder,
    invoke_body,
    messages_event,
)
from gateway.protocols.base import ConvertedStream, Ctx, RouteMatch, UpstreamTarget
from gateway.protocols.openai import OpenAIAdapter
from gateway.protocols.sse import SSEEvent
from gateway.upstream.eventstream import EventStreamParser, encode_event, encode_exception

CTX = Ctx(request_id="r1", model="claude", created=1)
ADAPTER = InvokeAdapter(EventStreamParser)
MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"


def target(stream: bool, beta: str | None = None) -> UpstreamTarget:
    headers = {"anthropic-beta": beta} if beta else {}
    return UpstreamTarget(
        "c", "https://bedrock-runtime.us-west-2.amazonaws.com", "", MODEL, 1024, stream, headers
    )


def chunk(event: dict[str, Any]) -> bytes:
    data = base64.b64encode(orjson.dumps(event)).decode()
    return encode_event("chunk", orjson.dumps({"bytes": data, "p": "abcdefghij"}))


def test_the_invoke_body_drops_model_and_stream_and_names_the_version_and_betas() -> None:
    messages_body = {"model": "claude-x", "stream": True, "max_tokens": 5, "messages": []}
    assert invoke_body(messages_body, " a-2024 ,b-2025,") == {
        "max_tokens": 5,
        "messages": [],
        "anthropic_version": "bedrock-2023-05-31",
        "anthropic_beta": ["a-2024", "b-2025"],
    }
    assert "anthropic_beta" not in invoke_body({"messages": []})
    assert messages_body["model"] == "claude-x"  # the caller's body is not changed


@pytest.mark.parametrize(
    ("stream", "action"), [(False, "invoke"), (True, "invoke-with-response-stream")]
)
def test_a_chat_request_goes_to_invoke_with_the_messages_body(stream: bool, action: str) -> None:
    req = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    call = ADAPTER.encode_request(req, target(stream, "x-beta"))  # type: ignore[arg-type]
    assert call.url == f"https://bedrock-runtime.us-west-2.amazonaws.com/model/{MODEL}/{action}"
    assert orjson.loads(call.body) == {
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": "hi"}],
        "anthropic_version": "bedrock-2023-05-31",
        "anthropic_beta": ["x-beta"],
    }
    assert "x-api-key" not in call.headers and "anthropic-version" not in call.headers


def test_the_passthrough_keeps_the_clients_body_but_model_and_stream() -> None:
    route = RouteMatch(protocol="anthropic", capability="chat", model="claude", stream=True)
    payload = {
        "model": "claude",
        "stream": True,
        "max_tokens": 9,
        "metadata": {"user_id": "u"},
        "messages": [{"role": "user", "content": "hi"}],
    }
    call = ADAPTER.passthrough_request(payload, route, target(True))
    assert call.url.endswith("/invoke-with-response-stream")
    assert orjson.loads(call.body) == {
        "max_tokens": 9,
        "metadata": {"user_id": "u"},
        "messages": [{"role": "user", "content": "hi"}],
        "anthropic_version": "bedrock-2023-05-31",
    }
    with pytest.raises(InvalidRequestError):
        ADAPTER.passthrough_request([], route, target(True))


def test_a_chunk_is_the_messages_event_it_carries() -> None:
    event = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "hé"},
    }
    parser = EventStreamParser()
    (wrapped,) = parser.feed(chunk(event))
    assert messages_event(wrapped) == SSEEvent("content_block_delta", orjson.dumps(event))
    later_first = SSEEvent(
        "chunk",
        orjson.dumps(
            {"bytes": base64.b64encode(b'{"index":0,"type":"content_block_stop"}').decode()}
        ),
    )
    assert messages_event(later_first) == SSEEvent(
        "content_block_stop", b'{"index":0,"type":"content_block_stop"}'
    )
    assert messages_event(SSEEvent("somethingElse", b"{}")) is None


@pytest.mark.parametrize(
    "data",
    [b"not json", b'{"bytes": "@@@"}', b'{"nobytes": 1}', b'{"bytes": 5}', b"[]"],
)
def test_a_malformed_chunk_is_the_upstreams_fault(data: bytes) -> None:
    with pytest.raises(UpstreamError, match="malformed chunk"):
        messages_event(SSEEvent("chunk", data))


def test_an_exception_becomes_a_messages_error_event() -> None:
    event = SSEEvent("exception:modelTimeoutException", b'{"message":"too slow"}')
    out = messages_event(event)
    assert out is not None and out.event == "error"
    assert orjson.loads(out.data) == {
        "type": "error",
        "error": {"type": "timeout_error", "message": "too slow"},
    }


def message_stream(text: str) -> list[dict[str, Any]]:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [],
        "usage": {"input_tokens": 7, "output_tokens": 1},
    }
    return [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 2},
        },
        {
            "type": "message_stop",
            "amazon-bedrock-invocationMetrics": {"inputTokenCount": 7, "outputTokenCount": 2},
        },
    ]


def test_an_invoke_stream_converts_for_a_chat_client() -> None:
    raw = b"".join(chunk(e) for e in message_stream("Hello"))
    route = RouteMatch(protocol="openai", capability="chat", model="claude", stream=True)
    ctx = Ctx(request_id="r1", model="claude", created=1, include_usage=True)
    stream = ConvertedStream(
        ADAPTER.stream_decoder(ctx),
        OpenAIAdapter().stream_encoder(ctx, route),
        EventStreamParser(),
    )
    out = stream.feed(raw[:37]) + stream.feed(raw[37:]) + stream.finish()
    assert b'"content":"Hello"' in out and out.endswith(b"data: [DONE]\n\n")
    assert stream.usage == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}


def test_an_exception_mid_stream_raises_bedrocks_error_unretried() -> None:
    decoder = InvokeStreamDecoder(CTX)
    parser = EventStreamParser()
    raw = chunk(message_stream("x")[0]) + encode_exception(
        "throttlingException", b'{"message":"Too many tokens"}'
    )
    events = parser.feed(raw)
    assert decoder.feed(events[0])[0]["choices"][0]["delta"]["role"] == "assistant"
    with pytest.raises(GatewayError) as info:
        decoder.feed(events[1])
    assert (info.value.status, info.value.message, info.value.retryable) == (
        429,
        "Too many tokens",
        False,
    )


def test_the_passthrough_reads_usage_and_ends_only_at_message_stop() -> None:
    route = RouteMatch(protocol="anthropic", capability="chat", model="claude", stream=True)
    events = message_stream("Hi")
    stream = ADAPTER.passthrough_stream(CTX, route, target(True))
    out = stream.feed(b"".join(chunk(e) for e in events))
    out += stream.finish()
    assert out.count(b"event: ") == len(events)
    assert b'"model":"claude"' in out  # the client's name, not Bedrock's id
    assert stream.usage == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    cut = ADAPTER.passthrough_stream(CTX, route, target(True))
    cut.feed(b"".join(chunk(e) for e in events[:3]))
    with pytest.raises(UpstreamError, match="before message_stop"):
        cut.finish()


def test_bedrock_errors_decode_by_type() -> None:
    err = ADAPTER.decode_error(403, b'{"message":"no"}', "AccessDeniedException")
    assert (err.status, err.channel_fault) == (502, True)
    assert ADAPTER.decode_error(400, b'{"message":"bad"}', "ValidationException").status == 400


def test_a_ping_and_an_error_inside_chunks_are_read_by_their_type() -> None:
    """The decoder is fed the chunks' Messages events unnamed: a ping is nothing, an error
    event raises Anthropic's error."""
    decoder = InvokeStreamDecoder(CTX)
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    raw = chunk(message_stream("x")[0]) + chunk({"type": "ping"}) + chunk(overloaded)
    start, ping, error = EventStreamParser().feed(raw)
    assert decoder.feed(start)[0]["choices"][0]["delta"]["role"] == "assistant"
    assert decoder.feed(ping) == []
    with pytest.raises(GatewayError) as info:
        decoder.feed(error)
    assert (info.value.status, info.value.message, info.value.retryable) == (
        503,
        "Overloaded",
        False,
    )
