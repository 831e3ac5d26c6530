"""Channel health: which channels are cooling down after failures (beside channel choice).

A channel whose upstream refuses its credentials cools down at once for the configured
``cooldown_seconds``; one that fails otherwise (unreachable, 5xx) cools down only after
``FAILURES_BEFORE_COOLDOWN`` failures in a row, for at most ``FAILURE_COOLDOWN_SECONDS``: one
timeout under load must not turn a single-channel model into 503s. A success clears the count.
A stream is judged at its end (``relay.pipeline.Relay._stream``): one that stalled past its
idle timeout or broke off counts as a failure, one that ended well as a success.
``routing.candidates`` reads ``cooling`` to leave cooling channels out.

Cooldowns are shared through the store: ``share()``, twice a second off the request path,
publishes the cooldowns this process began and takes every other instance's, so that no
instance keeps calling a channel another one found dead.
"""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.errors import GatewayError, GatewayOverloadedError
from gateway.store import Store
from gateway.store.cancellation import raise_if_cancelled

log = logging.getLogger("gateway.health")

FAILURES_BEFORE_COOLDOWN = 3
FAILURE_COOLDOWN_SECONDS = 5.0
SHARE_INTERVAL = 0.5  # seconds between two exchanges of cooldowns with the store


class ChannelHealth:
    """This process's view of its channels' health."""

    __slots__ = ("cooling", "failures_total", "_failures", "_cooldown", "_begun")

    def __init__(self, cooldown_seconds: float) -> None:
        self.cooling: dict[str, float] = {}  # channel -> monotonic time it may serve again
        self._failures: dict[str, int] = {}  # channel -> failures in a row
        self.failures_total: dict[str, int] = {}  # channel -> failed attempts (metrics)
        self._cooldown = cooldown_seconds
        self._begun: dict[str, int] = {}  # cooldowns to publish: channel -> until (epoch ms)

    def succeeded(self, channel: str) -> None:
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

    async def share(self, store: Store) -> None:
        """Publish the cooldowns begun here since the last call; take every instance's."""
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
