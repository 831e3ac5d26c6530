"""The outcomes the gateway reports, one class per HTTP status.

    GatewayError(status, type, message)
    ├── InvalidRequestError         400  malformed JSON, a body the protocol rejects
    ├── AuthenticationError         401  missing, unknown, disabled or expired key
    ├── InsufficientBalanceError    402  account balance not above zero
    ├── PermissionDeniedError       403  upstream refused the client's request (not credentials)
    ├── NotFoundError               404  model, channel or path
    │   └── UnknownURLError         404  a path or generate-content action the gateway lacks
    ├── MethodNotAllowedError       405  a known path with another method (``allow``)
    ├── PayloadTooLargeError        413  body over the configured limit
    ├── RateLimitError              429  upstream rate limit after retries
    ├── InternalError               500  a bug of ours
    ├── UpstreamError               502  upstream failure, bad reply, bad channel credentials
    ├── UpstreamUnavailableError    503  upstream overloaded, or every channel cooling down
    │   └── GatewayOverloadedError  503  this process ran out of sockets: not the channel's fault
    └── UpstreamTimeoutError        504  upstream did not answer in time

Errors are raised deep and rendered at the edge by the client protocol's adapter
(``Adapter.encode_error``), so each SDK raises its own typed error. ``retryable`` tells the
relay whether another channel may be tried (only before the first byte reached the client);
``channel_fault`` marks a failure of the channel itself (bad credentials), which cools it down.
"""

from __future__ import annotations


class GatewayError(Exception):
    status: int = 500
    type: str = "api_error"
    code: str | None = None  # a machine-readable code where the status alone is ambiguous
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        retryable: bool | None = None,
        channel_fault: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if retryable is not None:
            self.retryable = retryable
        self.channel_fault = channel_fault
        self.retry_after = retry_after


class InvalidRequestError(GatewayError):
    status = 400
    type = "invalid_request_error"


class AuthenticationError(GatewayError):
    status = 401
    type = "authentication_error"


class InsufficientBalanceError(GatewayError):
    status = 402
    type = "insufficient_balance"


class PermissionDeniedError(GatewayError):
    status = 403
    type = "permission_error"


class NotFoundError(GatewayError):
    status = 404
    type = "not_found_error"


class UnknownURLError(NotFoundError):
    """Not a missing model: clients report ``model_not_found`` as one."""

    code = "unknown_url"


class MethodNotAllowedError(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"

    def __init__(self, message: str, *, allow: tuple[str, ...]) -> None:
        super().__init__(message)
        self.allow = allow


class RequestTimeoutError(GatewayError):
    """408: the client did not send its request body in time."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLargeError(GatewayError):
    status = 413
    type = "request_too_large"


class RateLimitError(GatewayError):
    status = 429
    type = "rate_limit_error"
    retryable = True


class InternalError(GatewayError):
    status = 500
    type = "api_error"


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"
    retryable = True


class UpstreamUnavailableError(GatewayError):
    status = 503
    type = "overloaded_error"
    retryable = True


class GatewayOverloadedError(UpstreamUnavailableError):
    """The gateway itself could not open a connection (no file descriptors, no ports left):
    neither retried elsewhere nor counted against the channel."""

    retryable = False


class UpstreamTimeoutError(GatewayError):
    status = 504
    type = "timeout_error"
    retryable = True


def error_for_status(status: int, message: str) -> GatewayError:
    """The gateway error for an upstream HTTP status (used by every adapter's decode_error).

    Client mistakes (400, 404, 413, 422) pass through with their status and are not retried;
    the channel's own credentials failing (401, 403) is the gateway's problem, never the
    client's 401: it becomes a retryable 502 that cools the channel down.
    """
    if status in (401, 403):
        return UpstreamError(
            f"upstream rejected the channel's credentials ({status})", channel_fault=True
        )
    if status == 429:
        return RateLimitError(message)
    if status == 404:
        return NotFoundError(message)
    if status == 413:
        return PayloadTooLargeError(message)
    if status == 408:
        return UpstreamTimeoutError(message)
    if 400 <= status < 500:
        return InvalidRequestError(message)
    if status == 503 or status == 529:
        return UpstreamUnavailableError(message)
    if status == 504:
        return UpstreamTimeoutError(message)
    return UpstreamError(message)
