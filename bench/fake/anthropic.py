"""Anthropic Messages wire format: the reply body, the event stream and the error body.

Stream order: ``message_start``; then per content block (thinking, redacted thinking, text,
each tool_use, with contiguous indices) ``content_block_start``, its deltas
(``thinking_delta`` then one ``signature_delta``; ``text_delta``; ``input_json_delta``
pieces) and ``content_block_stop``; a ``ping`` after the first block starts;
``message_delta`` with ``stop_reason`` and the usage; ``message_stop``. An error after the
start is ``event: error`` with the error body.
"""

from __future__ import annotations

from typing import Any

import orjson

from bench.fake.plan import CONTENT, HEAD, TAIL, Plan

SSE_TYPE = "text/event-stream; charset=utf-8"
STOP_REASON = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "stop_sequence": "stop_sequence",
}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
ERROR_MESSAGES = {
    400: "Invalid request.",
    401: "invalid x-api-key",
    403: "Your API key does not have permission to use the specified resource.",
    404: "The requested resource could not be found.",
    413: "Request exceeds the maximum allowed number of bytes.",
    429: "Number of request tokens has exceeded your per-minute rate limit.",
    500: "Internal server error",
    529: "Overloaded",
}
PING = b'event: ping\ndata: {"type": "ping"}\n\n'
MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def error_payload(
    status: int, error_type: str | None, message: str | None, request_id: str = "req_fake"
) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {
            "type": error_type or ERROR_TYPES.get(status, "api_error"),
            "message": message or ERROR_MESSAGES.get(status, "Internal server error"),
        },
        "request_id": request_id,
    }


def usage(plan: Plan) -> dict[str, Any]:
    """Anthropic's usage object: the cache writes in all, and by lifetime in
    ``cache_creation`` (5 minutes, or an hour where a breakpoint asked ``ttl: "1h"``)."""
    hour = plan.cache_write_1h_tokens
    return {
        "input_tokens": plan.prompt_tokens - plan.cached_tokens - plan.cache_write_tokens,
        "cache_creation_input_tokens": plan.cache_write_tokens,
        "cache_read_input_tokens": plan.cached_tokens,
        "cache_creation": {
            "ephemeral_5m_input_tokens": plan.cache_write_tokens - hour,
            "ephemeral_1h_input_tokens": hour,
        },
        "output_tokens": plan.completion_tokens,
        "service_tier": "standard",
    }


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _message(plan: Plan, content: list[dict[str, Any]], final: bool) -> dict[str, Any]:
    return {
        "id": f"msg_{plan.request_id}",
        "type": "message",
        "role": "assistant",
        "model": plan.model,
        "content": content,
        "stop_reason": STOP_REASON[plan.finish] if final else None,
        "stop_sequence": plan.stop_sequence if final else None,
        "usage": usage(plan) if final else {**usage(plan), "output_tokens": 1},
    }


def render(plan: Plan) -> bytes:
    content: list[dict[str, Any]] = []
    if plan.reasoning:
        content.append(
            {"type": "thinking", "thinking": plan.reasoning, "signature": plan.signature}
        )
    if plan.redacted:
        content.append({"type": "redacted_thinking", "data": plan.redacted})
    if plan.text or not plan.tool_calls:
        content.append({"type": "text", "text": plan.text})
    for call in plan.tool_calls:
        content.append(
            {
                "type": "tool_use",
                "id": f"toolu_{call.id}",
                "name": call.name,
                "input": orjson.loads(call.arguments),
            }
        )
    return orjson.dumps(_message(plan, content, final=True))


def stream(plan: Plan) -> list[tuple[int, bytes]]:
    events = [
        (
            HEAD,
            _event(
                "message_start", {"type": "message_start", "message": _message(plan, [], False)}
            ),
        )
    ]
    index = 0

    def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> None:
        nonlocal index
        events.append(
            (
                HEAD,
                _event(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": start},
                ),
            )
        )
        if index == 0:
            events.append((HEAD, PING))
        for delta in deltas:
            payload = {"type": "content_block_delta", "index": index, "delta": delta}
            kind = HEAD if delta.get("partial_json") == "" else CONTENT
            events.append((kind, _event("content_block_delta", payload)))
        stop = {"type": "content_block_stop", "index": index}
        events.append((HEAD, _event("content_block_stop", stop)))
        index += 1

    if plan.reasoning:
        deltas = [{"type": "thinking_delta", "thinking": p} for p in plan.reasoning_pieces]
        deltas.append({"type": "signature_delta", "signature": plan.signature})
        block({"type": "thinking", "thinking": "", "signature": ""}, deltas)
    if plan.redacted:
        block({"type": "redacted_thinking", "data": plan.redacted}, [])
    if plan.text or not plan.tool_calls:
        block(
            {"type": "text", "text": ""},
            [{"type": "text_delta", "text": p} for p in plan.pieces],
        )
    for call in plan.tool_calls:
        start = {"type": "tool_use", "id": f"toolu_{call.id}", "name": call.name, "input": {}}
        pieces = ("", *call.pieces)
        block(start, [{"type": "input_json_delta", "partial_json": p} for p in pieces])
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": STOP_REASON[plan.finish], "stop_sequence": plan.stop_sequence},
        "usage": usage(plan),
    }
    events.append((TAIL, _event("message_delta", delta)))
    events.append((TAIL, MESSAGE_STOP))
    return events


def stream_error(error_type: str | None, message: str | None, written: int) -> bytes:
    return _event("error", error_payload(529, error_type, message))
