"""The model-list endpoints: the key's models in the shape each protocol's SDK expects.

Answered from the catalogue, after authentication, with no usage record (CONTRACT §6).
``GET /v1/models`` serves three shapes: Anthropic's when the request carries
``anthropic-version``; Gemini's when it carries only ``x-goog-api-key`` (google-genai's
default API version is v1); else OpenAI's.

A model's exact ``aliases`` are listed after the catalogue's names, as models of their own:
the names clients look for (Claude Code's model discovery keeps the ids starting ``claude``).
One model is found by any name that reaches it, a ``*`` alias's too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

from gateway.config import Model
from gateway.edge.asgi import request_headers, send_error, send_json
from gateway.edge.routes import RouteSpec
from gateway.errors import GatewayError, NotFoundError
from gateway.policy.gate import Gate
from gateway.policy.routing import LiveCatalogue
from gateway.protocols import CLIENTS
from gateway.types import JSON, Receive, Scope, Send

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
        methods += ["embedContent", "batchEmbedContents"]
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


class ModelLists:
    """The handler of the ``models`` and ``model`` routes."""

    __slots__ = ("gate", "catalogue")

    def __init__(self, gate: Gate, catalogue: LiveCatalogue) -> None:
        self.gate = gate
        self.catalogue = catalogue

    async def handle(
        self, spec: RouteSpec, path_model: str | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        try:
            headers = request_headers(scope)
            key = self.gate.authenticate(spec, scope, headers, datetime.now(UTC))
            catalogue = self.catalogue.current
            models = catalogue.group_models(key.group)
            if key.models is not None:
                models = tuple(m for m in models if m.name in key.models)
            if spec.kind == "model":
                name = (path_model or "").removeprefix("models/")
                meant = catalogue.resolve(key.group, name)
                models = tuple(replace(m, name=name) for m in models if m.name == meant)
            else:
                named = [replace(m, name=a) for m in models for a in catalogue.aliases(m)]
                models = (*models, *named)
            shape = spec.protocol
            if shape == "openai":
                if b"anthropic-version" in headers:
                    shape = "anthropic"
                elif b"x-goog-api-key" in headers and b"authorization" not in headers:
                    shape = "gemini"
            body = (
                self._one(shape, path_model, models)
                if spec.kind == "model"
                else LISTS[shape](models)
            )
            await send_json(send, 200, body)
        except GatewayError as err:
            await send_error(send, CLIENTS[spec.protocol], err)

    @staticmethod
    def _one(shape: str, path_model: str | None, models: Sequence[Model]) -> JSON:
        name = (path_model or "").removeprefix("models/")
        found = next((m for m in models if m.name == name), None)
        if found is None:
            raise NotFoundError(f"The model '{name}' does not exist.")
        return ENTRIES[shape](found)


LISTS = {"openai": openai_list, "anthropic": anthropic_list, "gemini": gemini_list}
ENTRIES = {"openai": openai_model, "anthropic": anthropic_model, "gemini": gemini_model}
