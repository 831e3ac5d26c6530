"""The converse protocol (Bedrock's Converse API, upstream side) and Bedrock's errors, beyond
the fixtures of tests/fixtures/bedrock: the edges of each mapping, by behaviour."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import GatewayError, InvalidRequestError, UpstreamError
from gateway.protocols import bedrock
from gateway.protocols.base import Ctx, UpstreamTarget
from gateway.protocols.converse import ConverseAdapter
from gateway.protocols.converse.reply import FINISH_REASONS
from gateway.protocols.sse import SSEEvent
from gateway.types import ChatChunk, ChatRequest

ADAPTER = ConverseAdapter()
CTX = Ctx(request_id="r1", model="m", created=1)
ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.meta.llama3-2-90b-v1:0"


def target(stream: bool = False, model: str = "amazon.nova-pro-v1:0") -> UpstreamTarget:
    return UpstreamTarget(
        "c", "https://bedrock-runtime.eu-west-1.amazonaws.com/", "", model, 4096, stream
    )


def body(req: dict[str, Any], stream: bool = False) -> dict[str, Any]:
    call = ADAPTER.encode_request(req, target(stream))  # type: ignore[arg-type]
    assert call.headers == {"content-type": "application/json"}  # unsigned: the channel signs
    payload: dict[str, Any] = orjson.loads(call.body)
    return payload


def user(content: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}]}


# requests ------------------------------------------------------------------------------------
def test_urls_name_the_model_as_one_segment_and_the_action() -> None:
    assert ADAPTER.encode_request(user("x"), target()).url == (
        "https://bedrock-runtime.eu-west-1.amazonaws.com/model/amazon.nova-pro-v1:0/converse"
    )
    call = ADAPTER.encode_request(user("x"), target(stream=True, model=ARN))
    assert call.url.endswith(
        "/model/arn:aws:bedrock:us-east-1:123456789012:inference-profile%2F"
        "us.meta.llama3-2-90b-v1:0/converse-stream"
    )


def test_a_stream_request_has_the_same_body() -> None:
    req = {**user("hi"), "max_tokens": 9, "stream": True}
    assert (
        body(req, stream=True)
        == body(req)
        == {
            "messages": [{"role": "user", "content": [{"text": "hi"}]}],
            "inferenceConfig": {"maxTokens": 9},
        }
    )


def test_tool_choice_none_keeps_the_tools_when_the_history_has_tool_blocks() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    history = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "f", "arguments": ""}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "done", "is_error": True},
    ]
    out = body({"model": "m", "messages": history, "tools": tools, "tool_choice": "none"})
    assert out["toolConfig"] == {
        "tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": EMPTY}}}]
    }
    assert out["messages"][1]["content"] == [
        {"toolUse": {"toolUseId": "t1", "name": "f", "input": {}}}
    ]
    result = out["messages"][2]["content"][0]["toolResult"]
    assert result == {"toolUseId": "t1", "content": [{"text": "done"}], "status": "error"}
    assert "toolConfig" not in body({**user("hi"), "tools": tools, "tool_choice": "none"})


EMPTY = {"type": "object", "properties": {}}


def test_required_tool_choice_is_any_and_strict_is_kept() -> None:
    tools = [
        {
            "type": "function",
            "function": {"name": "f", "strict": True, "parameters": {"type": "object"}},
        }
    ]
    out = body({**user("x"), "tools": tools, "tool_choice": "required"})
    assert out["toolConfig"] == {
        "tools": [
            {"toolSpec": {"name": "f", "strict": True, "inputSchema": {"json": {"type": "object"}}}}
        ],
        "toolChoice": {"any": {}},
    }


def test_consecutive_turns_of_one_role_merge_and_empty_ones_vanish() -> None:
    req = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": [{"type": "text", "text": "b"}]},
            {"role": "system", "content": ""},
        ],
    }
    out = body(req)
    assert out == {"messages": [{"role": "user", "content": [{"text": "a"}, {"text": "b"}]}]}


def test_documents_go_as_document_blocks_with_a_valid_name() -> None:
    part = {
        "type": "file",
        "file": {"filename": "q3 (final).pdf", "file_data": "data:application/pdf;base64,JVBERi0="},
    }
    block = body(user([part]))["messages"][0]["content"][0]["document"]
    assert block == {
        "format": "pdf",
        "name": "document messages 0 content 0",
        "source": {"bytes": "JVBERi0="},
    }


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ({"type": "image_url", "image_url": {"url": "https://x/y.png"}}, "base64 data: URLs"),
        ({"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}, "image/bmp"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "input_audio"),
        ({"type": "file", "file": {"file_data": "data:audio/mpeg;base64,AA=="}}, "audio/mpeg"),
    ],
)
def test_what_converse_cannot_take_is_a_400(part: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequestError, match="cannot be sent|data: URLs") as info:
        body(user([part]))
    assert message in info.value.message


def test_tool_arguments_that_are_not_json_are_the_clients_mistake() -> None:
    msg = {
        "role": "assistant",
        "tool_calls": [
            {"id": "t", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
        ],
    }
    with pytest.raises(InvalidRequestError, match=r"tool_calls\[0\]\.function\.arguments"):
        body({"model": "m", "messages": [{"role": "user", "content": "x"}, msg]})


def test_unsigned_reasoning_is_left_out_and_redacted_reasoning_kept() -> None:
    msg = {
        "role": "assistant",
        "content": "ok",
        "reasoning_content": "hmm",
        "redacted_reasoning": ["b64data"],
    }
    out = body({"model": "m", "messages": [{"role": "user", "content": "x"}, msg]})
    assert out["messages"][1]["content"] == [
        {"reasoningContent": {"redactedContent": "b64data"}},
        {"text": "ok"},
    ]


def test_top_k_reasoning_effort_and_parallel_tool_calls_are_not_sent() -> None:
    req = {
        **user("x"),
        "top_k": 5,
        "reasoning_effort": "high",
        "parallel_tool_calls": False,
        "seed": 1,
        "user": "u",
        "response_format": {"type": "json_object"},
    }
    assert body(req) == {"messages": [{"role": "user", "content": [{"text": "x"}]}]}


# whole replies -------------------------------------------------------------------------------
def reply(content: list[Any], stop: str = "end_turn", usage: Any = None) -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop,
        "usage": usage or {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7},
        "metrics": {"latencyMs": 1},
    }


@pytest.mark.parametrize(
    ("stop", "finish"),
    [*FINISH_REASONS.items(), ("malformed_tool_use", "stop"), ("a_later_reason", "stop")],
)
def test_stop_reasons(stop: str, finish: str) -> None:
    resp = ADAPTER.decode_response(reply([{"text": "x"}], stop))
    assert resp["choices"][0]["finish_reason"] == finish


def test_a_reply_of_only_tool_uses_has_null_content_and_json_arguments() -> None:
    use = {"toolUse": {"toolUseId": "t9", "name": "f", "input": {"a": [1, "b"]}}}
    msg = ADAPTER.decode_response(reply([use], "tool_use"))["choices"][0]["message"]
    assert msg["content"] is None
    assert msg["tool_calls"] == [
        {"id": "t9", "type": "function", "function": {"name": "f", "arguments": '{"a":[1,"b"]}'}}
    ]


def test_usage_counts_cache_reads_and_writes_in_the_prompt() -> None:
    usage = {
        "inputTokens": 10,
        "outputTokens": 5,
        "totalTokens": 1315,
        "cacheReadInputTokens": 1000,
        "cacheWriteInputTokens": 300,
    }
    assert ADAPTER.decode_response(reply([{"text": "x"}], usage=usage))["usage"] == {
        "prompt_tokens": 1310,
        "completion_tokens": 5,
        "total_tokens": 1315,
        "prompt_tokens_details": {"cached_tokens": 1000},
        "cache_creation_tokens": 300,
    }


@pytest.mark.parametrize(
    "payload",
    [
        [],
        {"output": {}},
        {"output": {"message": {"content": "text"}}},
        {"output": {"message": {"content": [{"text": 3}]}}},
        {"output": {"message": {"content": [{"toolUse": {"name": "f"}}]}}},
    ],
)
def test_a_malformed_reply_is_the_upstreams_fault(payload: Any) -> None:
    with pytest.raises(UpstreamError):
        ADAPTER.decode_response(payload)


# streams -------------------------------------------------------------------------------------
def feed(*events: tuple[str, Any]) -> list[ChatChunk]:
    decoder = ADAPTER.stream_decoder(CTX)
    chunks: list[ChatChunk] = []
    for name, payload in events:
        chunks.extend(decoder.feed(SSEEvent(name, orjson.dumps(payload))))
    return chunks + decoder.close()


def test_a_stream_ends_with_its_finish_then_its_usage() -> None:
    chunks = feed(
        ("messageStart", {"role": "assistant"}),
        ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "hi"}, "p": "abc"}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        ("messageStop", {"stopReason": "max_tokens"}),
        ("metadata", {"usage": {"inputTokens": 2, "outputTokens": 1, "totalTokens": 3}}),
        ("someLaterEvent", {"x": 1}),
    )
    assert [c["choices"][0]["delta"] for c in chunks[:2]] == [
        {"role": "assistant", "content": ""},
        {"content": "hi"},
    ]
    assert chunks[2]["choices"][0]["finish_reason"] == "length"
    assert chunks[3]["choices"] == []
    assert chunks[3]["usage"] == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}


def test_tool_input_outside_a_tool_block_is_refused() -> None:
    with pytest.raises(UpstreamError, match="outside a toolUse block"):
        feed(("contentBlockDelta", {"contentBlockIndex": 4, "delta": {"toolUse": {"input": "{"}}}))


def test_a_stream_cut_before_message_stop_raises_at_close() -> None:
    with pytest.raises(UpstreamError, match="before messageStop"):
        feed(("messageStart", {"role": "assistant"}))


def test_a_malformed_event_raises() -> None:
    decoder = ADAPTER.stream_decoder(CTX)
    with pytest.raises(UpstreamError, match="malformed contentBlockDelta"):
        decoder.feed(SSEEvent("contentBlockDelta", b"not json"))
    with pytest.raises(UpstreamError):
        decoder.feed(SSEEvent("contentBlockDelta", b'{"delta": {"text": 7}}'))


@pytest.mark.parametrize(
    ("exception", "status"),
    [
        ("throttlingException", 429),
        ("validationException", 400),
        ("serviceUnavailableException", 503),
        ("internalServerException", 502),
        ("modelStreamErrorException", 502),
        ("modelTimeoutException", 504),
        ("somethingNewException", 502),
    ],
)
def test_an_exception_in_the_stream_is_bedrocks_error_never_retried(
    exception: str, status: int
) -> None:
    decoder = ADAPTER.stream_decoder(CTX)
    event = SSEEvent(bedrock.EXCEPTION_PREFIX + exception, b'{"message":"it broke"}')
    with pytest.raises(GatewayError) as info:
        decoder.feed(event)
    assert (info.value.status, info.value.message) == (status, "it broke")
    assert not info.value.retryable


# errors --------------------------------------------------------------------------------------
CORAL = ":http://internal.amazon.com/coral/com.amazon.bedrock/"


@pytest.mark.parametrize(
    ("status", "header", "expected", "fault"),
    [
        (429, "ThrottlingException" + CORAL, 429, False),
        (400, "ValidationException" + CORAL, 400, False),
        (400, "ServiceQuotaExceededException", 429, False),
        (404, "ResourceNotFoundException", 404, False),
        (429, "ModelNotReadyException", 503, False),
        (503, "ServiceUnavailableException", 503, False),
        (408, "ModelTimeoutException", 504, False),
        (500, "InternalServerException", 502, False),
        (424, "ModelErrorException", 502, False),
        (403, "AccessDeniedException" + CORAL, 502, True),
        (403, "UnrecognizedClientException", 502, True),
        (403, "InvalidSignatureException", 502, True),
        (400, "ExpiredTokenException", 502, True),
        (403, None, 502, True),  # by status, as every adapter maps a 403
        (418, None, 400, False),
        (500, "AnUnknownException", 502, False),
    ],
)
def test_errors_by_type_then_status(
    status: int, header: str | None, expected: int, fault: bool
) -> None:
    raw = b'{"message":"The canonical string was: ... x-amz-security-token:SECRET"}'
    err = ADAPTER.decode_error(status, raw, header)
    assert (err.status, err.channel_fault) == (expected, fault)
    if fault:  # the gateway's own words: AWS's may quote the session token
        assert "SECRET" not in err.message and not err.status == 401


def test_an_error_type_in_the_body_serves_when_the_header_is_missing() -> None:
    raw = b'{"__type":"com.amazon.coral.service#ThrottlingException","Message":"slow"}'
    err = ADAPTER.decode_error(400, raw)
    assert (err.status, err.message) == (429, "slow")
    assert ADAPTER.decode_error(502, b"<html>bad gateway</html>").status == 502


def test_the_adapter_is_an_upstream_side() -> None:
    req: ChatRequest = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert ADAPTER.name == "converse"
    assert ADAPTER.encode_request(req, target()).body == (
        b'{"messages":[{"role":"user","content":[{"text":"x"}]}]}'
    )
