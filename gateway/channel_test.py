"""``POST /admin/channels/{name}/test``: one minimal request through a channel, as the relay
would send it (the channel's protocol, its key, its model map, its timeouts, the shared
upstream pool), reported as ``{ok, status, latency_ms, error?}``. Not billed, no usage record,
no effect on the channel's health: an operator's probe, not traffic.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import orjson

from gateway.config import Channel, Settings
from gateway.errors import GatewayError, InvalidRequestError, NotFoundError
from gateway.protocols import ADAPTERS
from gateway.protocols.base import UpstreamTarget
from gateway.types import JSON, ChatRequest

if TYPE_CHECKING:
    from gateway.upstream import Upstream

PROBE = "Reply with one word: ok."


def channel_named(settings: Settings, name: str) -> Channel:
    for channel in settings.channels:
        if channel.name == name:
            return channel
    raise NotFoundError(f"no channel {name!r}")


def probe_model(settings: Settings, channel: Channel) -> str:
    """The first model the channel serves that can chat (what a one-token probe asks)."""
    for name in channel.models:
        model = settings.model(name)
        if model is not None and "chat" in model.capabilities:
            return name
    raise InvalidRequestError(f"channel {channel.name!r} serves no chat model to test with")


async def test_channel(settings: Settings, upstream: Upstream, name: str) -> JSON:
    channel = channel_named(settings, name)
    model_name = probe_model(settings, channel)
    model = settings.model(model_name)
    assert model is not None
    adapter = ADAPTERS[channel.type]
    target = UpstreamTarget(
        channel=channel.name,
        base_url=channel.base_url,
        api_key=channel.api_key,
        model=channel.upstream_model(model_name),
        default_max_tokens=1,
        stream=False,
    )
    request: ChatRequest = {
        "model": model_name,
        "messages": [{"role": "user", "content": PROBE}],
        "max_tokens": 1,
    }
    call = adapter.encode_request(request, target)
    started = time.perf_counter()
    status = 0
    try:
        resp = await upstream.request(call, None, channel.timeouts)
        status = resp.status
        try:
            raw = await resp.read()
        finally:
            resp.close()
        if status >= 400:
            raise adapter.decode_error(status, raw)
        adapter.decode_response(orjson.loads(raw))
    except GatewayError as err:
        return {
            "ok": False,
            "status": status or err.status,
            "latency_ms": _since(started),
            "error": err.message,
        }
    except ValueError:  # a 200 that is not JSON
        return {
            "ok": False,
            "status": status,
            "latency_ms": _since(started),
            "error": "the upstream's reply is not JSON",
        }
    return {"ok": True, "status": status, "latency_ms": _since(started)}


def _since(started: float) -> int:
    return round((time.perf_counter() - started) * 1000)
