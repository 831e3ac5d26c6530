"""Azure OpenAI addressing (``gateway.protocols.azure``), pure: the openai adapter's calls sent
to the deployment (or the resource, or the v1 API) with ``api-key``, and Azure's errors,
content-filter refusals first. The SDK's own requests are compared in
tests/test_fake_azure.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import InvalidRequestError, NotFoundError, RateLimitError, UpstreamError
from gateway.protocols.azure import (
    AzureSite,
    azure_call,
    azure_url,
    decode_error,
    endpoint_of,
)
from gateway.protocols.base import UpstreamCall, UpstreamTarget
from gateway.protocols.openai import OpenAIAdapter
from gateway.protocols.openai.reply import error_body
from gateway.types import ChatRequest

SITE = AzureSite("https://res.openai.azure.com/", "2024-10-21")
ROOT = "https://res.openai.azure.com/openai"
KEY = "azure-key-0001"
# Azure's own words for a prompt the content filter refused
FILTERED = {
    "error": {
        "message": "The response was filtered due to the prompt triggering Azure OpenAI's "
        "content management policy. Please modify your prompt and retry.",
        "type": None,
        "param": "prompt",
        "code": "content_filter",
        "status": 400,
        "innererror": {
            "code": "ResponsibleAIPolicyViolation",
            "content_filter_result": {
                "hate": {"filtered": False, "severity": "safe"},
                "jailbreak": {"filtered": False, "detected": False},
                "self_harm": {"filtered": False, "severity": "safe"},
                "sexual": {"filtered": True, "severity": "medium"},
                "violence": {"filtered": True, "severity": "high"},
            },
        },
    }
}


def target(stream: bool = False) -> UpstreamTarget:
    return UpstreamTarget("az", "https://ignored.example/v1", KEY, "gpt4o-prod", 1024, stream)


@pytest.mark.parametrize(
    "endpoint",
    ["/chat/completions", "/completions", "/embeddings", "/images/generations",
     "/audio/transcriptions", "/audio/speech"],
)  # fmt: skip
def test_deployment_endpoints_go_under_the_deployment_with_the_api_version(endpoint: str) -> None:
    assert endpoint_of("https://x/v1" + endpoint) == endpoint
    assert azure_url(SITE, "gpt4o-prod", endpoint) == (
        f"{ROOT}/deployments/gpt4o-prod{endpoint}?api-version=2024-10-21"
    )


def test_the_responses_api_goes_to_the_resource_and_v1_to_the_v1_api() -> None:
    assert azure_url(SITE, "d", "/responses") == f"{ROOT}/responses?api-version=2024-10-21"
    v1 = AzureSite("https://res.openai.azure.com", "v1")
    assert azure_url(v1, "d", "/responses") == f"{ROOT}/v1/responses"
    assert azure_url(v1, "d", "/chat/completions") == f"{ROOT}/v1/chat/completions"


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_call_keeps_its_body_and_trades_bearer_for_api_key(stream: bool) -> None:
    req: ChatRequest = {"model": "client", "messages": [{"role": "user", "content": "hi"}]}
    encoded = OpenAIAdapter().encode_request(req, target(stream))
    call = azure_call(encoded, SITE, "gpt4o-prod", KEY)
    assert call.url == f"{ROOT}/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21"
    assert call.body is encoded.body
    assert orjson.loads(call.body)["model"] == "gpt4o-prod"
    assert call.headers == {"Content-Type": "application/json", "api-key": KEY}


def test_a_multipart_upload_keeps_its_content_type() -> None:
    encoded = UpstreamCall(
        "https://ignored.example/v1/audio/transcriptions",
        {"Authorization": f"Bearer {KEY}", "Content-Type": "multipart/form-data; boundary=b"},
        b"",
    )
    call = azure_call(encoded, SITE, "whisper", KEY)
    assert call.url == f"{ROOT}/deployments/whisper/audio/transcriptions?api-version=2024-10-21"
    assert call.headers == {"Content-Type": "multipart/form-data; boundary=b", "api-key": KEY}


def test_an_endpoint_azure_lacks_is_not_found() -> None:
    with pytest.raises(NotFoundError):
        endpoint_of("https://x/v1/rerank")


def test_a_deployment_name_is_one_path_segment() -> None:
    assert azure_url(SITE, "a/b c", "/embeddings").startswith(f"{ROOT}/deployments/a%2Fb%20c/")


# errors ------------------------------------------------------------------------------------
def test_a_content_filter_refusal_is_the_clients_400_named_content_filter() -> None:
    err = decode_error(400, orjson.dumps(FILTERED))
    assert isinstance(err, InvalidRequestError) and not err.retryable
    assert err.code == "content_filter"
    assert err.message.startswith("The response was filtered")
    assert err.message.endswith("(filtered: sexual, violence)")
    assert error_body(err)["error"]["code"] == "content_filter"  # what openai clients see


def test_an_image_refusal_by_its_inner_code_is_a_content_filter_too() -> None:
    body = {
        "error": {
            "code": "contentFilter",
            "message": "Your task failed as a result of our safety system.",
            "inner_error": {
                "code": "ResponsibleAIPolicyViolation",
                "content_filter_result": {"violence": {"filtered": True, "severity": "low"}},
            },
        }
    }
    err = decode_error(400, orjson.dumps(body))
    assert err.code == "content_filter" and err.message.endswith("(filtered: violence)")


def azure_error(code: str, message: str) -> bytes:
    return orjson.dumps({"error": {"code": code, "message": message}})


def test_azures_other_errors_map_as_the_openai_adapter_maps_them() -> None:
    denied = decode_error(401, azure_error("401", "Access denied due to invalid subscription key"))
    assert isinstance(denied, UpstreamError) and denied.channel_fault and denied.status == 502
    limited = decode_error(429, azure_error("429", "Requests ... exceeded token rate limit"))
    assert isinstance(limited, RateLimitError)
    assert decode_error(500, b"").status == 502
    too_long = decode_error(400, azure_error("context_length_exceeded", "too long"))
    assert isinstance(too_long, InvalidRequestError) and too_long.message == "too long"


def test_a_missing_deployment_may_be_elsewhere_but_a_wrong_endpoint_is_the_channels() -> None:
    missing = decode_error(404, azure_error("DeploymentNotFound", "The API deployment ..."))
    assert isinstance(missing, NotFoundError) and missing.retryable and not missing.channel_fault
    wrong = decode_error(404, azure_error("404", "Resource not found"))
    assert isinstance(wrong, UpstreamError) and wrong.channel_fault


def test_what_is_not_azures_shape_is_read_as_openais() -> None:
    payload: dict[str, Any] = {"message": "plain"}
    assert decode_error(400, orjson.dumps(payload)).message == "plain"


# Azure's streams through the openai adapter ---------------------------------------------------
PROMPT_FILTER_CHUNK = (
    b'data: {"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":'
    b'[{"prompt_index":0,"content_filter_results":{"hate":{"filtered":false,"severity":"safe"}}}]}'
    b"\n\n"
)


def azure_stream(finish: str = "stop") -> bytes:
    def chunk(choices: list[dict[str, Any]], usage: Any = None) -> bytes:
        payload = {
            "choices": choices,
            "created": 1750000000,
            "id": "chatcmpl-az1",
            "model": "gpt-4o-2024-11-20",
            "object": "chat.completion.chunk",
            "system_fingerprint": "fp_az",
            "usage": usage,
        }
        return b"data: " + orjson.dumps(payload) + b"\n\n"

    safe = {"hate": {"filtered": False, "severity": "safe"}}
    return b"".join(
        [
            PROMPT_FILTER_CHUNK,
            chunk([{"content_filter_results": {}, "delta": {"role": "assistant", "content": ""},
                    "finish_reason": None, "index": 0, "logprobs": None}]),
            chunk([{"content_filter_results": safe, "delta": {"content": "Hello"},
                    "finish_reason": None, "index": 0, "logprobs": None}]),
            chunk([{"content_filter_results": {}, "delta": {}, "finish_reason": finish,
                    "index": 0, "logprobs": None}]),
            chunk([], {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}),
            b"data: [DONE]\n\n",
        ]
    )  # fmt: skip


@pytest.mark.parametrize("cut", [None, 40, len(PROMPT_FILTER_CHUNK) + 10])
def test_an_azure_stream_passes_with_the_clients_model_name_throughout(cut: int | None) -> None:
    """Azure's first chunk says ``"model":""``: the upstream's name is learnt from the next
    one, so that no chunk shows the deployment's model snapshot."""
    from gateway.protocols.base import Ctx
    from gateway.protocols.openai.passthrough import OpenAIPassthrough

    raw = azure_stream()
    stream = OpenAIPassthrough(Ctx("r1", "chat-small", 0, include_usage=True), target(True))
    pieces = [raw] if cut is None else [raw[:cut], raw[cut:]]
    out = b"".join(stream.feed(p) for p in pieces) + stream.finish()
    assert b"gpt-4o-2024-11-20" not in out
    assert out.count(b'"model":"chat-small"') == 4 and b'"prompt_filter_results"' in out
    assert stream.usage == {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}


def test_an_azure_stream_decodes_for_other_clients_content_filter_stop_included() -> None:
    from gateway.protocols.openai.stream import OpenAIStreamDecoder
    from gateway.protocols.sse import SSEParser

    decoder = OpenAIStreamDecoder()
    chunks = [c for e in SSEParser().feed(azure_stream("content_filter")) for c in decoder.feed(e)]
    decoder.close()
    texts = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert "".join(t or "" for t in texts) == "Hello"
    finishes = [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]]
    assert finishes[-1] == "content_filter"
