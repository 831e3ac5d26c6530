"""What console sessions and sign-in keep in Redis (``RedisStore`` takes these methods from
``SignInKeys``; ``redis.py`` has the rest of the store and its other key names).

- ``gw:console:secret`` holds the secret every instance signs console sessions with: random,
  made by the first instance that asks (``SET NX``, so two instances starting at once agree),
  replaced by a rotation, which changes the version so that every cache loads the new one.
- ``gw:signin:failures:<name>`` counts the failed sign-ins (and admin-token attempts) of one
  client address range or account name: made with its expiry by the first failure of a
  window (one script, so a counter never outlives its window), one key (one slot) each.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis.asyncio as aioredis

SESSION_SECRET_KEY = "gw:console:secret"  # string: the console sessions' signing secret
SECRET_BYTES = 32
FAILURES_KEY = "gw:signin:failures:{name}"  # string: failures in the window; expires with it
# KEYS: the counter   ARGV: window (seconds)   -> {failures, seconds left}
COUNT_FAILURE_LUA = """
local n = redis.call('INCR', KEYS[1])
local left = redis.call('TTL', KEYS[1])
if left < 0 then redis.call('EXPIRE', KEYS[1], ARGV[1]); left = tonumber(ARGV[1]) end
return {n, left}
"""


class SignInKeys:
    """The session secret and the sign-in failures of ``RedisStore`` (see the module
    docstring)."""

    if TYPE_CHECKING:

        @property
        def client(self) -> aioredis.Redis: ...

        async def _changed(self) -> None: ...

    async def session_secret(self) -> bytes:
        secret = await self.client.get(SESSION_SECRET_KEY)
        if secret is None:
            await self.client.set(SESSION_SECRET_KEY, os.urandom(SECRET_BYTES), nx=True)
            secret = await self.client.get(SESSION_SECRET_KEY)
        assert isinstance(secret, bytes)  # made just now, by this instance or another
        return secret

    async def rotate_session_secret(self) -> None:
        await self.client.set(SESSION_SECRET_KEY, os.urandom(SECRET_BYTES))
        await self._changed()

    async def count_failure(
        self, names: Sequence[str], window: int, now: int
    ) -> list[tuple[int, int]]:
        script = self.client.register_script(COUNT_FAILURE_LUA)  # failures only: no hot path
        out: list[tuple[int, int]] = []
        for name in names:  # one slot each: one by one, as a cluster takes scripts
            failures, left = await script(keys=[FAILURES_KEY.format(name=name)], args=[window])
            out.append((int(failures), now + int(left)))
        return out
