"""What AWS Bedrock's runtime says whatever the model's API (Converse, or Claude's Messages
body through ``invoke``): its paths (``/model/{id}/...``) and its errors, as HTTP replies and
inside event streams.

A model id goes into the path as one segment quoted only where a path needs it (an ARN's
``/`` is ``%2F``; ``:`` stays, as Anthropic's Bedrock SDK sends it): the form aiohttp sends a
URL in, so that the path is signed as it goes out (``gateway.upstream.sigv4``).

An HTTP error is ``{"message": ...}`` with the error's type in the ``x-amzn-errortype`` header
(``ValidationException:http://internal.amazon.com/coral/...``: the part before the first
colon; a body's ``__type``, ``com.amazon.coral.service#ThrottlingException``, where the header
is missing). Inside a stream an error is an event-stream message of type ``exception`` whose
``:exception-type`` is the same name in lower camel case (``throttlingException``); the
event-stream reader (``gateway.upstream.eventstream``) hands it over as an ``SSEEvent`` named
``EXCEPTION_PREFIX + type``.

Mapped by the error's type, else by status; never by message text:

| type                                                        | gateway                    |
|-------------------------------------------------------------|----------------------------|
| ThrottlingException                                         | 429 RateLimitError         |
| ServiceQuotaExceededException (the channel account's quota) | 429 RateLimitError         |
| ValidationException                                         | 400 InvalidRequestError    |
| ResourceNotFoundException                                   | 404 NotFoundError          |
| ModelNotReadyException, ServiceUnavailableException         | 503 UpstreamUnavailable    |
| ModelTimeoutException                                       | 504 UpstreamTimeoutError   |
| InternalServerException, ModelErrorException,               | 502 UpstreamError          |
| ModelStreamErrorException                                   |                            |
| AccessDeniedException, UnrecognizedClientException,         | 502, the channel's fault   |
| InvalidSignatureException, IncompleteSignatureException,    | (cooled down; never the    |
| MissingAuthenticationTokenException, ExpiredTokenException  | client's 401/403)          |

A credential failure's message is the gateway's own: AWS's may quote the canonical request,
whose headers include the session token.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import quote

import orjson

from gateway.errors import (
    GatewayError,
    InvalidRequestError,
    NotFoundError,
    RateLimitError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    error_for_status,
)
from gateway.protocols.sse import SSEEvent
from gateway.types import JSON

PATH_SAFE = "-._~!$&'()*+,;=:@"  # what a path segment may hold unquoted (RFC 3986 pchar)
EXCEPTION_PREFIX = "exception:"  # an SSEEvent name: an event-stream exception, its type after
ERROR_TYPE_HEADER = "x-amzn-errortype"
ERRORS: dict[str, Callable[[str], GatewayError]] = {
    "ThrottlingException": RateLimitError,
    "ServiceQuotaExceededException": RateLimitError,
    "ValidationException": InvalidRequestError,
    "ResourceNotFoundException": NotFoundError,
    "ModelNotReadyException": UpstreamUnavailableError,
    "ServiceUnavailableException": UpstreamUnavailableError,
    "ModelTimeoutException": UpstreamTimeoutError,
    "InternalServerException": UpstreamError,
    "ModelErrorException": UpstreamError,
    "ModelStreamErrorException": UpstreamError,
}
CREDENTIAL_ERRORS = frozenset(
    {
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidSignatureException",
        "IncompleteSignatureException",
        "MissingAuthenticationTokenException",
        "ExpiredTokenException",
    }
)


def model_path(model: str) -> str:
    """``/model/{id}``, the id quoted as one path segment."""
    return "/model/" + quote(model, safe=PATH_SAFE)


def error_type(value: object) -> str:
    """The bare error name of an ``x-amzn-errortype`` header, a body's ``__type`` or an
    ``:exception-type`` (upper camel case); "" when there is none."""
    if not isinstance(value, str) or not value:
        return ""
    name = value.split(":", 1)[0].rsplit("#", 1)[-1].strip()
    return name[:1].upper() + name[1:]


def error_of(status: int | None, etype: str, payload: JSON) -> GatewayError:
    """The gateway error for an error of type ``etype`` with body ``payload``; ``status`` is
    None inside a stream."""
    message = f"upstream returned HTTP {status}" if status else "upstream stream error"
    if isinstance(payload, dict):
        text = payload.get("message") or payload.get("Message")
        if isinstance(text, str) and text:
            message = text
    if etype in CREDENTIAL_ERRORS:
        return UpstreamError(
            f"upstream rejected the channel's credentials ({etype})", channel_fault=True
        )
    make = ERRORS.get(etype)
    if make is not None:
        return make(message)
    if status is not None:
        return error_for_status(status, message)
    return UpstreamError(message)


def decode_error(status: int, raw: bytes, header: str | None = None) -> GatewayError:
    """An HTTP error reply; ``header`` is its ``x-amzn-errortype`` (None when not given)."""
    try:
        payload = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        payload = None
    etype = error_type(header)
    if not etype and isinstance(payload, dict):
        etype = error_type(payload.get("__type"))
    return error_of(status, etype, payload)


def is_exception(event: SSEEvent) -> bool:
    name = event.event
    return name is not None and name.startswith(EXCEPTION_PREFIX)


def stream_error(event: SSEEvent) -> GatewayError:
    """An exception inside a stream -> the gateway error (never retried: bytes were sent)."""
    try:
        payload = orjson.loads(event.data) if event.data else None
    except orjson.JSONDecodeError:
        payload = None
    name = (event.event or "")[len(EXCEPTION_PREFIX) :]
    err = error_of(None, error_type(name), payload)
    err.retryable = False
    return err
