"""A wrong-typed field through the live gateway (real sockets, the fake upstream behind it):
a 400 in the path's protocol shape, for each client protocol toward a converting channel,
whole and streamed."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.plugins.servers import KEYS, ServedGateway

AUTH = {"Authorization": f"Bearer {KEYS['alice']}"}
MESSAGES = [{"role": "user", "content": "hi"}]
# (path, body, the field the error must name, the protocol's error shape)
CASES: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "/v1/chat/completions",
        {"model": "gemini-small", "messages": MESSAGES, "stop": 5},
        "stop",
        "openai",
    ),
    (
        "/v1/chat/completions",
        {"model": "claude-small", "messages": [{"role": "user", "content": 7}], "stream": True},
        "content",
        "openai",
    ),
    (
        "/v1/messages",
        {"model": "gemini-small", "max_tokens": 16, "messages": MESSAGES, "stop_sequences": 5},
        "stop_sequences",
        "anthropic",
    ),
    (
        "/v1/messages",
        {
            "model": "chat-small",
            "max_tokens": 16,
            "messages": MESSAGES,
            "tools": True,
            "stream": True,
        },
        "tools",
        "anthropic",
    ),
    (
        "/v1beta/models/chat-small:generateContent",
        {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"stopSequences": 5}},
        "stopSequences",
        "gemini",
    ),
    (
        "/v1beta/models/claude-small:streamGenerateContent?alt=sse",
        {"contents": [{"role": ["user"], "parts": [{"text": "hi"}]}]},
        "role",
        "gemini",
    ),
    (
        "/v1/responses",
        {"model": "gemini-small", "input": "hi", "temperature": "hot"},
        "temperature",
        "openai",
    ),
    (
        "/v1/responses",
        {"model": "claude-small", "input": [{"role": "user", "content": 7}], "stream": True},
        "content",
        "openai",
    ),
]


def assert_shape(shape: str, body: Any, field: str) -> None:
    if shape == "anthropic":
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    elif shape == "gemini":
        assert set(body["error"]) >= {"code", "message", "status"}
        assert body["error"]["code"] == 400
        assert body["error"]["status"] == "INVALID_ARGUMENT"
        message = body["error"]["message"]
    else:
        assert body["error"]["type"] == "invalid_request_error"
        assert "code" in body["error"]
        message = body["error"]["message"]
    assert field in message, message


@pytest.mark.parametrize(
    ("path", "body", "field", "shape"), CASES, ids=[f"{c[3]}-{c[2]}" for c in CASES]
)
async def test_wrong_type_is_a_400_in_the_paths_shape(
    gateway: ServedGateway,
    path: str,
    body: dict[str, Any],
    field: str,
    shape: str,
) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.post(gateway.url + path, json=body, headers=AUTH) as r,
    ):
        assert r.status == 400, await r.text()
        assert r.content_type == "application/json"
        assert_shape(shape, await r.json(), field)
