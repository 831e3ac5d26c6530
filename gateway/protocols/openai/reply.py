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
    return payload  # type: ignore[return-value]


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
