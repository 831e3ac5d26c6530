"""The catalogue: the config's groups, models and channels as JSON, never an upstream api_key.

``seed`` saves ``catalogue_json`` in either backend; the admin API lists models and channels in
the same shapes (``model_json``, ``channel_json``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from gateway.types import JSON

if TYPE_CHECKING:
    from gateway.config import Channel, Model, Settings


def model_json(model: Model) -> dict[str, JSON]:
    price = model.price
    return {
        "name": model.name,
        "capabilities": sorted(model.capabilities),
        "price": {
            "input": price.input,
            "output": price.output,
            "request": price.request,
            "image": price.image,
            "audio_second": price.audio_second,
            "speech_char": price.speech_char,
        },
        "default_max_tokens": model.default_max_tokens,
    }


def channel_json(ch: Channel) -> dict[str, JSON]:
    """A channel without its upstream api_key."""
    return {
        "name": ch.name,
        "type": ch.type,
        "base_url": ch.base_url,
        "groups": list(ch.groups),
        "models": list(ch.models),
        "model_map": dict(ch.model_map),
        "priority": ch.priority,
        "weight": ch.weight,
    }


def catalogue_json(settings: Settings) -> bytes:
    """What ``seed`` saves: the groups, models and channels."""
    return orjson.dumps(
        {
            "groups": list(settings.groups),
            "models": [model_json(m) for m in settings.models],
            "channels": [channel_json(c) for c in settings.channels],
        }
    )
