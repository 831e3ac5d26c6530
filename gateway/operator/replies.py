"""The admin API's replies: JSON with ``cache-control: no-store``, and errors in the OpenAI
shape ``{"error": {"message", "type", "code"}}`` (``admin.py`` and ``audit_api.py``)."""

from __future__ import annotations

import orjson
from starlette.responses import Response

from gateway.errors import GatewayError
from gateway.types import JSON

ERROR_CODES = {
    400: "invalid_request",
    401: "invalid_admin_token",
    403: "csrf",
    404: "not_found",
    408: "request_timeout",
    409: "already_exists",
    413: "request_too_large",
    429: "too_many_attempts",
    500: "internal_error",
    503: "store_unavailable",
}


def json_response(payload: JSON, status: int = 200) -> Response:
    # no-store: a reply may carry a key's only showing, or balances that change
    return Response(
        orjson.dumps(payload),
        status_code=status,
        media_type="application/json",
        headers={"cache-control": "no-store"},
    )


def error_response(err: GatewayError) -> Response:
    body = {
        "error": {
            "message": err.message,
            "type": err.type,
            "code": err.code or ERROR_CODES.get(err.status),
        }
    }
    resp = json_response(body, err.status)
    if err.status == 401:
        resp.headers["www-authenticate"] = "Bearer"
    return resp
