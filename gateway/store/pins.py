"""Session pins in the store (``policy/affinity.py`` keeps them in memory and writes behind).

A pin is a short text (``<channel>`` or ``<channel>\\t<key digest>``) under an opaque id (a
hash of the account, model and session name: never the session's own name), kept for
``ttl_ms`` after it was last written. One operation writes a batch (``sync``); for each entry
``(id, value, expected)``:

- ``expected`` None (*keep*: a session seen, or first claimed): the value is written when
  the id has none, or its expiry renewed when it has this value; another value is left as it
  is, and returned, so that the instance adopts it;
- ``expected`` given (*move*: the pinned channel failed or was disabled): the value replaces
  ``expected`` (or nothing); a pin another instance moved already is left, and returned.

``sync`` returns the value each id holds afterwards, so the first instance to claim a session
wins and every other adopts its choice. Redis: one string per pin, ``gw:{pins}:<id>`` (one
hash tag, so that one script holds a whole batch on a Cluster), expiring by itself. SQLite:
the ``pins`` table, made at first use, its expired rows dropped by each batch.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from gateway.store import Store
from gateway.store.sqlite import SQLiteStore

if TYPE_CHECKING:  # redis is loaded with a Redis store only (``store.backends``)
    from redis.commands.core import AsyncScript

    from gateway.store.redis import RedisStore

PIN_KEY = "gw:{{pins}}:{id}"  # string: the pin's value, expiring
# KEYS: the pins; ARGV: ttl ms, then value, expected ("": keep) per key -> the values after
SYNC_PINS_LUA = """
local out = {}
for i = 1, #KEYS do
  local value, expected = ARGV[2 * i], ARGV[2 * i + 1]
  local current = redis.call('GET', KEYS[i])
  if (not current) or current == value or (expected ~= '' and current == expected) then
    redis.call('SET', KEYS[i], value, 'PX', ARGV[1])
    out[i] = value
  else
    out[i] = current
  end
end
return out
"""
SQLITE_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS pins "
    "(id TEXT PRIMARY KEY, value TEXT NOT NULL, expires INTEGER NOT NULL)"
)
LOAD_CHUNK = 500  # ids in one SELECT ... IN (...)

# (id, value, expected value or None)
PinWrite = tuple[str, str, str | None]


class PinStore(Protocol):
    async def sync(self, writes: Sequence[PinWrite], ttl_ms: int, now: int) -> dict[str, str]:
        """Apply the writes (see the module docstring); every id's value afterwards.
        ``now``: milliseconds since the epoch."""
        ...


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


class RedisPins:
    __slots__ = ("_store", "_script", "_client")

    def __init__(self, store: RedisStore) -> None:
        self._store = store
        self._script: AsyncScript | None = None
        self._client: object = None

    async def sync(self, writes: Sequence[PinWrite], ttl_ms: int, now: int) -> dict[str, str]:
        if not writes:
            return {}
        client = self._store.client
        if self._script is None or self._client is not client:
            self._script, self._client = client.register_script(SYNC_PINS_LUA), client
        keys = [PIN_KEY.format(id=pin_id) for pin_id, _, _ in writes]
        args: list[str | int] = [ttl_ms]
        for _, value, expected in writes:
            args += [value, expected or ""]
        raw = await self._script(keys=keys, args=args)
        return {w[0]: _text(v) for w, v in zip(writes, raw, strict=True)}


class SQLitePins:
    __slots__ = ("_store",)

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    async def sync(self, writes: Sequence[PinWrite], ttl_ms: int, now: int) -> dict[str, str]:
        if not writes:
            return {}

        def run(conn: sqlite3.Connection) -> dict[str, str]:
            conn.execute(SQLITE_SCHEMA)
            conn.execute("DELETE FROM pins WHERE expires <= ?", (now,))
            out: dict[str, str] = {}
            for pin_id, value, expected in writes:
                row = conn.execute("SELECT value FROM pins WHERE id = ?", (pin_id,)).fetchone()
                current = None if row is None else row[0]
                if current is None or current == value or current == expected:
                    conn.execute(
                        "INSERT INTO pins (id, value, expires) VALUES (?, ?, ?) ON CONFLICT (id) "
                        "DO UPDATE SET value = excluded.value, expires = excluded.expires",
                        (pin_id, value, now + ttl_ms),
                    )
                    current = value
                out[pin_id] = current
            return out

        return await self._store._tx(run)  # the store's own write transaction, on its thread


def pin_store(store: Store) -> PinStore | None:
    """Where pins are shared for this store; None for a store that keeps none (each instance
    then pins on its own)."""
    if isinstance(store, SQLiteStore):
        return SQLitePins(store)
    from gateway.store.redis import RedisStore  # a store that is not SQLite's: redis is loaded

    if isinstance(store, RedisStore):
        return RedisPins(store)
    return None
