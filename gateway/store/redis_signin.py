"""What console sessions and sign-in keep in Redis (``RedisStore`` takes these methods from
``SignInKeys``; ``redis.py`` has the rest of the store and its other key names).

- ``gw:console:secret`` holds the secret every instance signs console sessions with: random,
  made by the first instance that asks (``SET NX``, so two instances starting at once agree),
  replaced by a rotation, which changes the version so that every cache loads the new one.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis.asyncio as aioredis

SESSION_SECRET_KEY = "gw:console:secret"  # string: the console sessions' signing secret
SECRET_BYTES = 32


class SignInKeys:
    """The session secret of ``RedisStore`` (see the module docstring)."""

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
