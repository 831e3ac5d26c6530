"""Chat-completions replies and errors, both ways: a reply from an openai channel is the
internal shape already (it is checked); one converted from another protocol gets a
chat-completions id, time and the client's model name. Errors are mapped by status.
"""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError, UpstreamError, error_for_status
from gateway.protocols.base import Ctx
from gateway.types import JSON, ChatResponse

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
    if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
        raise UpstreamError("upstream sent a malformed chat completion")
    for i, choice in enumerate(payload["choices"]):
        _check_choice(choice, f"choices[{i}]")
    _check_usage(payload.get("usage"))
    return payload  # type: ignore[return-value]


def check_chunk(chunk: dict[str, JSON]) -> None:
    """A stream chunk from an openai channel, checked as ``decode_response`` checks a reply
    (UpstreamError naming the field)."""
    choices = chunk.get("choices")
    _check(choices is None or isinstance(choices, list), "choices")
    for i, choice in enumerate(choices or ()):
        where = f"choices[{i}]"
        _check(isinstance(choice, dict), where)
        _check(isinstance(choice.get("index", 0), int), f"{where}.index")
        _check(_optional_text(choice.get("finish_reason")), f"{where}.finish_reason")
        delta = choice.get("delta")
        if delta is None:
            continue
        _check(isinstance(delta, dict), f"{where}.delta")
        for name in ("content", "reasoning_content", "reasoning_signature", "refusal", "role"):
            _check(_optional_text(delta.get(name)), f"{where}.delta.{name}")
        calls = delta.get("tool_calls")
        _check(calls is None or isinstance(calls, list), f"{where}.delta.tool_calls")
        for j, call in enumerate(calls or ()):
            at = f"{where}.delta.tool_calls[{j}]"
            _check(isinstance(call, dict), at)
            _check(isinstance(call.get("index", 0), int), f"{at}.index")
            _check(_optional_text(call.get("id")), f"{at}.id")
            _check(_optional_text(call.get("thought_signature")), f"{at}.thought_signature")
            function = call.get("function")
            _check(function is None or isinstance(function, dict), f"{at}.function")
            for name in ("name", "arguments"):
                _check(_optional_text((function or {}).get(name)), f"{at}.function.{name}")
    _check_usage(chunk.get("usage"))


def _check_usage(usage: JSON) -> None:
    if usage is None:
        return
    _check(isinstance(usage, dict), "usage")
    for name in ("prompt_tokens_details", "completion_tokens_details"):
        _check(usage.get(name) is None or isinstance(usage[name], dict), f"usage.{name}")


def _check(ok: bool, where: str) -> None:
    if not ok:
        raise UpstreamError(f"upstream sent a malformed chat completion ({where})")


def _optional_text(value: JSON) -> bool:
    return value is None or isinstance(value, str)


def _check_choice(choice: JSON, where: str) -> None:
    """What the other protocols' encoders read of a choice has the type they expect: a
    reply from an openai channel becomes theirs without a second pass over it."""
    _check(isinstance(choice, dict), where)
    _check(_optional_text(choice.get("finish_reason")), f"{where}.finish_reason")
    msg = choice.get("message")
    if msg is None:
        return
    _check(isinstance(msg, dict), f"{where}.message")
    content = msg.get("content")
    _check(_optional_text(content) or isinstance(content, list), f"{where}.message.content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            at = f"{where}.message.content[{j}]"
            _check(isinstance(part, dict) and _optional_text(part.get("text")), at)
    for name in ("reasoning_content", "reasoning_signature", "refusal"):
        _check(_optional_text(msg.get(name)), f"{where}.message.{name}")
    calls = msg.get("tool_calls")
    if calls is None:
        return
    _check(isinstance(calls, list), f"{where}.message.tool_calls")
    for j, call in enumerate(calls):
        at = f"{where}.message.tool_calls[{j}]"
        _check(isinstance(call, dict), at)
        _check(_optional_text(call.get("thought_signature")), f"{at}.thought_signature")
        function = call.get("function")
        _check(isinstance(function, dict), f"{at}.function")
        _check(_optional_text(function.get("name")), f"{at}.function.name")
        _check(_optional_text(function.get("arguments")), f"{at}.function.arguments")


def encode_response(resp: ChatResponse, ctx: Ctx) -> JSON:
    resp["id"] = f"chatcmpl-{ctx.request_id}"
    resp["object"] = "chat.completion"
    resp["created"] = ctx.created
    resp["model"] = ctx.model
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
