"""What an open stream keeps of its request: a pass-through job lets its parsed body go once
its attempt answered, and still estimates its prompt (for a stream cut short before the
upstream counted it) from the bytes it sent, as it would have from the parsed body, whatever
the channel made of the body (Bedrock's and Vertex's Messages bodies drop ``model``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from gateway.kinds.chat import ChatJob
from gateway.protocols import CLIENTS
from gateway.protocols.anthropic.bedrock import invoke_body
from gateway.protocols.base import UpstreamCall
from gateway.protocols.vertex import claude_body, gemini_body

QUESTION = "What colour is the sky on a clear day, seen from Earth?"
OPENAI = {
    "model": "chat-small",
    "stream": True,
    "messages": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": QUESTION},
    ],
}
ANTHROPIC = {
    "model": "claude-small",
    "stream": True,
    "max_tokens": 100,
    "system": "Answer in one word.",
    "messages": [{"role": "user", "content": QUESTION}],
}
GEMINI = {
    "systemInstruction": {"parts": [{"text": "Answer in one word."}]},
    "contents": [{"role": "user", "parts": [{"text": QUESTION}]}],
}
RESPONSES = {"model": "chat-small", "stream": True, "instructions": "One word.", "input": QUESTION}


def renamed(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "model": "upstream-name"}


# (client protocol, its body, what the channel's pass-through sends)
CASES: dict[str, tuple[str, dict[str, Any], Callable[[dict[str, Any]], Any]]] = {
    "openai": ("openai", OPENAI, renamed),
    "anthropic": ("anthropic", ANTHROPIC, renamed),
    "anthropic-on-bedrock": ("anthropic", ANTHROPIC, lambda p: invoke_body(p, None)),
    "anthropic-on-vertex": ("anthropic", ANTHROPIC, lambda p: claude_body(p, "claude-x")),
    "gemini": ("gemini", GEMINI, dict),
    "gemini-on-vertex": ("gemini", GEMINI, lambda p: gemini_body(p, "streamGenerateContent")),
    "responses": ("responses", RESPONSES, renamed),
}


def job(protocol: str, body: dict[str, Any]) -> ChatJob:
    client = CLIENTS[protocol]
    payload = orjson.loads(orjson.dumps(body))
    model = "gemini-small" if protocol == "gemini" else None  # gemini's is in the path
    action = "streamGenerateContent" if protocol == "gemini" else None
    return ChatJob(client, client.match("chat", payload, model, b"", action), payload)


@pytest.mark.parametrize("case", list(CASES))
def test_a_released_pass_through_job_keeps_no_parsed_body_and_estimates_alike(case: str) -> None:
    protocol, body, send = CASES[case]
    expected = job(protocol, body).prompt_estimate()
    assert expected > 0
    released = job(protocol, body)
    sent = orjson.dumps(send(orjson.loads(orjson.dumps(body))))
    released.sent = UpstreamCall("http://upstream/", {}, sent)
    released.release()
    assert released.payload is None
    assert released.prompt_estimate() == expected


def test_a_job_with_nothing_sent_keeps_its_body_until_estimated() -> None:
    kept = job("openai", OPENAI)
    kept.release()
    assert kept.payload is not None
    assert kept.prompt_estimate() > 0
