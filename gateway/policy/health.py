"""Channel health: which channels are cooling down after failures (beside channel choice).

A channel whose upstream refuses its credentials cools down at once for the configured
``cooldown_seconds``; one that fails otherwise (unreachable, 5xx) cools down only after
``FAILURES_BEFORE_COOLDOWN`` failures in a row, for at most ``FAILURE_COOLDOWN_SECONDS``: one
timeout under load must not turn a single-channel model into 503s. A success clears the count.
A stream is judged at its end (``relay.pipeline.Relay._stream_ended``): one that stalled past its
idle timeout or broke off counts as a failure, one that ended well as a success.
``routing.candidates`` reads ``cooling`` to leave cooling channels out.

Cooldowns are shared through the store: ``share()``, twice a second off the request path,
publishes the cooldowns this process began and takes every other instance's, so that no
instance keeps calling a channel another one found dead. The same exchange writes the
session pins behind (``policy/affinity.py``), when the app gave the health one.

A channel of several keys (``api_keys``) keeps each key's health under a name of its own
(``policy/upstream_keys.py``): ``of(channel)`` gives an attempt on one of its keys a view of
this health that cools that key, not the channel, when the upstream refuses or rate-limits
it, and reads the rate-limit headers of its replies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gateway.config import Channel
from gateway.errors import GatewayError, GatewayOverloadedError
from gateway.policy.upstream_keys import UpstreamKeys
from gateway.store import Store
from gateway.store.cancellation import raise_if_cancelled

if TYPE_CHECKING:
    from gateway.policy.affinity import Affinity

log = logging.getLogger("gateway.health")

FAILURES_BEFORE_COOLDOWN = 3
FAILURE_COOLDOWN_SECONDS = 5.0
SHARE_INTERVAL = 0.5  # seconds between two exchanges of cooldowns with the store


class ChannelHealth:
    """This process's view of its channels' health."""

    __slots__ = (
        "cooling", "failures_total", "keys", "affinity", "_failures", "_cooldown", "_begun",
    )  # fmt: skip

    def __init__(self, cooldown_seconds: float) -> None:
        # channel (or a key of one: ``upstream_keys``) -> monotonic time it may serve again
        self.cooling: dict[str, float] = {}
        self._failures: dict[str, int] = {}  # channel -> failures in a row
        self.failures_total: dict[str, int] = {}  # channel -> failed attempts (metrics)
        self._cooldown = cooldown_seconds
        self._begun: dict[str, int] = {}  # cooldowns to publish: channel -> until (epoch ms)
        self.keys = UpstreamKeys(self.cooling)
        self.affinity: Affinity | None = None  # the session pins, when the app made them

    def of(self, channel: Channel) -> ChannelHealth:
        """What an attempt on ``channel`` reports to: this health, or for one key of a
        channel of several a view that keeps that key's own health (``KeyHealth``)."""
        return self if not channel.api_keys else KeyHealth(self, channel)

    def succeeded(self, channel: str, headers: Mapping[str, str] | None = None) -> None:
        """An attempt that answered (``headers``: its reply's, read by a key's view)."""
        if self._failures:
            self._failures.pop(channel, None)

    def failed(self, channel: str, err: GatewayError, request_id: str = "") -> None:
        """Count a failed attempt on the channel, as ``err`` says: the channel's own fault
        (credentials) cools it at once; an upstream failure (5xx, unreachable, timeout)
        counts toward a cooldown; a client's mistake or this process running out of
        connections says nothing about the channel. ``request_id``: the request whose
        attempt it was, named by the log line of a cooldown it begins."""
        if isinstance(err, GatewayOverloadedError):
            return
        if err.channel_fault or err.status >= 500:
            self.failures_total[channel] = self.failures_total.get(channel, 0) + 1
        if err.channel_fault:
            self._cool(channel, self._cooldown, request_id)
        elif err.status >= 500:
            n = self._failures.get(channel, 0) + 1
            if n >= FAILURES_BEFORE_COOLDOWN:
                self._failures.pop(channel, None)
                self._cool(channel, min(self._cooldown, FAILURE_COOLDOWN_SECONDS), request_id)
            else:
                self._failures[channel] = n

    def _cool(self, channel: str, seconds: float, request_id: str) -> None:
        if seconds > 0:
            self.cooling[channel] = time.monotonic() + seconds
            self._begun[channel] = int((time.time() + seconds) * 1000)
            log.warning(
                "relay.channel_cooling request_id=%s channel=%s seconds=%g",
                request_id or "-",
                channel,
                seconds,
            )

    def cool_key(self, variant: Channel, name: str, seconds: float, request_id: str) -> None:
        """Cool one key of a channel of several (``seconds`` 0: ``cooldown_seconds``); the
        channel too, until its first key is ready, once every key is cooling."""
        self._cool(name, seconds or self._cooldown, request_id)
        now = time.monotonic()
        if not self.keys.ready(self.keys.ring(variant), now):
            self._cool(variant.name, self.keys.soonest(variant, now), request_id)

    async def share(self, store: Store) -> None:
        """Publish the cooldowns begun here since the last call; take every instance's; then
        write the session pins behind (``Affinity.sync``)."""
        begun, self._begun = self._begun, {}
        wall = time.time()
        try:
            shared = await store.share_cooling(begun, int(wall * 1000))
        except BaseException:
            for channel, until in begun.items():  # published next time
                self._begun[channel] = max(until, self._begun.get(channel, 0))
            raise
        now = time.monotonic()
        for channel, until in shared.items():
            at = now + until / 1000 - wall
            if at > self.cooling.get(channel, 0.0):
                self.cooling[channel] = at
        if self.affinity is not None:
            await self.affinity.sync(store)

    async def share_forever(self, store: Store) -> None:
        """``share()`` every ``SHARE_INTERVAL`` seconds; a store that does not answer is
        logged once per spell, and this process's own cooldowns go on meanwhile."""
        failing = False
        while True:
            await asyncio.sleep(SHARE_INTERVAL)
            try:
                await self.share(store)
            except Exception as exc:
                raise_if_cancelled()
                if not failing:
                    log.warning("health.share_failed error=%s", type(exc).__name__)
                failing = True
            else:
                raise_if_cancelled()  # a cancel that landed in redis-py's pipeline
                if failing:
                    log.info("health.share_recovered")
                failing = False


class KeyHealth(ChannelHealth):
    """An attempt's view of the health for one key of a channel of several keys: a refusal
    or a rate limit cools the key (``ChannelHealth.cool_key``), a reply's rate-limit headers
    say how much room the key has left; everything else is the channel's. Only ``failed``
    and ``succeeded`` are used through it (``relay/attempt.py``); the state stays in the
    channel health it was made from."""

    __slots__ = ("whole", "variant")

    def __init__(self, whole: ChannelHealth, variant: Channel) -> None:
        self.whole = whole
        self.variant = variant

    def failed(self, channel: str, err: GatewayError, request_id: str = "") -> None:
        refused = self.whole.keys.refused(self.variant, err)
        if refused is None:
            self.whole.failed(channel, err, request_id)
            return
        self.whole.cool_key(self.variant, *refused, request_id)
        if err.status == 429 and err.retry_after is None:
            # the attempt reads Retry-After into ``err.retry_after`` just after telling the
            # health (``attempt.open_attempt``): the key's rest is set again once it has
            try:
                asyncio.get_running_loop().call_soon(self._rest, err, request_id)
            except RuntimeError:  # no loop (a test of the health alone)
                pass

    def _rest(self, err: GatewayError, request_id: str) -> None:
        if err.retry_after is not None:
            name = self.whole.keys.name_of(self.variant)
            self.whole.cool_key(self.variant, name, max(err.retry_after, 1.0), request_id)

    def succeeded(self, channel: str, headers: Mapping[str, str] | None = None) -> None:
        self.whole.succeeded(channel)
        if headers is not None:
            self.whole.keys.replied(self.variant, headers, time.monotonic())
