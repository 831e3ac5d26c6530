"""Channel health: which channels are cooling down after failures (beside channel choice).

A channel whose upstream refuses its credentials cools down at once for the configured
``cooldown_seconds``; one that fails otherwise (unreachable, 5xx) cools down only after
``FAILURES_BEFORE_COOLDOWN`` failures in a row, for at most ``FAILURE_COOLDOWN_SECONDS``: one
timeout under load must not turn a single-channel model into 503s. A success clears the count.
``routing.candidates`` reads ``cooling`` to leave cooling channels out.
"""

from __future__ import annotations

import logging
import time

from gateway.errors import GatewayError, GatewayOverloadedError

log = logging.getLogger("gateway.health")

FAILURES_BEFORE_COOLDOWN = 3
FAILURE_COOLDOWN_SECONDS = 5.0


class ChannelHealth:
    """This process's view of its channels' health."""

    __slots__ = ("cooling", "_failures", "_cooldown")

    def __init__(self, cooldown_seconds: float) -> None:
        self.cooling: dict[str, float] = {}  # channel -> monotonic time it may serve again
        self._failures: dict[str, int] = {}  # channel -> failures in a row
        self._cooldown = cooldown_seconds

    def succeeded(self, channel: str) -> None:
        if self._failures:
            self._failures.pop(channel, None)

    def failed(self, channel: str, err: GatewayError) -> None:
        """Count a failed attempt on the channel, as ``err`` says: the channel's own fault
        (credentials) cools it at once; an upstream failure (5xx, unreachable, timeout)
        counts toward a cooldown; a client's mistake or this process running out of
        connections says nothing about the channel."""
        if isinstance(err, GatewayOverloadedError):
            return
        if err.channel_fault:
            self._cool(channel, self._cooldown)
        elif err.status >= 500:
            n = self._failures.get(channel, 0) + 1
            if n >= FAILURES_BEFORE_COOLDOWN:
                self._failures.pop(channel, None)
                self._cool(channel, min(self._cooldown, FAILURE_COOLDOWN_SECONDS))
            else:
                self._failures[channel] = n

    def _cool(self, channel: str, seconds: float) -> None:
        if seconds > 0:
            self.cooling[channel] = time.monotonic() + seconds
            log.warning("relay.channel_cooling channel=%s seconds=%g", channel, seconds)
