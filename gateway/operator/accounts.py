"""Accounts, keys and usage as the operator manages them: one set of service functions behind
both the admin API (``admin.py``) and the ``gateway`` command line (``cli/``).

Each function validates what a person or a script typed, talks to the store, and raises a
``GatewayError`` whose status the admin API sends as it is (400 bad input, 404 missing,
409 already exists); the CLI prints its message. The ``*_json`` functions give the one JSON
shape both surfaces show: money in balance units (the store's micro-units / 1e6), times in
RFC 3339 UTC with a ``Z``, and a key's secret only in the reply that created it.
"""

from __future__ import annotations

import ipaddress
import secrets
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation

from gateway.config import NAME_RE, ConfigError, Settings, parse_time
from gateway.errors import GatewayError, InvalidRequestError, NotFoundError
from gateway.store import (
    MICRO,
    Account,
    ConflictError,
    DailyUsage,
    KeyRecord,
    MissingError,
    Store,
    UsageRecord,
    hash_key,
    key_hint,
)
from gateway.store.catalogue import View, view
from gateway.store.catalogue import channel_json as channel_json
from gateway.store.catalogue import model_json as model_json
from gateway.store.records import KEY_CHANGES, KEY_STATUSES, from_micro
from gateway.store.records import format_time as format_time
from gateway.store.records import usage_json as usage_json
from gateway.types import JSON

MAX_AMOUNT = 10**12  # balance units; keeps micro-units well inside a signed 64-bit integer
MAX_NAME_LEN = 200
MAX_ID_LEN = 128
USAGE_DEFAULT_LIMIT = 100
USAGE_MAX_LIMIT = 1000


class AlreadyExistsError(GatewayError):
    """409: an account id (or key id) that is already taken."""

    status = 409
    type = "conflict_error"


# ---- values --------------------------------------------------------------------------------


def to_micro(value: object, field: str) -> int:
    """A JSON number (or a Decimal typed at the command line) in balance units -> micro-units.

    Goes through the number's decimal text, so 0.1 is exactly 100000 micro-units and
    0.1 + 0.2 adds up to exactly 0.3; anything finer than a micro-unit is rounded half-even.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise InvalidRequestError(f"{field}: must be a number")
    try:
        dec = value if isinstance(value, Decimal) else Decimal(str(value))
    except InvalidOperation:
        raise InvalidRequestError(f"{field}: must be a number") from None
    if not dec.is_finite():
        raise InvalidRequestError(f"{field}: must be a finite number")
    if abs(dec) > MAX_AMOUNT:
        raise InvalidRequestError(f"{field}: must be at most {MAX_AMOUNT} in size")
    return int((dec * MICRO).to_integral_value(rounding=ROUND_HALF_EVEN))


def format_money(micro: int) -> str:
    """Micro-units as exact decimal text for people: 300000 -> '0.3', -5 * MICRO -> '-5'."""
    sign = "-" if micro < 0 else ""
    whole, frac = divmod(abs(micro), MICRO)
    if not frac:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{frac:06d}".rstrip("0")


def _time(value: object, field: str) -> datetime | None:
    if value is not None and not isinstance(value, str):
        raise InvalidRequestError(f"{field}: must be an RFC 3339 time or null")
    try:
        return parse_time(value, field)
    except ConfigError:
        raise InvalidRequestError(
            f"{field}: not an RFC 3339 time (e.g. 2030-01-01T00:00:00Z)"
        ) from None


def _ident(value: object, field: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{field}: must be a non-empty string")
    if len(value) > MAX_ID_LEN or not NAME_RE.match(value):
        raise InvalidRequestError(
            f"{field}: {value!r} is not a valid id (letters, digits and ._:/@-, "
            f"at most {MAX_ID_LEN} characters)"
        )
    return value


def _group(groups: Sequence[str], value: object, field: str = "group") -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{field}: must be a non-empty string")
    if value not in groups:
        raise InvalidRequestError(
            f"{field}: unknown group {value!r} (configured: {', '.join(groups)})"
        )
    return value


async def _catalogue(store: Store, settings: Settings) -> View:
    """The live catalogue: the file's groups and models and those made through the admin
    API."""
    return view(await store.load_catalogue(), settings)


def _name(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME_LEN:
        raise InvalidRequestError(f"name: must be a string of at most {MAX_NAME_LEN} characters")
    return value


def _status(value: object) -> str:
    if value not in KEY_STATUSES:
        raise InvalidRequestError("status: must be 'enabled' or 'disabled'")
    assert isinstance(value, str)
    return value


MAX_LIMIT_ITEMS = 1000


def _quota(value: object) -> int | None:
    """A key's quota in balance units (null: none) -> micro-units."""
    if value is None:
        return None
    micro = to_micro(value, "quota")
    if micro < 0:
        raise InvalidRequestError("quota: must not be negative (null for no quota)")
    return micro


def _model_names(value: object) -> tuple[str, ...] | None:
    """A key's ``models``: catalogue names (null: every model of its group)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_LIMIT_ITEMS:
        raise InvalidRequestError("models: must be a list of model names or null")
    for i, name in enumerate(value):
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(f"models[{i}]: must be a non-empty string")
    return tuple(dict.fromkeys(value))


def group_models(v: View, group: str) -> list[str]:
    """The catalogue names a key of ``group`` may be limited to: the models some channel of
    the group serves, in catalogue order. A disabled channel counts: disabling one for a while
    does not make the keys' limits wrong."""
    served = {m for ch in v.channels if group in ch.groups for m in ch.models}
    return [m.name for m in v.models if m.name in served]


def _models_in_group(names: Sequence[object], v: View, group: str) -> None:
    """Each of a key's ``models`` must be a model of its group (a typo would make every
    request 404): 400 naming the first that is not."""
    allowed = group_models(v, group)
    for i, name in enumerate(names):
        if name not in allowed:
            raise InvalidRequestError(
                f"models[{i}]: {name!r} is not a model of group {group!r} "
                f"(its models: {', '.join(allowed) or 'none'})"
            )


def _networks(value: object) -> tuple[str, ...] | None:
    """A key's ``allowed_ips``: CIDRs or single addresses (null: from anywhere), kept as
    their normal text (10.1.2.3/8 -> 10.0.0.0/8)."""
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_LIMIT_ITEMS:
        raise InvalidRequestError("allowed_ips: must be a list of CIDRs or null")
    out: list[str] = []
    for i, cidr in enumerate(value):
        try:
            if not isinstance(cidr, str):
                raise ValueError
            out.append(str(ipaddress.ip_network(cidr.strip(), strict=False)))
        except ValueError:
            raise InvalidRequestError(
                f"allowed_ips[{i}]: {cidr!r} is not an IP network (e.g. 203.0.113.0/24)"
            ) from None
    return tuple(dict.fromkeys(out))


def key_limits(body: Mapping[str, object]) -> dict[str, object]:
    """The limits among ``body``'s fields (quota, models, allowed_ips), checked."""
    out: dict[str, object] = {}
    if "quota" in body:
        out["quota"] = _quota(body["quota"])
    if "models" in body:
        out["models"] = _model_names(body["models"])
    if "allowed_ips" in body:
        out["allowed_ips"] = _networks(body["allowed_ips"])
    return out


def only_fields(body: Mapping[str, object], allowed: frozenset[str] | set[str]) -> None:
    """Reject fields the endpoint does not know, so a typo is not silently ignored."""
    for k in body:
        if k not in allowed:
            raise InvalidRequestError(f"{k}: unknown field (expected {', '.join(sorted(allowed))})")


# ---- accounts ------------------------------------------------------------------------------


async def create_account(store: Store, account_id: object, balance: object = 0) -> Account:
    aid = _ident(account_id, "id")
    micro = to_micro(balance, "balance")
    try:
        return await store.create_account(aid, micro)
    except ConflictError:
        raise AlreadyExistsError(f"account {aid!r} already exists") from None


async def get_account(store: Store, account_id: str) -> Account:
    acct = await store.get_account(account_id)
    if acct is None:
        raise NotFoundError(f"account {account_id!r} not found")
    return acct


async def list_accounts(store: Store) -> list[Account]:
    balances = await store.load_balances()
    return [Account(id=k, balance=v) for k, v in sorted(balances.items())]


async def topup(store: Store, account_id: str, amount: object) -> Account:
    """Add ``amount`` (negative: a correction) to the balance, atomically in the store."""
    micro = to_micro(amount, "amount")
    account = await store.get_account(account_id)
    if account is None:
        raise NotFoundError(f"account {account_id!r} not found")
    # a balance stays within MAX_AMOUNT either way, so that repeated top-ups never leave a
    # signed 64-bit integer (SQLite would turn it into an inexact REAL, Redis refuse it); two
    # top-ups racing past this check still end far inside 2**63 micro-units
    if abs(account.balance + micro) > MAX_AMOUNT * MICRO:
        raise InvalidRequestError(
            f"amount: the balance would be {format_money(account.balance + micro)}; "
            f"a balance is at most {MAX_AMOUNT} in size"
        )
    try:
        return await store.topup(account_id, micro)
    except MissingError:
        raise NotFoundError(f"account {account_id!r} not found") from None


# ---- keys ----------------------------------------------------------------------------------


def new_secret() -> str:
    return "sk-" + secrets.token_urlsafe(36)  # 36 random bytes: 48 url-safe characters


def new_key_id() -> str:
    return "k_" + secrets.token_hex(6)


async def create_key(
    store: Store,
    settings: Settings,
    *,
    account: object,
    group: object = None,
    name: object = None,
    expires_at: object = None,
    quota: object = None,
    models: object = None,
    allowed_ips: object = None,
    owner: str | None = None,
) -> tuple[KeyRecord, str]:
    """Make a key (``owner``: the user making it in the console); returns the record and the
    secret, which nothing keeps."""
    if not isinstance(account, str) or not account:
        raise InvalidRequestError("account: must be a non-empty string")
    live = await _catalogue(store, settings)
    grp = settings.groups[0] if group is None else _group(live.groups, group)
    name = _name("" if name is None else name)
    expiry = _time(expires_at, "expires_at")
    limit_quota, limit_models = _quota(quota), _model_names(models)
    if isinstance(models, list):  # given, and a list of names (_model_names checked)
        _models_in_group(models, live, grp)
    limit_ips = _networks(allowed_ips)
    if await store.get_account(account) is None:
        raise NotFoundError(f"account {account!r} not found")
    now = datetime.now(UTC).replace(microsecond=0)
    for _ in range(3):
        secret = new_secret()
        rec = KeyRecord(
            id=new_key_id(),
            key_hash=hash_key(secret),
            account=account,
            group=grp,
            name=name,
            status="enabled",
            expires_at=expiry,
            created_at=now,
            hint=key_hint(secret),
            quota=limit_quota,
            models=limit_models,
            allowed_ips=limit_ips,
            owner=owner,
        )
        try:
            await store.create_key(rec)
        except ConflictError:
            continue  # a random id collided; draw again
        except MissingError:
            what = f"account {account!r}" if owner is None else f"account or user {owner!r}"
            raise NotFoundError(f"{what} not found") from None
        return rec, secret
    raise AlreadyExistsError("could not allocate a unique key id; try again")


async def get_key(store: Store, key_id: str) -> KeyRecord:
    rec = await store.get_key(key_id)
    if rec is None:
        raise NotFoundError(f"key {key_id!r} not found")
    return rec


async def spent_by_key(store: Store) -> dict[str, int]:
    """What each key spent in all (micro-units), for ``key_json``."""
    return await store.load_spent()


async def list_keys(store: Store, account: str | None = None) -> list[KeyRecord]:
    keys = await store.list_keys(account or None)
    return sorted(keys, key=lambda k: (k.created_at or datetime.min.replace(tzinfo=UTC), k.id))


async def update_key(
    store: Store, settings: Settings, key_id: str, body: Mapping[str, object]
) -> KeyRecord:
    """Change any of status, group, expires_at (null clears the expiry), name and the
    limits quota, models and allowed_ips (null clears a limit). The key's models, given or
    kept, must be models of its group, given or kept."""
    only_fields(body, KEY_CHANGES)
    changes: dict[str, object] = key_limits(body)
    if "status" in body:
        changes["status"] = _status(body["status"])
    if "group" in body or changes.get("models") is not None:
        live = await _catalogue(store, settings)
        if "group" in body:
            changes["group"] = _group(live.groups, body["group"])
        current = await get_key(store, key_id)
        group = str(changes.get("group", current.group))
        # the names given (a list: key_limits checked them), else those the key has
        names = body["models"] if "models" in body else current.models
        if isinstance(names, list | tuple):
            _models_in_group(names, live, group)
    lapsed = False
    if "expires_at" in body:
        changes["expires_at"] = _time(body["expires_at"], "expires_at")
        expires = (await get_key(store, key_id)).expires_at
        lapsed = expires is not None and expires <= datetime.now(UTC)
    if "name" in body:
        changes["name"] = _name(body["name"])
    if not changes:
        return await get_key(store, key_id)
    try:
        rec = await store.update_key(key_id, changes)
    except MissingError:
        raise NotFoundError(f"key {key_id!r} not found") from None
    # an expired key given a new expiry is like a disabled one enabled again: the sessions
    # it had when it lapsed stay over
    if changes.get("status") == "disabled" or lapsed:
        await end_key_sessions(store, rec)
    return rec


async def delete_key(store: Store, key_id: str) -> None:
    rec = await store.get_key(key_id)
    if rec is None or not await store.delete_key(key_id):
        raise NotFoundError(f"key {key_id!r} not found")
    await end_key_sessions(store, rec)


async def end_key_sessions(store: Store, rec: KeyRecord) -> None:
    """Every console session the key signed in until now ends for good, on every instance
    within a second: enabling the key again (or making it again with the same secret) does
    not bring one back (``console/session.py``)."""
    # imported here: the console package imports this module
    from gateway.operator.console.session import LIFETIME, key_sessions

    now = int(time.time())
    await store.revoke_session(key_sessions(rec.key_hash), now + LIFETIME, now)


# ---- usage ---------------------------------------------------------------------------------


def usage_limit(value: object) -> int:
    """The ``limit`` of a usage query: default 100, at least 1, at most 1000 (larger is cut)."""
    if value is None or value == "":
        return USAGE_DEFAULT_LIMIT
    if isinstance(value, bool):
        raise InvalidRequestError("limit: must be a positive integer")
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise InvalidRequestError("limit: must be a positive integer") from None
    if not isinstance(value, int) or value < 1:
        raise InvalidRequestError("limit: must be a positive integer")
    return min(value, USAGE_MAX_LIMIT)


async def usage(
    store: Store, account: str | None = None, limit: object = None
) -> list[UsageRecord]:
    """Usage records, newest first."""
    n = usage_limit(limit)
    records = await store.usage(account or None, n)
    return records[:n]


# ---- JSON shapes ---------------------------------------------------------------------------
# usage_json (store/records.py), model_json and channel_json (store/catalogue.py) are imported
# above: the store writes the same shapes.


def daily_json(d: DailyUsage) -> dict[str, JSON]:
    return {
        "day": d.day,
        "account": d.account,
        "key_id": d.key_id,
        "model": d.model,
        "requests": d.requests,
        "prompt_tokens": d.prompt_tokens,
        "completion_tokens": d.completion_tokens,
        "cost": from_micro(d.cost),
        "cache_read_tokens": d.cache_read_tokens,
        "cache_write_tokens": d.cache_write_tokens,
    }


def account_json(acct: Account) -> dict[str, JSON]:
    return {"id": acct.id, "balance": from_micro(acct.balance)}


def key_json(rec: KeyRecord, secret: str | None = None, spent: int = 0) -> dict[str, JSON]:
    """A key as shown: never its hash; its secret only when just made; ``spent`` (what it
    spent in all, micro-units) in balance units; ``owner``: the user that made it (null: the
    admin's)."""
    out: dict[str, JSON] = {"id": rec.id}
    if secret is not None:
        out["key"] = secret
    out.update(
        name=rec.name,
        account=rec.account,
        group=rec.group,
        status=rec.status,
        expires_at=format_time(rec.expires_at),
        created_at=format_time(rec.created_at),
        hint=rec.hint,
        quota=None if rec.quota is None else from_micro(rec.quota),
        spent=from_micro(spent),
        models=None if rec.models is None else list(rec.models),
        allowed_ips=None if rec.allowed_ips is None else list(rec.allowed_ips),
        owner=rec.owner,
    )
    return out
