"""Session affinity: the requests of one session reach the same channel, and the same key of a
channel of several keys, on every instance, so that the provider's prompt cache stays warm.

A session is named by the first of (CONTRACT §3): the ``x-session-id`` header; Claude Code's
``x-claude-code-session-id`` header; the Responses and chat ``prompt_cache_key`` field;
Codex's ``session_id`` header; the messages protocol's ``metadata.user_id`` (the body's fields
are read by the client adapter's ``match``, in the one parse of the body: ``RouteMatch.session``,
with ``session_late`` for the one that ranks after Codex's header). A request with none is
placed as before. A pin is per account, catalogue model and session (a prompt cache is per
model), under an opaque id: a hash, so that no session name is kept or stored.

Design: each instance keeps its pins in memory (``Affinity.pins``) and the store holds the
shared truth (``store/pins.py``), reached in two ways, neither a round trip per request:

- *first sight*: the first request of a session that this instance has no pin for proposes a
  placement and claims it in the store; the store keeps the first claim and answers with it,
  so every instance adopts the first instance's choice. The claims of the requests arriving
  together go in one batch (one script or transaction), and a request waits at most
  ``CLAIM_TIMEOUT`` for it (a store away: the request goes where it proposed, and the claim is
  written later);
- *write-behind*: a pin used again is renewed in the store at most every ``REFRESH_SECONDS``,
  and a pin moved is written as a compare-and-set on the value it replaced, both in the batch
  channel health sends with its cooldowns every half second (``ChannelHealth.share``). The
  store answers each pin's value: one another instance moved first is adopted.

A pin moves when its channel is no longer a candidate (cooling down after failures, disabled,
deleted, no longer serving the model), or its key is cooling: the request goes where routing
and key health send it, and the session stays there. Pins expire ``TTL_SECONDS`` after their
last request (in memory) or last write (in the store), well past the 10 minutes of quiet the
contract keeps a session for.

Consistency window: the first requests of a session are consistent across instances (they
meet at the store's claim). A move made on one instance reaches the others when they next
write the pin: on their next request of that session after their next ``REFRESH_SECONDS``
tick plus the half-second exchange; until then (a channel that recovered on one instance
before it saw the other's move) the session may be split between the old and new channel,
at most ``REFRESH_SECONDS + 0.5`` s after it uses the other instance again. With the store
unreachable, each instance keeps its own pins.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.config import Channel
from gateway.policy.health import ChannelHealth
from gateway.protocols.base import RouteMatch
from gateway.store import Store
from gateway.store.pins import PinStore, PinWrite, pin_store

log = logging.getLogger("gateway.affinity")

# the headers that name a session before the body's field, and Codex's, after it
SESSION_HEADERS = (b"x-session-id", b"x-claude-code-session-id")
LATE_SESSION_HEADER = b"session_id"
MAX_SESSION_CHARS = 512  # a longer name is cut: it only has to tell sessions apart
TTL_SECONDS = 15 * 60.0  # a pin lives this long after its last request (in the store: write)
REFRESH_SECONDS = 5.0  # a pin used again is renewed in the store at most this often
CLAIM_TIMEOUT = 0.25  # the longest a first request waits for its claim's answer
MAX_PINS = 200_000  # pins one instance keeps; past it, the least recently used go
MAX_WRITES = 5_000  # pins one write-behind batch holds (the rest go in the next)


def session_of(headers: Mapping[bytes, bytes], route: RouteMatch) -> str:
    """The session a request names, in the contract's order; "" for none."""
    for name in SESSION_HEADERS:
        raw = headers.get(name)
        if raw:
            return raw.decode("latin-1")[:MAX_SESSION_CHARS]
    if route.session and not route.session_late:
        return route.session[:MAX_SESSION_CHARS]
    raw = headers.get(LATE_SESSION_HEADER)
    if raw:
        return raw.decode("latin-1")[:MAX_SESSION_CHARS]
    return route.session[:MAX_SESSION_CHARS]


def pin_id(account: str, model: str, session: str) -> str:
    """The pin's opaque id: never the session's name."""
    text = f"{account}\0{model}\0{session}".encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()


@dataclass(slots=True)
class Pin:
    model: str
    channel: str
    key: str  # the key's digest (``upstream_keys.key_digest``); "" for a channel of one key
    seen: float  # monotonic: its last request
    written: float = 0.0  # monotonic: when the store last agreed (0: never)
    moved_from: str = ""  # the store's value a move replaces, until the move is written

    @property
    def value(self) -> str:
        return f"{self.channel}\t{self.key}" if self.key else self.channel

    def take(self, value: str) -> None:
        self.channel, _, self.key = value.partition("\t")


class Affinity:
    """This instance's session pins, and where a request of a session goes."""

    __slots__ = ("health", "keys", "pins", "store", "_dirty", "_claims", "_claiming", "moves")

    def __init__(self, health: ChannelHealth, store: Store | None = None) -> None:
        health.affinity = self
        self.health = health
        self.keys = health.keys
        self.pins: dict[str, Pin] = {}  # pin id -> pin, least recently used first
        self.store: PinStore | None = None if store is None else pin_store(store)
        self._dirty: set[str] = set()  # pins to write behind
        self._claims: dict[str, tuple[str, asyncio.Future[str | None]]] = {}
        self._claiming: asyncio.Task[None] | None = None
        self.moves = 0  # pins moved by this instance (metrics)

    # -- the request path ------------------------------------------------------------------

    async def place(
        self, pid: str, model: str, channels: list[Channel], now: float
    ) -> list[Channel]:
        """The channels a request of the session tries, in order: its pinned channel and key
        first while they are candidates; else the first candidate, and the pin moves there.
        First sight on this instance claims the placement in the store (``_claim``)."""
        pin = self.pins.get(pid)
        if pin is not None:
            self.pins[pid] = self.pins.pop(pid)  # most recently used last
            return self._placed(pid, pin, channels, now)
        first, key = self._fresh(channels, "", now)
        proposed = Pin(model, first.name, key, now)
        value = await self._claim(pid, proposed.value)
        if value is None:  # the store did not answer: written behind instead
            self._dirty.add(pid)
        else:
            proposed.written = now
            proposed.take(value)
        self._keep(pid, proposed)
        return self._placed(pid, proposed, channels, now)

    def _placed(self, pid: str, pin: Pin, channels: list[Channel], now: float) -> list[Channel]:
        pin.seen = now
        first = next((c for c in channels if c.name == pin.channel), None)
        key = pin.key
        if first is not None and first.api_keys:
            got = self.keys.choose(first, key, now)
            first, key = (first, key) if got is None else got
        if first is None:
            first, key = self._fresh(channels, "", now)
        value = f"{first.name}\t{key}" if key else first.name
        if value != pin.value:  # moved: its channel or key is no longer a candidate
            if pin.written and not pin.moved_from:
                pin.moved_from = pin.value
            pin.take(value)
            self.moves += 1
            self._dirty.add(pid)
        elif now - pin.written >= REFRESH_SECONDS:
            self._dirty.add(pid)
        return [first, *self.with_keys([c for c in channels if c.name != first.name], now)]

    def _fresh(self, channels: list[Channel], pinned: str, now: float) -> tuple[Channel, str]:
        first = channels[0]
        if first.api_keys:
            got = self.keys.choose(first, pinned, now)
            if got is not None:
                return got
        return first, ""

    def with_keys(self, channels: list[Channel], now: float) -> list[Channel]:
        """The channels with a key chosen for each of several keys (``upstream_keys``), and
        another key of each such channel added at the end, to try after the rest."""
        if not any(c.api_keys for c in channels):
            return channels  # most catalogues: nothing to do
        out: list[Channel] = []
        more: list[Channel] = []
        for c in channels:
            if not c.api_keys:
                out.append(c)
                continue
            got = self.keys.choose(c, "", now)
            chosen = c if got is None else got[0]
            out.append(chosen)
            other = self.keys.other(c, chosen, now)
            if other is not None:
                more.append(other)
        return out + more

    def _keep(self, pid: str, pin: Pin) -> None:
        self.pins[pid] = pin
        if len(self.pins) > MAX_PINS:  # the least recently used tenth goes
            for old in list(self.pins)[: MAX_PINS // 10]:
                del self.pins[old]
                self._dirty.discard(old)

    async def _claim(self, pid: str, value: str) -> str | None:
        """The value the store holds for ``pid`` after claiming ``value`` for it (in a batch
        with the other claims of the moment); None when it did not answer in time."""
        if self.store is None:
            return None
        found = self._claims.get(pid)
        if found is None:
            future: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
            self._claims[pid] = (value, future)
            if self._claiming is None:
                self._claiming = asyncio.create_task(self._claim_batches(), name="gw.pins")
        else:
            future = found[1]
        try:
            return await asyncio.wait_for(asyncio.shield(future), CLAIM_TIMEOUT)
        except TimeoutError:
            return None

    async def _claim_batches(self) -> None:
        store = self.store
        assert store is not None
        try:
            while self._claims:
                await asyncio.sleep(0)  # the claims of this moment join the batch
                batch, self._claims = self._claims, {}
                writes: list[PinWrite] = [(pid, v, None) for pid, (v, _) in batch.items()]
                try:
                    found = await store.sync(writes, int(TTL_SECONDS * 1000), _epoch_ms())
                except Exception as exc:  # noqa: BLE001 - a store away: placed without it
                    log.warning("affinity.claim_failed error=%s", type(exc).__name__)
                    found = {}
                for pid, (_, future) in batch.items():
                    if not future.done():
                        future.set_result(found.get(pid))
        finally:
            self._claiming = None

    # -- off the request path ----------------------------------------------------------------

    async def sync(self, store: Store | None = None) -> None:
        """Write behind the pins used or moved since the last call, and adopt what the store
        holds for them (``ChannelHealth.share`` calls it every half second)."""
        if self.store is None and store is not None:
            self.store = pin_store(store)
        now = time.monotonic()
        self._sweep(now)
        if self.store is None or not self._dirty:
            return
        ids = list(self._dirty)[:MAX_WRITES]
        self._dirty.difference_update(ids)
        sent = {pid: self.pins[pid].value for pid in ids if pid in self.pins}
        writes = [(pid, v, self.pins[pid].moved_from or None) for pid, v in sent.items()]
        try:
            found = await self.store.sync(writes, int(TTL_SECONDS * 1000), _epoch_ms())
        except BaseException:
            self._dirty.update(sent)  # written next time
            raise
        for pid, value in found.items():
            pin = self.pins.get(pid)
            if pin is None or pin.value != sent[pid]:
                continue  # moved again meanwhile: written next time
            pin.written, pin.moved_from = now, ""
            if value != pin.value:
                pin.take(value)  # another instance claimed or moved it first

    def _sweep(self, now: float) -> None:
        """Forget the pins not used for ``TTL_SECONDS`` (oldest first: the dict's order)."""
        for pid, pin in list(self.pins.items()):
            if now - pin.seen < TTL_SECONDS:
                break
            del self.pins[pid]
            self._dirty.discard(pid)

    def counts(self) -> dict[tuple[str, str], int]:
        """Live pins by (model, channel), for the metrics and the console."""
        out: dict[tuple[str, str], int] = {}
        for pin in self.pins.values():
            k = (pin.model, pin.channel)
            out[k] = out.get(k, 0) + 1
        return out


def _epoch_ms() -> int:
    return int(time.time() * 1000)
