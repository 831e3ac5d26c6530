"""The protocol adapters by name: ``ADAPTERS`` are the channel types (both sides of a protocol);
``CLIENTS`` the protocols clients speak (every channel type, plus client-only ones)."""

from __future__ import annotations

from gateway.protocols.anthropic import AnthropicAdapter
from gateway.protocols.base import Adapter, ClientSide
from gateway.protocols.gemini import GeminiAdapter
from gateway.protocols.openai import OpenAIAdapter
from gateway.protocols.responses import ResponsesAdapter

ADAPTERS: dict[str, Adapter] = {
    "openai": OpenAIAdapter(),
    "anthropic": AnthropicAdapter(),
    "gemini": GeminiAdapter(),
}
CLIENTS: dict[str, ClientSide] = {**ADAPTERS, "responses": ResponsesAdapter()}

__all__ = ["ADAPTERS", "CLIENTS", "Adapter", "ClientSide"]
