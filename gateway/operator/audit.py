"""The audit log of the operator's side: who changed what, when, from where, and how it ended.

Every change asked for through the admin API, a signed-in console user's own routes or the
command line becomes one ``store.audit.AuditEntry``. It is written in one place per surface,
never by the handlers themselves: ``admin._guarded`` and ``console/users.signed_in`` (each
mutating route names its ``Audited`` action in its route table) and ``cli.run_command``
(``cli/audit.py`` names the commands). The relay never writes one.

- **Who**: ``admin`` (the admin token or the admin's console session), ``user:<username>``,
  ``cli:<OS user>``; ``key:<hint>`` is kept for a key holder's console session, which today
  only reads. ``via`` says which surface: ``api``, ``console`` or ``cli``.
- **What**: ``action`` (``<object type>.<verb>``: ``key.create``, ``account.credit``,
  ``channel.update``, ...), the object's type and id (the path's, else the id or name the
  reply gave a new object, else the one the request named), and the fields the request gave
  with their values, masked (``masked``): a secret's value (passwords, API keys, key and code
  secrets, tokens, cloud credentials: by field name, ``SECRET_NAMES``) becomes ``[secret]``,
  and any text shaped like a credential is redacted as upstream errors are
  (``policy/redaction.py``); long texts and lists are cut.
- **When and where**: the time it was answered (RFC 3339 UTC) and the client's /24 or /48,
  found as the usage records find it (``policy/billing.ClientAddress``: a trusted proxy's
  X-Forwarded-For believed).
- **Outcome**: the HTTP status answered. A refused change (400, 404, 409, ...) is recorded
  with its status, so that a guessed code or a forbidden group shows; a request refused
  before it was authenticated (401, 429, a missing CSRF header, a refused sign-up) is not,
  as it names no operator (the sign-in limiter counts failed sign-ins).

The entry is written after the change, in its own store call (``record``), within what the
change left of its route's store time (so a hung store's 503 still comes about when the
admin API promises it): a store that fails between the two loses the entry, which is logged
(``audit.write_failed``), and the change's reply goes out as it was. Operator changes are
rare; the hot path never waits here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.config.clouds import SECRET_FIELDS as CLOUD_SECRETS
from gateway.edge.asgi import REQUEST_ID, request_headers
from gateway.policy.billing import ip_range
from gateway.policy.redaction import SECRET_FIELDS as CHANNEL_SECRETS
from gateway.policy.redaction import redact
from gateway.store import Store
from gateway.store.audit import AuditEntry, entry_dict
from gateway.store.records import format_time
from gateway.types import JSON

log = logging.getLogger("gateway.audit")

SECRET = "[secret]"
# fields whose value is a secret, by name (and any name holding one of SECRET_WORDS, or
# ending in _token): a user's password (and a password change's current and new), a key's
# or a code's secret, a channel's upstream credentials
SECRET_NAMES = frozenset(
    {"password", "current", "new", "key", "token", "code", "secret", "admin_token",
     "password_hash", "key_hash", "code_hash", *CHANNEL_SECRETS, *CLOUD_SECRETS}
)  # fmt: skip
SECRET_WORDS = ("password", "secret", "credential", "api_key")
MAX_FIELDS = 40  # fields kept of one change
MAX_TEXT = 200  # characters kept of a text value
MAX_ITEMS = 50  # items kept of a list, entries of an object
MAX_DEPTH = 3  # objects within objects kept
WRITE_TIMEOUT = 2.0  # seconds an entry's write may take before it is given up (and logged)
# seconds an entry's write has at least, when the change used up its route's store time (a
# store that hung: the 503 goes out this much later, not a whole store timeout later)
MIN_WRITE_TIMEOUT = 0.5


@dataclass(frozen=True, slots=True)
class Audited:
    """A mutating route's audit action (``key.create``) and the path parameter that names its
    object (None: a new object, named by the reply)."""

    action: str
    id_param: str | None = None

    @property
    def object_type(self) -> str:
        return self.action.partition(".")[0]


def secret_name(name: str) -> bool:
    low = name.lower()
    return (
        low in SECRET_NAMES or any(word in low for word in SECRET_WORDS) or low.endswith("_token")
    )


def masked(value: JSON, depth: int = 0) -> JSON:
    """A value as an entry keeps it: secrets under a secret's name masked at any depth,
    credential-shaped text redacted, long text and lists cut."""
    if isinstance(value, str):
        text = redact(value)
        return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"
    if isinstance(value, list):
        if depth >= MAX_DEPTH:
            return f"[{len(value)} items]"
        return [masked(v, depth + 1) for v in value[:MAX_ITEMS]]
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return "{…}"
        return {
            str(k)[:MAX_TEXT]: SECRET if secret_name(str(k)) else masked(v, depth + 1)
            for k, v in list(value.items())[:MAX_ITEMS]
        }
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(value)[:MAX_TEXT]


def fields_of(body: Mapping[str, JSON]) -> dict[str, JSON]:
    """The fields a change named, with their values masked (``masked``)."""
    out: dict[str, JSON] = {}
    for name, value in list(body.items())[:MAX_FIELDS]:
        key = str(name)[:MAX_TEXT]
        out[key] = SECRET if secret_name(key) else masked(value, 1)
    return out


def body_fields(raw: bytes | None) -> dict[str, JSON]:
    """The fields of a request's JSON object body; none for any other body."""
    if not raw:
        return {}
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return fields_of(payload) if isinstance(payload, dict) else {}


def client_range(request: Request) -> str:
    """The client's /24 or /48, as its usage records would hold it."""
    gate = getattr(request.app.state.gateway, "gate", None)  # none in a bare admin API
    client = request.scope.get("client")
    if gate is None:
        return ip_range(str(client[0]) if client else None)
    forwarded = request_headers(request.scope).get(b"x-forwarded-for")
    found: str = gate.address.range_of(client, forwarded)
    return found


def _named(payload: JSON) -> str:
    if isinstance(payload, dict):
        for name in ("id", "name", "username"):
            value = payload.get(name)
            if isinstance(value, str) and value:
                return value
    return ""


def object_id(request: Request, audited: Audited, resp: Response | None, fallback: str = "") -> str:
    """The changed object's id: the path's, else the id or name of what the reply made (only
    those: a reply may hold a secret shown once), else what the request body named."""
    if audited.id_param is not None:
        return str(request.path_params.get(audited.id_param, ""))
    if resp is not None and resp.status_code < 300 and resp.media_type == "application/json":
        try:
            found = _named(orjson.loads(bytes(resp.body)))
        except orjson.JSONDecodeError:
            found = ""
        if found:
            return found
    raw = getattr(request.state, "body", None)
    try:
        named = _named(orjson.loads(raw)) if raw else ""
    except orjson.JSONDecodeError:
        named = ""
    return redact(named)[:MAX_TEXT] or fallback


def entry_of(
    request: Request,
    audited: Audited,
    resp: Response | None,
    actor: str,
    via: str,
    fallback_id: str = "",
) -> AuditEntry:
    """The entry of a change asked for by ``request`` and answered with ``resp``."""
    return AuditEntry(
        time=datetime.now(UTC),
        actor=actor,
        action=audited.action,
        object_type=audited.object_type,
        object_id=object_id(request, audited, resp, fallback_id),
        fields=body_fields(getattr(request.state, "body", None)),
        ip_range=client_range(request),
        status=resp.status_code if resp is not None else 0,
        via=via,
        request_id=str(request.scope.get(REQUEST_ID, "")),
    )


async def record(store: Store, entry: AuditEntry, budget: float = WRITE_TIMEOUT) -> None:
    """Write the entry within ``budget`` seconds (what the change left of its route's store
    time; at least ``MIN_WRITE_TIMEOUT``); a store that fails or does not answer in time is
    logged, never raised: the change it records is done (or refused) either way."""
    try:
        async with asyncio.timeout(max(budget, MIN_WRITE_TIMEOUT)):
            await store.add_audit(entry)
    except Exception as exc:  # noqa: BLE001 - any failure of the store: logged, the reply goes out
        log.warning(
            "audit.write_failed action=%s object=%s:%s error=%s",
            entry.action,
            entry.object_type,
            entry.object_id,
            type(exc).__name__,
        )


def entry_json(e: AuditEntry) -> dict[str, JSON]:
    return entry_dict(e, format_time(e.time))
