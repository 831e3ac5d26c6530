"""The `anthropic` protocol: the Messages API (``/v1/messages``, ``/v1/messages/count_tokens``).

Client side, a Messages request is decoded into the chat-completions shape and replies are
encoded back; upstream side, a chat request becomes a Messages request to
``{base_url}/v1/messages``. Passthrough changes only ``model``. Both sides count tokens
(``Counting``, ``Counter``). Modules: ``request`` (requests both ways), ``reply`` (whole replies,
errors, and the mappings streams share), ``stream`` (the stream decoder and encoder),
``passthrough`` (anthropic client, anthropic channel).

Mappings worth knowing:

- ``system`` (string or text blocks) <-> leading ``system`` message; ``system``/``developer``
  messages anywhere in a chat conversation are hoisted into the top-level ``system``. A
  ``role: "system"`` message inside ``messages`` (Claude Code sends them mid-conversation)
  becomes a chat ``system`` message where it stands; an anthropic channel gets it as sent.
- ``tool_result`` blocks <-> ``tool`` messages (consecutive ones grouped into one user turn);
  consecutive same-role messages are merged, as the Messages API requires.
- ``tool_choice`` auto/any/none/tool <-> auto/required/none/function;
  ``disable_parallel_tool_use`` <-> ``parallel_tool_calls: false``.
- ``stop_reason`` end_turn/stop_sequence/pause_turn -> stop, max_tokens -> length,
  tool_use -> tool_calls, refusal -> content_filter (and back: stop -> end_turn).
- ``thinking`` <-> ``reasoning_effort``: effort low/medium/high (minimal counts as low) sends
  ``budget_tokens`` 1024/4096/16384, capped below ``max_tokens`` (thinking is left off when
  fewer than 1024 tokens remain); a budget up to 2048 reads as low, up to 8192 medium, above
  high; ``adaptive`` reads as medium. Thinking blocks + signature <-> ``reasoning_content`` +
  ``reasoning_signature``; ``redacted_thinking`` <-> ``redacted_reasoning``.
- usage: ``prompt_tokens`` = input + cache read + cache creation; cache reads are
  ``prompt_tokens_details.cached_tokens``, cache writes ``cache_creation_tokens``.
- ``metadata.user_id`` <-> ``user``; images: base64 source <-> ``data:`` URL, url source <-> URL;
  a base64 PDF ``document`` <-> a chat ``file`` part with ``file_data``.
- A tool call's ``thought_signature`` (Gemini) is shown to Messages clients as a thinking block
  with empty text and that signature, so it comes back as ``reasoning_signature``.
- Errors for clients: 400 invalid_request_error, 401 authentication_error, 402 billing_error,
  403 permission_error, 404 not_found_error, 413 request_too_large, 429 rate_limit_error,
  500/502 api_error, 503/529 overloaded_error, 504 timeout_error (the type Anthropic's own API
  and SDK use for a gateway timeout). From an anthropic channel, the error type refines the
  status: overloaded_error -> 503, timeout_error -> 504, rate_limit_error -> 429, and
  authentication/permission/billing errors are the channel's fault (502, cooled down).
- Replies carry ``msg_{request_id}`` and the client's model name; an empty text block is left
  out of replies and out of requests (the Messages API rejects empty text blocks and turns).

Not carried across (dropped on purpose); "out" is Messages -> others, "in" others -> Messages:

| field                                                   | dir | why                             |
|---------------------------------------------------------|-----|---------------------------------|
| ``cache_control`` (system, blocks, tools)               | out | no cache breakpoints elsewhere  |
| ``tool_result.is_error``                                | out | chat tool messages lack it      |
| server tools (web search, bash, ...), their blocks      | out | run by Anthropic; no equivalent |
| citations, ``search_result``, ``container_upload``      | out | no counterpart                  |
| ``stop_sequence`` (which sequence matched)              | out | finish_reason is only "stop"    |
| ``service_tier``, ``container``, ``mcp_servers``,       | out | Anthropic-only                  |
| ``context_management``                                  |     |                                 |
| ``response_format`` (JSON mode, json_schema)            | in  | no field in 2023-06-01; not     |
|                                                         |     | emulated with a forced tool     |
| ``n``, ``seed``, ``logprobs``, ``logit_bias``,          | in  | no counterpart                  |
| ``presence_penalty``, ``frequency_penalty``             |     |                                 |
| tool ``strict``, message ``name``                       | in  | no counterpart                  |
| ``reasoning_content`` without a signature               | in  | unsigned thinking is rejected   |
| audio input parts                                       | in  | Messages takes no audio (400)   |
"""

from __future__ import annotations

from typing import ClassVar

from gateway.errors import GatewayError, UpstreamError
from gateway.protocols.anthropic import passthrough, reply, request
from gateway.protocols.anthropic.passthrough import AnthropicPassthrough
from gateway.protocols.anthropic.reply import decode_message, encode_message, error_body
from gateway.protocols.anthropic.request import decode_messages_request
from gateway.protocols.anthropic.stream import AnthropicStreamDecoder, AnthropicStreamEncoder
from gateway.protocols.base import Ctx, RouteMatch, UpstreamCall, UpstreamTarget, text_field
from gateway.protocols.fields import REQUEST
from gateway.protocols.openai.request import body_model
from gateway.types import JSON, ChatRequest, ChatResponse, Usage

__all__ = [
    "AnthropicAdapter",
    "AnthropicPassthrough",
    "AnthropicStreamDecoder",
    "AnthropicStreamEncoder",
    "error_body",
]


class AnthropicAdapter:
    """The Messages API, both sides, with token counting (``/v1/messages/count_tokens``) on
    both sides and its pass-through."""

    name: ClassVar[str] = "anthropic"

    # client side -------------------------------------------------------------------------
    def match(
        self, kind: str, payload: JSON, path_model: str | None, query: bytes, stream: bool | None
    ) -> RouteMatch:
        model = body_model(payload)
        REQUEST.opt_bool(payload.get("stream"), "stream")
        REQUEST.opt_integer(payload.get("max_tokens"), "max_tokens")
        if stream is None:
            stream = kind == "chat" and payload.get("stream") is True
        return RouteMatch(
            protocol=self.name,
            capability=kind,
            model=model,
            stream=stream,
            session=text_field(payload.get("metadata"), "user_id"),
            session_late=True,  # after Codex's session_id header (CONTRACT §3)
        )

    def decode_request(self, payload: JSON, route: RouteMatch) -> ChatRequest:
        return decode_messages_request(payload, route)

    def encode_response(self, resp: ChatResponse, ctx: Ctx) -> JSON:
        return encode_message(resp, ctx)

    def stream_encoder(self, ctx: Ctx, route: RouteMatch) -> AnthropicStreamEncoder:
        return AnthropicStreamEncoder(ctx)

    def encode_error(self, err: GatewayError) -> tuple[int, JSON]:
        return err.status, error_body(err)

    def encode_count(self, tokens: int, ctx: Ctx) -> JSON:
        return {"input_tokens": tokens}

    # upstream side -----------------------------------------------------------------------
    def encode_request(self, req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
        return request.encode_request(req, target)

    def decode_response(self, payload: JSON) -> ChatResponse:
        return decode_message(payload)

    def stream_decoder(self, ctx: Ctx) -> AnthropicStreamDecoder:
        return AnthropicStreamDecoder(ctx)

    def decode_error(self, status: int, raw: bytes) -> GatewayError:
        return reply.decode_error(status, raw)

    def count_request(self, req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
        return request.count_request(req, target)

    def decode_count(self, payload: JSON) -> int:
        tokens = payload.get("input_tokens") if isinstance(payload, dict) else None
        if not isinstance(tokens, int):
            raise UpstreamError("upstream sent a malformed token count")
        return tokens

    # passthrough -------------------------------------------------------------------------
    def passthrough_request(
        self, payload: JSON, route: RouteMatch, target: UpstreamTarget
    ) -> UpstreamCall:
        return passthrough.passthrough_request(payload, route, target)

    def passthrough_response(self, payload: JSON, ctx: Ctx) -> tuple[JSON, Usage | None]:
        return passthrough.passthrough_response(payload, ctx)

    def passthrough_stream(
        self, ctx: Ctx, route: RouteMatch, target: UpstreamTarget
    ) -> AnthropicPassthrough:
        return AnthropicPassthrough(ctx)
