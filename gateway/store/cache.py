"""The hot path's view of the store: keys and balances in memory, at most about a second stale.

``key()``, ``balance()`` and ``debit()`` are plain dict operations and never await. A background
task asks the store for its ``version()`` every ``interval``: when it changed (a key or an
account changed, here or in another instance), the keys are reloaded; balances are reloaded on
every tick (one query) so that other instances' debits show within a second.

Requests in flight *hold* what they are expected to cost (``hold()``): admission refuses an
account whose balance, less what is held, is not above zero, so concurrent requests overdraw it
by at most the error of their estimates, not by their number. Settlement replaces the hold with
the debit in one step (``debit(..., held=)``). Every tick, the holds of this process are
published to the store and every other instance's are read (``Store.share_holds``), so the
instances on one store refuse together; published holds expire unless renewed, so an instance
that died lets go of them by itself.

A key's ``quota`` works the same way: every debit and hold also counts against the key's own
entry (``KEY_SLOT`` + its id), and ``quota_left()`` is its quota less what the store says it
spent, less that entry's pending, unseen and held amounts.

Local debits are tracked until the store's snapshot certainly includes them, so a reload never
"forgets" a request this process already billed:

- ``debit()`` (called by ``UsageWriter.submit``) adds to ``pending``;
- ``settled()`` (called by the writer once ``store.settle`` returned) moves the amounts to
  ``unseen``, tagged with a sequence number;
- a reload drops the ``unseen`` amounts settled before it started reading: those are in the
  snapshot. The writer settles under the reload's lock (``settling()``), so no reload reads
  the store between a settle and its ``settled()``: one that did would read the debit in the
  store while it is still pending here, count it twice, and refuse an account or a key with
  money left for a tick (a key with a quota was refused its next request that way).

A failed reload (the store briefly down) logs one line, keeps the old snapshot and tries again
on the next tick.

Console sessions signed out (``Store.revoke_session``) change the version too: their nonces are
reloaded with the keys, so checking a session (``revoked()``) is a dict lookup here, never a
store round trip, and every instance refuses a signed-out session within a second. The
instance that signs a session out adds it at once (``revoke()``). Nothing is ever un-revoked,
so a reload adds to what is known and only drops what is over (a session ends by itself
after its lifetime: the store forgets it then too).

Users (CONTRACT §5b) change the version too and are reloaded with the keys, so the hot path
never asks the store about one: a key a user made (``KeyRecord.owner``) is held here as
disabled while that user is disabled or gone, so it answers 401 through the same check as any
disabled key, and enabled again with its user. A user's console sessions are checked here
too (``user_session_ok``): its user enabled, and not begun before the user's sessions were
ended (by ``operator/users.py``, as a revoked session entry ``USER_SESSIONS`` + the user's id whose
time is when the sessions then begun would end: every session that ends no later is over).

The console's session secret (``Store.session_secret``) is loaded with the keys too, so a
rotation (``Store.rotate_session_secret``) ends every session on every instance within a
second; until the store first answered there is none (``session_secret`` is None).

The catalogue (groups, models, channels) changes the version too: when it changed, its records
are reloaded with the keys and handed to the function given to ``on_catalogue`` (the relay's,
which builds a new immutable ``routing.Catalogue`` and swaps it in). The hot path never reads
the store for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from gateway.store import KeyRecord, Store, UserRecord
from gateway.store.cancellation import cancel_and_wait, raise_if_cancelled
from gateway.store.catalogue import CatalogueRecords

log = logging.getLogger("gateway.store.cache")

DEFAULT_INTERVAL = 0.5
# a key's own entry among the accounts' in what is pending, unseen and held: a key with a
# quota is an account of its own whose balance is its quota less what it spent
KEY_SLOT = "key\x00"
HOLD_TTL_MS = 5_000  # published holds outlive a few missed ticks, and a dead instance briefly
# the revoked-session entry that ends a user's sessions: never a session nonce (those are hex)
USER_SESSIONS = "user:"


def as_owned(keys: list[KeyRecord], users: dict[str, UserRecord]) -> dict[str, KeyRecord]:
    """The key table by hash, a key of a user that is not enabled (or is gone) held as
    disabled."""
    out: dict[str, KeyRecord] = {}
    for k in keys:
        if k.owner is not None and k.status == "enabled":
            user = users.get(k.owner)
            if user is None or user.status != "enabled":
                k = replace(k, status="disabled")
        out[k.key_hash] = k
    return out


class Cache:
    def __init__(
        self, store: Store, interval: float | None = None, instance: str | None = None
    ) -> None:
        self._store = store
        self._instance = instance or os.urandom(6).hex()  # names this process's holds
        self._others_held: dict[str, int] = {}  # what other instances hold, per account
        # the default read here, not at import: bench.clock_scaled stretches it
        self._interval = DEFAULT_INTERVAL if interval is None else interval
        self.fresh_at = time.monotonic()  # when keys and balances last came from the store
        self._keys: dict[str, KeyRecord] = {}
        self._balances: dict[str, int] = {}
        self._spent: dict[str, int] = {}  # key id -> what it spent, as the store last said
        self._revoked: dict[str, int] = {}  # signed-out session nonce -> when it ends (unix s)
        self._users: dict[str, UserRecord] = {}
        self.session_secret: bytes | None = None  # what console sessions are signed with
        self._pending: dict[str, int] = {}
        self._held: dict[str, int] = {}
        self._unseen: dict[int, Mapping[str, int]] = {}
        self._unseen_total: dict[str, int] = {}
        self._settled_seq = 0
        self._version: int | None = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self._catalogue_listener: Callable[[CatalogueRecords], None] | None = None

    def on_catalogue(self, listener: Callable[[CatalogueRecords], None]) -> None:
        """Call ``listener`` with the catalogue's records on every load that finds the store's
        version changed (and on the first)."""
        self._catalogue_listener = listener

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Load everything once (raises if the store does not answer), then keep refreshing."""
        await self._reload(force=True)
        await self._share_holds()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="gateway.cache")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
            self._held.clear()  # nothing runs any more: let the other instances know now
            try:
                await self._share_holds()
            except Exception as exc:
                log.warning("cache.share_holds_failed error=%s", type(exc).__name__)

    async def refresh(self) -> None:
        """Reload keys and balances now (the admin API calls this after a change)."""
        try:
            await self._reload(force=True)
        except Exception as exc:
            log.warning("cache.refresh_failed error=%s", type(exc).__name__)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self._reload(force=False)
                await self._share_holds()
            except Exception as exc:
                raise_if_cancelled()
                if not self._failing:
                    log.warning("cache.refresh_failed error=%s", type(exc).__name__)
                self._failing = True
            else:
                raise_if_cancelled()
                if self._failing:
                    log.info("cache.refresh_recovered")
                self._failing = False

    async def _reload(self, force: bool) -> None:
        async with self._lock:
            seq = self._settled_seq
            version = await self._store.version()
            changed = force or version != self._version
            listener = self._catalogue_listener
            keys = records = revoked = users = secret = None
            if changed:
                keys = await self._store.load_keys()
                users = await self._store.list_users()
                records = await self._store.load_catalogue() if listener is not None else None
                revoked = await self._store.load_revoked(int(time.time()))
                secret = await self._store.session_secret()
            balances = await self._store.load_balances()
            spent = await self._store.load_spent()
            # everything read, then swapped in together with no await between: a request never
            # sees a new key without its account's balance (or a catalogue without its keys),
            # and a read that fails half-way leaves the old snapshot whole
            if keys is not None and users is not None:
                if listener is not None and records is not None:
                    listener(records)
                self._users = {u.id: u for u in users}
                self._keys = as_owned(keys, self._users)
                self._version = version
                self.session_secret = secret
            if revoked is not None:
                now = int(time.time())
                # what this process revoked while the store was read is kept
                kept = {n: e for n, e in self._revoked.items() if e > now}
                self._revoked = kept | revoked
            self._balances = balances
            self._spent = spent
            self.fresh_at = time.monotonic()
            done = [s for s in self._unseen if s <= seq]
            if done:
                for s in done:
                    del self._unseen[s]
                total: dict[str, int] = {}
                for amounts in self._unseen.values():
                    for account, amount in amounts.items():
                        total[account] = total.get(account, 0) + amount
                self._unseen_total = total

    async def _share_holds(self) -> None:
        """Publish this process's holds; take every other instance's."""
        now = int(time.time() * 1000)
        held = dict(self._held)
        self._others_held = await self._store.share_holds(self._instance, held, HOLD_TTL_MS, now)

    # -- the hot path -----------------------------------------------------------------------

    def key(self, key_hash: str) -> KeyRecord | None:
        return self._keys.get(key_hash)

    def revoked(self, nonce: str) -> bool:
        """Whether the console session of this nonce was signed out (here or elsewhere)."""
        return nonce in self._revoked

    def user(self, user_id: str) -> UserRecord | None:
        return self._users.get(user_id)

    def user_sessions_ended(self, user_id: str) -> int:
        """Until when (unix seconds) the sessions ended for this user would have lasted: a
        session that ends no later is over (0: none were ended)."""
        return self._revoked.get(USER_SESSIONS + user_id, 0)

    def user_session_ok(self, user_id: str, expires: int) -> bool:
        """Whether a console session of this user that ends at ``expires`` may go on: the
        user is enabled, and its sessions were not ended after this one began."""
        user = self._users.get(user_id)
        if user is None or user.status != "enabled":
            return False
        return expires > self._revoked.get(USER_SESSIONS + user_id, 0)

    def revoked_until(self, name: str) -> int:
        """When the revocation entry ``name`` ends (unix seconds; 0: there is none)."""
        return self._revoked.get(name, 0)

    def revoke(self, nonce: str, expires: int) -> None:
        """A session signed out on this instance: refused here at once (the store tells the
        other instances)."""
        self._revoked[nonce] = max(expires, self._revoked.get(nonce, 0))

    def balance(self, account: str) -> int | None:
        """The account's balance in micro-units, less this process's debits the snapshot does
        not include yet; None for an unknown account."""
        stored = self._balances.get(account)
        if stored is None:
            return None
        return stored - self._pending.get(account, 0) - self._unseen_total.get(account, 0)

    def held(self, account: str) -> int:
        """What the account's requests in flight hold, here and on the other instances, in
        micro-units."""
        return self._held.get(account, 0) + self._others_held.get(account, 0)

    def quota_left(self, key: KeyRecord) -> int:
        """What a key with a ``quota`` may still spend, less what its requests in flight
        hold, in micro-units."""
        assert key.quota is not None
        slot = KEY_SLOT + key.id
        return (
            key.quota
            - self._spent.get(key.id, 0)
            - self._pending.get(slot, 0)
            - self._unseen_total.get(slot, 0)
            - self.held(slot)
        )

    def hold(self, account: str, key_id: str, amount: int) -> None:
        """A request's expected cost, held against its account and its key."""
        if amount:
            held = self._held
            held[account] = held.get(account, 0) + amount
            slot = KEY_SLOT + key_id
            held[slot] = held.get(slot, 0) + amount

    def debit(self, account: str, key_id: str, amount: int, held: int = 0) -> None:
        """A request's cost, replacing what it ``held``, from its account and its key."""
        slot = KEY_SLOT + key_id
        if amount:
            pending = self._pending
            pending[account] = pending.get(account, 0) + amount
            pending[slot] = pending.get(slot, 0) + amount
        if held:
            self._release(account, held)
            self._release(slot, held)

    def _release(self, entry: str, held: int) -> None:
        left = self._held.get(entry, 0) - held
        if left > 0:
            self._held[entry] = left
        else:
            self._held.pop(entry, None)

    def settling(self) -> asyncio.Lock:
        """Held by the writer around ``store.settle`` and its ``settled()``: a reload waits
        for both, so it never reads a debit that is still pending here."""
        return self._lock

    def settled(self, amounts: Mapping[str, int]) -> None:
        """The writer stored these debits (per account, and per ``KEY_SLOT`` + key id): the
        next reload will include them."""
        if not amounts:
            return
        self._settled_seq += 1
        self._unseen[self._settled_seq] = amounts
        for account, amount in amounts.items():
            left = self._pending.get(account, 0) - amount
            if left:
                self._pending[account] = left
            else:
                self._pending.pop(account, None)
            self._unseen_total[account] = self._unseen_total.get(account, 0) + amount

    @property
    def version(self) -> int | None:
        """The store version of the keys in memory (None before the first load)."""
        return self._version
