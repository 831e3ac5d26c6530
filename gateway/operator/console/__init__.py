"""The web console at ``/console`` (CONTRACT §5a): one static page and a few JSON routes.

The page (``static/index.html``, ``app.css`` and the modules ``app.js``, ``ui.js``,
``people.js``, ``square.js``, ``audit.js``: no build step, no third-party code) signs in with
the admin token, an ``sk-`` key, or a user's username and password (``POST /console/session``;
a user's own routes: ``users.py``), which sets the signed, HttpOnly session cookie of
``session.py`` and forgets the token. Signed in as the admin, the page calls the admin API
itself (``/admin/...``), which accepts the session in place of the bearer token (with the CSRF
header on any change); signed in with a key, it reads that key's own view here: ``/console/me``
(the key, its balance and spend), ``/console/usage`` (its records and daily totals) and
``/console/square`` (the model square of its group).

Every reply is ``no-store``; the page is served with a strict Content-Security-Policy (only
this origin's script and style, no inline code, no framing).

Sign-in takes only ``application/json`` (a form on another site can post only form types or
``text/plain`` without a preflight) and refuses a request another site's page made (its
``Origin`` is not this host, or ``Sec-Fetch-Site: cross-site``) with 403: otherwise such a
form could sign the victim's browser in as the attacker's key (login CSRF). Failed sign-ins
are limited per client address and per key hint (``lockout.py``: 429 past the limit). Sign-out
ends the
session on the server, on every instance: its nonce goes to the store's revoked sessions,
which every cache loads with the keys (``store/cache.py``), so checking a session never waits
for the store.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.config import Model
from gateway.edge.asgi import request_headers
from gateway.edge.small_body import read_small_body
from gateway.errors import AuthenticationError, GatewayError, PermissionDeniedError
from gateway.operator import usage_query
from gateway.operator import users as user_service
from gateway.operator.accounts import daily_json, key_json, usage_json, usage_limit
from gateway.operator.console import users as user_routes
from gateway.operator.console.http import (
    SECURITY_HEADERS,
    error_reply,
    forget_session,
    json_reply,
    locked_out,
    session_cookie,
    session_reply,
    signer_of,
)

# the admin API reads the console's session with these (``admin._console_admin``)
from gateway.operator.console.http import csrf_ok as csrf_ok
from gateway.operator.console.http import session_of as session_of
from gateway.operator.console.session import NoSecretError, Session, key_sessions
from gateway.operator.console.trial import try_chat
from gateway.operator.lockout import Lockout
from gateway.policy.auth import check_key, key_hash
from gateway.policy.billing import cache_price_map
from gateway.store import MICRO, KeyRecord
from gateway.store.catalogue import model_json
from gateway.types import JSON

log = logging.getLogger("gateway.console")

STATIC = Path(__file__).parent / "static"
ASSETS = {
    "app.js": "text/javascript",
    "ui.js": "text/javascript",
    "channels.js": "text/javascript",  # the Channels page, a module app.js imports
    "people.js": "text/javascript",
    "square.js": "text/javascript",
    "audit.js": "text/javascript",
    "app.css": "text/css",
}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
# the endpoints that serve each capability, as the model square shows them
ENDPOINTS = {
    "chat": [
        "POST /v1/chat/completions",
        "POST /v1/responses",
        "POST /v1/messages",
        "POST /v1beta/models/{model}:generateContent",
        "POST /v1/completions",
    ],
    "embeddings": ["POST /v1/embeddings", "POST /v1beta/models/{model}:embedContent"],
    "images": ["POST /v1/images/generations"],
    "audio": [
        "POST /v1/audio/transcriptions",
        "POST /v1/audio/translations",
        "POST /v1/audio/speech",
    ],
    "rerank": ["POST /v1/rerank", "POST /v2/rerank"],
}
USAGE_DAYS = 30
USAGE_RECORDS = 100  # a page of the key's records, unless the request asks for up to 1000
STORE_TIMEOUT = 2.0  # seconds a sign-out waits for the store before answering 503
DEFAULT_PORTS = {"http": 80, "https": 443}
SIGN_IN_MAX_BODY = 8 * 1024  # bytes of a sign-in body: a token and little else
NO_STORE = "store_unavailable"


def _key_of(request: Request, session: Session) -> KeyRecord:
    """The signed-in key, still usable now (its session ends when it no longer is; 401) and
    from here (403 from outside its ``allowed_ips``)."""
    state = request.app.state.gateway
    key = check_key(state.cache.key(session.key_hash), datetime.now(UTC))
    _from_allowed_address(request, key)
    return key


def _from_allowed_address(request: Request, key: KeyRecord) -> None:
    """PermissionDeniedError (403) from an address the key's ``allowed_ips`` do not hold."""
    if key.allowed_ips is not None:
        gate = request.app.state.gateway.gate
        gate.check_address(key, request.scope, request_headers(request.scope))


# ---- the page ------------------------------------------------------------------------------


async def page(request: Request) -> Response:
    html = (STATIC / "index.html").read_bytes()
    headers = {**SECURITY_HEADERS, "content-security-policy": CSP}
    return Response(html, media_type="text/html; charset=utf-8", headers=headers)


async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    if name not in ASSETS:
        return error_reply(404, f"no console asset {name!r}", "not_found")
    return Response(
        (STATIC / name).read_bytes(),
        media_type=ASSETS[name] + "; charset=utf-8",
        headers={"cache-control": "no-cache", "x-content-type-options": "nosniff"},
    )


# ---- sign-in -------------------------------------------------------------------------------


def same_origin(origin: str, host: str) -> bool:
    """Whether an ``Origin`` header names the host the request was sent to (its ``Host``
    header). Schemes are not compared: behind a proxy that ends TLS the browser's origin is
    https and the request here http. A ``Host`` without a port (a proxy's ``$host``) matches
    the origin's host name on any port."""
    try:
        seen, here = urlsplit(origin), urlsplit("//" + host)
        if seen.scheme not in DEFAULT_PORTS or not seen.hostname or not here.hostname:
            return False  # "null" (a sandboxed frame, a file:), or no Host to compare with
        port = seen.port or DEFAULT_PORTS[seen.scheme]  # ValueError: not a port
        return seen.hostname == here.hostname and here.port in (None, port)
    except ValueError:  # a port that is not a number
        return False


def cross_site(request: Request) -> bool:
    """Whether another site's page made the request (the browser says so)."""
    if request.headers.get("sec-fetch-site", "").lower() == "cross-site":
        return True
    origin = request.headers.get("origin")
    return origin is not None and not same_origin(origin, request.headers.get("host", ""))


async def _signed_out_body(request: Request) -> dict[str, JSON] | Response:
    """The JSON object of a request made without a session (sign-in, sign-up), or the reply
    that refuses it: from another site's page (403), not JSON (415), too large or too slow
    (413, 408). A body that is not a JSON object reads as ``{}``."""
    if cross_site(request):
        return error_reply(403, "sign-in from another site's page is refused", "cross_site")
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        return error_reply(
            415, "sign-in takes a JSON body (content-type: application/json)", "media_type"
        )
    state = request.app.state.gateway
    try:
        raw = await read_small_body(
            request, SIGN_IN_MAX_BODY, state.settings.server.body_timeout_seconds
        )
    except GatewayError as err:  # too large (413) or too slow (408): not read to its end
        resp = error_reply(err.status, err.message, err.code or err.type)
        resp.headers["connection"] = "close"
        return resp
    except ClientDisconnect:
        return Response(status_code=499)  # gone while its body was read: no one to answer
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


async def sign_in(request: Request) -> Response:
    """``{token}``: the admin token or an ``sk-`` key; ``{username, password}``: a user
    (``console/users.py``)."""
    body = await _signed_out_body(request)
    if isinstance(body, Response):
        return body
    if "username" in body:
        return await user_routes.sign_in(request, body)
    token = body.get("token")
    if not isinstance(token, str) or not token.strip():
        return error_reply(
            400, "token: give the admin token or an sk- key (or username and password)",
            "invalid_request",
        )  # fmt: skip
    return await _signed_in_with(request, token.strip())


async def sign_up(request: Request) -> Response:
    """``POST /console/users``: a user signs itself up, when registration is open."""
    body = await _signed_out_body(request)
    if isinstance(body, Response):
        return body
    return await user_routes.register(request, body)


async def _signed_in_with(request: Request, token: str) -> Response:
    """The session of a token that is the admin token or a usable key; 401 for anything
    else, counted against the client's address and the key's hint (``lockout``): past the
    limit, 429 with Retry-After, whatever the token."""
    state = request.app.state.gateway
    lockout: Lockout = state.lockout
    names = lockout.names(request.scope, token)
    if wait := lockout.wait(names):
        return locked_out(lockout, wait)
    admin_token: str = state.settings.admin_token
    signer = signer_of(request)
    try:
        if admin_token and hmac.compare_digest(token.encode(), admin_token.encode()):
            cookie, session = signer.issue("admin")
        else:
            try:
                key = check_key(state.cache.key(key_hash(token)), datetime.now(UTC))
            except AuthenticationError as err:
                if wait := await lockout.failed(names):
                    return locked_out(lockout, wait)
                return error_reply(401, err.message, "invalid_credentials")
            try:
                _from_allowed_address(request, key)
            except PermissionDeniedError as err:
                return error_reply(403, err.message, "address_not_allowed")
            ended = state.cache.revoked_until(key_sessions(key.key_hash))
            cookie, session = signer.issue("key", key.key_hash, after=ended)
    except NoSecretError:
        return error_reply(503, "the store has not answered yet; sign in again shortly", NO_STORE)
    return session_reply(request, cookie, session)


async def sign_out(request: Request) -> Response:
    """End the session here at once and, through the store, on every instance within a
    second. When the store does not take it: 503 and the cookie kept, to try again."""
    session = signer_of(request).read(session_cookie(request))
    if session is not None:
        if not csrf_ok(request, session):
            return error_reply(403, "missing or wrong x-console-csrf header", "csrf")
        cache = request.app.state.gateway.cache
        if not cache.revoked(session.nonce):  # else the store has it already
            store = request.app.state.gateway.store
            try:
                async with asyncio.timeout(STORE_TIMEOUT):
                    await store.revoke_session(session.nonce, session.expires, int(time.time()))
            except Exception as exc:  # noqa: BLE001 - the store failed or did not answer
                log.warning("console.sign_out_failed error=%s", type(exc).__name__)
                return error_reply(503, "the store does not answer; sign out again", NO_STORE)
            cache.revoke(session.nonce, session.expires)
    return forget_session(json_reply({"signed_in": False}), request)


# ---- what a signed-in console reads --------------------------------------------------------


def _signed_in(request: Request) -> tuple[Session, KeyRecord | None] | Response:
    """The session and, for a key's, the key; a user's is checked by ``session_of``."""
    session = session_of(request)
    if session is None:
        return error_reply(401, "not signed in", "not_signed_in")
    if session.role in ("admin", "user"):
        return session, None
    try:
        return session, _key_of(request, session)
    except PermissionDeniedError as err:
        return error_reply(403, err.message, "address_not_allowed")
    except GatewayError as err:
        return error_reply(401, err.message, "not_signed_in")


async def me(request: Request) -> Response:
    found = _signed_in(request)
    if isinstance(found, Response):
        return found
    session, key = found
    if session.role == "user":
        return await user_routes.me(request, session)
    out: dict[str, JSON] = {"role": session.role, "csrf": session.csrf(signer_of(request))}
    if key is not None:
        state = request.app.state.gateway
        spent = (await state.store.load_spent()).get(key.id, 0)
        balance = state.cache.balance(key.account)
        out["key"] = key_json(key, spent=spent)
        out["balance"] = None if balance is None else balance / MICRO
        if key.quota is not None:
            out["quota_left"] = max(key.quota - spent, 0) / MICRO
    return json_reply(out)


async def usage(request: Request) -> Response:
    """The signed-in key's usage records, a page at a time (``limit``, ``cursor``, and the
    filters of /admin/usage but ``account`` and ``key``: ``usage_query``), found through the
    store's key filter however busy its account; and its daily totals. A user's: its keys'
    (``users.usage``). The admin reads /admin/usage."""
    found = _signed_in(request)
    if isinstance(found, Response):
        return found
    session, key = found
    try:
        limit = usage_limit(request.query_params.get("limit") or USAGE_RECORDS)
    except GatewayError as err:
        return error_reply(err.status, err.message, "invalid_request")
    if session.role == "user":
        return await user_routes.usage(request, session, limit)
    if key is None:
        return error_reply(404, "the admin reads /admin/usage", "not_found")
    state = request.app.state.gateway
    params = request.query_params
    try:
        query = usage_query.from_params(params, account=key.account, key_id=key.id)
        await state.writer.flush()
        page = await usage_query.read(state.store, query, limit)
    except GatewayError as err:
        return error_reply(err.status, err.message, "invalid_request")
    today = datetime.now(UTC).date()
    since = (today - timedelta(days=USAGE_DAYS - 1)).isoformat()
    days = await state.store.usage_daily(since, today.isoformat(), key.account)
    return json_reply(
        {
            "records": [usage_json(r) for r in page.records],
            "next_cursor": None if page.next is None else usage_query.cursor_text(page.next),
            "daily": [daily_json(d) for d in days if d.key_id == key.id],
        }
    )


def _viewer_groups(request: Request, session: Session, key: KeyRecord | None) -> list[str]:
    """The groups whose models the viewer may see: a key's own, a user's usable ones, every
    group for the admin (the live catalogue's: run-time groups too)."""
    live = request.app.state.gateway.catalogue.current.groups
    if key is not None:
        return [key.group]
    if session.role == "user":
        user = user_routes.user_of(request, session)
        return [] if user is None else user_service.usable_groups(user, live)
    return list(live)


def _billed(model: Model, price: dict[str, JSON]) -> dict[str, JSON]:
    """A model's prices as billing uses them: its cache prices left unset given the prices
    that stand in for them (``billing.cache_prices``: the table's ratios, else the input's or
    the writes'), so that the square shows what a cache read or write costs."""
    return {**price, **cache_price_map(model.price, model.table)}


def _priced(price: dict[str, JSON], ratio: float) -> dict[str, JSON]:
    """A model's prices in a group: each times the group's ratio (unset ones stay unset)."""
    return {k: v if v is None else round(v * ratio, 9) for k, v in price.items()}


async def square(request: Request) -> Response:
    """The model square: each model the viewer's groups reach (``?group=`` one of them),
    with its capabilities, the endpoints that serve it, and its prices in each of those
    groups (times the group's ratio; the cache prices as billed, ``_billed``), and each
    group's tool kind (``tools``: the set-up the
    console shows a new key of the group first). A key sees its group's (its ``models``
    only), a user its groups', the admin every group's."""
    found = _signed_in(request)
    if isinstance(found, Response):
        return found
    session, key = found
    catalogue = request.app.state.gateway.catalogue.current
    groups = _viewer_groups(request, session, key)
    chosen = request.query_params.get("group") or None
    if chosen is not None and chosen not in groups:
        return error_reply(404, f"no group {chosen!r}", "not_found")
    shown = [chosen] if chosen is not None else groups
    entries: dict[str, dict[str, JSON]] = {}
    billed: dict[str, dict[str, JSON]] = {}  # each model's prices as billed, by its name
    for g in shown:
        ratio = float(catalogue.ratio(g))
        for m in catalogue.group_models(g):
            if key is not None and key.models is not None and m.name not in key.models:
                continue
            entry = entries.get(m.name)
            if entry is None:
                entry = entries[m.name] = model_json(m)
                caps = sorted(m.capabilities)
                entry["endpoints"] = [e for cap in caps for e in ENDPOINTS.get(cap, [])]
                entry["groups"], entry["prices"] = [], {}
                billed[m.name] = _billed(m, entry["price"])  # once a model, not once a group
            entry["groups"].append(g)
            entry["prices"][g] = _priced(billed[m.name], ratio)
    order = {m.name: i for i, m in enumerate(catalogue.models.values())}
    models: list[JSON] = sorted(entries.values(), key=lambda e: order.get(str(e["name"]), 0))
    ratios: dict[str, JSON] = {g: float(catalogue.ratio(g)) for g in groups}
    tools: dict[str, JSON] = {g: catalogue.tool(g) for g in groups}
    group = chosen if chosen is not None else (key.group if key is not None else None)
    return json_reply(
        {"group": group, "groups": groups, "ratios": ratios, "tools": tools, "models": models}
    )


def console_routes() -> list[BaseRoute]:
    """The console's routes, mounted at ``/console``."""
    return [
        Route("/", page, methods=["GET"]),
        Route("/assets/{name}", asset, methods=["GET"]),
        Route("/session", sign_in, methods=["POST"]),
        Route("/session", sign_out, methods=["DELETE"]),
        Route("/users", sign_up, methods=["POST"]),
        Route("/me", me, methods=["GET"]),
        Route("/usage", usage, methods=["GET"]),
        Route("/square", square, methods=["GET"]),
        Route("/try", try_chat, methods=["POST"]),
        *(Route(path, fn, methods=[method]) for path, fn, method in user_routes.user_routes()),
    ]
