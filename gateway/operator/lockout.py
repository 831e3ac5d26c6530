"""Failed sign-ins and admin-token attempts, limited per client address and per account name.

Console sign-in (the admin token, a key, or a user's password) and the admin API's bearer
token could be guessed as fast as the server answered. Each failure now counts against the
client's address range (its /24 or /48: the store never holds a full address) and, for a key,
the key's hint (its account name here: ``sk-…abcd``), for a user, its username
(``console/users.failed_sign_in``), in the store (``Store.count_failure``), so every instance
counts together. After ``LIMIT`` failures in ``WINDOW`` seconds (the window starts at the
first), every attempt from that address or for that name gets 429 with ``Retry-After`` until
the window ends, right or wrong: a limit that still tried the credential would tell a guesser
when it was right.

Only failures cost anything: an attempt is checked against this instance's view (``wait``: a
dict lookup, no store round trip), which each failure refreshes from the store's shared
count. So an instance that has not yet seen a failure of an address lets one attempt through
to find the store's count; a guesser gets at most ``LIMIT`` tries a window, and one more per
instance. Nothing here is on the relay's path: client requests are authenticated by their
key's hash alone.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

from gateway.edge.asgi import request_headers
from gateway.policy.billing import ClientAddress, ip_range
from gateway.store import Store, key_hint
from gateway.store.cancellation import raise_if_cancelled
from gateway.store.users import USERNAME_RE, username_key
from gateway.types import Scope

log = logging.getLogger("gateway.lockout")

LIMIT = 10  # failed attempts an address or a name may make in a window
WINDOW = 300  # seconds a window lasts from its first failure
MAX_NAMES = 10_000  # names this instance remembers; past it the windows over are forgotten


class Lockout:
    """Counts failures (``failed``) and says how long an attempt must wait (``wait``)."""

    __slots__ = ("_store", "_address", "limit", "window", "_seen")

    def __init__(
        self, store: Store, address: ClientAddress, limit: int = LIMIT, window: int = WINDOW
    ) -> None:
        self._store = store
        self._address = address
        self.limit = limit
        self.window = window
        # name -> (failures, when its window ends on the monotonic clock), as last known
        self._seen: dict[str, tuple[int, float]] = {}

    def names(
        self, scope: Scope, token: str | None = None, username: str | None = None
    ) -> list[str]:
        """What an attempt counts against: the client's address range (the socket peer, or
        the forwarded address from a trusted proxy), the key's hint when ``token`` looks like
        a key, and a console user's name (``username``, in any case: one user, however it is
        written) when it could be one."""
        forwarded = request_headers(scope).get(b"x-forwarded-for")
        names = ["address:" + ip_range(self._address.of(scope.get("client"), forwarded))]
        if token is not None and token.startswith("sk-"):
            names.append("key:" + key_hint(token))
        if username and USERNAME_RE.match(username):  # else it names no user
            names.append("user:" + username_key(username))
        return names

    def wait(self, names: Sequence[str]) -> int:
        """Seconds an attempt for these names must wait (0: it may be tried)."""
        now = time.monotonic()
        longest = 0.0
        for name in names:
            seen = self._seen.get(name)
            if seen is not None and seen[0] >= self.limit and seen[1] > now:
                longest = max(longest, seen[1] - now)
        return math.ceil(longest)

    async def failed(self, names: Sequence[str]) -> int:
        """Count a failure against each name, here at once (so a burst of attempts on this
        instance stops at the limit however fast it comes) and in the store; the seconds the
        next attempt must wait (0: none)."""
        now = time.monotonic()
        if len(self._seen) >= MAX_NAMES:
            self._seen = {n: s for n, s in self._seen.items() if s[1] > now}
            if len(self._seen) >= MAX_NAMES:
                self._seen.clear()  # the store still counts: the next failure reads it
        for name in names:
            failures, until = self._seen.get(name, (0, 0.0))
            if until <= now:
                failures, until = 0, now + self.window
            self._seen[name] = (failures + 1, until)
        try:
            shared = await self._store.count_failure(names, self.window, int(time.time()))
        except Exception as exc:  # the store away: this instance's own count still holds
            raise_if_cancelled()
            log.warning("lockout.count_failed error=%s", type(exc).__name__)
        else:
            wall = time.time()
            for name, (failures, ends) in zip(names, shared, strict=True):
                mine = self._seen[name][0]
                self._seen[name] = (max(failures, mine), now + max(ends - wall, 0.0))
        wait = self.wait(names)
        if wait:
            log.warning("lockout.locked_out %s seconds=%d", names[0].replace(":", "=", 1), wait)
        return wait

    def message(self, wait: int) -> str:
        return (
            f"Too many failed attempts from this address or for this account: "
            f"try again in {wait} s."
        )
