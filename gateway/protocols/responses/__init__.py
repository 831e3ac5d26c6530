"""The OpenAI Responses API (``POST /v1/responses``) as a client protocol.

Client side only: a request converts to the chat-completions shape and reaches every channel
type; the reply and the stream convert back (``reply``, ``stream``). An openai channel with
``responses: true`` gets the body unconverted (``passthrough``). Errors are in the OpenAI
shape, so the ``openai`` SDK raises its typed errors; after a stream started, an error arrives
as ``response.failed``. Nothing is kept: ``store`` is always false, and a request that needs a
kept response (``previous_response_id``, ``conversation``) is refused with a 400. A request
body's tokens are counted at ``POST /v1/responses/input_tokens`` (``Counting``): by the
channel where its protocol counts, else by the local estimate.
"""

from __future__ import annotations

from typing import ClassVar

from gateway.errors import GatewayError
from gateway.protocols.base import Ctx, RouteMatch, UpstreamCall, UpstreamTarget, text_field
from gateway.protocols.fields import REQUEST
from gateway.protocols.openai.reply import error_body
from gateway.protocols.openai.request import body_model
from gateway.protocols.responses import passthrough, reply, request, tools
from gateway.protocols.responses.passthrough import ResponsesPassthrough
from gateway.protocols.responses.stream import ResponsesStreamEncoder
from gateway.types import JSON, ChatRequest, ChatResponse, Usage

__all__ = ["ResponsesAdapter"]


class ResponsesAdapter:
    """Responses API clients, and their pass-through to an upstream that serves it."""

    name: ClassVar[str] = "responses"

    def match(
        self, kind: str, payload: JSON, path_model: str | None, query: bytes, stream: bool | None
    ) -> RouteMatch:
        model = body_model(payload)
        namespaces, custom = tools.declared(payload)
        REQUEST.opt_bool(payload.get("stream"), "stream")
        REQUEST.opt_integer(payload.get("max_output_tokens"), "max_output_tokens")
        return RouteMatch(
            protocol=self.name,
            capability=kind,
            model=model,
            stream=payload.get("stream") is True,
            tool_namespaces=namespaces,
            custom_tools=custom,
            session=text_field(payload, "prompt_cache_key"),
        )

    def decode_request(self, payload: JSON, route: RouteMatch) -> ChatRequest:
        return request.decode_request(payload)

    def encode_response(self, resp: ChatResponse, ctx: Ctx) -> JSON:
        return reply.encode_response(resp, ctx)

    def stream_encoder(self, ctx: Ctx, route: RouteMatch) -> ResponsesStreamEncoder:
        return ResponsesStreamEncoder(ctx)

    def encode_error(self, err: GatewayError) -> tuple[int, JSON]:
        return err.status, error_body(err)

    # token counting (``POST /v1/responses/input_tokens``) ----------------------------------
    def encode_count(self, tokens: int, ctx: Ctx) -> JSON:
        return {"object": "response.input_tokens", "input_tokens": tokens}

    # passthrough -------------------------------------------------------------------------
    def passthrough_request(
        self, payload: JSON, route: RouteMatch, target: UpstreamTarget
    ) -> UpstreamCall:
        request.decode_request(payload)  # what the gateway refuses, it refuses here too
        return passthrough.passthrough_request(payload, route, target)

    def passthrough_response(self, payload: JSON, ctx: Ctx) -> tuple[JSON, Usage | None]:
        return passthrough.passthrough_response(payload, ctx)

    def passthrough_stream(
        self, ctx: Ctx, route: RouteMatch, target: UpstreamTarget
    ) -> ResponsesPassthrough:
        return ResponsesPassthrough(ctx, target)
