"""The Gemini generateContent protocol, both sides: client paths and gemini-type channels.

Client side: ``/v1beta/models/{model}:generateContent`` (and ``:streamGenerateContent``,
``:countTokens``, the same under ``/v1``); the model comes from the path, never the body.
Upstream side: ``{base_url}/v1beta/models/{model}:generateContent`` or
``:streamGenerateContent?alt=sse``, ``x-goog-api-key``. Both sides count tokens
(``:countTokens``). Modules: ``request`` (requests both ways), ``reply`` (whole replies and
errors both ways), ``stream`` (the stream decoder and encoder), ``passthrough`` (gemini client,
gemini channel), ``contents`` (contents and parts <-> chat messages and deltas, for requests
and replies alike), ``dialect`` (field spellings, the schema subset, base64).

Mapping choices:
- systemInstruction <-> system messages (system/developer messages anywhere in the list go to
  systemInstruction, one part per text part: contents take only user and model turns, and a
  system text made a user turn would be read as the user's); role model <-> assistant;
  consecutive contents of one role are merged.
- Bytes (inlineData.data, thoughtSignature) are base64, which google-genai writes URL-safe
  (``-``, ``_``): made standard and padded on the way in, so that the other APIs take them
  (and a signature another upstream issued comes back as it was issued); a pass-through body's
  inline data too. Standard base64 from other clients reaches Gemini as it came.
- functionCall/functionResponse <-> tool_calls/tool messages. Gemini has no call ids: client
  histories get ``call_{n}`` ids, paired to functionResponse parts by ``id`` when present, else
  by name in order; replies get ``call_{request or response id}_{n}``. A functionCall ``id``
  sent by the newer API is kept. Toward the upstream, ids are left out and a tool message
  finds its function name from the assistant tool call with the same id.
- A tool message's content goes into functionResponse.response as is when it is a JSON
  object, else as ``{"result": <text>}``; functionResponse.response comes back as its JSON.
- Schemas toward Gemini (function parameters, responseSchema) are reduced to the OpenAPI
  subset Gemini accepts: keys such as additionalProperties, $schema, $id, strict, examples,
  exclusiveMinimum are dropped, ``type: [t, "null"]`` becomes ``nullable``, ``const`` becomes
  a one-value ``enum``, ``oneOf`` becomes ``anyOf``. A schema using ``$ref`` cannot be reduced,
  so it is sent unchanged as parametersJsonSchema / responseJsonSchema.
- tool_choice: auto <-> AUTO, none <-> NONE, required <-> ANY, a named function <-> ANY with
  one allowedFunctionNames; ANY with several names -> required with the tools narrowed to them.
- reasoning_effort <-> thinkingConfig: none = budget 0; minimal 512, low 1024, medium 8192,
  high 24576 tokens, always with includeThoughts; back: 0 -> none, -1 (dynamic) -> medium,
  <=1024 -> low, <=8192 -> medium, else high; thinkingLevel is taken by name.
- Thought parts <-> reasoning_content. thoughtSignature on a functionCall part <-> the tool
  call's thought_signature; on a text or thought part <-> reasoning_signature, written back on
  the thought part (or the last text part, or the first functionCall without its own).
- 402 is rendered FAILED_PRECONDITION and 413 INVALID_ARGUMENT (see ``reply``).

Not carried across (dropped on purpose; none has a field or equivalent on the other side).
Direction: G>X from a Gemini client toward another upstream; X>G from another client toward a
Gemini upstream; >G in replies shown to a Gemini client; G> in Gemini replies shown elsewhere.

| Field                                                                           | Dir  |
|---------------------------------------------------------------------------------|------|
| safetySettings, cachedContent, labels                                           | G>X  |
| tools other than functionDeclarations (googleSearch, codeExecution, urlContext) | G>X  |
| toolConfig mode VALIDATED (sent as auto), toolConfig.retrievalConfig            | G>X  |
| thinkingConfig.includeThoughts alone (without a budget or a level)              | G>X  |
| responseModalities, speechConfig, mediaResolution, imageConfig                  | G>X  |
| responseLogprobs, logprobs, enableEnhancedCivicAnswers                          | G>X  |
| responseMimeType other than application/json (text/x.enum)                      | G>X  |
| functionResponse.parts (multimodal results), videoMetadata                      | G>X  |
| executableCode / codeExecutionResult parts, inlineData in model turns           | G>X  |
| parallel_tool_calls, user, logit_bias, logprobs, store, metadata, service_tier  | X>G  |
| prediction, modalities, audio, web_search_options                               | X>G  |
| non-function tools (custom, web_search); tool call ids                          | X>G  |
| refusal, redacted_reasoning, annotations; usage cache_creation_tokens           | >G   |
| safetyRatings, citationMetadata, groundingMetadata, avgLogprobs, finishMessage  | G>   |
| inlineData (image output), executableCode, codeExecutionResult parts of replies | G>   |
"""

from __future__ import annotations

from typing import ClassVar

from gateway.errors import GatewayError, InvalidRequestError, UpstreamError
from gateway.protocols.base import Ctx, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.fields import REQUEST
from gateway.protocols.gemini import passthrough, reply, request
from gateway.protocols.gemini.passthrough import GeminiPassthroughStream
from gateway.protocols.gemini.reply import error_body
from gateway.protocols.gemini.stream import GeminiStreamDecoder, GeminiStreamEncoder
from gateway.types import JSON, ChatRequest, ChatResponse, Usage

__all__ = [
    "GeminiAdapter",
    "GeminiPassthroughStream",
    "GeminiStreamDecoder",
    "GeminiStreamEncoder",
    "error_body",
]


class GeminiAdapter:
    """Generate content, both sides, with token counting (``:countTokens``) on both sides and
    its pass-through."""

    name: ClassVar[str] = "gemini"

    # --- client side

    def match(
        self, kind: str, payload: JSON, path_model: str | None, query: bytes, stream: bool | None
    ) -> RouteMatch:
        """The model and the stream flag come from the path, never the body; the stream's
        framing from the query (``alt=sse``: SSE, else the JSON array)."""
        model = (path_model or "").removeprefix("models/")
        if not model:
            raise InvalidRequestError("the model is required in the path: models/{model}:action")
        if not isinstance(payload, dict):
            raise InvalidRequestError("the request body must be a JSON object")
        config = REQUEST.opt_obj(
            payload.get("generationConfig", payload.get("generation_config")), "generationConfig"
        )
        if config is not None:
            tokens = config.get("maxOutputTokens", config.get("max_output_tokens"))
            REQUEST.opt_integer(tokens, "generationConfig", "maxOutputTokens")
        stream = bool(stream)
        if kind == "count_tokens":
            action = "countTokens"
        else:
            action = "streamGenerateContent" if stream else "generateContent"
        return RouteMatch(
            protocol=self.name,
            capability=kind,
            model=model,
            stream=stream,
            sse=b"alt=sse" in query.split(b"&"),
            action=action,
        )

    def decode_request(self, payload: JSON, route: RouteMatch) -> ChatRequest:
        return request.decode_request(payload, route)

    def encode_response(self, resp: ChatResponse, ctx: Ctx) -> JSON:
        return reply.encode_response(resp, ctx)

    def stream_encoder(self, ctx: Ctx, route: RouteMatch) -> GeminiStreamEncoder:
        return GeminiStreamEncoder(ctx, route.sse)

    def encode_error(self, err: GatewayError) -> tuple[int, JSON]:
        return err.status, error_body(err)

    def encode_count(self, tokens: int, ctx: Ctx) -> JSON:
        return {"totalTokens": tokens}

    # --- upstream side

    def encode_request(self, req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
        return request.encode_request(req, target)

    def decode_response(self, payload: JSON) -> ChatResponse:
        return reply.decode_response(payload)

    def stream_decoder(self, ctx: Ctx) -> GeminiStreamDecoder:
        return GeminiStreamDecoder(ctx)

    def decode_error(self, status: int, raw: bytes) -> GatewayError:
        return reply.decode_error(status, raw)

    def count_request(self, req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
        return request.count_request(req, target)

    def decode_count(self, payload: JSON) -> int:
        if not isinstance(payload, dict) or not isinstance(payload.get("totalTokens"), int):
            raise UpstreamError("upstream countTokens reply has no totalTokens")
        return int(payload["totalTokens"])

    # --- passthrough

    def passthrough_request(
        self, payload: JSON, route: RouteMatch, target: UpstreamTarget
    ) -> UpstreamCall:
        return passthrough.passthrough_request(payload, route, target)

    def passthrough_response(self, payload: JSON, ctx: Ctx) -> tuple[JSON, Usage | None]:
        return passthrough.passthrough_response(payload, ctx)

    def passthrough_stream(
        self, ctx: Ctx, route: RouteMatch, target: UpstreamTarget
    ) -> GeminiPassthroughStream:
        return GeminiPassthroughStream(ctx, route.sse)
