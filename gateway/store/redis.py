"""The shared store: Redis, for several gateway instances (``redis://host:port/db``), or a
Redis Cluster (``redis+cluster://host:port,host:port,...``: the nodes to start from; a
password as ``redis+cluster://:password@host:port,...``).

Every key name the gateway uses is a constant below (the Lua scripts are in
``redis_scripts.py``). Keys that one Lua script touches together share a hash tag, so the layout
works on a Redis Cluster too: an account's balance and its usage live in slot ``{acct:<id>}``,
and all key records in slot ``{keys}`` (a few thousand small records that change rarely; the hot
path reads them from the cache, never from here).

- A debit and its usage record are one atomic script per record. The record is added to the
  account's usage sorted set with ``ZADD NX`` first and the debit happens only when the record
  is new, so re-sending a batch after a failure (the writer retries) never debits twice.
- ``gw:version`` is INCR'd after every key change, account creation, top-up, catalogue
  change, console sign-out and session-secret rotation (never by a debit), and the new value
  is PUBLISHed on ``gw:changes``; caches poll the version.
- Console sessions signed out are one sorted set (nonce scored by when the session ends),
  trimmed of those over at each sign-out and expiring with the last of them.
- The catalogue (groups, models, channels) is one hash, ``gw:catalogue``: a field per entry
  and a ``version`` field that each edit's script checks and increments, so an edit is a
  compare-and-set on one key (``store/catalogue.py``).
- Secrets are never stored: key records are found by the SHA-256 of the secret; redemption
  codes likewise by the SHA-256 of the code.
- Users live beside the key records (slot ``{keys}``); redemption codes in slot ``{redeem}``,
  each credited in its account's slot in a second, idempotent step (``redis_people.py``
  explains why that is still exactly once).
- The audit log is one capped stream in its own slot, ``gw:{audit}:log`` (``redis_audit.py``).
- On a cluster every script's keys are in one slot (the tags above); pipelines hold plain
  commands only, across slots (a cluster client splits them by node); scripts, which a cluster
  pipeline cannot hold, are sent one by one and concurrently (settlement of a batch).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, cast
from urllib.parse import unquote

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from gateway.store import (
    MICRO,
    Account,
    ConflictError,
    CursorError,
    DailyUsage,
    KeyRecord,
    MissingError,
    Position,
    StoreClosedError,
    UsagePage,
    UsageQuery,
    UsageRecord,
    day_of,
)
from gateway.store.catalogue import CatalogueRecords, Editor, seed_edit
from gateway.store.records import (
    apply_key_changes,
    decode_key,
    encode_key,
    encode_usage,
    seed_keys,
    to_micros,
)
from gateway.store.redis_audit import AuditStream
from gateway.store.redis_people import PeopleKeys, RedisPeople
from gateway.store.redis_scripts import Scripts
from gateway.store.redis_signin import SignInKeys
from gateway.store.redis_usage import Scan, daily_totals, scan_usage

if TYPE_CHECKING:
    from gateway.config import Settings

CLUSTER_SCHEME = "redis+cluster://"
CLUSTER_CONCURRENCY = 16  # scripts in flight at once on a cluster (its client's pool is small)

# -- key names -------------------------------------------------------------------------------
VERSION_KEY = "gw:version"  # string counter, INCR'd on every change but debits
CHANGES_CHANNEL = "gw:changes"  # pub/sub: the new version after each change
CATALOGUE_KEY = "gw:catalogue"  # hash: kind:name -> entry JSON, and "version" (edit counter)
CATALOGUE_VERSION_FIELD = b"version"
ACCOUNTS_KEY = "gw:accounts"  # set of account ids
BALANCE_KEY = "gw:{{acct:{account}}}:bal"  # string: balance in micro-units
USAGE_KEY = "gw:{{acct:{account}}}:usage"  # sorted set: usage JSON scored by time (µs)
SPENT_KEY = "gw:{{acct:{account}}}:spent"  # hash: key id -> what it spent in all (micro-units)
# string: pico-units the account's records cost beyond what was debited, 0 to 999999 (absent: 0,
# as for every account before exact costs)
CARRY_KEY = "gw:{{acct:{account}}}:carry"
# hash: "<key id>\t<model>\t" + r (requests) | p, c (prompt, completion tokens) | $ (cost)
DAY_KEY = "gw:{{acct:{account}}}:day:{day}"
DAILY_MAX_DAYS = 400  # days one usage_daily call reads at most
USAGE_ACCOUNTS_KEY = "gw:usage:accounts"  # set of accounts that have usage records
KEY_RECORDS_KEY = "gw:{keys}:records"  # hash: key id -> key record JSON
KEY_HASHES_KEY = "gw:{keys}:by_hash"  # hash: SHA-256 of the secret -> key id
# console users, in the key records' slot: a user and its keys are deleted in one script
USERS_KEY = "gw:{keys}:users"  # hash: user id -> user record JSON
USERNAMES_KEY = "gw:{keys}:usernames"  # hash: username in lower case -> user id
OWNED_KEY = "gw:{{keys}}:owned:{user}"  # set: the ids of the keys the user made
# redemption codes, every code in one slot; each credit in its account's (redis_people.py)
CODES_KEY = "gw:{redeem}:codes"  # hash: SHA-256 of the code -> its record JSON (unchanging)
CLAIMS_KEY = "gw:{redeem}:claims"  # hash: SHA-256 of the code -> account TAB user TAB µs
PENDING_KEY = "gw:{redeem}:pending"  # set: codes claimed whose credit is not known to be done
REDEEMED_KEY = "gw:{{acct:{account}}}:redeemed"  # set: SHA-256 of each code credited here

INSTANCES_KEY = "gw:instances"  # set of instance ids that published holds
HOLDS_KEY = "gw:holds:{{{instance}}}"  # hash: account -> micro-units held; expires
COOLING_KEY = "gw:cooling"  # hash: channel -> until (ms since the epoch)
# sorted set: nonce of a console session signed out -> when it ends (unix seconds); one key
# (one slot), which expires with the last of them
REVOKED_KEY = "gw:revoked_sessions"
USAGE_KEEP = 1_000_000  # newest usage records kept per account
# a usage listing reads an account's records newest first in windows of ZREVRANGEBYSCORE
# (USAGE_BATCH at a time, or the page's size and one more when nothing is filtered out), and
# reads at most USAGE_SCAN records per call in all (each account at least the page's size):
# a page of rare matches comes back short, with a cursor where the reading stopped
USAGE_BATCH = 1_000
USAGE_SCAN = 10_000
USAGE_SCAN_CONCURRENCY = 16  # accounts read at once by a listing of every account
# a Redis that is away fails a call within these (seconds) rather than hanging it
CONNECT_TIMEOUT = 2.0
COMMAND_TIMEOUT = 10.0
# RESP2, said outright: redis-py 8 speaks RESP3 by default, and with it (and its maintenance
# notifications, on by default) its pool hands out a connection the server closed without
# checking it, so the first call after a Redis restart failed (an admin 503)
PROTOCOL = 2
UPDATE_RETRIES = 50


def balance_key(account: str) -> str:
    return BALANCE_KEY.format(account=account)


def usage_key(account: str) -> str:
    return USAGE_KEY.format(account=account)


def spent_key(account: str) -> str:
    return SPENT_KEY.format(account=account)


def carry_key(account: str) -> str:
    return CARRY_KEY.format(account=account)


def _settle_call(rec: UsageRecord) -> tuple[list[str], list[bytes | str | int]]:
    """SETTLE_LUA's keys (all in the account's slot) and arguments for one record."""
    account = rec.account
    keys = [
        balance_key(account),
        usage_key(account),
        spent_key(account),
        DAY_KEY.format(account=account, day=day_of(rec)),
        carry_key(account),
    ]
    args: list[bytes | str | int] = [
        rec.cost,
        to_micros(rec.time),
        encode_usage(rec),
        USAGE_KEEP,
        rec.key_id,
        f"{rec.key_id}\t{rec.model}\t",
        rec.prompt_tokens,
        rec.completion_tokens,
        rec.cost_pico,
        rec.cache_read_tokens,
        rec.cache_write_tokens,
    ]
    return keys, args


def cluster_nodes(url: str) -> tuple[list[ClusterNode], str | None]:
    """The start-up nodes (and the password) of a ``redis+cluster://`` URL."""
    rest = url[len(CLUSTER_SCHEME) :].split("/", 1)[0]
    password = None
    if "@" in rest:
        auth, rest = rest.rsplit("@", 1)
        password = unquote(auth.split(":", 1)[-1]) or None
    nodes = []
    for part in rest.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"redis+cluster URL: {part!r} is not host:port")
        nodes.append(ClusterNode(host.strip("[]"), int(port)))
    return nodes, password


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def owned_key(user: str | None) -> str:
    """The set of the keys a user made (none: a key of no user, whose set is never written)."""
    return OWNED_KEY.format(user=user or "")


class RedisStore(RedisPeople, SignInKeys, AuditStream):
    """The ``Store`` over Redis (see the module docstring; users and redemption codes:
    ``redis_people.py``; the session secret and sign-in failures, with their key names:
    ``redis_signin.py``; the audit log's stream: ``redis_audit.py``)."""

    _scripts: Scripts
    people = PeopleKeys(
        users=USERS_KEY,
        usernames=USERNAMES_KEY,
        owned=OWNED_KEY,
        key_records=KEY_RECORDS_KEY,
        key_hashes=KEY_HASHES_KEY,
        accounts=ACCOUNTS_KEY,
        balance=BALANCE_KEY,
        carry=CARRY_KEY,
        codes=CODES_KEY,
        claims=CLAIMS_KEY,
        pending=PENDING_KEY,
        redeemed=REDEEMED_KEY,
    )

    def __init__(self, url: str) -> None:
        self.url = url
        self.cluster = url.startswith(CLUSTER_SCHEME)
        self._client: aioredis.Redis | None = None

    @property
    def client(self) -> aioredis.Redis:
        if self._client is None:
            raise StoreClosedError("RedisStore is not open")
        return self._client

    async def open(self) -> None:
        if self._client is not None:
            return
        if self.cluster:
            nodes, password = cluster_nodes(self.url)
            cluster = RedisCluster(
                startup_nodes=nodes,
                password=password,
                decode_responses=False,
                socket_connect_timeout=CONNECT_TIMEOUT,
                socket_timeout=COMMAND_TIMEOUT,
                protocol=PROTOCOL,
            )
            # the cluster client has every command the store uses (not MULTI, not scripts
            # inside pipelines: see the module's notes), so it stands in for a Redis
            client = cast(aioredis.Redis, cluster)
        else:
            client = aioredis.from_url(
                self.url,
                decode_responses=False,
                socket_connect_timeout=CONNECT_TIMEOUT,
                socket_timeout=COMMAND_TIMEOUT,
                protocol=PROTOCOL,
            )
        self._scripts = Scripts.register(client)
        try:
            await client.ping()
        except BaseException:
            await client.aclose()
            raise
        self._client = client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _changed(self) -> None:
        version = await self.client.incr(VERSION_KEY)
        await self.client.publish(CHANGES_CHANNEL, version)

    # -- seed, version, snapshot ------------------------------------------------------------

    async def seed(self, settings: Settings) -> None:
        client = self.client
        changed = False
        if settings.accounts:
            async with client.pipeline(transaction=False) as pipe:
                for a in settings.accounts:
                    pipe.set(balance_key(a.id), round(a.balance * MICRO), nx=True)
                pipe.sadd(ACCOUNTS_KEY, *[a.id for a in settings.accounts])
                results = await pipe.execute()
            changed = any(bool(r) for r in results[:-1])
        for rec in seed_keys(settings, datetime.now(UTC)):
            created = await self._scripts.create_key(
                keys=[KEY_RECORDS_KEY, KEY_HASHES_KEY, owned_key(None), USERS_KEY],
                args=[rec.id, rec.key_hash, encode_key(rec), ""],
            )
            changed = changed or int(created) == 0
        if await client.type(CATALOGUE_KEY) in (b"string", "string"):
            await client.delete(CATALOGUE_KEY)  # an earlier version's one JSON value
        if await self._apply_catalogue_edit(seed_edit(settings)):
            changed = True
        if changed:
            await self._changed()

    async def version(self) -> int:
        raw = await self.client.get(VERSION_KEY)
        return 0 if raw is None else int(raw)

    async def load_keys(self) -> list[KeyRecord]:
        raw = await self.client.hgetall(KEY_RECORDS_KEY)
        return [decode_key(v) for v in raw.values()]

    async def load_balances(self) -> dict[str, int]:
        members = await self.client.smembers(ACCOUNTS_KEY)
        ids = sorted(_text(m) for m in members)
        if not ids:
            return {}
        async with self.client.pipeline(transaction=False) as pipe:
            for account in ids:
                pipe.get(balance_key(account))
            values = await pipe.execute()
        return {a: int(v) for a, v in zip(ids, values, strict=True) if v is not None}

    async def load_spent(self) -> dict[str, int]:
        members = await self.client.smembers(USAGE_ACCOUNTS_KEY)
        if not members:
            return {}
        async with self.client.pipeline(transaction=False) as pipe:
            for account in sorted(_text(m) for m in members):
                pipe.hgetall(spent_key(account))
            tables = await pipe.execute()
        return {_text(k): int(v) for table in tables for k, v in table.items()}

    async def load_revoked(self, now: int) -> dict[str, int]:
        raw = cast(
            "list[tuple[bytes, float]]",
            await self.client.zrangebyscore(REVOKED_KEY, f"({now}", "+inf", withscores=True),
        )
        return {_text(nonce): int(until) for nonce, until in raw}

    async def revoke_session(self, nonce: str, expires: int, now: int) -> None:
        await self._scripts.revoke_session(keys=[REVOKED_KEY], args=[now, nonce, expires])
        await self._changed()

    # -- accounts ---------------------------------------------------------------------------

    async def create_account(self, account_id: str, balance: int) -> Account:
        if not await self.client.set(balance_key(account_id), balance, nx=True):
            raise ConflictError(f"account {account_id!r} already exists")
        await self.client.sadd(ACCOUNTS_KEY, account_id)
        await self._changed()
        return Account(account_id, balance)

    async def get_account(self, account_id: str) -> Account | None:
        raw, carry = await self.client.mget(balance_key(account_id), carry_key(account_id))
        return None if raw is None else Account(account_id, int(raw), int(carry or 0))

    async def topup(self, account_id: str, amount: int) -> Account:
        new = await self._scripts.topup(keys=[balance_key(account_id)], args=[amount])
        if new is None:
            raise MissingError(f"no account {account_id!r}")
        await self._changed()
        carry = await self.client.get(carry_key(account_id))
        return Account(account_id, int(new), int(carry or 0))

    # -- keys -------------------------------------------------------------------------------

    async def create_key(self, rec: KeyRecord) -> None:
        if rec.created_at is None:
            rec = replace(rec, created_at=datetime.now(UTC))
        if not await self.client.exists(balance_key(rec.account)):
            raise MissingError(f"no account {rec.account!r}")
        result = int(
            await self._scripts.create_key(
                keys=[KEY_RECORDS_KEY, KEY_HASHES_KEY, owned_key(rec.owner), USERS_KEY],
                args=[rec.id, rec.key_hash, encode_key(rec), rec.owner or ""],
            )
        )
        if result == 3:
            raise MissingError(f"no user {rec.owner!r}")
        if result != 0:
            raise ConflictError(f"key {rec.id!r} (or its secret) already exists")
        await self._changed()

    async def get_key(self, key_id: str) -> KeyRecord | None:
        raw = await self.client.hget(KEY_RECORDS_KEY, key_id)
        return None if raw is None else decode_key(raw)

    async def list_keys(self, account: str | None = None) -> list[KeyRecord]:
        keys = await self.load_keys()
        if account is not None:
            keys = [k for k in keys if k.account == account]
        epoch = datetime.min.replace(tzinfo=UTC)
        keys.sort(key=lambda k: (k.created_at or epoch, k.id))
        return keys

    async def update_key(self, key_id: str, changes: dict[str, object]) -> KeyRecord:
        for _ in range(UPDATE_RETRIES):
            raw = await self.client.hget(KEY_RECORDS_KEY, key_id)
            if raw is None:
                raise MissingError(f"no key {key_id!r}")
            new = apply_key_changes(decode_key(raw), changes)
            written = await self._scripts.update_key(
                keys=[KEY_RECORDS_KEY], args=[key_id, raw, encode_key(new)]
            )
            if int(written) == 1:
                await self._changed()
                return new
        raise ConflictError(f"key {key_id!r} kept changing; update not applied")

    async def delete_key(self, key_id: str) -> bool:
        found = await self.get_key(key_id)
        if found is None:
            return False
        deleted = await self._scripts.delete_key(
            keys=[KEY_RECORDS_KEY, KEY_HASHES_KEY, owned_key(found.owner)], args=[key_id]
        )
        if int(deleted) == 0:
            return False
        await self._changed()
        return True

    # -- usage ------------------------------------------------------------------------------

    async def settle(self, records: Sequence[UsageRecord]) -> None:
        if not records:
            return
        if self.cluster:  # no scripts in a cluster's pipelines: the records one by one, at once
            await self.client.sadd(USAGE_ACCOUNTS_KEY, *sorted({r.account for r in records}))
            calls = [_settle_call(r) for r in records]
            for i in range(0, len(calls), CLUSTER_CONCURRENCY):
                part = calls[i : i + CLUSTER_CONCURRENCY]
                await asyncio.gather(*(self._scripts.settle(keys=k, args=a) for k, a in part))
            return
        async with self.client.pipeline(transaction=False) as pipe:
            # the index first: no record is ever stored under an account it does not list
            pipe.sadd(USAGE_ACCOUNTS_KEY, *sorted({r.account for r in records}))
            for rec in records:
                keys, args = _settle_call(rec)
                await self._scripts.settle(keys=keys, args=args, client=pipe)
            await pipe.execute()

    async def usage_daily(
        self, since: str, until: str, account: str | None = None
    ) -> list[DailyUsage]:
        first, last = date.fromisoformat(since), date.fromisoformat(until)
        days = [
            (first + timedelta(days=i)).isoformat()
            for i in range(min((last - first).days + 1, DAILY_MAX_DAYS))
        ]
        if account is not None:
            accounts = [account]
        else:
            accounts = sorted(_text(m) for m in await self.client.smembers(USAGE_ACCOUNTS_KEY))
        pairs = [(a, d) for a in accounts for d in days]
        if not pairs:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for a, d in pairs:
                pipe.hgetall(DAY_KEY.format(account=a, day=d))
            tables = await pipe.execute()
        return daily_totals(pairs, tables)

    async def share_holds(
        self, instance: str, holds: Mapping[str, int], ttl_ms: int, now: int
    ) -> dict[str, int]:
        args: list[str | int] = [ttl_ms]
        for account, amount in holds.items():
            args += [account, amount]
        await self._scripts.publish_holds(keys=[HOLDS_KEY.format(instance=instance)], args=args)
        client = self.client
        await client.sadd(INSTANCES_KEY, instance)
        others = sorted(
            _text(m) for m in await client.smembers(INSTANCES_KEY) if _text(m) != instance
        )
        if not others:
            return {}
        async with client.pipeline(transaction=False) as pipe:
            for other in others:
                pipe.hgetall(HOLDS_KEY.format(instance=other))
            published: list[dict[bytes, bytes]] = await pipe.execute()
        totals: dict[str, int] = {}
        gone = []
        for other, held in zip(others, published, strict=True):
            if not held:
                gone.append(other)  # expired: that instance stopped or holds nothing
            for raw_account, raw_amount in held.items():
                account = _text(raw_account)
                totals[account] = totals.get(account, 0) + int(raw_amount)
        if gone:
            await client.srem(INSTANCES_KEY, *gone)
        return totals

    async def share_cooling(self, cooling: Mapping[str, int], now: int) -> dict[str, int]:
        args: list[str | int] = [now]
        for channel, until in cooling.items():
            args += [channel, until]
        raw = await self._scripts.share_cooling(keys=[COOLING_KEY], args=args)
        return {_text(raw[i]): int(raw[i + 1]) for i in range(0, len(raw), 2)}

    async def usage(self, account: str | None = None, limit: int = 100) -> list[UsageRecord]:
        return (await self.usage_page(UsageQuery(account=account), limit)).records

    async def usage_page(self, query: UsageQuery, limit: int) -> UsagePage:
        """Each account's sorted set is read newest first (``redis_usage.scan_usage``); a listing of
        every account merges theirs. Records of one microsecond are ordered by request id,
        which is also the cursor's tiebreaker."""
        if limit <= 0:
            return UsagePage([], None)
        if query.after is not None and not isinstance(query.after[1], str):
            raise CursorError("not a cursor of this store")
        if query.account is not None:
            accounts = [query.account]
        else:
            members = await self.client.smembers(USAGE_ACCOUNTS_KEY)
            accounts = sorted(_text(m) for m in members)
        if not accounts:
            return UsagePage([], None)
        budget = max(limit, USAGE_SCAN // len(accounts))
        gate = asyncio.Semaphore(USAGE_SCAN_CONCURRENCY)

        async def scan(account: str) -> Scan:
            async with gate:
                key = usage_key(account)
                return await scan_usage(self.client, key, query, limit, budget, USAGE_BATCH)

        scans = await asyncio.gather(*(scan(a) for a in accounts))
        # an account whose reading stopped short of its page bounds the merged page: what it
        # holds past the record where it stopped was not read
        bound = max((s.stopped for s in scans if s.stopped is not None), default=None)
        found = [(pos, rec) for s in scans for pos, rec in s.found if bound is None or pos >= bound]
        found.sort(key=lambda item: item[0], reverse=True)
        page = found[:limit]
        more = len(found) > limit or bound is not None or any(s.more for s in scans)
        if len(page) == limit and more:
            after: Position | None = page[-1][0]
        else:
            after = bound
        return UsagePage([rec for _, rec in page], after)

    # -- catalogue: every entry in the one hash CATALOGUE_KEY, so every operation is on one key

    async def load_catalogue(self) -> CatalogueRecords:
        raw = await self.client.hgetall(CATALOGUE_KEY)
        raw.pop(CATALOGUE_VERSION_FIELD, None)
        return CatalogueRecords.decode((_text(k), v) for k, v in raw.items())

    async def _apply_catalogue_edit(self, edit: Editor) -> bool:
        """Read, edit, write only if no other edit came between (the hash's version field);
        else again. Whether anything changed. Does not bump the store's version."""
        for _ in range(UPDATE_RETRIES):
            raw = await self.client.hgetall(CATALOGUE_KEY)
            version = raw.pop(CATALOGUE_VERSION_FIELD, b"0")
            change = edit(CatalogueRecords.decode((_text(k), v) for k, v in raw.items()))
            if not change:
                return False
            put, delete = change.fields()
            args: list[bytes | str | int] = [version, len(put)]
            for name, payload in put:
                args += [name, payload]
            args += delete
            if int(await self._scripts.edit_catalogue(keys=[CATALOGUE_KEY], args=args)) == 1:
                return True
        raise ConflictError("the catalogue kept changing; edit not applied")

    async def edit_catalogue(self, edit: Editor) -> None:
        if await self._apply_catalogue_edit(edit):
            await self._changed()
