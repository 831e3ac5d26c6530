"""The model square's try-it box for a key the page does not hold: ``POST /console/try``.

A key's secret is shown once, when it is made, and kept only as its hash, so the console cannot
fill in a key made in another tab or last week. A signed-in user (or a key's own session)
names one of its keys by id instead, and the console relays one small chat for it:

``{key, model, message}`` -> ``{reply, model, usage, request_id}``

The chat goes through the client surface in process (``Services.client_surface``), as
``POST /v1/chat/completions`` from the same client address, authenticated as that key by its
hash (``policy.gate.CONSOLE_KEY``): the key's group, models, allowed IPs, quota and balance
hold, and it is billed and recorded like any call of the key. Another user's key, or the
admin's, is the same 404 as an unknown one; a key session may name only its own key; the admin
(who holds no key) pastes one instead. It changes the balance, so it needs the CSRF header.
Nothing of the exchange is kept or logged: the message and the reply pass through.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.edge.small_body import read_small_body
from gateway.errors import GatewayError
from gateway.operator.console.http import csrf_ok, error_reply, json_reply, session_of
from gateway.operator.console.session import Session
from gateway.policy.auth import check_key
from gateway.policy.gate import CONSOLE_KEY
from gateway.store import KeyRecord
from gateway.types import JSON, Message, Scope

MAX_BODY = 16 * 1024  # bytes of a try-it body
MAX_MESSAGE = 4000  # characters of the one message
MAX_TOKENS = 512  # the reply's bound: a small test, whatever the model's default
PATH = "/v1/chat/completions"
# the original request's headers the relayed call keeps: where it came from, as the key's
# ``allowed_ips`` and the usage record's address range read it
KEPT_HEADERS = (b"x-forwarded-for", b"forwarded", b"user-agent")


def _fields(raw: bytes) -> tuple[str, str, str] | Response:
    """(key id, model, message) of the body, or the 400 that refuses it."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        return error_reply(400, "request body: must be a JSON object", "invalid_request")
    for name in ("key", "model", "message"):
        if not isinstance(body.get(name), str) or not body[name].strip():
            return error_reply(400, f"{name}: must be a non-empty string", "invalid_request")
    if len(body["message"]) > MAX_MESSAGE:
        return error_reply(
            400, f"message: at most {MAX_MESSAGE} characters in a try", "invalid_request"
        )
    return body["key"], body["model"], body["message"]


async def _key(request: Request, session: Session, key_id: str) -> KeyRecord | Response:
    """The session's key of that id: a user's own, or a key session's own key; else 404."""
    state = request.app.state.gateway
    if session.role == "user":
        found: KeyRecord | None = await state.store.get_key(key_id)
        if found is not None and found.owner == session.user:
            return found
    elif session.role == "key":
        found = state.cache.key(session.key_hash)
        if found is not None and found.id == key_id:
            return found
    else:  # the admin holds no key of its own
        return error_reply(403, "the admin tries a key by pasting it", "not_a_key_holder")
    return error_reply(404, f"key {key_id!r} not found", "not_found")


def _scope(request: Request, key: KeyRecord, length: int) -> Scope:
    """The relayed call's scope: a chat from the same client, as that key (by its hash)."""
    kept = [(k, v) for k, v in request.scope["headers"] if k in KEPT_HEADERS]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.1"},
        "http_version": request.scope.get("http_version", "1.1"),
        "method": "POST",
        "scheme": request.scope.get("scheme", "http"),
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(length).encode()),
            *kept,
        ],
        "client": request.scope.get("client"),
        "server": request.scope.get("server"),
        CONSOLE_KEY: key.key_hash,
    }


async def _relay(
    request: Request, scope: Scope, raw: bytes
) -> tuple[int, dict[bytes, bytes], bytes]:
    """The chat through the client surface: its status, headers and body."""
    sent = False
    status, headers, parts = 0, {}, []

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        return await request.receive()  # the browser's own: its going away ends the call

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = dict(message.get("headers", ()))
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await request.app.state.gateway.client_surface(scope, receive, send)
    return status, headers, b"".join(parts)


def _answer(status: int, headers: dict[bytes, bytes], raw: bytes) -> Response:
    """The console's answer: the reply's text and usage, or its error in the console's shape."""
    request_id = headers.get(b"x-request-id", b"").decode("latin-1")
    try:
        payload: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        payload = None
    if status != 200 or not isinstance(payload, dict):
        error = payload.get("error") if isinstance(payload, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        resp = error_reply(status or 502, str(message or "the call failed"), "try_failed")
        resp.headers["x-request-id"] = request_id
        return resp
    choices = payload.get("choices") or [{}]
    text = (choices[0].get("message") or {}).get("content")
    out: dict[str, JSON] = {
        "reply": text if isinstance(text, str) else "",
        "model": payload.get("model"),
        "usage": payload.get("usage"),
        "request_id": request_id,
    }
    return json_reply(out)


async def try_chat(request: Request) -> Response:
    """``POST /console/try``."""
    session = session_of(request)
    if session is None:
        return error_reply(401, "not signed in", "not_signed_in")
    if not csrf_ok(request, session):
        return error_reply(403, "missing or wrong x-console-csrf header", "csrf")
    state = request.app.state.gateway
    try:
        raw = await read_small_body(request, MAX_BODY, state.settings.server.body_timeout_seconds)
        fields = _fields(raw)
        if isinstance(fields, Response):
            return fields
        key_id, model, message = fields
        key = await _key(request, session, key_id)
        if isinstance(key, Response):
            return key
        check_key(key, datetime.now(UTC))  # a disabled or expired key: 401, as its calls get
    except ClientDisconnect:
        return Response(status_code=499)
    except GatewayError as err:
        return error_reply(err.status, err.message, err.code or err.type)
    chat = {
        "model": model,
        "messages": [{"role": "user", "content": message}],
        "max_tokens": MAX_TOKENS,
    }
    body = orjson.dumps(chat)
    status, headers, reply = await _relay(request, _scope(request, key, len(body)), body)
    if not status:  # the browser went away during the call
        return Response(status_code=499)
    return _answer(status, headers, reply)
