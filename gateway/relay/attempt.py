"""One upstream attempt, up to the point where something can reach the client.

Everything that goes wrong before then is the channel's failure, and another channel may still
be tried: the upstream unreachable or answering an error status, no first byte within the
first-byte timeout, a reply that is not what its protocol says (not JSON, empty, malformed),
a stream that is garbage, ends, or reports an error before its first output. Each such failure
is counted toward the channel's cooldown (``health.ChannelHealth``); a client's mistake that
the upstream reports (a 4xx) is not, and is not retried. A whole reply is the channel's
success here; a stream's success or failure is known only at its end (``Relay._stream_ended``):
one that stalls past its idle timeout, breaks off or reports an error after its first output
counts against the channel as one before it would, though no other channel can be tried.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.config import Channel
from gateway.edge.interrupt import UPSTREAM_QUIET
from gateway.errors import GatewayError, UpstreamTimeoutError
from gateway.kinds.base import Exchange, Reply
from gateway.observe.observers import Observers
from gateway.policy.health import ChannelHealth
from gateway.policy.redaction import channel_secrets, redact_error
from gateway.protocols.base import RelayStream
from gateway.relay.request import RelayRequest
from gateway.upstream import UpstreamPool, UpstreamReply
from gateway.upstream.pool import READ_FAILURES, read_error

log = logging.getLogger("gateway.relay")

# the failures whose upstream wait (``Retry-After``) the client is told: rate limited (429),
# overloaded or unavailable (503, and Anthropic's 529, which the client gets as 503)
WAIT_STATUSES = frozenset({429, 503})
MAX_RETRY_AFTER = 86_400.0  # a longer wait is no wait the client could use


@dataclass(slots=True)
class Answer:
    """What an attempt that succeeded holds: a whole reply, or a stream and its first output."""

    resp: UpstreamReply
    reply: Reply | None = None
    stream: RelayStream | None = None
    first: bytes = b""  # the stream's first output for the client
    ended: bool = False  # the stream ended with it
    failure: GatewayError | None = None  # the error the stream ended with, in ``first``
    channel: Channel | None = None  # whose credentials a later error's message may not hold


async def open_attempt(
    upstream: UpstreamPool, exchange: Exchange, target: Channel, health: ChannelHealth, rid: str
) -> UpstreamReply:
    """The upstream's response once its status is known and is a success."""
    assert exchange.call is not None
    channel = target.name
    try:
        resp = await upstream.request(exchange.call, exchange.upload, target.timeouts, target)
    except GatewayError as err:
        health.failed(channel, err, rid)
        raise
    if resp.status < 400:
        return resp
    try:
        raw = await resp.read()
    finally:
        resp.close()
    failure = redact_error(
        exchange.decode_error(resp.status, raw, resp.headers), channel_secrets(target)
    )
    log.warning(
        "relay.upstream_status request_id=%s channel=%s status=%d", rid, channel, resp.status
    )
    health.failed(channel, failure, rid)
    if failure.status in WAIT_STATUSES and failure.retry_after is None:
        failure.retry_after = retry_after(resp.headers.get("retry-after"))
    raise failure


def retry_after(value: str | None) -> float | None:
    """An upstream's ``Retry-After`` as seconds: a number of them, or an HTTP date (from
    now); None for anything else (an empty, negative, infinite or unreadable value)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        seconds = max((when - datetime.now(UTC)).total_seconds(), 0.0)
    if not 0 <= seconds <= MAX_RETRY_AFTER:  # NaN compares False
        return None
    return seconds


async def first_output(
    resp: UpstreamReply, exchange: Exchange, stream: RelayStream, channel: Channel | None = None
) -> tuple[bytes, bool, GatewayError | None]:
    """Read the upstream's stream until it gives the client something: (bytes, ended, the
    error it ended with). An error before any output raises; one that came after output in
    the same read is part of the stream: the output, then the error in the stream (its
    message without the ``channel``'s credentials)."""
    while True:
        try:
            try:
                raw = await resp.chunk()
            except READ_FAILURES as exc:
                raise read_error(exc) from None
            if not raw:
                return stream.finish(), True, None
            out = stream.feed(raw)
        except GatewayError as err:
            tail = stream.error(redact_error(err, channel_secrets(channel)))
            if tail == exchange.stream(resp.headers).error(err):
                raise  # nothing came before it
            return tail, True, err
        if out:
            return out, False, None


class Attempts:
    """Runs one upstream attempt of a request (``run``), with the channel's health, the
    first-byte timeout, and the attempt's trace span and failure metric."""

    __slots__ = ("upstream", "health", "first_byte_timeout", "observers")

    def __init__(
        self,
        upstream: UpstreamPool,
        health: ChannelHealth,
        first_byte_timeout: float | None,
        observers: Observers,
    ) -> None:
        self.upstream = upstream
        self.health = health
        self.first_byte_timeout = first_byte_timeout
        self.observers = observers

    async def run(self, req: RelayRequest, exchange: Exchange, channel: Channel) -> Answer:
        """Send the exchange's call and read until there is something for the client: the
        whole reply, or a stream's first output. Raises the gateway error of a failure before
        then (counted in the metrics as a failed attempt, and in the trace)."""
        call = req.call
        tracing = self.observers.tracing
        span = (
            None
            if tracing is None
            else tracing.attempt(call.span, channel, channel.upstream_model(req.model.name))
        )
        began = time.perf_counter()
        try:
            answer = await self._timed(req, exchange, channel)
        except GatewayError as err:
            if span is not None:
                tracing.failed(span, type(err).__name__)  # type: ignore[union-attr]
            observed = self.observers.observed
            if observed is not None:
                seconds = time.perf_counter() - began
                observed.attempt_failed(
                    call.model, call.endpoint, channel.name, err.status, seconds
                )
            raise
        finally:
            if span is not None:
                span.end()
        call.upstream_started = began
        if answer.first:  # a stream's first output: the upstream's first chunk came
            call.upstream_first = time.perf_counter() - began
        return answer

    async def _timed(self, req: RelayRequest, exchange: Exchange, channel: Channel) -> Answer:
        """The attempt under its first-byte timeout.

        A stream whose upstream answered but stays quiet for the keep-alive interval
        (``req.quiet``, woken by the keep-alive timer) is taken as it is, with nothing to send
        yet: its client then gets keep-alives instead of a load balancer cutting it, and no
        other channel is tried. So is one the timer committed while its upstream withheld
        its status line (``stream.KeepAlive``). Only a ``first_byte_timeout`` (the
        channel's own, else the gateway's) costs a timer of its own."""
        timeout = self.first_byte_timeout
        if channel.timeouts.first_byte is not None:
            timeout = channel.timeouts.first_byte
        # a channel of several keys: the attempt's key keeps its own health (upstream_keys)
        health, rid = self.health.of(channel), req.request_id
        try:
            if timeout is None:
                answer = await _answer(self.upstream, exchange, channel, health, req)
            else:
                async with asyncio.timeout(timeout):
                    answer = await _answer(self.upstream, exchange, channel, health, req)
        except TimeoutError:
            failure = UpstreamTimeoutError(
                f"the upstream sent nothing within {timeout:g} s", retryable=True
            )
            health.failed(channel.name, failure, rid)
            raise failure from None
        if answer.reply is not None:  # a stream's outcome is told at its end (the pipeline)
            health.succeeded(channel.name, answer.resp.headers)  # rate-limit headers: keys
        return answer


async def _answer(
    upstream: UpstreamPool,
    exchange: Exchange,
    target: Channel,
    health: ChannelHealth,
    req: RelayRequest,
) -> Answer:
    rid, quiet = req.request_id, req.quiet
    if quiet is None:
        resp = await open_attempt(upstream, exchange, target, health, rid)
    else:
        quiet.opening = True  # the keep-alive timer may commit the stream meanwhile
        try:
            resp = await open_attempt(upstream, exchange, target, health, rid)
        finally:
            quiet.opening = False
    channel = target.name
    try:
        if not req.stream:
            return Answer(resp, reply=exchange.reply(await resp.read(), resp.headers))
        relay_stream = exchange.stream(resp.headers)
        if quiet is None:
            found = await first_output(resp, exchange, relay_stream, target)
            return Answer(resp, None, relay_stream, *found, channel=target)
        if quiet.started:  # committed while the upstream withheld its status: taken as it is
            return Answer(resp, stream=relay_stream, channel=target)
        quiet.wait()
        try:
            found = await first_output(resp, exchange, relay_stream, target)
        except asyncio.CancelledError:
            quiet.stop_waiting()
            if req.interrupt.absorb(UPSTREAM_QUIET):
                return Answer(resp, stream=relay_stream, channel=target)  # quiet, not failed
            raise
        quiet.stop_waiting()
        return Answer(resp, None, relay_stream, *found, channel=target)
    except GatewayError as err:
        redact_error(err, channel_secrets(target))
        resp.close()
        if err.status >= 500:
            err.retryable = True  # nothing reached the client yet
            log.warning(
                "relay.upstream_bad_reply request_id=%s channel=%s status=%d",
                rid,
                channel,
                err.status,
            )
        health.failed(channel, err, rid)
        raise
    except BaseException:
        resp.close()
        raise
