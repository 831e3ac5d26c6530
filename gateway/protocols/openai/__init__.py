"""The `openai` protocol: chat completions, which is also the internal shape.

Client side, decoding is nearly the identity (the body is checked, not copied); upstream side,
the request loses the gateway's extension fields (``gateway.types``) and gains
``stream_options.include_usage`` so every stream can be billed; the usage chunk is dropped on
the way back unless the client asked for it. Chat completions has no token-count endpoint, so
this adapter is neither ``Counting`` nor a ``Counter``.

Modules: ``request`` (requests both ways), ``reply`` (whole replies and errors both ways),
``stream`` (the stream encoder and decoder), ``passthrough`` (openai client, openai channel).

Not carried toward an openai channel (dropped on purpose):

| field                                   | why                                            |
|-----------------------------------------|------------------------------------------------|
| ``top_k``                               | chat completions has no such parameter         |
| ``reasoning_signature``, ``redacted_reasoning`` | other providers' opaque data       |
| tool call ``thought_signature``         | Gemini's opaque data                           |
| tool message ``is_error``               | chat completions has no failed-tool flag       |
| ``reasoning_content`` on input messages | OpenAI does not take reasoning back as input   |
| ``usage.cache_creation_tokens``         | no field for it in chat completions usage      |
"""

from __future__ import annotations

from typing import ClassVar

from gateway.errors import GatewayError
from gateway.protocols.base import Ctx, RouteMatch, UpstreamCall, UpstreamTarget, text_field
from gateway.protocols.openai import passthrough, reply, request
from gateway.protocols.openai.passthrough import OpenAIPassthrough
from gateway.protocols.openai.reply import error_body
from gateway.protocols.openai.request import (
    body_model,
    check_chat_request,
    check_facts,
    usage_wanted,
)
from gateway.protocols.openai.stream import OpenAIStreamDecoder, OpenAIStreamEncoder
from gateway.types import JSON, ChatRequest, ChatResponse, Usage

__all__ = [
    "OpenAIAdapter",
    "OpenAIPassthrough",
    "OpenAIStreamDecoder",
    "OpenAIStreamEncoder",
    "body_model",
    "check_chat_request",
    "error_body",
    "usage_wanted",
]


class OpenAIAdapter:
    """Chat completions, both sides, and its pass-through."""

    name: ClassVar[str] = "openai"

    # client side -------------------------------------------------------------------------
    def match(
        self, kind: str, payload: JSON, path_model: str | None, query: bytes, stream: bool | None
    ) -> RouteMatch:
        model = body_model(payload)
        check_facts(payload)
        if stream is None:
            stream = kind == "chat" and payload.get("stream") is True
        return RouteMatch(
            protocol=self.name,
            capability=kind,
            model=model,
            stream=stream,
            include_usage=stream and usage_wanted(payload),
            session=text_field(payload, "prompt_cache_key"),
        )

    def decode_request(self, payload: JSON, route: RouteMatch) -> ChatRequest:
        check_chat_request(payload)
        return payload  # type: ignore[no-any-return]

    def encode_response(self, resp: ChatResponse, ctx: Ctx) -> JSON:
        return reply.encode_response(resp, ctx)

    def stream_encoder(self, ctx: Ctx, route: RouteMatch) -> OpenAIStreamEncoder:
        return OpenAIStreamEncoder(ctx)

    def encode_error(self, err: GatewayError) -> tuple[int, JSON]:
        return err.status, error_body(err)

    # upstream side -----------------------------------------------------------------------
    def encode_request(self, req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
        return request.encode_request(req, target)

    def decode_response(self, payload: JSON) -> ChatResponse:
        return reply.decode_response(payload)

    def stream_decoder(self, ctx: Ctx) -> OpenAIStreamDecoder:
        return OpenAIStreamDecoder()

    def decode_error(self, status: int, raw: bytes) -> GatewayError:
        return reply.decode_error(status, raw)

    # passthrough -------------------------------------------------------------------------
    def passthrough_request(
        self, payload: JSON, route: RouteMatch, target: UpstreamTarget
    ) -> UpstreamCall:
        return passthrough.passthrough_request(payload, route, target)

    def passthrough_response(self, payload: JSON, ctx: Ctx) -> tuple[JSON, Usage | None]:
        return passthrough.passthrough_response(payload, ctx)

    def passthrough_stream(
        self, ctx: Ctx, route: RouteMatch, target: UpstreamTarget
    ) -> OpenAIPassthrough:
        return OpenAIPassthrough(ctx, target)
