"""Users (CONTRACT §5b) as the operator manages them and as they manage themselves: one set of
service functions behind the admin API (``admin.py``), the command line (``cli/users.py``)
and the console's own routes (``console/users.py``).

A user signs in to the console with a username and a password, belongs to an account (its
balance is the account's) and makes keys of its own in the groups it is allowed. Usernames
are 3 to 64 letters, digits and ``._@-``, unique regardless of case; passwords are kept only
as their argon2 hash (``passwords.py``).

Disabling a user ends its console sessions on every instance (``end_sessions``: a revoked
entry like sign-out's, which every cache loads) and makes its keys answer 401 until it is
enabled again (the cache holds a disabled user's keys disabled: ``store/cache.py``). Enabled
again, its keys work again but the sessions ended stay ended. An admin's new password for a
user ends its sessions too. Deleting a user deletes its keys with it.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from gateway.config import Settings
from gateway.errors import InvalidRequestError, NotFoundError
from gateway.operator.accounts import (
    AlreadyExistsError,
    end_key_sessions,
    format_time,
    only_fields,
)
from gateway.operator.console.session import LIFETIME
from gateway.operator.passwords import checked, hash_password, needs_rehash, verify_password
from gateway.store import ConflictError, MissingError, Store, UserRecord
from gateway.store.cache import USER_SESSIONS
from gateway.store.catalogue import view
from gateway.store.users import USER_STATUSES, USERNAME_RE
from gateway.types import JSON

CREATE_FIELDS = frozenset({"username", "password", "account", "groups"})
CHANGE_FIELDS = frozenset({"password", "groups", "status"})
MAX_GROUPS = 100


def user_json(u: UserRecord) -> dict[str, JSON]:
    """A user as shown: never its password or its hash."""
    return {
        "id": u.id,
        "username": u.username,
        "account": u.account,
        "groups": list(u.groups),
        "status": u.status,
        "created_at": format_time(u.created_at),
    }


def new_user_id() -> str:
    return "u_" + secrets.token_hex(6)


def _username(value: object) -> str:
    if not isinstance(value, str) or not USERNAME_RE.match(value):
        raise InvalidRequestError(
            "username: 3 to 64 letters, digits and ._@- (starting with a letter or a digit)"
        )
    return value


async def _groups(store: Store, settings: Settings, value: object) -> tuple[str, ...]:
    """The groups a user may make keys in: each a group of the live catalogue."""
    if not isinstance(value, list) or len(value) > MAX_GROUPS:
        raise InvalidRequestError("groups: must be a list of group names")
    known = view(await store.load_catalogue(), settings).groups
    for i, g in enumerate(value):
        if not isinstance(g, str) or g not in known:
            raise InvalidRequestError(
                f"groups[{i}]: unknown group {g!r} (groups: {', '.join(known)})"
            )
    return tuple(dict.fromkeys(value))


async def _add(store: Store, rec: UserRecord, balance: int | None) -> UserRecord:
    try:
        await store.create_user(rec, balance)
    except ConflictError:
        raise AlreadyExistsError(f"username {rec.username!r} is taken") from None
    except MissingError:
        raise NotFoundError(f"account {rec.account!r} not found") from None
    return rec


async def create_user(store: Store, settings: Settings, body: Mapping[str, object]) -> UserRecord:
    """The admin's: a user of an account that exists, in the groups given (default: the
    console's ``default_groups``)."""
    only_fields(body, CREATE_FIELDS)
    username = _username(body.get("username"))
    password = checked(body.get("password"))
    account = body.get("account")
    if not isinstance(account, str) or not account:
        raise InvalidRequestError("account: must be a non-empty string")
    given = body.get("groups", list(settings.console.default_groups))
    groups = await _groups(store, settings, given)
    now = datetime.now(UTC).replace(microsecond=0)
    rec = UserRecord(
        new_user_id(), username, await hash_password(password), account, groups, "enabled", now
    )
    return await _add(store, rec, None)


async def register(store: Store, settings: Settings, body: Mapping[str, object]) -> UserRecord:
    """Signing oneself up (``console.registration: open``): a user with an account of its
    own (its id is the user's; balance 0) in the console's ``default_groups``."""
    only_fields(body, {"username", "password"})
    username = _username(body.get("username"))
    password = checked(body.get("password"))
    user_id = new_user_id()
    groups = await _groups(store, settings, list(settings.console.default_groups))
    now = datetime.now(UTC).replace(microsecond=0)
    rec = UserRecord(
        user_id, username, await hash_password(password), user_id, groups, "enabled", now
    )
    return await _add(store, rec, 0)


async def get_user(store: Store, user_id: str) -> UserRecord:
    found = await store.get_user(user_id)
    if found is None:
        raise NotFoundError(f"user {user_id!r} not found")
    return found


async def list_users(store: Store) -> list[UserRecord]:
    return await store.list_users()


async def end_sessions(store: Store, user_id: str) -> None:
    """End every console session of the user begun until now, on every instance: revoked
    like a signed-out session, until the last of them would have ended anyway."""
    now = int(time.time())
    await store.revoke_session(USER_SESSIONS + user_id, now + LIFETIME, now)


async def update_user(
    store: Store, settings: Settings, user_id: str, body: Mapping[str, object]
) -> UserRecord:
    """The admin's change: any of ``password`` (a new one), ``groups``, ``status``."""
    only_fields(body, CHANGE_FIELDS)
    changes: dict[str, object] = {}
    if "status" in body:
        if body["status"] not in USER_STATUSES:
            raise InvalidRequestError("status: must be 'enabled' or 'disabled'")
        changes["status"] = body["status"]
    if "groups" in body:
        changes["groups"] = await _groups(store, settings, body["groups"])
    if "password" in body:
        changes["password_hash"] = await hash_password(checked(body["password"]))
    if not changes:
        return await get_user(store, user_id)
    try:
        rec = await store.update_user(user_id, changes)
    except MissingError:
        raise NotFoundError(f"user {user_id!r} not found") from None
    if rec.status != "enabled" or "password_hash" in changes:
        await end_sessions(store, user_id)
    return rec


async def delete_user(store: Store, user_id: str) -> list[str]:
    """Delete the user and its keys; the ids of those keys. Each deleted key's console
    sessions end for good, as any deleted key's do (``accounts.end_key_sessions``)."""
    user = await store.get_user(user_id)
    owned = [] if user is None else await store.list_keys(user.account)
    try:
        deleted = await store.delete_user(user_id)
    except MissingError:
        raise NotFoundError(f"user {user_id!r} not found") from None
    for rec in owned:
        if rec.id in deleted:
            await end_key_sessions(store, rec)
    return deleted


async def authenticate(store: Store, username: object, password: object) -> UserRecord | None:
    """The user these credentials sign in, or None (unknown, wrong, or disabled: the same
    answer, in the same time). A hash of older parameters is replaced on the way."""
    if not isinstance(username, str) or not isinstance(password, str):
        return None
    if len(password) > 1024 or len(username) > 64:
        return None
    found = await store.find_user(username) if USERNAME_RE.match(username) else None
    ok = await verify_password(None if found is None else found.password_hash, password)
    if not ok or found is None or found.status != "enabled":
        return None
    if needs_rehash(found.password_hash):
        fresh = await hash_password(password)
        found = await store.update_user(found.id, {"password_hash": fresh})
    return found


async def change_password(store: Store, user: UserRecord, current: object, new: object) -> bool:
    """The user's own change: False (nothing changes) when ``current`` is not its password."""
    fresh = checked(new, "new")
    if not isinstance(current, str) or not await verify_password(user.password_hash, current):
        return False
    await store.update_user(user.id, {"password_hash": await hash_password(fresh)})
    return True


def usable_groups(user: UserRecord, live: Sequence[str]) -> list[str]:
    """The groups the user may make keys in that the catalogue still has."""
    return [g for g in user.groups if g in live]
