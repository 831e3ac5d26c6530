"""One upstream attempt, up to the point where something can reach the client.

Everything that goes wrong before then is the channel's failure, and another channel may still
be tried: the upstream unreachable or answering an error status, no first byte within the
first-byte timeout, a reply that is not what its protocol says (not JSON, empty, malformed),
a stream that is garbage, ends, or reports an error before its first output. Each such failure
is counted toward the channel's cooldown (``health.ChannelHealth``); a client's mistake that
the upstream reports (a 4xx) is not, and is not retried.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from gateway.config import Channel
from gateway.errors import GatewayError, UpstreamTimeoutError
from gateway.kinds.base import Exchange, Reply
from gateway.policy.health import ChannelHealth
from gateway.protocols.base import RelayStream
from gateway.relay.stream import Quiet
from gateway.upstream.pool import Upstream, UpstreamResponse

log = logging.getLogger("gateway.relay")


@dataclass(slots=True)
class Answer:
    """What an attempt that succeeded holds: a whole reply, or a stream and its first output."""

    resp: UpstreamResponse
    reply: Reply | None = None
    stream: RelayStream | None = None
    first: bytes = b""  # the stream's first output for the client
    ended: bool = False  # the stream ended with it
    failure: GatewayError | None = None  # the error the stream ended with, in ``first``


async def open_attempt(
    upstream: Upstream, exchange: Exchange, target: Channel, health: ChannelHealth, rid: str
) -> UpstreamResponse:
    """The upstream's response once its status is known and is a success."""
    assert exchange.call is not None
    channel = target.name
    try:
        resp = await upstream.request(exchange.call, exchange.upload, target.timeouts)
    except GatewayError as err:
        health.failed(channel, err, rid)
        raise
    if resp.status < 400:
        return resp
    try:
        raw = await resp.read()
    finally:
        resp.close()
    failure = exchange.decode_error(resp.status, raw)
    log.warning(
        "relay.upstream_status request_id=%s channel=%s status=%d", rid, channel, resp.status
    )
    health.failed(channel, failure, rid)
    retry_after = resp.headers.get("retry-after")
    if failure.status == 429 and failure.retry_after is None and retry_after:
        try:
            failure.retry_after = float(retry_after)
        except ValueError:
            pass
    raise failure


async def first_output(
    resp: UpstreamResponse, exchange: Exchange, stream: RelayStream
) -> tuple[bytes, bool, GatewayError | None]:
    """Read the upstream's stream until it gives the client something: (bytes, ended, the
    error it ended with). An error before any output raises; one that came after output in
    the same read is part of the stream: the output, then the error in the stream."""
    while True:
        try:
            raw = await resp.chunk()
            if not raw:
                return stream.finish(), True, None
            out = stream.feed(raw)
        except GatewayError as err:
            tail = stream.error(err)
            if tail == exchange.stream(resp.headers).error(err):
                raise  # nothing came before it
            return tail, True, err
        if out:
            return out, False, None


async def attempt(
    upstream: Upstream,
    exchange: Exchange,
    channel: Channel,
    health: ChannelHealth,
    quiet: Quiet | None,
    stream: bool,
    first_byte_timeout: float | None,
    rid: str,
) -> Answer:
    """Send the exchange's call and read until there is something for the client: the whole
    reply, or a stream's first output. Raises the gateway error of a failure before then.

    A stream whose upstream answered but stays quiet for the keep-alive interval (``quiet``,
    woken by the keep-alive timer) is taken as it is, with nothing to send yet: its client
    then gets keep-alives instead of a load balancer cutting it, and no other channel is
    tried. Only a ``first_byte_timeout`` (the channel's own, else ``first_byte_timeout``)
    costs a timer of its own."""
    if channel.timeouts.first_byte is not None:
        first_byte_timeout = channel.timeouts.first_byte
    try:
        if first_byte_timeout is None:
            answer = await _answer(upstream, exchange, channel, health, quiet, stream, rid)
        else:
            async with asyncio.timeout(first_byte_timeout):
                answer = await _answer(upstream, exchange, channel, health, quiet, stream, rid)
    except TimeoutError:
        failure = UpstreamTimeoutError(
            f"the upstream sent nothing within {first_byte_timeout:g} s", retryable=True
        )
        health.failed(channel.name, failure, rid)
        raise failure from None
    health.succeeded(channel.name)
    return answer


async def _answer(
    upstream: Upstream,
    exchange: Exchange,
    target: Channel,
    health: ChannelHealth,
    quiet: Quiet | None,
    stream: bool,
    rid: str,
) -> Answer:
    resp = await open_attempt(upstream, exchange, target, health, rid)
    channel = target.name
    try:
        if not stream:
            return Answer(resp, reply=exchange.reply(await resp.read(), resp.headers))
        relay_stream = exchange.stream(resp.headers)
        if quiet is None:
            found = await first_output(resp, exchange, relay_stream)
            return Answer(resp, None, relay_stream, *found)
        quiet.wait()
        try:
            found = await first_output(resp, exchange, relay_stream)
        except asyncio.CancelledError:
            if quiet.stop_waiting(True):
                return Answer(resp, stream=relay_stream)  # quiet, not failed
            raise
        quiet.stop_waiting(False)
        return Answer(resp, None, relay_stream, *found)
    except GatewayError as err:
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
