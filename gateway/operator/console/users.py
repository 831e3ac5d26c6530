"""A user's own console (CONTRACT §5b): signed in with a username and a password, a user
lists, makes, changes and deletes its own keys in the groups it may use, redeems codes to top
up its account, and changes its password.

| Method | Path | |
|---|---|---|
| POST | ``/console/session`` | ``{username, password}`` -> ``{role: "user", csrf}`` + the cookie |
| POST | ``/console/users`` | ``{username, password}``: sign up (``console.registration: open``) |
| GET | ``/console/registration`` | ``{registration: open|closed}``: whether the page offers it |
| GET / POST | ``/console/keys`` | the user's keys (no secrets) / a new one, the secret shown once |
| PATCH / DELETE | ``/console/keys/{id}`` | another user's key (or the admin's) is a 404 |
| POST | ``/console/redeem`` | ``{code}`` -> ``{balance}`` |
| POST | ``/console/password`` | ``{current, new}`` |

Every change needs the session's CSRF header (403 without). A key's group must be one of
the user's (403 otherwise). The user's session and its keys follow the user: disabled, its
sessions end and its keys answer 401 (``store/cache.py``).

Failed sign-ins (and a wrong current password) go through ``failed_sign_in``, the one place
they reach the sign-in limiter (``operator/lockout.py``): per address and per username, as
key and admin-token sign-ins are per address and per key hint; past it, 429 with Retry-After.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.edge.small_body import read_small_body
from gateway.errors import GatewayError, InvalidRequestError, NotFoundError
from gateway.operator import accounts, audit, redemptions, usage_query, users
from gateway.operator.console.http import (
    csrf_ok,
    error_reply,
    json_reply,
    locked_out,
    session_of,
    session_reply,
    signer_of,
)
from gateway.operator.console.session import LIFETIME, NoSecretError, Session
from gateway.operator.lockout import Lockout
from gateway.store import MICRO, KeyRecord, UsageRecord, UserRecord
from gateway.store.backends import store_failures
from gateway.types import JSON

log = logging.getLogger("gateway.console.users")

MAX_BODY = 16 * 1024  # bytes of a user's request body
MAX_KEYS = 100  # keys one user may hold
KEY_FIELDS = frozenset({"group", "name", "expires_at", "quota", "models", "allowed_ips"})
KEY_CHANGES = frozenset({"status", "name", "expires_at", "quota", "models", "allowed_ips"})
STORE_TIMEOUT = 5.0  # seconds a user's request waits for the store (and a hash) before a 503
SHARED_ACCOUNT_PAGES = 5  # pages of an account's records read for one page of a user's
USAGE_DAYS = 30

REGISTERED = audit.Audited("user.register")  # a sign-up's audit action (only those that made one)

Handler = Callable[[Request, UserRecord], Awaitable[Response]]


def _sign_in_names(request: Request, username: str) -> list[str]:
    """What a user's sign-in counts against (``operator/lockout.py``): the client's address
    range and the username."""
    lockout: Lockout = request.app.state.gateway.lockout
    return lockout.names(request.scope, username=username)


def sign_in_wait(request: Request, username: str) -> Response | None:
    """The 429 (with Retry-After) of an attempt from an address, or for a username, past the
    failed sign-in limit, before its password is even checked (right or wrong: a limit that
    still tried it would tell a guesser when it was right); None: it may be tried."""
    lockout: Lockout = request.app.state.gateway.lockout
    wait = lockout.wait(_sign_in_names(request, username))
    return locked_out(lockout, wait) if wait else None


async def failed_sign_in(request: Request, username: str) -> Response | None:
    """Called on every refused user sign-in (unknown user, wrong password, disabled user: one
    answer for all) and every wrong current password, before it is answered: the failure is
    counted against the client's address and the username, like a key's or the admin
    token's (``operator/lockout.py``, in the store, so every instance counts together). Past
    the limit it returns the 429 with Retry-After, which is sent instead of the 401/400; else
    None. The admin token and ``sk-`` key sign-ins fail in ``console.sign_in``, not here."""
    lockout: Lockout = request.app.state.gateway.lockout
    wait = await lockout.failed(_sign_in_names(request, username))
    return locked_out(lockout, wait) if wait else None


async def _refused(request: Request, username: str) -> Response:
    limited = await failed_sign_in(request, username)
    return limited or error_reply(401, "wrong username or password", "invalid_credentials")


async def sign_in(request: Request, body: dict[str, JSON]) -> Response:
    """``{username, password}`` (the body ``console.sign_in`` read) -> a user's session."""
    state = request.app.state.gateway
    username = body.get("username")
    name = username if isinstance(username, str) else ""
    if waiting := sign_in_wait(request, name):
        return waiting
    user = await users.authenticate(state.store, username, body.get("password"))
    if user is None:
        return await _refused(request, name)
    cache = state.cache
    if not cache.user_session_ok(user.id, 2**62):  # made or enabled a moment ago elsewhere
        await cache.refresh()
    # a session begun in the second its user's sessions were ended would end with them: it
    # begins (and lasts) that second longer
    now = max(time.time(), cache.user_sessions_ended(user.id) - LIFETIME + 1)
    try:
        cookie, session = signer_of(request).issue("user", user=user.id, now=now)
    except NoSecretError:
        return error_reply(
            503, "the store has not answered yet; sign in again shortly", "store_unavailable"
        )
    return session_reply(request, cookie, session)


async def register(request: Request, body: dict[str, JSON]) -> Response:
    state = request.app.state.gateway
    if state.settings.console.registration != "open":
        return error_reply(403, "sign-up is closed; ask the administrator", "registration_closed")
    try:
        user = await users.register(state.store, state.settings, body)
    except GatewayError as err:
        return error_reply(err.status, err.message, err.code or err.type)
    await state.cache.refresh()
    log.info("console.registered user=%s", user.id)
    resp = json_reply(users.user_json(user), 201)
    entry = audit.entry_of(request, REGISTERED, resp, "user:" + user.username, "console")
    entry = replace(entry, fields=audit.fields_of(body))  # the body was read by the sign-up
    await audit.record(state.store, entry)
    return resp


async def registration(request: Request) -> Response:
    return json_reply({"registration": request.app.state.gateway.settings.console.registration})


def user_of(request: Request, session: Session) -> UserRecord | None:
    user: UserRecord | None = request.app.state.gateway.cache.user(session.user)
    return user


def signed_in(
    handler: Handler, action: str = "", of: str | None = None
) -> Callable[[Request], Awaitable[Response]]:
    """A route of a signed-in user: 401 without one, 403 for a change without the CSRF
    header; the body bounded; a ``GatewayError`` in the console's error shape. A change
    (``action``, its object named by the path parameter ``of``, else by the reply, else the
    user's own account or user) gets its audit log entry (``operator/audit.py``)."""
    audited = audit.Audited(action, of) if action else None

    async def endpoint(request: Request) -> Response:
        session = session_of(request)
        user = None if session is None or session.role != "user" else user_of(request, session)
        if session is None or user is None:
            return error_reply(401, "not signed in as a user", "not_signed_in")
        if not csrf_ok(request, session):
            return error_reply(403, "missing or wrong x-console-csrf header", "csrf")
        started = time.monotonic()
        resp = await _answer(request, user, handler)
        if audited is not None:
            own = user.account if audited.object_type == "account" else user.id
            actor = "user:" + user.username
            entry = audit.entry_of(request, audited, resp, actor, "console", own)
            left = STORE_TIMEOUT - (time.monotonic() - started)
            await audit.record(request.app.state.gateway.store, entry, left)
        return resp

    return endpoint


async def _answer(request: Request, user: UserRecord, handler: Handler) -> Response:
    state = request.app.state.gateway
    try:
        request.state.body = await read_small_body(
            request, MAX_BODY, state.settings.server.body_timeout_seconds
        )
        async with asyncio.timeout(STORE_TIMEOUT):
            return await handler(request, user)
    except ClientDisconnect:
        return Response(status_code=499)
    except GatewayError as err:
        return error_reply(err.status, err.message, err.code or err.type)
    except store_failures() as exc:  # the store failed or did not answer in time
        log.warning("console.store_unavailable error=%s", type(exc).__name__)
        return error_reply(503, "the store does not answer; try again", "store_unavailable")


def _body(request: Request) -> dict[str, JSON]:
    try:
        payload = orjson.loads(request.state.body)
    except orjson.JSONDecodeError:
        raise InvalidRequestError("request body: not valid JSON") from None
    if not isinstance(payload, dict):
        raise InvalidRequestError("request body: must be a JSON object")
    return payload


async def _own_keys(request: Request, user: UserRecord) -> list[KeyRecord]:
    keys = await request.app.state.gateway.store.list_keys(user.account)
    return [k for k in keys if k.owner == user.id]


async def _own_key(request: Request, user: UserRecord) -> KeyRecord:
    """The key of the path, if the user's own: any other (another user's, the admin's, none
    at all) is the same 404, so that ids of others' keys cannot be probed."""
    key_id = request.path_params["id"]
    found: KeyRecord | None = await request.app.state.gateway.store.get_key(key_id)
    if found is None or found.owner != user.id:
        raise NotFoundError(f"key {key_id!r} not found")
    return found


# ---- the routes ----------------------------------------------------------------------------


async def list_keys(request: Request, user: UserRecord) -> Response:
    state = request.app.state.gateway
    spent = await state.store.load_spent()
    keys = await _own_keys(request, user)
    return json_reply({"data": [accounts.key_json(k, spent=spent.get(k.id, 0)) for k in keys]})


async def create_key(request: Request, user: UserRecord) -> Response:
    body = _body(request)
    accounts.only_fields(body, KEY_FIELDS)
    state = request.app.state.gateway
    group = body.get("group")
    live = state.catalogue.current.groups
    if not isinstance(group, str) or group not in users.usable_groups(user, live):
        return error_reply(403, f"you may not make keys in group {group!r}", "group_not_allowed")
    if len(await _own_keys(request, user)) >= MAX_KEYS:
        return error_reply(409, f"at most {MAX_KEYS} keys; delete one first", "too_many_keys")
    rec, secret = await accounts.create_key(
        state.store,
        state.settings,
        account=user.account,
        owner=user.id,
        **{k: body.get(k) for k in KEY_FIELDS},
    )
    await state.cache.refresh()
    return json_reply(accounts.key_json(rec, secret), 201)


async def update_key(request: Request, user: UserRecord) -> Response:
    body = _body(request)
    accounts.only_fields(body, KEY_CHANGES)
    key = await _own_key(request, user)
    state = request.app.state.gateway
    rec = await accounts.update_key(state.store, state.settings, key.id, body)
    await state.cache.refresh()
    spent = (await state.store.load_spent()).get(rec.id, 0)
    return json_reply(accounts.key_json(rec, spent=spent))


async def delete_key(request: Request, user: UserRecord) -> Response:
    key = await _own_key(request, user)
    state = request.app.state.gateway
    await accounts.delete_key(state.store, key.id)
    await state.cache.refresh()
    return json_reply({"id": key.id, "deleted": True})


async def redeem(request: Request, user: UserRecord) -> Response:
    state = request.app.state.gateway
    await state.writer.flush()  # the balance answered includes this instance's requests
    account = await redemptions.redeem(state.store, user, _body(request))
    await state.cache.refresh()
    return json_reply({"balance": account.balance / MICRO})


async def password(request: Request, user: UserRecord) -> Response:
    body = _body(request)
    accounts.only_fields(body, {"current", "new"})
    state = request.app.state.gateway
    if waiting := sign_in_wait(request, user.username):
        return waiting
    if not await users.change_password(state.store, user, body.get("current"), body.get("new")):
        limited = await failed_sign_in(request, user.username)
        return limited or error_reply(400, "current: not your password", "wrong_password")
    return json_reply({"changed": True})


# ---- what the shared routes (/console/me, /usage) show a user ------------------------------


async def me(request: Request, session: Session) -> Response:
    user = user_of(request, session)
    if user is None:
        return error_reply(401, "not signed in", "not_signed_in")
    state = request.app.state.gateway
    balance = state.cache.balance(user.account)
    return json_reply(
        {
            "role": "user",
            "csrf": session.csrf(signer_of(request)),
            "user": users.user_json(user),
            "groups": users.usable_groups(user, state.catalogue.current.groups),
            "balance": None if balance is None else balance / MICRO,
        }
    )


async def _records(
    request: Request, user: UserRecord, own: set[str], limit: int
) -> tuple[list[UsageRecord], str | None]:
    """A page of the user's records: one key's (``key``), else its account's that its keys
    made (the account may have keys of others: then up to a few of its pages are read)."""
    state = request.app.state.gateway
    params = request.query_params
    key_id = params.get("key") or None
    if key_id is not None and key_id not in own:
        raise NotFoundError(f"key {key_id!r} not found")
    query = usage_query.from_params(params, account=user.account, key_id=key_id)
    await state.writer.flush()
    shared = key_id is None and any(
        k.owner != user.id for k in await state.store.list_keys(user.account)
    )
    found: list[UsageRecord] = []
    for _ in range(SHARED_ACCOUNT_PAGES if shared else 1):
        page = await usage_query.read(state.store, query, limit)
        found += [r for r in page.records if r.key_id in own]
        query = replace(query, after=page.next)
        if page.next is None or len(found) >= limit:
            break
    cursor = None if query.after is None else usage_query.cursor_text(query.after)
    return found, cursor


async def usage(request: Request, session: Session, limit: int) -> Response:
    """The user's usage records (``?key=`` one of its keys; the /admin/usage filters) and
    daily totals per key."""
    user = user_of(request, session)
    if user is None:
        return error_reply(401, "not signed in", "not_signed_in")
    own = {k.id for k in await _own_keys(request, user)}
    try:
        records, cursor = await _records(request, user, own, limit)
    except GatewayError as err:
        return error_reply(err.status, err.message, "invalid_request")
    state = request.app.state.gateway
    today = datetime.now(UTC).date()
    since = (today - timedelta(days=USAGE_DAYS - 1)).isoformat()
    days = await state.store.usage_daily(since, today.isoformat(), user.account)
    return json_reply(
        {
            "records": [accounts.usage_json(r) for r in records],
            "next_cursor": cursor,
            "daily": [accounts.daily_json(d) for d in days if d.key_id in own],
        }
    )


def user_routes() -> list[tuple[str, Callable[[Request], Awaitable[Response]], str]]:
    """(path, endpoint, method) of a user's own routes, under ``/console``."""
    return [
        ("/registration", registration, "GET"),
        ("/keys", signed_in(list_keys), "GET"),
        ("/keys", signed_in(create_key, "key.create"), "POST"),
        ("/keys/{id}", signed_in(update_key, "key.update", "id"), "PATCH"),
        ("/keys/{id}", signed_in(delete_key, "key.delete", "id"), "DELETE"),
        ("/redeem", signed_in(redeem, "account.redeem"), "POST"),
        ("/password", signed_in(password, "user.password"), "POST"),
    ]
