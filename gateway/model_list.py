"""The model lists each protocol's SDK expects, built from the catalogue (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.config import Model
from gateway.types import JSON

CREATED = 1700000000  # catalogue models have no creation time; a fixed one keeps lists stable
CREATED_RFC3339 = "2023-11-14T22:13:20Z"
GEMINI_METHODS = ("generateContent", "streamGenerateContent", "countTokens")


def openai_model(m: Model) -> JSON:
    return {"id": m.name, "object": "model", "created": CREATED, "owned_by": "gateway"}


def openai_list(models: Sequence[Model]) -> JSON:
    return {"object": "list", "data": [openai_model(m) for m in models]}


def anthropic_model(m: Model) -> JSON:
    return {"type": "model", "id": m.name, "display_name": m.name, "created_at": CREATED_RFC3339}


def anthropic_list(models: Sequence[Model]) -> JSON:
    data = [anthropic_model(m) for m in models]
    return {
        "data": data,
        "has_more": False,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def gemini_model(m: Model) -> JSON:
    methods = list(GEMINI_METHODS) if "chat" in m.capabilities else []
    if "embeddings" in m.capabilities:
        methods.append("embedContent")
    return {
        "name": f"models/{m.name}",
        "baseModelId": m.name,
        "version": "001",
        "displayName": m.name,
        "description": "",
        "inputTokenLimit": 1_000_000,
        "outputTokenLimit": m.default_max_tokens,
        "supportedGenerationMethods": methods,
    }


def gemini_list(models: Sequence[Model]) -> JSON:
    return {"models": [gemini_model(m) for m in models]}
