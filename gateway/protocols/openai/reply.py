"""Chat-completions replies and errors, both ways: a reply from an openai channel is the
internal shape already (it is checked); one converted from another protocol gets a
chat-completions id, time and the client's model name. Errors are mapped by status.
"""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError, UpstreamError, error_for_status
from gateway.protocols.base import Ctx, count, usage_parts
from gateway.protocols.fields import REPLY
from gateway.types import JSON, ChatResponse, Usage

ERROR_CODES = {
    400: "invalid_request_error",
    401: "invalid_api_key",
    402: "insufficient_quota",
    403: "permission_denied",
    404: "model_not_found",
    413: "request_too_large",
    429: "rate_limit_exceeded",
    500: "internal_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_timeout",
}


def error_body(err: GatewayError) -> JSON:
    return {
        "error": {
            "message": err.message,
            "type": err.type,
            "param": None,
            "code": err.code or ERROR_CODES.get(err.status, err.type),
        }
    }


def decode_response(payload: JSON) -> ChatResponse:
    """A chat completion is the internal shape already: checked where the client encoders read
    it (choices, their message, tool calls, usage), not copied."""
    if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
        raise UpstreamError("upstream sent a malformed chat completion")
    for i, choice in enumerate(payload["choices"]):
        where = f"choices[{i}]"
        choice = REPLY.obj(choice, where)
        REPLY.opt_integer(choice.get("index"), where, "index")
        REPLY.opt_text(choice.get("finish_reason"), where, "finish_reason")
        message = REPLY.opt_obj(choice.get("message"), where, "message")
        if message is not None:
            check_message(message, f"{where}.message")
    check_usage(payload.get("usage"))
    return payload  # type: ignore[return-value]


def check_message(msg: dict[str, JSON], where: str) -> None:
    """An assistant message or a stream delta of an openai channel, where it is read."""
    content = msg.get("content")
    if isinstance(content, list):
        for k, part in enumerate(content):
            REPLY.opt_text(REPLY.obj(part, f"{where}.content", k).get("text"), where, "text")
    else:
        REPLY.opt_text(content, where, "content")
    for key in ("reasoning_content", "reasoning_signature", "refusal"):
        REPLY.opt_text(msg.get(key), where, key)
    calls = REPLY.opt_array(msg.get("tool_calls"), where, "tool_calls")
    for k, call in enumerate(calls):
        at = f"{where}.tool_calls[{k}]"
        call = REPLY.obj(call, at)
        REPLY.opt_integer(call.get("index"), at, "index")
        REPLY.opt_text(call.get("id"), at, "id")
        REPLY.opt_text(call.get("thought_signature"), at, "thought_signature")
        function = REPLY.opt_obj(call.get("function"), at, "function")
        if function is not None:
            REPLY.opt_text(function.get("name"), at, "function.name")
            REPLY.opt_text(function.get("arguments"), at, "function.arguments")


def check_usage(usage: JSON) -> None:
    """A usage object: its counts are read leniently (``count``), its details must be objects."""
    usage = REPLY.opt_obj(usage, "usage")
    if usage:
        REPLY.opt_obj(usage.get("prompt_tokens_details"), "usage", "prompt_tokens_details")
        details = usage.get("completion_tokens_details")
        REPLY.opt_obj(details, "usage", "completion_tokens_details")


def encode_usage(usage: Usage) -> Usage:
    """A converted reply's usage as chat completions reports it: ``prompt_tokens`` with the
    cache reads and writes in it, cache reads in ``prompt_tokens_details.cached_tokens``,
    reasoning in ``completion_tokens_details.reasoning_tokens`` (cache writes have no field
    of their own: the internal ``cache_creation_tokens`` is left out)."""
    parts = usage_parts(usage)
    out: Usage = {
        "prompt_tokens": parts.prompt,
        "completion_tokens": parts.completion,
        "total_tokens": count(usage.get("total_tokens")) or parts.prompt + parts.completion,
    }
    if parts.cache_read:
        out["prompt_tokens_details"] = {"cached_tokens": parts.cache_read}
    if parts.reasoning:
        out["completion_tokens_details"] = {"reasoning_tokens": parts.reasoning}
    return out


def encode_response(resp: ChatResponse, ctx: Ctx) -> JSON:
    resp["id"] = f"chatcmpl-{ctx.request_id}"
    resp["object"] = "chat.completion"
    resp["created"] = ctx.created
    resp["model"] = ctx.model
    usage = resp.get("usage")
    if usage:
        resp["usage"] = encode_usage(usage)
    return resp


def decode_error(status: int, raw: bytes) -> GatewayError:
    message = f"upstream returned HTTP {status}"
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        message = str(payload["error"].get("message") or message)
    elif isinstance(payload, dict) and isinstance(payload.get("message"), str):
        message = payload["message"]
    return error_for_status(status, message)


def stream_error(payload: JSON) -> GatewayError:
    """An error event inside a stream -> the gateway error (never retried: bytes were sent)."""
    err = payload.get("error")
    message = "upstream error"
    status = 502
    if isinstance(err, dict):
        message = str(err.get("message") or message)
        code = err.get("code")
        if isinstance(code, int) and 400 <= code < 600:
            status = code
        elif err.get("type") in ("rate_limit_error", "rate_limit_exceeded"):
            status = 429
    mapped = error_for_status(status, message)
    mapped.retryable = False  # bytes were already sent
    return mapped
