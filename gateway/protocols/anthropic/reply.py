"""Messages API replies, whole, both ways, and the mappings replies and streams share: stop
reasons, usage, error types (by status and Anthropic's error type, never by message), and an
assistant turn's blocks (built here for replies and for requests' histories alike).
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from gateway.errors import (
    GatewayError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    error_for_status,
)
from gateway.protocols.base import Ctx, count, usage_parts
from gateway.protocols.fields import REPLY, REQUEST, Reader
from gateway.types import JSON, ChatMessage, ChatResponse, ToolCall, Usage

FINISH_REASONS = {  # Anthropic stop_reason -> chat finish_reason
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
STOP_REASONS = {  # chat finish_reason -> Anthropic stop_reason
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
ERROR_TYPES = {  # gateway status -> Anthropic error type (what its SDKs raise on)
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


# mappings -----------------------------------------------------------------------------------
def finish_reason(stop_reason: JSON) -> str:
    return FINISH_REASONS.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def stop_reason(finish: JSON) -> str:
    return STOP_REASONS.get(finish, "end_turn") if isinstance(finish, str) else "end_turn"


def decode_usage(usage: JSON) -> Usage:
    """Anthropic usage -> chat usage; prompt tokens include cache reads and cache writes, and
    the writes those written for an hour (``cache_creation.ephemeral_1h_input_tokens``), which
    cost more (cut to the writes where they are billed, ``Metered.classified``)."""
    if not isinstance(usage, dict):
        return {}
    fresh = count(usage.get("input_tokens"))
    read = count(usage.get("cache_read_input_tokens"))
    created = count(usage.get("cache_creation_input_tokens"))
    output = count(usage.get("output_tokens"))
    out: Usage = {
        "prompt_tokens": fresh + read + created,
        "completion_tokens": output,
        "total_tokens": fresh + read + created + output,
    }
    if read:
        out["prompt_tokens_details"] = {"cached_tokens": read}
    if created:
        out["cache_creation_tokens"] = created
        by_ttl = usage.get("cache_creation")
        hour = count(by_ttl.get("ephemeral_1h_input_tokens")) if isinstance(by_ttl, dict) else 0
        if hour > 0:
            out["cache_creation_1h_tokens"] = hour
    return out


def encode_usage(usage: Usage | None, input_estimate: int = 0) -> dict[str, int]:
    """Chat usage -> Anthropic usage (input tokens exclude cache reads and writes)."""
    if not usage:
        return {
            "input_tokens": input_estimate,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 0,
        }
    parts = usage_parts(usage)
    return {
        "input_tokens": parts.fresh,
        "cache_creation_input_tokens": parts.cache_write,
        "cache_read_input_tokens": parts.cache_read,
        "output_tokens": parts.completion,
    }


def error_body(err: GatewayError) -> JSON:
    etype = ERROR_TYPES.get(err.status)
    if etype is None:
        etype = "invalid_request_error" if 400 <= err.status < 500 else "api_error"
    return {"type": "error", "error": {"type": etype, "message": err.message}}


def decode_error_payload(status: int | None, payload: JSON) -> GatewayError:
    """An Anthropic error body (HTTP reply, or an in-stream ``error`` event when ``status`` is
    None) -> the gateway error. By status, adjusted by Anthropic's error type; never by message.
    """
    etype = None
    message = f"upstream returned HTTP {status}" if status else "upstream stream error"
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict):
        etype = err.get("type")
        if isinstance(err.get("message"), str) and err["message"]:
            message = err["message"]
    if etype in ("authentication_error", "permission_error", "billing_error"):
        return UpstreamError(
            f"upstream rejected the channel's credentials ({status or etype})", channel_fault=True
        )
    if etype == "overloaded_error":
        return UpstreamUnavailableError(message)
    if etype == "rate_limit_error":
        return RateLimitError(message)
    if etype == "timeout_error":
        return UpstreamTimeoutError(message)
    if status is not None:
        return error_for_status(status, message)
    if etype == "invalid_request_error":
        return InvalidRequestError(message)
    if etype == "not_found_error":
        return NotFoundError(message)
    if etype == "request_too_large":
        return PayloadTooLargeError(message)
    return UpstreamError(message)


def decode_error(status: int, raw: bytes) -> GatewayError:
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        payload = None
    return decode_error_payload(status, payload)


def stream_error(data: bytes) -> GatewayError:
    """An ``error`` event inside a stream -> the gateway error (never retried: bytes were
    sent)."""
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        payload = None
    err = decode_error_payload(None, payload)
    err.retryable = False
    return err


# whole replies ---------------------------------------------------------------------------
def decode_assistant_blocks(content: JSON, where: str, fields: Reader = REQUEST) -> ChatMessage:
    """An assistant turn's blocks (a request's history, or a reply when ``fields`` is
    ``REPLY``) -> a chat assistant message."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    thinking: list[str] = []
    signature = None
    redacted: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(content):
        btype = block.get("type") if isinstance(block, dict) else None
        at = f"{where}.{j}"
        if btype == "text":
            texts.append(fields.opt_text(block.get("text"), at, "text") or "")
        elif btype == "tool_use":
            tool_input = fields.opt_obj(block.get("input"), at, "input")
            calls.append(
                {
                    "id": fields.opt_text(block.get("id"), at, "id") or "",
                    "type": "function",
                    "function": {
                        "name": fields.opt_text(block.get("name"), at, "name") or "",
                        "arguments": orjson.dumps(tool_input or {}).decode(),
                    },
                }
            )
        elif btype == "thinking":
            thinking.append(fields.opt_text(block.get("thinking"), at, "thinking") or "")
            block_signature = fields.opt_text(block.get("signature"), at, "signature")
            if block_signature:
                signature = block_signature
        elif btype == "redacted_thinking":
            redacted.append(fields.opt_text(block.get("data"), at, "data") or "")
        elif btype is None:
            raise fields.bad(at, "type", "a content block type")
    msg: ChatMessage = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        msg["tool_calls"] = calls
    if any(thinking):
        msg["reasoning_content"] = "".join(thinking)
    if signature:
        msg["reasoning_signature"] = signature
    if redacted:
        msg["redacted_reasoning"] = redacted
    if msg["content"] is None and not calls:
        msg["content"] = ""
    return msg


def decode_message(payload: JSON) -> ChatResponse:
    if not isinstance(payload, dict) or not isinstance(payload.get("content"), list):
        raise UpstreamError("upstream sent a malformed message")
    msg = decode_assistant_blocks(payload["content"], "content", REPLY)
    if msg.get("content") == "" and msg.get("tool_calls"):
        msg["content"] = None
    return {
        "id": str(payload.get("id") or ""),
        "object": "chat.completion",
        "created": 0,
        "model": str(payload.get("model") or ""),
        "choices": [
            {"index": 0, "message": msg, "finish_reason": finish_reason(payload.get("stop_reason"))}
        ],
        "usage": decode_usage(payload.get("usage")),
    }


def _call_signature(calls: list[ToolCall] | None) -> str | None:
    """A Gemini thoughtSignature on a function call has no place on a tool_use block; it rides
    in a thinking block (empty text) so that it comes back as ``reasoning_signature``."""
    for call in calls if isinstance(calls, list) else ():
        if isinstance(call, dict) and isinstance(call.get("thought_signature"), str):
            return call["thought_signature"]
    return None


def assistant_blocks(
    msg: ChatMessage,
    content: list[JSON],
    thinking: str | None,
    signature: str | None,
    bad_arguments: Callable[[int], GatewayError],
    fields: Reader = REQUEST,
    where: str = "",
) -> list[JSON]:
    """An assistant turn's blocks in the order Messages gives them: thinking (when it has text
    or a signature), redacted thinking, ``content`` (its text, media), the refusal, tool uses.
    ``bad_arguments(k)`` is raised when tool call ``k``'s arguments are not JSON; a field of the
    wrong type raises ``fields``' error, named from ``where`` (the message)."""
    blocks: list[JSON] = []
    thinking = fields.opt_text(thinking, where, "reasoning_content")
    signature = fields.opt_text(signature, where, "reasoning_signature")
    if thinking or signature:
        blocks.append(
            {"type": "thinking", "thinking": thinking or "", "signature": signature or ""}
        )
    redacted = fields.opt_array(msg.get("redacted_reasoning"), where, "redacted_reasoning")
    for k, data in enumerate(redacted):
        blocks.append({"type": "redacted_thinking", "data": fields.text(data, where, k)})
    blocks.extend(content)
    refusal = fields.opt_text(msg.get("refusal"), where, "refusal")
    if refusal:
        blocks.append({"type": "text", "text": refusal})
    calls = fields.opt_array(msg.get("tool_calls"), where, "tool_calls")
    for k, call in enumerate(calls):
        at = f"{where}.tool_calls[{k}]"
        call = fields.obj(call, at)
        function = fields.opt_obj(call.get("function"), at, "function") or {}
        arguments = fields.opt_text(function.get("arguments"), at, "function.arguments")
        try:
            args = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError:
            raise bad_arguments(k) from None
        blocks.append(
            {
                "type": "tool_use",
                "id": fields.opt_text(call.get("id"), at, "id") or "",
                "name": fields.opt_text(function.get("name"), at, "function.name") or "",
                "input": args if isinstance(args, dict) else {},
            }  # fmt: skip
        )
    return blocks


def _bad_reply_arguments(k: int) -> GatewayError:
    return UpstreamError("upstream returned tool arguments that are not JSON")


def encode_message(resp: ChatResponse, ctx: Ctx) -> JSON:
    choices = resp.get("choices") or []
    if not choices:
        raise UpstreamError("upstream sent a reply without choices")
    msg = choices[0].get("message") or {}
    text = msg.get("content")
    if isinstance(text, list):
        text = "".join(
            p["text"] for p in text if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    content = assistant_blocks(
        msg,
        [{"type": "text", "text": REPLY.text(text, "message", "content")}] if text else [],
        msg.get("reasoning_content"),
        msg.get("reasoning_signature") or _call_signature(msg.get("tool_calls")),
        _bad_reply_arguments,
        REPLY,
        "message",
    )
    return {
        "id": f"msg_{ctx.request_id}",
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": content,
        "stop_reason": stop_reason(choices[0].get("finish_reason")),
        "stop_sequence": None,
        "usage": encode_usage(resp.get("usage"), ctx.prompt_tokens_estimate),
    }
