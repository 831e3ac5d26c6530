"""The admin API (contract §5): ordinary Starlette handlers under ``/admin``, off the hot path.

Every handler first checks ``Authorization: Bearer <admin_token>`` in constant time; an empty
configured token turns the API off (always 401). Handlers parse the request, call the service
functions in ``accounts.py`` (shared with the command line) and render what they return or
raise: errors in the OpenAI shape ``{"error": {"message", "type", "code"}}``, never a 500 for
a bad body.

Every change is recorded in the audit log (``audit.py``): the route table names each one's
action, and ``_guarded`` writes its entry once the handler answered, whatever the answer.

Consistency: before reading balances or usage the handler flushes this instance's usage writer,
so a caller sees its own finished requests; after any change it refreshes this instance's cache,
so the change applies here at once (other instances follow within a second).

A store that is away, or does not answer within ``STORE_TIMEOUT``, is a 503 in the same shape,
never a hung call. A body that does not arrive within the client paths' body timeout
(``server.body_timeout_seconds``, plus a second per 16 KiB) is a 408, read before the store's
time starts. Any other failure is a bug: a 500 in the same shape, logged with its traceback.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Generic, Protocol, TypeVar, cast

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.config import Settings
from gateway.edge.asgi import REQUEST_ID
from gateway.edge.small_body import read_small_body
from gateway.errors import (
    AuthenticationError,
    GatewayError,
    InternalError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    UpstreamUnavailableError,
)
from gateway.operator import (
    accounts,
    audit,
    audit_api,
    catalogue,
    console,
    redemptions,
    usage_query,
    users,
)
from gateway.operator.lockout import Lockout
from gateway.operator.replies import error_response, json_response
from gateway.store import Store
from gateway.store.backends import store_failures
from gateway.store.catalogue import View
from gateway.types import JSON
from gateway.upstream import UpstreamPool

log = logging.getLogger("gateway.admin")

DAILY_MAX_DAYS = 400  # days one /admin/usage/daily call may span
MAX_BODY = 64 * 1024  # bytes of an admin request body (the largest real one is a few KiB)
STORE_TIMEOUT = 2.0  # seconds an admin call waits for the store before answering 503
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
# what a store that is away or hung raises: its own errors, its connection's, the time out


class Refreshable(Protocol):
    async def refresh(self) -> None: ...


class Flushable(Protocol):
    async def flush(self) -> None: ...
    def journal_writable(self) -> bool: ...


class AdminState(Protocol):
    """What the app puts in ``app.state.gateway`` that the admin API uses."""

    @property
    def settings(self) -> Settings: ...
    @property
    def store(self) -> Store: ...
    @property
    def cache(self) -> Refreshable: ...
    @property
    def writer(self) -> Flushable: ...
    @property
    def upstream(self) -> UpstreamPool: ...


T = TypeVar("T")
Handler = Callable[[Request, AdminState], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


def authorized(header: str, admin_token: str) -> bool:
    """``Bearer <admin_token>``, compared in constant time; an empty admin_token admits no one."""
    if not admin_token:
        return False
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(token.strip().encode(), admin_token.encode())


def _console_admin(request: Request) -> bool | None:
    """Whether the request comes from the console signed in as the admin (None: it is, but a
    change lacks the session's CSRF token)."""
    session = console.session_of(request)
    if session is None or session.role != "admin":
        return False
    return True if console.csrf_ok(request, session) else None


async def _refused(request: Request, state: AdminState) -> Response | None:
    """Why the request may not go on (401, 403, 429), or None: the admin token, or the
    console's admin session (with its CSRF token on a change). A bearer token is limited
    (``lockout.Lockout``): past the failures a window allows, 429 whatever it says."""
    header = request.headers.get("authorization", "")
    lockout: Lockout | None = getattr(state, "lockout", None)  # none in a bare admin API
    limited = lockout if header else None  # a bearer token is an attempt, a cookie is not
    names = limited.names(request.scope) if limited is not None else []
    if limited is not None and (wait := limited.wait(names)):
        return _locked_out(limited, wait)
    if authorized(header, state.settings.admin_token):
        return None
    signed_in = _console_admin(request)
    if signed_in is None:
        return error_response(PermissionDeniedError("missing x-console-csrf header"))
    if signed_in:
        return None
    if limited is not None and (wait := await limited.failed(names)):
        return _locked_out(limited, wait)
    return error_response(AuthenticationError("missing or invalid admin token"))


def _locked_out(lockout: Lockout, wait: int) -> Response:
    resp = error_response(RateLimitError(lockout.message(wait)))
    resp.headers["retry-after"] = str(wait)
    return resp


def _guarded(
    handler: Handler, timeout: float = STORE_TIMEOUT, audited: audit.Audited | None = None
) -> Endpoint:
    """The endpoint of a handler: the caller checked (``_refused``), the handler answered
    (``_answer``) and, for a change (``audited``), the audit log's entry written."""

    @functools.wraps(handler)
    async def endpoint(request: Request) -> Response:
        state = cast(AdminState, request.app.state.gateway)
        refused = await _refused(request, state)
        if refused is not None:
            return refused
        started = time.monotonic()
        resp = await _answer(request, state, handler, timeout)
        if audited is not None:  # the bearer token, or the admin's console session
            via = "api" if request.headers.get("authorization") else "console"
            entry = audit.entry_of(request, audited, resp, "admin", via)
            await audit.record(state.store, entry, timeout - (time.monotonic() - started))
        return resp

    return endpoint


async def _answer(
    request: Request, state: AdminState, handler: Handler, timeout: float
) -> Response:
    try:
        request.state.body = await read_small_body(
            request, MAX_BODY, state.settings.server.body_timeout_seconds
        )
        async with asyncio.timeout(timeout):
            return await handler(request, state)
    except ClientDisconnect:
        return Response(status_code=499)  # gone while its body was read: no one to answer
    except GatewayError as err:
        resp = error_response(err)
        if err.status in (408, 413):  # the body was not read to its end
            resp.headers["connection"] = "close"
        return resp
    except store_failures() as exc:  # the store failed or did not answer in time
        log.warning(
            "admin.store_unavailable request_id=%s path=%s error=%s",
            request.scope.get(REQUEST_ID, "-"),
            request.url.path,
            type(exc).__name__,
        )
        away = UpstreamUnavailableError("The store does not answer; try again shortly.")
        return error_response(away)
    except Exception:
        log.exception("admin.unexpected method=%s path=%s", request.method, request.url.path)
        return error_response(InternalError("internal error"))


async def _body(request: Request) -> dict[str, JSON]:
    """The request's JSON object (read by ``_guarded``, bounded in size and time)."""
    raw: bytes = request.state.body
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequestError("request body: not valid JSON") from None
    if not isinstance(payload, dict):
        raise InvalidRequestError("request body: must be a JSON object")
    return payload


# ---- accounts ------------------------------------------------------------------------------


async def list_accounts(request: Request, state: AdminState) -> Response:
    await state.writer.flush()
    accts = await accounts.list_accounts(state.store)
    return json_response({"data": [accounts.account_json(a) for a in accts]})


async def create_account(request: Request, state: AdminState) -> Response:
    body = await _body(request)
    accounts.only_fields(body, {"id", "balance"})
    acct = await accounts.create_account(state.store, body.get("id"), body.get("balance", 0))
    await state.cache.refresh()
    return json_response(accounts.account_json(acct), 201)


async def get_account(request: Request, state: AdminState) -> Response:
    await state.writer.flush()
    acct = await accounts.get_account(state.store, request.path_params["id"])
    return json_response(accounts.account_json(acct))


async def topup(request: Request, state: AdminState) -> Response:
    body = await _body(request)
    accounts.only_fields(body, {"amount"})
    if "amount" not in body:
        raise InvalidRequestError("amount: required")
    await state.writer.flush()
    acct = await accounts.topup(state.store, request.path_params["id"], body["amount"])
    await state.cache.refresh()
    return json_response(accounts.account_json(acct))


# ---- keys ----------------------------------------------------------------------------------


async def list_keys(request: Request, state: AdminState) -> Response:
    keys = await accounts.list_keys(state.store, request.query_params.get("account"))
    spent = await accounts.spent_by_key(state.store)
    return json_response({"data": [accounts.key_json(k, spent=spent.get(k.id, 0)) for k in keys]})


async def create_key(request: Request, state: AdminState) -> Response:
    body = await _body(request)
    accounts.only_fields(
        body, {"account", "group", "name", "expires_at", "quota", "models", "allowed_ips"}
    )
    rec, secret = await accounts.create_key(
        state.store,
        state.settings,
        account=body.get("account"),
        group=body.get("group"),
        name=body.get("name"),
        expires_at=body.get("expires_at"),
        quota=body.get("quota"),
        models=body.get("models"),
        allowed_ips=body.get("allowed_ips"),
    )
    await state.cache.refresh()
    return json_response(accounts.key_json(rec, secret), 201)


async def get_key(request: Request, state: AdminState) -> Response:
    rec = await accounts.get_key(state.store, request.path_params["id"])
    spent = await accounts.spent_by_key(state.store)
    return json_response(accounts.key_json(rec, spent=spent.get(rec.id, 0)))


async def update_key(request: Request, state: AdminState) -> Response:
    body = await _body(request)
    rec = await accounts.update_key(state.store, state.settings, request.path_params["id"], body)
    await state.cache.refresh()
    spent = await accounts.spent_by_key(state.store)
    return json_response(accounts.key_json(rec, spent=spent.get(rec.id, 0)))


async def delete_key(request: Request, state: AdminState) -> Response:
    key_id = request.path_params["id"]
    await accounts.delete_key(state.store, key_id)
    await state.cache.refresh()
    return json_response({"id": key_id, "deleted": True})


# ---- usage and catalogue -------------------------------------------------------------------


async def usage(request: Request, state: AdminState) -> Response:
    """Usage records, newest first, filtered and paged (``usage_query``). The next page's
    cursor is in the ``x-next-cursor`` header, and in the body's ``next_cursor`` when the
    request gives one of the filters or a cursor (with only ``account`` and ``limit`` the
    body stays ``{"data": [...]}`` as it always was)."""
    params = request.query_params
    limit = accounts.usage_limit(params.get("limit"))
    query = usage_query.from_params(params)
    await state.writer.flush()
    page = await usage_query.read(state.store, query, limit)
    cursor = None if page.next is None else usage_query.cursor_text(page.next)
    body: dict[str, JSON] = {"data": [accounts.usage_json(r) for r in page.records]}
    if usage_query.asks_for_pages(params):
        body["next_cursor"] = cursor
    resp = json_response(body)
    if cursor is not None:
        resp.headers[usage_query.CURSOR_HEADER] = cursor
    return resp


async def usage_daily(request: Request, state: AdminState) -> Response:
    """Daily totals per account, key and model (``?since=&until=`` days, both included;
    default the last 30; ``account=``), from the store's daily totals."""
    today = datetime.now(UTC).date()
    params = request.query_params
    until = _day(params.get("until"), "until", today)
    since = _day(params.get("since"), "since", until - timedelta(days=29))
    if since > until:
        raise InvalidRequestError("since: must not be after until")
    if (until - since).days >= DAILY_MAX_DAYS:
        raise InvalidRequestError(f"since: at most {DAILY_MAX_DAYS} days before until")
    rows = await state.store.usage_daily(
        since.isoformat(), until.isoformat(), params.get("account") or None
    )
    rows.sort(key=lambda d: (d.day, d.account, d.key_id, d.model))
    # the console's overview reads this: it also shows the sessions pinned and the prompt
    # cache's hit rate per model and channel, as this instance's metrics count them, and the
    # instance's settlement journal
    observers = getattr(state, "observers", None)  # an instance's: none in a bare admin API
    sessions = observers.metrics.cache_use() if observers is not None else []
    journal = {"writable": state.writer.journal_writable()}
    days = [accounts.daily_json(d) for d in rows]
    return json_response({"data": days, "sessions": sessions, "journal": journal})


def _day(value: str | None, name: str, default: date) -> date:
    if not value:
        return default
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise InvalidRequestError(f"{name}: must be a date, YYYY-MM-DD") from None


async def list_models(request: Request, state: AdminState) -> Response:
    v = await catalogue.load(state.store, state.settings)
    return json_response({"data": [catalogue.model_out(m, v) for m in v.models]})


async def list_channels(request: Request, state: AdminState) -> Response:
    """The channels, each with its ``health`` on this instance now: ``cooling`` (left out
    of routing after failures, until ``cooling_until``, seconds from now) or ``healthy``."""
    v = await catalogue.load(state.store, state.settings)
    health = getattr(state, "health", None)  # an instance's: none in a bare admin API
    cooling: dict[str, float] = health.cooling if health is not None else {}
    now = time.monotonic()
    out = []
    for c in v.channels:
        entry = catalogue.channel_out(c, v)
        left = cooling.get(c.name, 0.0) - now
        entry["health"] = "cooling" if left > 0 else "healthy"
        if left > 0:
            entry["cooling_for"] = round(left, 1)
        out.append(entry)
    return json_response({"data": out})


async def list_groups(request: Request, state: AdminState) -> Response:
    """``{"data": [{name, ratio, origin}]}``: each group as POST /admin/groups answers it."""
    v = await catalogue.load(state.store, state.settings)
    return json_response({"data": [catalogue.group_out(g, v) for g in v.groups]})


# ---- catalogue changes (contract §5): the file's entries answer 409 -------------------------


@dataclass(frozen=True, slots=True)
class Entries(Generic[T]):
    """One kind of catalogue entry (channels, models, groups) as the admin API edits it: the
    service functions of ``catalogue.py`` and how an entry is shown. Each handler changes
    the store, refreshes this instance's cache and shows the entry as the store now has it."""

    create: Callable[[Store, Settings, object], Awaitable[T]]
    update: Callable[[Store, Settings, str, object], Awaitable[T | None]]
    delete: Callable[[Store, Settings, str], Awaitable[None]]
    out: Callable[[T, View], dict[str, JSON]]
    find: Callable[[View, str], T | None] = lambda v, name: None
    noun: str = "entry"

    async def shown(self, state: AdminState, entry: T, status: int = 200) -> Response:
        v = await catalogue.load(state.store, state.settings)
        return json_response(self.out(entry, v), status)

    async def get(self, request: Request, state: AdminState) -> Response:
        v = await catalogue.load(state.store, state.settings)
        name = request.path_params["name"]
        found = self.find(v, name)
        if found is None:
            raise NotFoundError(f"{self.noun} {name!r} not found")
        return json_response(self.out(found, v))

    async def add(self, request: Request, state: AdminState) -> Response:
        made = await self.create(state.store, state.settings, await _body(request))
        await state.cache.refresh()
        return await self.shown(state, made, 201)

    async def change(self, request: Request, state: AdminState) -> Response:
        name = request.path_params["name"]
        body = await _body(request)
        changed = await self.update(state.store, state.settings, name, body)
        await state.cache.refresh()
        return await self.shown(state, cast(T, name) if changed is None else changed)

    async def remove(self, request: Request, state: AdminState) -> Response:
        name = request.path_params["name"]
        await self.delete(state.store, state.settings, name)
        await state.cache.refresh()
        return json_response({"name": name, "deleted": True})


CHANNELS = Entries(
    catalogue.create_channel, catalogue.update_channel, catalogue.delete_channel,
    catalogue.channel_out, lambda v, name: v.channel(name), "channel",
)  # fmt: skip
MODELS = Entries(
    catalogue.create_model, catalogue.update_model, catalogue.delete_model,
    catalogue.model_out, lambda v, name: v.model(name), "model",
)  # fmt: skip
GROUPS = Entries(
    catalogue.create_group, catalogue.update_group, catalogue.delete_group, catalogue.group_out
)


async def channel_test(request: Request, state: AdminState) -> Response:
    name = request.path_params["name"]
    result = await catalogue.try_channel(state.store, state.settings, state.upstream, name)
    return json_response(result)


# ---- users and redemption codes (CONTRACT §5b) ---------------------------------------------


async def list_users(request: Request, state: AdminState) -> Response:
    found = await users.list_users(state.store)
    return json_response({"data": [users.user_json(u) for u in found]})


async def create_user(request: Request, state: AdminState) -> Response:
    rec = await users.create_user(state.store, state.settings, await _body(request))
    await state.cache.refresh()
    return json_response(users.user_json(rec), 201)


async def update_user(request: Request, state: AdminState) -> Response:
    """Any of password, groups, status; disabling ends the user's sessions and stops its
    keys (``users.update_user``)."""
    body = await _body(request)
    rec = await users.update_user(state.store, state.settings, request.path_params["id"], body)
    await state.cache.refresh()
    return json_response(users.user_json(rec))


async def delete_user(request: Request, state: AdminState) -> Response:
    user_id = request.path_params["id"]
    keys = await users.delete_user(state.store, user_id)
    await state.cache.refresh()
    return json_response({"id": user_id, "deleted": True, "keys": keys})


async def create_redemptions(request: Request, state: AdminState) -> Response:
    """``{amount, count, expires_at?}`` -> the codes, shown only in this reply."""
    body = await _body(request)
    accounts.only_fields(body, {"amount", "count", "expires_at"})
    if "amount" not in body:
        raise InvalidRequestError("amount: required")
    made = await redemptions.create_codes(
        state.store, body["amount"], body.get("count", 1), body.get("expires_at")
    )
    return json_response(redemptions.made_json(made), 201)


async def list_redemptions(request: Request, state: AdminState) -> Response:
    """Every code (``?status=unused|used|expired``): its hint, never the code."""
    codes = await redemptions.list_codes(state.store, request.query_params.get("status") or None)
    now = datetime.now(UTC)
    return json_response({"data": [redemptions.code_json(c, now) for c in codes]})


async def rotate_sessions(request: Request, state: AdminState) -> Response:
    """A new console session secret: every console session (the caller's too) ends, here at
    once and on every instance within a second; the service goes on."""
    await state.store.rotate_session_secret()
    await state.cache.refresh()
    return json_response({"rotated": True})


async def not_found(request: Request, state: AdminState) -> Response:
    raise NotFoundError(f"no admin endpoint {request.method} {request.url.path}")


def admin_routes() -> list[BaseRoute]:
    """The admin routes, to be mounted at ``/admin``. Each change names its audit action
    (and the path parameter of its object): ``_guarded`` writes its entry."""

    def r(path: str, handler: Handler, method: str, action: str = "", of: str = "") -> Route:
        audited = audit.Audited(action, of or None) if action else None
        return Route(path, _guarded(handler, audited=audited), methods=[method])

    return [
        r("/accounts", list_accounts, "GET"),
        r("/accounts", create_account, "POST", "account.create"),
        r("/accounts/{id}", get_account, "GET"),
        r("/accounts/{id}/topup", topup, "POST", "account.credit", "id"),
        r("/keys", list_keys, "GET"),
        r("/keys", create_key, "POST", "key.create"),
        r("/keys/{id}", get_key, "GET"),
        r("/keys/{id}", update_key, "PATCH", "key.update", "id"),
        r("/keys/{id}", delete_key, "DELETE", "key.delete", "id"),
        r("/usage", usage, "GET"),
        r("/usage/daily", usage_daily, "GET"),
        r("/audit", audit_api.list_entries, "GET"),
        # every matching entry, a page of the store at a time
        Route("/audit.csv", _guarded(audit_api.export_csv, 5 * STORE_TIMEOUT), methods=["GET"]),
        r("/models", list_models, "GET"),
        r("/channels", list_channels, "GET"),
        r("/groups", list_groups, "GET"),
        # the catalogue at run time; names may hold a slash, hence {name:path}
        r("/channels", CHANNELS.add, "POST", "channel.create"),
        # an upstream's answer may take the channel's whole test time, not the store's
        Route(
            "/channels/{name:path}/test",
            _guarded(channel_test, catalogue.CHANNEL_TEST_TIMEOUT + STORE_TIMEOUT),
            methods=["POST"],
        ),
        r("/channels/{name:path}", CHANNELS.get, "GET"),
        r("/channels/{name:path}", CHANNELS.change, "PATCH", "channel.update", "name"),
        r("/channels/{name:path}", CHANNELS.remove, "DELETE", "channel.delete", "name"),
        r("/models", MODELS.add, "POST", "model.create"),
        r("/models/{name:path}", MODELS.get, "GET"),
        r("/models/{name:path}", MODELS.change, "PATCH", "model.update", "name"),
        r("/models/{name:path}", MODELS.remove, "DELETE", "model.delete", "name"),
        r("/groups", GROUPS.add, "POST", "group.create"),
        r("/groups/{name:path}", GROUPS.change, "PATCH", "group.update", "name"),
        r("/groups/{name:path}", GROUPS.remove, "DELETE", "group.delete", "name"),
        r("/users", list_users, "GET"),
        # a password is hashed (argon2, tens of milliseconds) before the store is reached
        r("/users", create_user, "POST", "user.create"),
        r("/users/{id}", update_user, "PATCH", "user.update", "id"),
        r("/users/{id}", delete_user, "DELETE", "user.delete", "id"),
        r("/redemptions", list_redemptions, "GET"),
        r("/redemptions", create_redemptions, "POST", "redemption.create"),
        r("/sessions/rotate", rotate_sessions, "POST", "sessions.rotate"),
        # last: anything else under /admin is still behind the token, then 404 in our shape
        Route("/{path:path}", _guarded(not_found), methods=ALL_METHODS),
    ]
