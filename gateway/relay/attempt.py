"""One upstream attempt: send the exchange's call, and classify a failure before the first
byte reached the client, keeping the channel's health (``health.ChannelHealth``)."""

from __future__ import annotations

import logging

from gateway.errors import GatewayError
from gateway.health import ChannelHealth
from gateway.kinds.base import Exchange
from gateway.upstream import Upstream, UpstreamResponse

log = logging.getLogger("gateway.relay")


async def open_attempt(
    upstream: Upstream, exchange: Exchange, channel: str, health: ChannelHealth
) -> UpstreamResponse:
    """The upstream's response once its status is known and is a success. A failure raises
    the gateway error for it (``retryable`` says whether another channel may be tried)."""
    assert exchange.call is not None
    try:
        resp = await upstream.request(exchange.call, exchange.upload)
    except GatewayError as err:
        health.failed(channel, err)
        raise
    if resp.status < 400:
        health.succeeded(channel)
        return resp
    try:
        raw = await resp.read()
    finally:
        resp.close()
    failure = exchange.decode_error(resp.status, raw)
    log.warning("relay.upstream_status channel=%s status=%d", channel, resp.status)
    health.failed(channel, failure)
    retry_after = resp.headers.get("retry-after")
    if failure.status == 429 and failure.retry_after is None and retry_after:
        try:
            failure.retry_after = float(retry_after)
        except ValueError:
            pass
    raise failure
