"""The `converse` protocol: AWS Bedrock's Converse API, spoken by ``bedrock`` channels to
every model that is not Anthropic's (those take their own Messages body through ``invoke``,
``gateway.protocols.anthropic.bedrock``).

Upstream side only (no client speaks Converse to the gateway): a chat request becomes a
Converse request to ``{base_url}/model/{id}/converse`` (``/converse-stream``), replies and
streams come back to the chat-completions shape. The call goes out unsigned: the channel
signs it (``gateway.upstream.sigv4``). A stream is AWS event-stream framing, read into events
by ``gateway.upstream.eventstream.EventStreamParser`` for ``ConverseStreamDecoder``. Modules:
``request`` (chat -> Converse), ``reply`` (whole replies, stop reasons, usage), ``stream``
(the stream decoder); errors are Bedrock's, ``gateway.protocols.bedrock``.

Mappings worth knowing (field names are botocore's ``bedrock-runtime`` service model's):

- ``system``/``developer`` messages anywhere -> ``system: [{text}]``; ``tool`` messages ->
  ``toolResult`` blocks in a user turn (``is_error`` -> ``status: "error"``); consecutive
  turns of one role merge, empty text blocks and empty turns are left out (Bedrock rejects
  blank text).
- images: base64 ``data:`` URLs -> ``image{format, source.bytes}`` (png, jpeg, gif, webp);
  ``file`` parts with base64 ``file_data`` -> ``document{format, name, source.bytes}``.
- assistant history: ``reasoning_content`` + ``reasoning_signature`` ->
  ``reasoningContent.reasoningText{text, signature}``; ``redacted_reasoning`` ->
  ``reasoningContent.redactedContent``; tool calls -> ``toolUse{toolUseId, name, input}``.
- ``tools`` -> ``toolConfig.tools[].toolSpec{name, description, inputSchema.json, strict}``;
  ``tool_choice`` auto/required/function -> ``toolChoice`` auto/any/tool.
- ``max_completion_tokens``/``max_tokens``, ``temperature``, ``top_p``, ``stop`` ->
  ``inferenceConfig{maxTokens, temperature, topP, stopSequences}`` (no default max: Converse
  needs none).
- ``response_format`` json_schema -> ``outputConfig.textFormat`` (``json_schema``, the
  schema as JSON text).
- ``stopReason`` end_turn/stop_sequence -> stop, max_tokens/model_context_window_exceeded
  -> length, tool_use -> tool_calls, guardrail_intervened/content_filtered ->
  content_filter, anything else -> stop.
- usage: ``prompt_tokens`` = inputTokens + cacheReadInputTokens + cacheWriteInputTokens;
  cache reads are ``prompt_tokens_details.cached_tokens``, writes ``cache_creation_tokens``.

Not carried (dropped on purpose), all toward Converse unless said:

| field                                                     | why                              |
|-----------------------------------------------------------|----------------------------------|
| ``tool_choice: "none"``                                   | Converse has no "none": the      |
|                                                           | tools are left out, or sent with |
|                                                           | no choice when the history holds |
|                                                           | tool blocks (Bedrock wants them) |
| ``parallel_tool_calls``                                   | no field                         |
| ``top_k``, ``reasoning_effort``                           | model-specific: they belong in   |
|                                                           | ``additionalModelRequestFields``,|
|                                                           | whose keys differ per model      |
| ``response_format`` json_object                           | no schema to give                |
| image links (http URLs), s3 locations, audio input        | only inline bytes (400)          |
| ``n``, ``seed``, ``logprobs``, ``logit_bias``,            | no counterpart                   |
| ``presence_penalty``, ``frequency_penalty``, ``user``,    |                                  |
| message ``name``, a file part's ``filename``              | (documents get a generated name) |
| reasoning without a signature                             | unsigned reasoning is refused    |
| from Converse: images, documents, citations, guardrail    | no chat counterpart              |
| content, server tool results, ``trace``, ``metrics``,     |                                  |
| ``additionalModelResponseFields``                         |                                  |
"""

from __future__ import annotations

from typing import ClassVar

from gateway.errors import GatewayError
from gateway.protocols import bedrock
from gateway.protocols.base import Ctx, UpstreamCall, UpstreamTarget
from gateway.protocols.converse import request
from gateway.protocols.converse.reply import decode_response
from gateway.protocols.converse.stream import ConverseStreamDecoder
from gateway.types import JSON, ChatRequest, ChatResponse

__all__ = ["ConverseAdapter", "ConverseStreamDecoder"]


class ConverseAdapter:
    """Bedrock's Converse API, upstream side (``UpstreamSide``)."""

    name: ClassVar[str] = "converse"

    def encode_request(self, req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
        return request.encode_request(req, target)

    def decode_response(self, payload: JSON) -> ChatResponse:
        return decode_response(payload)

    def stream_decoder(self, ctx: Ctx) -> ConverseStreamDecoder:
        return ConverseStreamDecoder(ctx)

    def decode_error(self, status: int, raw: bytes, header: str | None = None) -> GatewayError:
        """``header``: the reply's ``x-amzn-errortype``, which names the error."""
        return bedrock.decode_error(status, raw, header)
