"""An upstream's usage with odd values (text, null, a bool, a float, a nested field that is not
an object) is read as counts where it can be and as 0 where it cannot: a conversion never stops
halfway on it (table-driven, both adapters, both directions)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.protocols.anthropic import AnthropicAdapter
from gateway.protocols.anthropic.reply import encode_usage as anthropic_encode_usage
from gateway.protocols.base import count
from gateway.protocols.gemini import GeminiAdapter
from gateway.protocols.gemini.reply import encode_usage as gemini_encode_usage

ODD = ["12", None, True, float("nan"), float("inf"), [3], {"n": 3}]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(7, 7), (7.9, 7), (0, 0), (-3, -3), *((v, 0) for v in ODD)],
)
def test_count(value: Any, expected: int) -> None:
    assert count(value) == expected


def anthropic_reply(usage: Any) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "usage": usage,
    }


def gemini_reply(meta: Any) -> dict[str, Any]:
    return {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": "hi"}]}, "finishReason": "STOP",
             "index": "first"},
        ],
        "usageMetadata": meta,
    }  # fmt: skip


@pytest.mark.parametrize("odd", ODD, ids=repr)
def test_anthropic_reply_with_odd_usage_values(odd: Any) -> None:
    resp = AnthropicAdapter().decode_response(
        anthropic_reply({"input_tokens": odd, "output_tokens": 5, "cache_read_input_tokens": odd})
    )
    assert resp["usage"]["prompt_tokens"] == 0 and resp["usage"]["completion_tokens"] == 5
    assert resp["choices"][0]["message"]["content"] == "hi"


@pytest.mark.parametrize("odd", ODD, ids=repr)
def test_gemini_reply_with_odd_usage_values(odd: Any) -> None:
    resp = GeminiAdapter().decode_response(
        gemini_reply({"promptTokenCount": 4, "candidatesTokenCount": odd, "totalTokenCount": odd})
    )
    assert resp["usage"]["prompt_tokens"] == 4 and resp["usage"]["completion_tokens"] == 0
    assert resp["usage"]["total_tokens"] == 4
    assert resp["choices"][0]["message"]["content"] == "hi"


@pytest.mark.parametrize("odd", ODD, ids=repr)
def test_usage_with_odd_values_encodes_for_either_client(odd: Any) -> None:
    """An openai channel's usage, relayed to an anthropic or gemini client."""
    usage: Any = {
        "prompt_tokens": 10,
        "completion_tokens": odd,
        "total_tokens": odd,
        "prompt_tokens_details": odd,
        "completion_tokens_details": {"reasoning_tokens": odd},
    }
    assert anthropic_encode_usage(usage) == {
        "input_tokens": 10,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
    }
    assert gemini_encode_usage(usage) == {
        "promptTokenCount": 10,
        "candidatesTokenCount": 0,
        "totalTokenCount": 10,
    }
