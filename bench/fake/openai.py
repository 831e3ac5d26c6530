"""OpenAI chat-completions wire format: the reply body, the stream chunks and the error body.

Stream: a first chunk with the role, one chunk per piece (``reasoning_content``, ``content``,
tool-call deltas with ``index``, the ``id`` and name only on a call's first delta, arguments
spread over several deltas), a chunk with ``finish_reason``, then with
``stream_options.include_usage`` a usage-only chunk whose ``choices`` is empty (every earlier
chunk then carries ``"usage": null``), and ``data: [DONE]``. An error after the start is a
``data: {"error": {...}}`` event with no ``[DONE]`` after it.
"""

from __future__ import annotations

from typing import Any

import orjson

from bench.fake.plan import CONTENT, HEAD, TAIL, Plan

SSE_TYPE = "text/event-stream; charset=utf-8"
DONE = b"data: [DONE]\n\n"
FINGERPRINT = "fp_fake"
FINISH = {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "stop_sequence": "stop"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "requests",
}
ERROR_CODES = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}
ERROR_MESSAGES = {
    400: "Invalid request.",
    401: "Incorrect API key provided.",
    403: "You are not allowed to use this model.",
    404: "The model does not exist or you do not have access to it.",
    429: "Rate limit reached for requests. Please try again in 1s.",
    500: "The server had an error while processing your request. Sorry about that!",
    503: "The engine is currently overloaded, please try again later.",
}
MISSING_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization "
    "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)


def error_payload(
    status: int,
    error_type: str | None = None,
    message: str | None = None,
    code: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    return {
        "error": {
            "message": message or ERROR_MESSAGES.get(status, "The server had an error."),
            "type": error_type or ERROR_TYPES.get(status, "server_error"),
            "param": param,
            "code": code if code is not None else ERROR_CODES.get(status),
        }
    }


def usage(plan: Plan) -> dict[str, Any]:
    return {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": plan.completion_tokens,
        "total_tokens": plan.prompt_tokens + plan.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": plan.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": plan.reasoning_tokens,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def render(plan: Plan) -> bytes:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": plan.text if plan.text or not plan.tool_calls else None,
        "refusal": None,
        "annotations": [],
    }
    if plan.reasoning:
        message["reasoning_content"] = plan.reasoning
    if plan.tool_calls:
        message["tool_calls"] = [
            _tool_call(f"call_{c.id}", c.name, c.arguments) for c in plan.tool_calls
        ]
    return orjson.dumps(
        {
            "id": f"chatcmpl-{plan.request_id}",
            "object": "chat.completion",
            "created": plan.created,
            "model": plan.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": FINISH[plan.finish],
                }
            ],
            "usage": usage(plan),
            "service_tier": "default",
            "system_fingerprint": FINGERPRINT,
        }
    )


def stream(plan: Plan, include_usage: bool) -> list[tuple[int, bytes]]:
    # The envelope around each delta is the same bytes every time: build it once.
    envelope: dict[str, Any] = {
        "id": f"chatcmpl-{plan.request_id}",
        "object": "chat.completion.chunk",
        "created": plan.created,
        "model": plan.model,
        "service_tier": "default",
        "system_fingerprint": FINGERPRINT,
        "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": None}],
    }
    if include_usage:
        envelope["usage"] = None
    prefix, _, suffix = orjson.dumps(envelope).partition(b'"delta":{}')
    prefix = b"data: " + prefix + b'"delta":'

    def chunk(delta: dict[str, Any]) -> bytes:
        return prefix + orjson.dumps(delta) + suffix + b"\n\n"

    events = [(HEAD, chunk({"role": "assistant", "content": "", "refusal": None}))]
    events += [(CONTENT, chunk({"reasoning_content": p})) for p in plan.reasoning_pieces]
    events += [(CONTENT, chunk({"content": p})) for p in plan.pieces]
    for i, call in enumerate(plan.tool_calls):
        first = _tool_call(f"call_{call.id}", call.name, "")
        events.append((CONTENT, chunk({"tool_calls": [{"index": i, **first}]})))
        for piece in call.pieces:
            delta = {"tool_calls": [{"index": i, "function": {"arguments": piece}}]}
            events.append((CONTENT, chunk(delta)))
    final = dict(envelope)
    final["choices"] = [
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": FINISH[plan.finish]}
    ]
    events.append((TAIL, b"data: " + orjson.dumps(final) + b"\n\n"))
    if include_usage:
        last = dict(envelope)
        last["choices"] = []
        last["usage"] = usage(plan)
        events.append((TAIL, b"data: " + orjson.dumps(last) + b"\n\n"))
    events.append((TAIL, DONE))
    return events


def stream_error(error_type: str | None, message: str | None, written: int) -> bytes:
    payload = error_payload(500, error_type, message)
    return b"data: " + orjson.dumps(payload) + b"\n\n"
