"""The store: one small interface over accounts, keys, usage records and the catalogue.

Two backends pass one test suite: SQLite (``sqlite:///path``, the embedded default; WAL, one
writer thread, safe with several worker processes) and Redis (``redis://host:port/db``, shared
by several instances, or a Redis Cluster: ``redis+cluster://host:port,host:port``). Money is
integer micro-units (1 balance unit = 1,000,000), never floats. Keys are stored by the
SHA-256 of their secret, never the secret. A request's cost is exact below the micro-unit: its
record keeps the pico-units (1e-12) below its whole micro-units, and settlement carries them per
account (``Account.carry``), debiting a micro-unit whenever they make one (``policy/billing``).

The hot path never awaits the store: it reads ``cache.Cache`` (a snapshot at most one second
stale) and hands usage records to ``writer.UsageWriter``.

Users (CONTRACT §5b) sign in to the console with a password (stored only as its argon2 hash,
``operator/passwords.py``) and make keys of their own: a key records its ``owner``, and the
cache refuses the keys of a user that is disabled or gone. Redemption codes are stored by the
SHA-256 of the code, never the code; ``redeem`` credits a code's amount exactly once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.config import Settings
    from gateway.store.audit import AuditEntry, AuditPage, AuditQuery
    from gateway.store.catalogue import CatalogueRecords, Editor

MICRO = 1_000_000


class StoreError(Exception):
    """Base of store failures."""


class ConflictError(StoreError):
    """The id (or key secret) already exists."""


class MissingError(StoreError):
    """No such account or key."""


class CursorError(StoreError):
    """A usage cursor this store did not make."""


class StoreClosedError(StoreError, RuntimeError):
    """The store is not open: it never answered yet, or it was closed."""


class CodeRefusedError(StoreError):
    """A redemption code that credits nothing: ``reason`` is ``unknown``, ``used`` or
    ``expired``."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"redemption code {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Account:
    id: str
    balance: int  # micro-units
    # pico-units (1e-12) the account's records cost beyond what was debited from ``balance``:
    # 0 to 999,999; settlement debits one micro-unit more each time it reaches one
    carry: int = 0


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    key_hash: str  # hex SHA-256 of the secret
    account: str
    group: str
    name: str = ""
    status: str = "enabled"  # enabled | disabled
    expires_at: datetime | None = None  # UTC
    created_at: datetime | None = None  # UTC
    hint: str = ""  # "sk-…abcd": enough to recognise a key, never enough to use it
    # optional limits (CONTRACT §5): what the key may spend in all (micro-units; what it spent
    # is kept apart, ``Store.load_spent``), the catalogue names it may use within its group,
    # the networks (CIDR) it may be used from; None: no limit
    quota: int | None = None
    models: tuple[str, ...] | None = None
    allowed_ips: tuple[str, ...] | None = None
    # the user that made the key in the console (None: the admin's); the cache refuses the
    # key while that user is disabled or gone
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class UserRecord:
    """Someone who signs in to the console with a password and makes keys of their own in
    ``groups``; its balance is its account's."""

    id: str
    username: str  # unique regardless of case
    password_hash: str  # argon2 (operator/passwords.py); never the password
    account: str
    groups: tuple[str, ...]
    status: str = "enabled"  # enabled | disabled
    created_at: datetime | None = None  # UTC


@dataclass(frozen=True, slots=True)
class RedemptionRecord:
    """A code that adds ``amount`` to the account that redeems it, once."""

    id: str
    code_hash: str  # hex SHA-256 of the code (normalised: operator/redemptions.py)
    hint: str  # "GW-…WXYZ": enough to recognise a code, never enough to use it
    amount: int  # micro-units
    created_at: datetime  # UTC
    expires_at: datetime | None = None  # UTC; None: never
    used_at: datetime | None = None  # UTC, when it was redeemed
    account: str | None = None  # the account it credited
    user: str | None = None  # the user that redeemed it


# not frozen: one is built per request, and a frozen dataclass's __init__ sets every field
# through the slower object.__setattr__; nothing hashes a record or uses one as a key
@dataclass(slots=True)
class UsageRecord:
    """Call metadata only: never a prompt, a reply or a full client IP."""

    time: datetime  # UTC, when the request arrived
    request_id: str
    account: str
    key_id: str
    model: str  # the name the client asked for
    channel: str | None  # None when no channel was reached
    protocol: str  # the client's: openai | anthropic | gemini
    endpoint: str  # chat | count_tokens | embeddings | images | audio_transcription | ...
    prompt_tokens: int  # every input token, cache reads and writes included
    completion_tokens: int  # every output token, reasoning included
    cost: int  # whole micro-units of the cost (exactly: cost + cost_pico / 1e6)
    status: int  # HTTP status the client saw (499: the client went away)
    latency_ms: int
    ip_range: str  # a.b.c.0/24 or a /48
    # added later, so last and with defaults (a record an earlier version wrote has none):
    cache_read_tokens: int = 0  # of prompt_tokens, read from the provider's prompt cache
    cache_write_tokens: int = 0  # of prompt_tokens, written to it
    reasoning_tokens: int = 0  # of completion_tokens
    cost_pico: int = 0  # pico-units (1e-12) of the cost below its whole micro-units
    cache_write_1h_tokens: int = 0  # of cache_write_tokens, written for an hour (its own price)


@dataclass(frozen=True, slots=True)
class DailyUsage:
    """One day's usage of one key on one model (UTC days), kept by settlement beside the
    records so that totals per day, model, account or key never read every record."""

    day: str  # YYYY-MM-DD
    account: str
    key_id: str
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost: int  # micro-units
    # added later (0 on the days before): the prompt tokens read from and written to the
    # provider's prompt cache, of prompt_tokens
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


# where a listing of usage records stands: (time in microseconds since the epoch, the store's
# tiebreaker among records of the same microsecond: SQLite's row number, Redis's request id)
Position = tuple[int, int | str]
STATUS_CLASSES = ("ok", "error")  # below 400; 400 and up (499 included: the client went away)


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """Which usage records to list: every field given must match; ``since`` is included and
    ``until`` is not; ``after`` is a page's ``UsagePage.next``, where the page after it
    starts."""

    account: str | None = None
    key_id: str | None = None
    model: str | None = None
    status: int | str | None = None  # an HTTP status, or one of STATUS_CLASSES
    since: datetime | None = None
    until: datetime | None = None
    after: Position | None = None

    def matches(self, rec: UsageRecord) -> bool:
        """Whether the record passes the filters on its fields (not those on its time)."""
        if self.account is not None and rec.account != self.account:
            return False
        if self.key_id is not None and rec.key_id != self.key_id:
            return False
        if self.model is not None and rec.model != self.model:
            return False
        status = self.status
        if status is None:
            return True
        if status == "ok":
            return rec.status < 400
        if status == "error":
            return rec.status >= 400
        return rec.status == status

    @property
    def filtered(self) -> bool:
        """Whether some record of the account(s) may fail the filters on fields."""
        return self.key_id is not None or self.model is not None or self.status is not None


@dataclass(frozen=True, slots=True)
class UsagePage:
    """A page of usage records, newest first; ``next``: where the next page starts, None
    when nothing is left to read. A page may hold fewer records than asked for and still
    have a ``next`` (a store reads a bounded number of records per call): only ``next``
    None means the end."""

    records: list[UsageRecord]
    next: Position | None


def day_of(rec: UsageRecord) -> str:
    """The UTC day a record counts in, YYYY-MM-DD. (``isoformat``, not ``strftime``, whose
    C code imports ``time`` and builds a struct for each call: some 17k instructions a
    record settled.)"""
    return rec.time.date().isoformat()


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def key_hint(secret: str) -> str:
    return f"{secret[:3]}…{secret[-4:]}"


class Store(Protocol):
    async def open(self) -> None: ...
    async def close(self) -> None: ...

    async def seed(self, settings: Settings) -> None:
        """Create the config file's accounts and keys that are absent (never overwrite what
        changed at run time) and write the file's catalogue entries (groups, models,
        channels) as the file's, removing those an earlier file named and this one does not
        (``catalogue.seed_edit``)."""
        ...

    async def version(self) -> int:
        """A number that changes whenever a key, a user, an account (other than by a debit)
        or the catalogue changes, a code is redeemed, a console session is signed out or the
        session secret rotated."""
        ...

    async def load_keys(self) -> list[KeyRecord]: ...
    async def load_balances(self) -> dict[str, int]: ...

    async def load_spent(self) -> dict[str, int]:
        """What each key has spent in all (key id -> micro-units; keys that spent nothing may
        be left out). Settlement adds a record's cost to its key's in the same step as the
        debit."""
        ...

    async def revoke_session(self, nonce: str, expires: int, now: int) -> None:
        """A console session signed out (``console/session.py``): keep its nonce until
        ``expires``, when the session would end anyway (unix seconds), and change the
        version so that every cache loads it; forget those over at ``now``. An entry
        revoked again (a key's or a user's sessions, ``key_sessions``) ends at ``expires``
        or a second after it did, whichever is later: a session signed in after the first
        revocation ends a second after it (``Signer.issue``'s ``after``), so a second one in
        the same second must still reach it."""
        ...

    async def load_revoked(self, now: int) -> dict[str, int]:
        """The nonces of the sessions signed out and not over at ``now`` -> when they end."""
        ...

    async def session_secret(self) -> bytes:
        """The secret console sessions are signed with, the same for every instance: made at
        random by the first call on a new store, then kept (never derived from anything)."""
        ...

    async def rotate_session_secret(self) -> None:
        """Replace the session secret with a new random one and change the version: every
        console session signed until now ends, on every instance within a second."""
        ...

    async def count_failure(
        self, names: Sequence[str], window: int, now: int
    ) -> list[tuple[int, int]]:
        """One more failed sign-in (or admin-token attempt) against each of ``names`` (a
        client's address range, an account name): a counter shared by every instance that
        starts at a name's first failure and is forgotten ``window`` seconds later. Returns
        each name's (failures in its window, the unix second the window ends); ``now``: unix
        seconds."""
        ...

    async def create_account(self, account_id: str, balance: int) -> Account: ...
    async def get_account(self, account_id: str) -> Account | None: ...
    async def topup(self, account_id: str, amount: int) -> Account: ...

    async def create_key(self, rec: KeyRecord) -> None: ...
    async def get_key(self, key_id: str) -> KeyRecord | None: ...
    async def list_keys(self, account: str | None = None) -> list[KeyRecord]: ...
    async def update_key(self, key_id: str, changes: dict[str, object]) -> KeyRecord: ...
    async def delete_key(self, key_id: str) -> bool: ...

    async def list_users(self) -> list[UserRecord]:
        """Every user, by creation (the cache loads them with the keys)."""
        ...

    async def create_user(self, rec: UserRecord, balance: int | None = None) -> None:
        """Add a user. With ``balance``, its account ``rec.account`` is created with it in
        the same step (ConflictError when that account exists); else the account must exist
        (MissingError). ConflictError when the id or the username (in any case) is taken."""
        ...

    async def get_user(self, user_id: str) -> UserRecord | None: ...

    async def find_user(self, username: str) -> UserRecord | None:
        """The user of this username, in any case."""
        ...

    async def update_user(self, user_id: str, changes: Mapping[str, object]) -> UserRecord:
        """Change any of password_hash, groups, status (``users.apply_user_changes``).
        MissingError when there is no such user."""
        ...

    async def delete_user(self, user_id: str) -> list[str]:
        """Delete the user and, in the same step, every key it owns; the ids of those keys.
        MissingError when there is no such user."""
        ...

    async def create_redemptions(self, recs: Sequence[RedemptionRecord]) -> None:
        """Add codes (by their hashes); ConflictError, and none added, when one is taken."""
        ...

    async def list_redemptions(self) -> list[RedemptionRecord]:
        """Every code, by creation."""
        ...

    async def redeem(
        self, code_hash: str, account: str, user: str, now: datetime
    ) -> tuple[RedemptionRecord, Account]:
        """Mark the code used by ``account`` (and ``user``) and add its amount to the
        account's balance, exactly once however many redeem it at once, here or on other
        instances; the code as used and the account after. CodeRefusedError (nothing
        changes) for a code unknown, used or expired at ``now``; MissingError for no such
        account."""
        ...

    async def settle(self, records: Sequence[UsageRecord]) -> None:
        """For each record not yet held (by request id), atomically append it and debit its
        cost from its account: its whole micro-units, and one more when its pico-units bring
        the account's ``carry`` to a micro-unit (the debit counts toward its key's spent and
        the day's totals alike)."""
        ...

    async def usage(self, account: str | None = None, limit: int = 100) -> list[UsageRecord]:
        """Newest first."""
        ...

    async def usage_page(self, query: UsageQuery, limit: int) -> UsagePage:
        """At most ``limit`` of the records ``query`` selects, newest first (records of the
        same microsecond in the store's own fixed order), from ``query.after`` on. Raises
        CursorError for an ``after`` of another store's kind."""
        ...

    async def usage_daily(
        self, since: str, until: str, account: str | None = None
    ) -> list[DailyUsage]:
        """The daily totals from ``since`` to ``until`` (YYYY-MM-DD, both included), of one
        account or of all; in no particular order."""
        ...

    async def share_holds(
        self, instance: str, holds: Mapping[str, int], ttl_ms: int, now: int
    ) -> dict[str, int]:
        """Reservations shared by every instance: replace what ``instance`` holds (account ->
        micro-units, kept ``ttl_ms`` unless published again: an instance that died lets go
        of its holds by itself) and return, per account, what every *other* live instance
        holds. ``now``: milliseconds since the epoch."""
        ...

    async def load_catalogue(self) -> CatalogueRecords:
        """Every catalogue record (``store/catalogue.py``)."""
        ...

    async def edit_catalogue(self, edit: Editor) -> None:
        """Apply what ``edit`` (pure) makes of the current records, atomically, and bump the
        version when it changed something; what ``edit`` raises reaches the caller and
        changes nothing."""
        ...

    async def share_cooling(self, cooling: Mapping[str, int], now: int) -> dict[str, int]:
        """Channel health shared by every instance: record the cooldowns this instance began
        (channel -> until, in milliseconds since the epoch; a later time wins) and return
        every cooldown not over at ``now``, forgetting those that are."""
        ...

    async def add_audit(self, entry: AuditEntry) -> None:
        """Append one entry to the audit log (``store/audit.py``), keeping the newest
        ``AUDIT_KEEP``."""
        ...

    async def audit_page(self, query: AuditQuery, limit: int) -> AuditPage:
        """At most ``limit`` of the audit entries ``query`` selects, newest first, from
        ``query.after`` on. Raises CursorError for an ``after`` of another store's kind."""
        ...
