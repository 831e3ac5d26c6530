"""Users and redemption codes in the Redis store (mixed into ``redis.RedisStore``, whose
client, scripts and key names it uses: ``RedisStore.people`` names every key here).

Users share the key records' slot (``{keys}``), so deleting a user with its keys is one
script on a cluster too. A key a user made is listed in the user's set of keys
(``PeopleKeys.owned``), which ``CREATE_KEY_LUA`` and ``DELETE_KEY_LUA`` keep.

A redemption code credits its account exactly once, in two steps because the code (slot
``{redeem}``) and the account (slot ``{acct:<id>}``) cannot be in one script on a cluster:

1. **Claim** (``CLAIM_CODE_LUA``, the codes' slot): atomically, the code is checked (known,
   unclaimed, unexpired) and the claim (account, user, time) written, and the code put in
   the set of pending claims. However many instances redeem one code at once, one claim is
   written; every other call finds the code used (400, nothing changes).
2. **Credit** (``CREDIT_CODE_LUA``, the account's slot): the code's hash is added to the
   account's set of redeemed codes, and the amount to its balance only when that added it,
   so running the credit twice (a retry, a recovery beside the claimant) credits once.
3. The code leaves the pending set.

A process that dies between 1 and 2 leaves a claim without its credit: it stays in the
pending set, and the next redeem that finds a code used, or the next listing of the codes,
finishes every pending claim (step 2 again, which is idempotent). So each code credits its
claimant exactly once, sooner or later, and never anyone else.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, ClassVar

import redis.asyncio as aioredis

from gateway.store import (
    Account,
    CodeRefusedError,
    ConflictError,
    MissingError,
    RedemptionRecord,
    UserRecord,
)
from gateway.store.records import to_micros
from gateway.store.redemptions import claim_text, decode_code, encode_code
from gateway.store.redis_scripts import Scripts
from gateway.store.users import apply_user_changes, decode_user, encode_user, username_key

log = logging.getLogger("gateway.store.redis")

UPDATE_RETRIES = 50
REFUSALS = {0: "unknown", 1: "used", 2: "expired"}  # CLAIM_CODE_LUA's answers


@dataclass(frozen=True, slots=True)
class PeopleKeys:
    """The key names this module uses (``{user}``, ``{account}``: filled in), all constants of
    ``store/redis.py``."""

    users: str
    usernames: str
    owned: str  # {user}
    key_records: str
    key_hashes: str
    accounts: str
    balance: str  # {account}
    carry: str  # {account}
    codes: str
    claims: str
    pending: str
    redeemed: str  # {account}


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


class RedisPeople:
    """The ``Store``'s user and redemption methods over the store's client."""

    people: ClassVar[PeopleKeys]
    _scripts: Scripts

    if TYPE_CHECKING:

        @property
        def client(self) -> aioredis.Redis: ...
        async def _changed(self) -> None: ...

    # -- users ------------------------------------------------------------------------------

    async def list_users(self) -> list[UserRecord]:
        raw = await self.client.hgetall(self.people.users)
        users = [decode_user(v) for v in raw.values()]
        epoch = datetime.min.replace(tzinfo=UTC)
        users.sort(key=lambda u: (u.created_at or epoch, u.id))
        return users

    async def create_user(self, rec: UserRecord, balance: int | None = None) -> None:
        """With ``balance``, the account first (SET NX: a new account is one nobody else
        knows); when the user then cannot be added, that account is removed again."""
        names, client = self.people, self.client
        bal = names.balance.format(account=rec.account)
        if balance is not None:
            if not await client.set(bal, balance, nx=True):
                raise ConflictError(f"account {rec.account!r} already exists")
            await client.sadd(names.accounts, rec.account)
        elif not await client.exists(bal):
            raise MissingError(f"no account {rec.account!r}")
        made = await self._scripts.create_user(
            keys=[names.users, names.usernames],
            args=[rec.id, username_key(rec.username), encode_user(rec)],
        )
        if int(made) != 0:
            if balance is not None:
                await client.srem(names.accounts, rec.account)
                await client.delete(bal)
            raise ConflictError(f"user {rec.id!r} or {rec.username!r} exists")
        await self._changed()

    async def get_user(self, user_id: str) -> UserRecord | None:
        raw = await self.client.hget(self.people.users, user_id)
        return None if raw is None else decode_user(raw)

    async def find_user(self, username: str) -> UserRecord | None:
        user_id = await self.client.hget(self.people.usernames, username_key(username))
        return None if user_id is None else await self.get_user(_text(user_id))

    async def update_user(self, user_id: str, changes: Mapping[str, object]) -> UserRecord:
        users = self.people.users
        for _ in range(UPDATE_RETRIES):
            raw = await self.client.hget(users, user_id)
            if raw is None:
                raise MissingError(f"no user {user_id!r}")
            new = apply_user_changes(decode_user(raw), changes)
            written = await self._scripts.update_user(
                keys=[users], args=[user_id, raw, encode_user(new)]
            )
            if int(written) == 1:
                await self._changed()
                return new
        raise ConflictError(f"user {user_id!r} kept changing; update not applied")

    async def delete_user(self, user_id: str) -> list[str]:
        found = await self.get_user(user_id)
        if found is None:
            raise MissingError(f"no user {user_id!r}")
        names = self.people
        deleted = await self._scripts.delete_user(
            keys=[
                names.users,
                names.usernames,
                names.owned.format(user=user_id),
                names.key_records,
                names.key_hashes,
            ],
            args=[user_id, username_key(found.username)],
        )
        if deleted is None:
            raise MissingError(f"no user {user_id!r}")
        await self._changed()
        return sorted(_text(k) for k in deleted)

    # -- redemption codes (the module docstring: claim, then credit) -------------------------

    async def create_redemptions(self, recs: Sequence[RedemptionRecord]) -> None:
        args: list[bytes | str] = []
        for rec in recs:
            args += [rec.code_hash, encode_code(rec)]
        if args and int(await self._scripts.create_codes(keys=[self.people.codes], args=args)) == 0:
            raise ConflictError("a redemption code already exists")

    async def list_redemptions(self) -> list[RedemptionRecord]:
        await self._finish_claims()
        names, client = self.people, self.client
        codes = await client.hgetall(names.codes)
        claims = await client.hgetall(names.claims)
        out = [decode_code(_text(h), raw, claims.get(h)) for h, raw in codes.items()]
        out.sort(key=lambda r: (r.created_at, r.id))
        return out

    async def redeem(
        self, code_hash: str, account: str, user: str, now: datetime
    ) -> tuple[RedemptionRecord, Account]:
        names, client = self.people, self.client
        if not await client.exists(names.balance.format(account=account)):
            raise MissingError(f"no account {account!r}")
        claim = claim_text(account, user, now)
        claimed = await self._scripts.claim_code(
            keys=[names.codes, names.claims, names.pending],
            args=[code_hash, claim, to_micros(now)],
        )
        if isinstance(claimed, int):
            if claimed == 1:  # a claim whose credit never came (a process died) is finished
                await self._finish_claims()
            raise CodeRefusedError(REFUSALS[claimed])
        rec = decode_code(code_hash, claimed, claim)
        balance = await self._credit(rec)
        await client.srem(names.pending, code_hash)
        await self._changed()
        carry = await client.get(names.carry.format(account=account))
        return rec, Account(account, balance, int(carry or 0))

    async def _credit(self, rec: RedemptionRecord) -> int:
        """Step 2: the code's amount to its claimant's account, once (idempotent)."""
        assert rec.account is not None
        names = self.people
        balance = await self._scripts.credit_code(
            keys=[
                names.balance.format(account=rec.account),
                names.redeemed.format(account=rec.account),
            ],
            args=[rec.code_hash, rec.amount],
        )
        if balance is None:
            raise MissingError(f"no account {rec.account!r}")
        return int(balance)

    async def _finish_claims(self) -> None:
        """Credit every pending claim (step 2 again: a claim already credited is not credited
        twice) and clear it."""
        names, client = self.people, self.client
        pending = await client.smembers(names.pending)
        for member in pending:
            code_hash = _text(member)
            raw = await client.hget(names.codes, code_hash)
            claim = await client.hget(names.claims, code_hash)
            if raw is not None and claim is not None:
                try:
                    await self._credit(decode_code(code_hash, raw, claim))
                except MissingError:  # no such account: kept pending, never credited elsewhere
                    log.warning("redeem.claim_without_account code_hash=%s", code_hash[:12])
                    continue
            await client.srem(names.pending, code_hash)
        if pending:
            await self._changed()
