"""Vertex AI addressing (``gateway.protocols.vertex``), pure: the calls the gemini and anthropic
adapters encode, turned into Vertex's (URL, body, headers), and Vertex's two error shapes.
The SDKs' own requests are compared in tests/test_fake_vertex.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import (
    InternalError,
    InvalidRequestError,
    RateLimitError,
    UpstreamError,
    UpstreamUnavailableError,
)
from gateway.protocols.anthropic import AnthropicAdapter
from gateway.protocols.base import RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.gemini import GeminiAdapter
from gateway.protocols.vertex import (
    VertexSite,
    claude_call,
    decode_error,
    default_base_url,
    gemini_body,
    gemini_call,
    publisher,
    token_refused,
)
from gateway.types import ChatRequest

SITE = VertexSite("my-proj", "us-east5")
ROOT = "https://us-east5-aiplatform.googleapis.com/v1/projects/my-proj/locations/us-east5"
CLAUDE = "claude-sonnet-4-5@20250929"
GEMINI = "gemini-2.5-flash"


def target(
    model: str, stream: bool = False, headers: dict[str, str] | None = None
) -> UpstreamTarget:
    return UpstreamTarget(
        "vx", "https://ignored.example", "not-a-vertex-key", model, 1024, stream, headers or {}
    )


def chat(stream: bool = False) -> ChatRequest:
    req: ChatRequest = {
        "model": "client-name",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "again"},
        ],
        "max_tokens": 50,
    }
    if stream:
        req["stream"] = True
    return req


def body(call: UpstreamCall) -> Any:
    return orjson.loads(call.body)


def test_the_root_is_the_regions_endpoint_or_the_global_one() -> None:
    assert default_base_url("europe-west4") == "https://europe-west4-aiplatform.googleapis.com"
    assert default_base_url("global") == "https://aiplatform.googleapis.com"
    assert default_base_url("eu") == "https://aiplatform.eu.rep.googleapis.com"  # as the SDKs
    assert VertexSite("p", "global").root == "https://aiplatform.googleapis.com"
    assert VertexSite("p", "us-east5", "http://127.0.0.1:9/").root == "http://127.0.0.1:9"


def test_claude_names_go_to_anthropic_and_the_rest_to_google() -> None:
    assert publisher(CLAUDE) == "anthropic" and publisher("claude-3-haiku@20240307") == "anthropic"
    assert publisher(GEMINI) == "google" and publisher("gemini-2.0-flash-001") == "google"


# gemini ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("stream", "suffix"),
    [(False, ":generateContent"), (True, ":streamGenerateContent?alt=sse")],
)
def test_a_gemini_call_goes_to_the_google_publisher_with_the_token_left_to_add(
    stream: bool, suffix: str
) -> None:
    encoded = GeminiAdapter().encode_request(chat(stream), target(GEMINI, stream))
    call = gemini_call(encoded, SITE, GEMINI)
    assert call.url == f"{ROOT}/publishers/google/models/{GEMINI}{suffix}"
    assert "x-goog-api-key" not in {k.lower() for k in call.headers}
    assert "authorization" not in {k.lower() for k in call.headers}
    assert {k.lower(): v for k, v in call.headers.items()}["content-type"] == "application/json"
    assert body(call) == body(encoded)  # the adapter's body already suits Vertex
    assert [c["role"] for c in body(call)["contents"]] == ["user", "model", "user"]


def test_a_gemini_count_is_flat_as_vertex_takes_it() -> None:
    encoded = GeminiAdapter().count_request(chat(), target(GEMINI))
    assert "generateContentRequest" in body(encoded)  # AI Studio's form
    call = gemini_call(encoded, SITE, GEMINI)
    assert call.url == f"{ROOT}/publishers/google/models/{GEMINI}:countTokens"
    inner = body(encoded)["generateContentRequest"]
    assert body(call) == {k: v for k, v in inner.items() if k != "model"}
    assert set(body(call)) == {"contents", "systemInstruction"}


def test_a_gemini_clients_body_without_roles_gets_user_roles() -> None:
    payload: dict[str, Any] = {
        "contents": [{"parts": [{"text": "hi"}]}, {"role": "model", "parts": [{"text": "yo"}]}],
        "generationConfig": {"maxOutputTokens": 5},
    }
    route = RouteMatch("gemini", "chat", GEMINI, False)
    encoded = GeminiAdapter().passthrough_request(payload, route, target(GEMINI))
    call = gemini_call(encoded, SITE, GEMINI)
    assert body(call) == {
        "contents": [
            {"role": "user", "parts": [{"text": "hi"}]},
            {"role": "model", "parts": [{"text": "yo"}]},
        ],
        "generationConfig": {"maxOutputTokens": 5},
    }
    wrapped = {"generateContentRequest": {"model": f"models/{GEMINI}", **payload}}
    assert gemini_body(wrapped, "countTokens") == {
        "contents": body(call)["contents"],
        "generationConfig": {"maxOutputTokens": 5},
    }
    assert gemini_body({"contents": payload["contents"]}, "countTokens")["contents"][0]["role"]


# claude ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("stream", "action"), [(False, "rawPredict"), (True, "streamRawPredict")])
def test_a_claude_call_goes_to_the_anthropic_publisher_without_model(
    stream: bool, action: str
) -> None:
    headers = {
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "interleaved-thinking-2025-05-14",
    }
    encoded = AnthropicAdapter().encode_request(chat(stream), target(CLAUDE, stream, headers))
    call = claude_call(encoded, SITE, CLAUDE)
    assert call.url == f"{ROOT}/publishers/anthropic/models/{CLAUDE}:{action}"
    sent = body(call)
    want = {k: v for k, v in body(encoded).items() if k != "model"}
    assert sent == {**want, "anthropic_version": "vertex-2023-10-16"}
    assert sent.get("stream", False) is stream
    lower = {k.lower(): v for k, v in call.headers.items()}
    assert lower["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert not {"x-api-key", "anthropic-version", "authorization"} & set(lower)
    assert "not-a-vertex-key" not in str(call.headers)


def test_a_claude_count_names_its_model_at_the_count_endpoint() -> None:
    encoded = AnthropicAdapter().count_request(chat(), target(CLAUDE))
    call = claude_call(encoded, SITE, CLAUDE)
    assert call.url == f"{ROOT}/publishers/anthropic/models/count-tokens:rawPredict"
    assert body(call) == {
        **body(encoded),
        "model": CLAUDE,
        "anthropic_version": "vertex-2023-10-16",
    }


def test_an_anthropic_clients_body_passes_with_its_own_version_kept() -> None:
    payload: dict[str, Any] = {
        "model": "client-name",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}],
        "anthropic_version": "vertex-2099-01-01",
        "stream": True,
    }
    route = RouteMatch("anthropic", "chat", "client-name", True)
    encoded = AnthropicAdapter().passthrough_request(payload, route, target(CLAUDE, True))
    call = claude_call(encoded, SITE, CLAUDE)
    assert call.url.endswith(":streamRawPredict")
    assert "model" not in body(call) and body(call)["anthropic_version"] == "vertex-2099-01-01"


def test_a_model_name_is_one_path_segment() -> None:
    encoded = AnthropicAdapter().encode_request(chat(), target("claude-x;y/z@1"))
    call = claude_call(encoded, SITE, "claude-x;y/z@1")
    assert call.url == f"{ROOT}/publishers/anthropic/models/claude-x%3By%2Fz@1:rawPredict"


def test_a_call_of_another_kind_is_a_wiring_bug() -> None:
    call = UpstreamCall("https://x/v1/chat/completions", {}, b"{}")
    with pytest.raises(InternalError):
        gemini_call(call, SITE, GEMINI)
    with pytest.raises(InternalError):
        claude_call(call, SITE, CLAUDE)
    with pytest.raises(InvalidRequestError):
        claude_call(UpstreamCall("https://x/v1/messages", {}, b"[]"), SITE, CLAUDE)


# errors ------------------------------------------------------------------------------------
def google_error(code: int, status: str, reason: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": f"{status} happened", "status": status}
    if reason:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason}]
    return {"error": error}


def test_googles_errors_are_read_as_gemini_reads_them() -> None:
    expired = decode_error(
        401, orjson.dumps(google_error(401, "UNAUTHENTICATED", "ACCESS_TOKEN_EXPIRED"))
    )
    assert isinstance(expired, UpstreamError) and expired.channel_fault and expired.status == 502
    denied = decode_error(403, orjson.dumps(google_error(403, "PERMISSION_DENIED")))
    assert denied.channel_fault and denied.status == 502
    quota = decode_error(429, orjson.dumps([google_error(429, "RESOURCE_EXHAUSTED")]))
    assert isinstance(quota, RateLimitError) and quota.message == "RESOURCE_EXHAUSTED happened"
    bad = decode_error(400, orjson.dumps(google_error(400, "INVALID_ARGUMENT")))
    assert isinstance(bad, InvalidRequestError) and bad.message == "INVALID_ARGUMENT happened"
    assert decode_error(404, orjson.dumps(google_error(404, "NOT_FOUND"))).status == 404
    assert decode_error(500, b"<html>").status == 502


def test_a_claude_models_errors_are_read_as_anthropic_reads_them() -> None:
    def anthropic(kind: str) -> bytes:
        return orjson.dumps({"type": "error", "error": {"type": kind, "message": "m"}})

    assert isinstance(decode_error(529, anthropic("overloaded_error")), UpstreamUnavailableError)
    invalid = decode_error(400, anthropic("invalid_request_error"))
    assert isinstance(invalid, InvalidRequestError) and invalid.message == "m"
    assert decode_error(401, anthropic("authentication_error")).channel_fault


def test_a_401_means_the_token_was_refused() -> None:
    assert token_refused(401)
    assert not token_refused(403) and not token_refused(429)
