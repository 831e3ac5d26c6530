"""OpenAI's legacy completions wire format (``POST /v1/completions``): a ``prompt`` (and a
``suffix`` for fill-in-the-middle) continued as ``text``.

Reply: ``{"id": "cmpl-...", "object": "text_completion", "created", "model", "choices":
[{"text", "index", "logprobs", "finish_reason"}], "usage"}``. Stream: one chunk per piece of
text (the same object, each choice's ``text`` the piece, ``finish_reason`` null), a last chunk
with the finish reason, with ``stream_options.include_usage`` a usage-only chunk whose
``choices`` is empty, and ``data: [DONE]``. The directive is read from the prompt.
"""

from __future__ import annotations

from typing import Any

import orjson

from bench.fake import openai
from bench.fake.incoming import Incoming, RequestShapeError, from_openai
from bench.fake.plan import CONTENT, TAIL, Plan

SSE_TYPE = openai.SSE_TYPE
stream_error = openai.stream_error
FINISH = {"stop": "stop", "length": "length", "tool_calls": "stop", "stop_sequence": "stop"}


def incoming(payload: Any) -> Incoming:
    """The request as a one-message chat, for the fake's counting and its directive."""
    if not isinstance(payload, dict):
        raise RequestShapeError("We could not parse the JSON body of your request.")
    prompt = payload.get("prompt")
    if isinstance(prompt, list):
        prompt = "\n".join(p for p in prompt if isinstance(p, str))
    if not isinstance(prompt, str):
        raise RequestShapeError("Missing required parameter: 'prompt'.", "prompt")
    suffix = payload.get("suffix")
    chat = {
        "model": payload.get("model"),
        "messages": [{"role": "user", "content": prompt + (suffix or "")}],
        "max_tokens": payload.get("max_tokens"),
        "stop": payload.get("stop"),
    }
    return from_openai(chat)


def _envelope(plan: Plan) -> dict[str, Any]:
    return {
        "id": f"cmpl-{plan.request_id}",
        "object": "text_completion",
        "created": plan.created,
        "model": plan.model,
        "system_fingerprint": openai.FINGERPRINT,
    }


def _usage(plan: Plan) -> dict[str, Any]:
    return {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": plan.completion_tokens,
        "total_tokens": plan.prompt_tokens + plan.completion_tokens,
    }


def render(plan: Plan, body: dict[str, Any]) -> bytes:
    choice = {"text": plan.text, "index": 0, "logprobs": None, "finish_reason": FINISH[plan.finish]}
    return orjson.dumps({**_envelope(plan), "choices": [choice], "usage": _usage(plan)})


def stream(plan: Plan, body: dict[str, Any]) -> list[tuple[int, bytes]]:
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    envelope = _envelope(plan)

    def chunk(text: str, finish: str | None) -> bytes:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**envelope, "choices": [choice]}) + b"\n\n"

    events = [(CONTENT, chunk(piece, None)) for piece in plan.pieces]
    events.append((TAIL, chunk("", FINISH[plan.finish])))
    if include_usage:
        last = {**envelope, "choices": [], "usage": _usage(plan)}
        events.append((TAIL, b"data: " + orjson.dumps(last) + b"\n\n"))
    events.append((TAIL, openai.DONE))
    return events
