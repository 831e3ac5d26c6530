"""The protocol adapters, by name (the config's channel `type` values and client protocols)."""

from __future__ import annotations

from gateway.protocols.anthropic import AnthropicAdapter
from gateway.protocols.base import Adapter
from gateway.protocols.gemini import GeminiAdapter
from gateway.protocols.openai import OpenAIAdapter

ADAPTERS: dict[str, Adapter] = {
    "openai": OpenAIAdapter(),
    "anthropic": AnthropicAdapter(),
    "gemini": GeminiAdapter(),
}

__all__ = ["ADAPTERS", "Adapter"]
