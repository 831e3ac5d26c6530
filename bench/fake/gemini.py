"""Gemini generateContent wire format: the reply, the stream in both framings, the error body.

Every stream element is a whole ``GenerateContentResponse`` holding only the new parts: thought
parts (``thought: true``, the last with ``thoughtSignature``), one text part per piece, then one
element with every ``functionCall`` (complete ``args``; the first carries the signature too
when there was thinking, or the reply's ``call_signature``). The last element has
``finishReason`` and the full ``usageMetadata``; earlier ones carry only the prompt count.
``?alt=sse`` frames elements as ``data: {...}\\r\\n\\r\\n``; without it the body is one JSON
array written element by element.
An error after the start is an element ``{"error": {...}}``.
"""

from __future__ import annotations

from typing import Any

import orjson

from bench.fake.plan import CONTENT, TAIL, Plan

SSE_TYPE = "text/event-stream"
JSON_TYPE = "application/json; charset=UTF-8"
FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP", "stop_sequence": "STOP"}
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
CODES = {status: code for code, status in STATUSES.items()}
MESSAGES = {
    400: "Request contains an invalid argument.",
    403: "The caller does not have permission",
    404: "Requested entity was not found.",
    429: "Resource has been exhausted (e.g. check quota).",
    500: "An internal error has occurred. Please retry.",
    503: "The model is overloaded. Please try again later.",
    504: "Deadline expired before operation could complete.",
}
MISSING_KEY = (
    "Method doesn't allow unregistered callers (callers without established identity). "
    "Please use API Key or other form of API consumer identity to call this API."
)
BAD_KEY = "API key not valid. Please pass a valid API key."
SEPARATOR = b"\r\n,\r\n"


def error_payload(
    status: int,
    error_status: str | None = None,
    message: str | None = None,
    *,
    reason: str | None = None,
    retry_after: int | None = None,
) -> dict[str, Any]:
    error: dict[str, Any] = {
        "code": status,
        "message": message or MESSAGES.get(status, "An internal error has occurred."),
        "status": error_status or STATUSES.get(status, "UNKNOWN"),
    }
    details: list[dict[str, Any]] = []
    if reason is not None:
        details.append(
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": reason,
                "domain": "googleapis.com",
                "metadata": {"service": "generativelanguage.googleapis.com"},
            }
        )
    if retry_after is not None:
        details.append(
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{retry_after}s"}
        )
    if details:
        error["details"] = details
    return {"error": error}


def usage(plan: Plan) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "promptTokenCount": plan.prompt_tokens,
        "candidatesTokenCount": plan.completion_tokens - plan.reasoning_tokens,
        "totalTokenCount": plan.prompt_tokens + plan.completion_tokens,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": plan.prompt_tokens}],
    }
    if plan.reasoning_tokens:
        meta["thoughtsTokenCount"] = plan.reasoning_tokens
    if plan.cached_tokens:
        meta["cachedContentTokenCount"] = plan.cached_tokens
    return meta


def _calls(plan: Plan) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for i, call in enumerate(plan.tool_calls):
        part: dict[str, Any] = {
            "functionCall": {"name": call.name, "args": orjson.loads(call.arguments)}
        }
        if i == 0 and plan.call_signature:
            part["thoughtSignature"] = plan.call_signature
        parts.append(part)
    return parts


def _response(plan: Plan, parts: list[dict[str, Any]], final: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if final:
        candidate["finishReason"] = FINISH[plan.finish]
    return {
        "candidates": [candidate],
        "usageMetadata": usage(plan)
        if final
        else {"promptTokenCount": plan.prompt_tokens, "totalTokenCount": plan.prompt_tokens},
        "modelVersion": plan.model,
        "responseId": plan.request_id,
    }


def render(plan: Plan) -> bytes:
    parts: list[dict[str, Any]] = []
    if plan.reasoning:
        parts.append({"text": plan.reasoning, "thought": True, "thoughtSignature": plan.signature})
    if plan.text or not plan.tool_calls:
        parts.append({"text": plan.text})
    parts.extend(_calls(plan))
    return orjson.dumps(_response(plan, parts, final=True))


def _elements(plan: Plan) -> list[list[dict[str, Any]]]:
    elements: list[list[dict[str, Any]]] = []
    last = len(plan.reasoning_pieces) - 1
    for i, piece in enumerate(plan.reasoning_pieces):
        part: dict[str, Any] = {"text": piece, "thought": True}
        if i == last:
            part["thoughtSignature"] = plan.signature
        elements.append([part])
    elements.extend([{"text": piece}] for piece in plan.pieces)
    if plan.tool_calls:
        elements.append(_calls(plan))
    if not plan.pieces and not plan.tool_calls:
        elements.append([{"text": ""}])
    return elements


def stream(plan: Plan, sse: bool) -> list[tuple[int, bytes]]:
    elements = _elements(plan)
    last = len(elements) - 1
    bodies = [orjson.dumps(_response(plan, parts, i == last)) for i, parts in enumerate(elements)]
    if sse:
        return [(CONTENT, b"data: " + body + b"\r\n\r\n") for body in bodies]
    events = [(CONTENT, (b"[" if i == 0 else SEPARATOR) + body) for i, body in enumerate(bodies)]
    events.append((TAIL, b"\r\n]"))
    return events


def stream_error(error_status: str | None, message: str | None, written: int, sse: bool) -> bytes:
    code = CODES.get(error_status or "", 503) if error_status else 503
    body = orjson.dumps(error_payload(code, error_status, message))
    if sse:
        return b"data: " + body + b"\r\n\r\n"
    return (b"[" if written == 0 else SEPARATOR) + body + b"\r\n]"
