"""What every console route reads of a request and how it answers: the request's session
(signed cookie, not signed out, and for a user, that user still enabled: ``session_of``), its
CSRF token (``csrf_ok``), the session cookie set on sign-in (``session_reply``) and cleared on
sign-out (``forget_session``), and JSON replies with the console's headers (``json_reply``,
``error_reply``, and ``locked_out``: the 429 of a sign-in past the failed-attempt limit).

The cookie's name follows the request's transport (``over_tls``): over TLS it is
``__Host-gw_console``, ``Secure``, ``Path=/`` and without ``Domain``, so no other host of the
domain and no plain-http page can set or overwrite it; over plain http (the demo, a gateway on
127.0.0.1) browsers refuse a ``__Host-`` cookie, so it is ``gw_console``. A request came over
TLS when the gateway itself saw https, or when its socket peer is one of ``trusted_proxies``
(the trust that decides whether X-Forwarded-For is believed: ``billing.ClientAddress``) and
says ``X-Forwarded-Proto: https``; from anyone else that header is ignored. Over TLS only the
``__Host-`` cookie is read (a plain-named one may have been planted over http); over plain http
either.

Apart from the routes (``console/__init__.py`` and ``console/users.py``) so that both use it.
"""

from __future__ import annotations

import hmac

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.operator.console.session import (
    COOKIE,
    CSRF_HEADER,
    HOST_COOKIE,
    LIFETIME,
    Session,
    Signer,
    key_sessions,
)
from gateway.operator.lockout import Lockout
from gateway.types import JSON

SECURITY_HEADERS = {
    "cache-control": "no-store",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


def json_reply(payload: JSON, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(payload),
        status_code=status,
        media_type="application/json",
        headers={**SECURITY_HEADERS, **(headers or {})},
    )


def error_reply(status: int, message: str, code: str) -> Response:
    error = {"message": message, "type": "console_error", "code": code}
    return json_reply({"error": error}, status)


def locked_out(lockout: Lockout, wait: int) -> Response:
    """A sign-in refused for too many failures (``operator/lockout.py``): 429, Retry-After."""
    resp = error_reply(429, lockout.message(wait), "too_many_attempts")
    resp.headers["retry-after"] = str(wait)
    return resp


def over_tls(request: Request) -> bool:
    """Whether the browser reached us over TLS: the gateway saw https itself, or a trusted
    proxy says so in X-Forwarded-Proto (every value of it https: a proxy that appends to what
    a client sent cannot make a plain request look secure)."""
    if request.url.scheme == "https":
        return True
    lines = request.headers.getlist("x-forwarded-proto")
    if not lines:
        return False
    gate = request.app.state.gateway.gate
    if not gate.address.from_proxy(request.scope.get("client")):
        return False
    values = [v.strip().lower() for line in lines for v in line.split(",") if v.strip()]
    return bool(values) and all(v == "https" for v in values)


def session_cookie(request: Request) -> str | None:
    """The session cookie the request carries: over TLS only the ``__Host-`` one, else the
    plain one or, failing it, the ``__Host-`` one."""
    if over_tls(request):
        return request.cookies.get(HOST_COOKIE)
    return request.cookies.get(COOKIE) or request.cookies.get(HOST_COOKIE)


def signer_of(request: Request) -> Signer:
    signer: Signer = request.app.state.console
    return signer


def session_of(request: Request) -> Session | None:
    """The request's console session, if any and not signed out (CSRF not checked: see
    ``csrf_ok``); a key's only if it was signed in after its key was last disabled (the
    key's revocation entry, ``key_sessions``); a user's only while that user is enabled and
    its sessions were not ended since (``Cache.user_session_ok``); none in an app without the
    console (the admin routes mounted on their own)."""
    signer: Signer | None = getattr(request.app.state, "console", None)
    if signer is None:
        return None
    session = signer.read(session_cookie(request))
    if session is None:
        return None
    cache = request.app.state.gateway.cache
    if cache.revoked(session.nonce):
        return None
    if session.role == "key" and session.expires <= cache.revoked_until(
        key_sessions(session.key_hash)
    ):
        return None  # signed in before its key was disabled: over for good
    if session.role == "user" and not cache.user_session_ok(session.user, session.expires):
        return None
    return session


def csrf_ok(request: Request, session: Session) -> bool:
    """Reads need nothing more; a change must carry the session's CSRF token."""
    if request.method in ("GET", "HEAD"):
        return True
    sent = request.headers.get(CSRF_HEADER, "")
    return hmac.compare_digest(sent, session.csrf(signer_of(request)))


def session_reply(request: Request, cookie: str, session: Session) -> Response:
    """A sign-in's answer: the role and CSRF token, the session in its cookie."""
    resp = json_reply({"role": session.role, "csrf": session.csrf(signer_of(request))})
    secure = over_tls(request)
    resp.set_cookie(
        HOST_COOKIE if secure else COOKIE,
        cookie,
        max_age=LIFETIME,
        path="/",
        httponly=True,
        samesite="strict",
        secure=secure,
    )
    return resp


def forget_session(resp: Response, request: Request) -> Response:
    """Sign-out's answer clears the cookie the browser holds: the ``__Host-`` one over TLS
    (its clearing must be ``Secure`` too, or the browser ignores it) and the plain one."""
    if over_tls(request):
        resp.delete_cookie(HOST_COOKIE, path="/", secure=True, httponly=True, samesite="strict")
    resp.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return resp
