"""Generate-content replies, whole, both ways, and what replies and streams share: finish
reasons, usage, and errors (by HTTP status and google.rpc details, never by message).
402 is rendered FAILED_PRECONDITION and 413 INVALID_ARGUMENT (see ``GOOGLE_STATUS``).
"""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError, UpstreamError, error_for_status
from gateway.protocols.base import Ctx, count, usage_parts
from gateway.protocols.fields import REPLY
from gateway.protocols.gemini.contents import assistant_parts, part_deltas
from gateway.types import JSON, ChatMessage, ChatResponse, Choice, ToolCall, Usage

# Gemini finishReason -> chat finish_reason. A STOP with functionCall parts becomes tool_calls.
FINISH_FROM_GEMINI = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "IMAGE_PROHIBITED_CONTENT": "content_filter",
    "LANGUAGE": "content_filter",
    "MALFORMED_FUNCTION_CALL": "stop",
    "UNEXPECTED_TOOL_CALL": "stop",
    "TOO_MANY_TOOL_CALLS": "stop",
    "OTHER": "stop",
    "FINISH_REASON_UNSPECIFIED": "stop",
}
FINISH_TO_GEMINI = {
    "stop": "STOP",
    "length": "MAX_TOKENS",
    "content_filter": "SAFETY",
    "tool_calls": "STOP",
    "function_call": "STOP",
}

# HTTP status -> google.rpc status name. 402 (balance) is FAILED_PRECONDITION, not
# RESOURCE_EXHAUSTED: clients treat the latter as a rate limit and retry, and waiting does not
# refill a balance. 413 keeps its HTTP code with INVALID_ARGUMENT, Google's name for a body
# the API refuses. 502 (upstream failure) is UNAVAILABLE: the request may succeed later.
GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    402: "FAILED_PRECONDITION",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

# ErrorInfo reasons that mean the channel's own key is bad (fail over, cool the channel down).
CREDENTIAL_REASONS = frozenset({"API_KEY_INVALID", "API_KEY_EXPIRED"})


def error_body(err: GatewayError) -> JSON:
    name = GOOGLE_STATUS.get(err.status, "INTERNAL" if err.status >= 500 else "INVALID_ARGUMENT")
    return {"error": {"code": err.status, "message": err.message, "status": name}}


def error_from_payload(status: int, payload: JSON) -> GatewayError:
    """A Google error body ({"error": {code, message, status, details}}) -> GatewayError."""
    err = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(err, dict):
        return error_for_status(status, f"upstream returned HTTP {status}")
    message = err.get("message")
    if not isinstance(message, str) or not message:
        message = f"upstream returned HTTP {status}"
    details = err.get("details")
    reasons: set[str] = set()
    retry_after: float | None = None
    if isinstance(details, list):
        for detail in details:
            if not isinstance(detail, dict):
                continue
            kind = detail.get("@type", "")
            if isinstance(kind, str) and kind.endswith("google.rpc.ErrorInfo"):
                reason = detail.get("reason")
                if isinstance(reason, str):
                    reasons.add(reason)
            elif isinstance(kind, str) and kind.endswith("google.rpc.RetryInfo"):
                retry_after = _seconds(detail.get("retryDelay"))
    if reasons & CREDENTIAL_REASONS or err.get("status") == "FAILED_PRECONDITION":
        # FAILED_PRECONDITION: the project cannot use the API (billing, region): the channel's.
        return UpstreamError(
            f"upstream rejected the channel's credentials ({status})", channel_fault=True
        )
    gateway_err = error_for_status(status, message)
    if retry_after is not None:
        gateway_err.retry_after = retry_after
    return gateway_err


def _seconds(value: JSON) -> float | None:
    """google.protobuf.Duration in JSON ("30s", "1.5s") -> seconds."""
    if isinstance(value, str) and value.endswith("s"):
        try:
            return float(value[:-1])
        except ValueError:
            return None
    return None


def decode_usage(meta: JSON) -> Usage:
    """usageMetadata -> usage. completion_tokens includes thoughts (they are billed as output);
    toolUsePromptTokenCount is counted as prompt."""
    if not isinstance(meta, dict):
        raise UpstreamError("upstream usageMetadata is not an object")
    prompt = count(meta.get("promptTokenCount")) + count(meta.get("toolUsePromptTokenCount"))
    thoughts = count(meta.get("thoughtsTokenCount"))
    completion = count(meta.get("candidatesTokenCount")) + thoughts
    usage: Usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": count(meta.get("totalTokenCount")) or prompt + completion,
    }
    cached = count(meta.get("cachedContentTokenCount"))
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    if thoughts:
        usage["completion_tokens_details"] = {"reasoning_tokens": thoughts}
    return usage


def encode_usage(usage: Usage) -> JSON:
    """usage -> usageMetadata: promptTokenCount includes cachedContentTokenCount (and cache
    writes, which Gemini has no count for), candidatesTokenCount excludes thoughtsTokenCount."""
    parts = usage_parts(usage)
    prompt, completion = parts.prompt, parts.completion
    meta: JSON = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": completion - parts.reasoning,
        "totalTokenCount": count(usage.get("total_tokens")) or prompt + completion,
    }
    if parts.cache_read:
        meta["cachedContentTokenCount"] = parts.cache_read
    if parts.reasoning:
        meta["thoughtsTokenCount"] = parts.reasoning
    return meta


def decode_error(status: int, raw: bytes) -> GatewayError:
    try:
        payload = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        payload = None
    return error_from_payload(status, payload)


def finish_of(cand: dict[str, JSON], where: str) -> str | None:
    """A candidate's finishReason in chat terms (None: not finished)."""
    reason = REPLY.opt_text(cand.get("finishReason"), where, "finishReason")
    return FINISH_FROM_GEMINI.get(reason, "stop") if reason else None


def _decode_candidate(cand: JSON, calls: list[int], prefix: str) -> Choice:
    cand = REPLY.obj(cand, "candidates[]")
    msg: ChatMessage = {"role": "assistant", "content": None}
    texts: list[str] = []
    thoughts: list[str] = []
    tool_calls: list[ToolCall] = []
    content = cand.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    for delta in part_deltas(parts or [], calls, prefix):
        if "content" in delta:
            texts.append(delta["content"] or "")
        if "reasoning_content" in delta:
            thoughts.append(delta["reasoning_content"])
        if "reasoning_signature" in delta:
            msg["reasoning_signature"] = delta["reasoning_signature"]
        tool_calls.extend(delta.get("tool_calls") or ())
    msg["content"] = "".join(texts) if texts or not tool_calls else None
    if tool_calls:
        msg["tool_calls"] = tool_calls
    if thoughts:
        msg["reasoning_content"] = "".join(thoughts)
    finish = finish_of(cand, "candidates[]") or "stop"
    if finish == "stop" and tool_calls:
        finish = "tool_calls"
    return {"index": count(cand.get("index")), "message": msg, "finish_reason": finish}


def check_reply(payload: JSON) -> dict[str, JSON]:
    """A generate-content reply has its candidates, or the feedback of a prompt it blocked:
    an object with neither (``{}``) is no reply, and fails over like any garbage."""
    if not isinstance(payload, dict):
        raise UpstreamError("upstream reply is not a JSON object")
    if not isinstance(payload.get("candidates"), list) and not isinstance(
        payload.get("promptFeedback"), dict
    ):
        raise UpstreamError("upstream reply has neither candidates nor promptFeedback")
    return payload


def decode_response(payload: JSON) -> ChatResponse:
    payload = check_reply(payload)
    response_id = str(payload.get("responseId") or "")
    calls = [0]
    prefix = f"call_{response_id}_" if response_id else "call_"
    candidates = REPLY.opt_array(payload.get("candidates"), "candidates")
    choices = [_decode_candidate(c, calls, prefix) for c in candidates]
    feedback = payload.get("promptFeedback")
    if not choices and isinstance(feedback, dict) and feedback.get("blockReason"):
        choices = [
            {
                "index": 0,
                "message": {"role": "assistant", "content": ""},
                "finish_reason": "content_filter",
            }
        ]
    resp: ChatResponse = {
        "id": response_id,
        "object": "chat.completion",
        "created": 0,
        "model": str(payload.get("modelVersion") or ""),
        "choices": choices,
    }
    if "usageMetadata" in payload:
        resp["usage"] = decode_usage(payload["usageMetadata"])
    return resp


def encode_response(resp: ChatResponse, ctx: Ctx) -> JSON:
    candidates: list[JSON] = []
    for choice in resp.get("choices") or ():
        parts = assistant_parts(choice.get("message") or {}, upstream=False)
        candidate: JSON = {"content": {"parts": parts or [{"text": ""}], "role": "model"}}
        finish = choice.get("finish_reason")
        if finish:
            candidate["finishReason"] = FINISH_TO_GEMINI.get(finish, "OTHER")
        candidate["index"] = choice.get("index", 0)
        candidates.append(candidate)
    out: JSON = {"candidates": candidates}
    usage = resp.get("usage")
    if usage:
        out["usageMetadata"] = encode_usage(usage)
    out["modelVersion"] = ctx.model
    out["responseId"] = ctx.request_id
    return out
