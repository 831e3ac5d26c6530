"""Channels with several upstream keys (``api_keys``): which key a request uses, and each
key's health.

A channel of several keys is served as one *variant* per key: the channel itself with that
key as its ``api_key`` (built once per catalogue, so choosing one costs a lookup). Each key
has a name of its own in channel health (``<channel>#<8 hex of the key's SHA-256>``): a key
the upstream refuses (401, 403) or rate-limits (429) cools down on its own, under that name,
shared with every instance through the store like a channel's cooldown
(``ChannelHealth.share``); the channel cools down only when every key does. Other failures
(5xx, timeouts) are the channel's, as for a channel of one key.

Providers' rate-limit headers steer new sessions and requests without one away from a key
about to be refused: each reply's headers are read once, cheaply (a few dict lookups), and a
key whose requests or tokens left are under ``LOW_SHARE`` of its limit (or, without a limit
header, under ``LOW_REQUESTS`` / ``LOW_TOKENS``) is passed over until ``HEADROOM_TTL`` seconds
have gone by or a later reply says otherwise. A session keeps its key while that key is not
cooling down, low or not (its prompt cache is there).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Mapping
from dataclasses import replace

from gateway.config import Channel
from gateway.errors import GatewayError

KEY_RATE_LIMIT_SECONDS = 10.0  # a rate-limited key without Retry-After rests this long
LOW_SHARE = 0.05  # a limit's share left under which a key is passed over for new work
LOW_REQUESTS = 2  # without a limit header: requests left under which a key is passed over
LOW_TOKENS = 2_000  # likewise, tokens left
HEADROOM_TTL = 60.0  # seconds a reply's "low" holds (every provider's window resets by then)
# (remaining, limit) header pairs, by provider: OpenAI, Anthropic (requests, tokens, input)
REQUEST_HEADERS = (
    ("x-ratelimit-remaining-requests", "x-ratelimit-limit-requests"),
    ("anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-limit"),
)
TOKEN_HEADERS = (
    ("x-ratelimit-remaining-tokens", "x-ratelimit-limit-tokens"),
    ("anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-limit"),
    ("anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-input-tokens-limit"),
)


def key_digest(key: str) -> str:
    """Eight hex digits naming a key in health, pins and logs: never the key."""
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def _number(headers: Mapping[str, str], name: str) -> float | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return None


def is_low(headers: Mapping[str, str]) -> bool | None:
    """Whether a reply's rate-limit headers say its key is nearly out of requests or tokens;
    None when it sent none of them."""
    said = False
    for pairs, floor in ((REQUEST_HEADERS, LOW_REQUESTS), (TOKEN_HEADERS, LOW_TOKENS)):
        for remaining_name, limit_name in pairs:
            remaining = _number(headers, remaining_name)
            if remaining is None:
                continue
            said = True
            limit = _number(headers, limit_name)
            if limit and limit > 0 and remaining < limit * LOW_SHARE:
                return True
            if not limit and remaining < floor:
                return True
    return False if said else None


class KeyRing:
    """One channel's keys: a variant of the channel per key, and each key's health name."""

    __slots__ = ("channel", "variants", "digests", "names", "index", "position", "turn")

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.digests = tuple(key_digest(k) for k in channel.api_keys)
        self.variants = tuple(replace(channel, api_key=k) for k in channel.api_keys)
        self.names = tuple(f"{channel.name}#{d}" for d in self.digests)
        self.index = {d: i for i, d in enumerate(self.digests)}  # digest -> position
        self.position = {k: i for i, k in enumerate(channel.api_keys)}  # key -> position
        self.turn = itertools.count()  # round robin among the keys with headroom


class UpstreamKeys:
    """Every channel's keys, their cooldowns (in ``cooling``, channel health's map) and their
    headroom as the providers' headers last said."""

    __slots__ = ("cooling", "_rings", "_low")

    def __init__(self, cooling: dict[str, float]) -> None:
        self.cooling = cooling  # ChannelHealth.cooling: health name -> monotonic until
        self._rings: dict[str, KeyRing] = {}
        self._low: dict[str, float] = {}  # health name -> until when it counts as low

    def ring(self, channel: Channel) -> KeyRing:
        """The channel's ring, made again when the catalogue gave a new channel object."""
        found = self._rings.get(channel.name)
        if found is None or found.channel is not channel:
            if len(self._rings) > 4 * 1024:
                self._rings.clear()
            found = self._rings[channel.name] = KeyRing(channel)
        return found

    def ready(self, ring: KeyRing, now: float) -> list[int]:
        """The keys not cooling down."""
        return [i for i, n in enumerate(ring.names) if self.cooling.get(n, 0.0) <= now]

    def choose(self, channel: Channel, pinned: str, now: float) -> tuple[Channel, str] | None:
        """The variant a request uses, and its key's digest: the session's own key
        (``pinned``) while it is not cooling; else, round robin, a ready key with headroom,
        else any ready key. None when every key is cooling down."""
        ring = self.ring(channel)
        ready = self.ready(ring, now)
        if not ready:
            return None
        at = ring.index.get(pinned, -1)
        if at not in ready:
            roomy = [i for i in ready if self._low.get(ring.names[i], 0.0) <= now]
            pool = roomy or ready
            at = pool[next(ring.turn) % len(pool)]
        return ring.variants[at], ring.digests[at]

    def other(self, channel: Channel, used: Channel, now: float) -> Channel | None:
        """Another ready key of the channel than ``used``'s, to try next."""
        ring = self.ring(channel)
        for i in self.ready(ring, now):
            if ring.variants[i].api_key != used.api_key:
                return ring.variants[i]
        return None

    def name_of(self, variant: Channel) -> str:
        """The health name of the key a variant holds."""
        ring = self.ring(variant) if variant.name not in self._rings else self._rings[variant.name]
        at = ring.position.get(variant.api_key)
        if at is None:  # a variant of a catalogue since replaced: its ring anew
            ring = self._rings[variant.name] = KeyRing(variant)
            at = ring.position[variant.api_key]
        return ring.names[at]

    def replied(self, variant: Channel, headers: Mapping[str, str], now: float) -> None:
        """A reply on the variant's key: what its rate-limit headers say of its headroom."""
        low = is_low(headers)
        if low is None:
            return
        name = self.name_of(variant)
        if low:
            self._low[name] = now + HEADROOM_TTL
        else:
            self._low.pop(name, None)

    def refused(self, variant: Channel, err: GatewayError) -> tuple[str, float] | None:
        """(the key's health name, seconds to rest) when ``err`` is the key's own failure:
        its credentials refused (``channel_fault``) or rate limited (429); else None."""
        if err.status == 429:
            seconds = err.retry_after if err.retry_after else KEY_RATE_LIMIT_SECONDS
        elif err.channel_fault:
            seconds = 0.0  # the channel health's cooldown_seconds
        else:
            return None
        return self.name_of(variant), seconds

    def soonest(self, channel: Channel, now: float) -> float:
        """Seconds until the first of the channel's keys is ready again."""
        ring = self.ring(channel)
        return max(min(self.cooling.get(n, now) for n in ring.names) - now, 0.0)
