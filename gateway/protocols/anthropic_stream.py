"""Messages API replies, whole and streamed, both ways, and the mappings both sides share.

- ``AnthropicStreamDecoder``: an anthropic channel's events -> chat chunks, as they arrive.
- ``AnthropicStreamEncoder``: chat chunks -> the exact Messages event sequence for a client:
  ``message_start``, ``ping``, ``content_block_start/delta/stop`` (indices contiguous, every
  start paired with a stop), ``message_delta`` (stop reason, usage), ``message_stop``.
- ``AnthropicPassthrough``: anthropic client, anthropic channel: events forwarded as they are;
  only ``message_start`` is rewritten, when the model name differs.

Whole replies (``decode_message``, ``encode_message``), stop reasons, usage and error types are
mapped here too; ``gateway.protocols.anthropic`` holds requests and the adapter.
"""

from __future__ import annotations

import orjson

from gateway.errors import (
    GatewayError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    error_for_status,
)
from gateway.protocols.base import Ctx, EventPassthrough, count, field_of
from gateway.sse import SSEEvent, frame
from gateway.types import JSON, ChatChunk, ChatMessage, ChatResponse, Delta, ToolCall, Usage

EVENT_STREAM = "text/event-stream"

FINISH_REASONS = {  # Anthropic stop_reason -> chat finish_reason
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
STOP_REASONS = {  # chat finish_reason -> Anthropic stop_reason
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
ERROR_TYPES = {  # gateway status -> Anthropic error type (what its SDKs raise on)
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
PING = frame(b'{"type":"ping"}', "ping")
MESSAGE_STOP = frame(b'{"type":"message_stop"}', "message_stop")


# mappings -----------------------------------------------------------------------------------
def finish_reason(stop_reason: JSON) -> str:
    return FINISH_REASONS.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def stop_reason(finish: str | None) -> str:
    return STOP_REASONS.get(finish or "stop", "end_turn")


def decode_usage(usage: JSON) -> Usage:
    """Anthropic usage -> chat usage; prompt tokens include cache reads and cache writes."""
    if not isinstance(usage, dict):
        return {}
    fresh = count(usage.get("input_tokens"))
    read = count(usage.get("cache_read_input_tokens"))
    created = count(usage.get("cache_creation_input_tokens"))
    output = count(usage.get("output_tokens"))
    out: Usage = {
        "prompt_tokens": fresh + read + created,
        "completion_tokens": output,
        "total_tokens": fresh + read + created + output,
    }
    if read:
        out["prompt_tokens_details"] = {"cached_tokens": read}
    if created:
        out["cache_creation_tokens"] = created
    return out


def encode_usage(usage: Usage | None, input_estimate: int = 0) -> dict[str, int]:
    """Chat usage -> Anthropic usage (input tokens exclude cache reads and writes)."""
    if not usage:
        return {
            "input_tokens": input_estimate,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 0,
        }
    read = count(field_of(usage.get("prompt_tokens_details"), "cached_tokens"))
    created = count(usage.get("cache_creation_tokens"))
    prompt = count(usage.get("prompt_tokens"))
    return {
        "input_tokens": max(prompt - read - created, 0),
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": read,
        "output_tokens": count(usage.get("completion_tokens")),
    }


def error_body(err: GatewayError) -> JSON:
    etype = ERROR_TYPES.get(err.status)
    if etype is None:
        etype = "invalid_request_error" if 400 <= err.status < 500 else "api_error"
    return {"type": "error", "error": {"type": etype, "message": err.message}}


def decode_error_payload(status: int | None, payload: JSON) -> GatewayError:
    """An Anthropic error body (HTTP reply, or an in-stream ``error`` event when ``status`` is
    None) -> the gateway error. By status, adjusted by Anthropic's error type; never by message.
    """
    etype = None
    message = f"upstream returned HTTP {status}" if status else "upstream stream error"
    err = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(err, dict):
        etype = err.get("type")
        if isinstance(err.get("message"), str) and err["message"]:
            message = err["message"]
    if etype in ("authentication_error", "permission_error", "billing_error"):
        return UpstreamError(
            f"upstream rejected the channel's credentials ({status or etype})", channel_fault=True
        )
    if etype == "overloaded_error":
        return UpstreamUnavailableError(message)
    if etype == "rate_limit_error":
        return RateLimitError(message)
    if etype == "timeout_error":
        return UpstreamTimeoutError(message)
    if status is not None:
        return error_for_status(status, message)
    if etype == "invalid_request_error":
        return InvalidRequestError(message)
    if etype == "not_found_error":
        return NotFoundError(message)
    if etype == "request_too_large":
        return PayloadTooLargeError(message)
    return UpstreamError(message)


# whole replies ---------------------------------------------------------------------------
def decode_assistant_blocks(content: JSON, where: str) -> ChatMessage:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    thinking: list[str] = []
    signature = None
    redacted: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(content):
        btype = block.get("type") if isinstance(block, dict) else None
        if btype == "text":
            texts.append(block.get("text") or "")
        elif btype == "tool_use":
            calls.append(
                {
                    "id": str(block.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(block.get("name") or ""),
                        "arguments": orjson.dumps(block.get("input") or {}).decode(),
                    },
                }
            )
        elif btype == "thinking":
            thinking.append(block.get("thinking") or "")
            if block.get("signature"):
                signature = block["signature"]
        elif btype == "redacted_thinking":
            redacted.append(str(block.get("data") or ""))
        elif btype is None:
            raise InvalidRequestError(f"{where}.{j}: must be a content block with a type")
    msg: ChatMessage = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        msg["tool_calls"] = calls
    if any(thinking):
        msg["reasoning_content"] = "".join(thinking)
    if signature:
        msg["reasoning_signature"] = signature
    if redacted:
        msg["redacted_reasoning"] = redacted
    if msg["content"] is None and not calls:
        msg["content"] = ""
    return msg


def decode_message(payload: JSON) -> ChatResponse:
    if not isinstance(payload, dict) or not isinstance(payload.get("content"), list):
        raise UpstreamError("upstream sent a malformed message")
    msg = decode_assistant_blocks(payload["content"], "content")
    if msg.get("content") == "" and msg.get("tool_calls"):
        msg["content"] = None
    return {
        "id": str(payload.get("id") or ""),
        "object": "chat.completion",
        "created": 0,
        "model": str(payload.get("model") or ""),
        "choices": [
            {"index": 0, "message": msg, "finish_reason": finish_reason(payload.get("stop_reason"))}
        ],
        "usage": decode_usage(payload.get("usage")),
    }


def _call_signature(calls: list[ToolCall] | None) -> str | None:
    """A Gemini thoughtSignature on a function call has no place on a tool_use block; it rides
    in a thinking block (empty text) so that it comes back as ``reasoning_signature``."""
    for call in calls or ():
        if call.get("thought_signature"):
            return call["thought_signature"]
    return None


def encode_message(resp: ChatResponse, ctx: Ctx) -> JSON:
    choices = resp.get("choices") or []
    if not choices:
        raise UpstreamError("upstream sent a reply without choices")
    msg = choices[0].get("message") or {}
    content: list[JSON] = []
    signature = msg.get("reasoning_signature") or _call_signature(msg.get("tool_calls"))
    if msg.get("reasoning_content") or signature:
        content.append(
            {
                "type": "thinking",
                "thinking": msg.get("reasoning_content") or "",
                "signature": signature or "",
            }  # fmt: skip
        )
    for data in msg.get("redacted_reasoning") or ():
        content.append({"type": "redacted_thinking", "data": data})
    text = msg.get("content")
    if isinstance(text, list):
        text = "".join(p.get("text") or "" for p in text if isinstance(p, dict))
    if text:
        content.append({"type": "text", "text": text})
    if msg.get("refusal"):
        content.append({"type": "text", "text": msg["refusal"]})
    for call in msg.get("tool_calls") or ():
        function = call.get("function") or {}
        try:
            args = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            raise UpstreamError("upstream returned tool arguments that are not JSON") from None
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or "",
                "name": function.get("name") or "",
                "input": args if isinstance(args, dict) else {},
            }  # fmt: skip
        )
    return {
        "id": f"msg_{ctx.request_id}",
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": content,
        "stop_reason": stop_reason(choices[0].get("finish_reason")),
        "stop_sequence": None,
        "usage": encode_usage(resp.get("usage"), ctx.prompt_tokens_estimate),
    }


def _stream_error(data: bytes) -> GatewayError:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        payload = None
    err = decode_error_payload(None, payload)
    err.retryable = False  # bytes were already sent
    return err


def _load(data: bytes) -> dict[str, JSON]:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamError("upstream sent a malformed stream event") from None
    if not isinstance(payload, dict):
        raise UpstreamError("upstream sent a malformed stream event")
    return payload


# upstream side: Anthropic events -> chat chunks -----------------------------------------------
class AnthropicStreamDecoder:
    """One per stream. Text, tool use (``input_json_delta`` -> argument deltas), thinking and
    signatures become deltas as they arrive; usage (input from ``message_start``, output from
    ``message_delta``) becomes one final chunk with ``choices: []`` at ``message_stop``."""

    __slots__ = ("_id", "_created", "_model", "_tools", "_next_tool", "_usage", "_done")

    def __init__(self, ctx: Ctx) -> None:
        self._id = f"chatcmpl-{ctx.request_id}"
        self._created = ctx.created
        self._model = ctx.model
        self._tools: dict[int, int] = {}  # Anthropic block index -> tool call index
        self._next_tool = 0
        self._usage: dict[str, JSON] = {}
        self._done = False

    def _chunk(self, delta: Delta, finish: str | None = None) -> ChatChunk:
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def feed(self, event: SSEEvent) -> list[ChatChunk]:
        if event.event == "ping":
            return []
        if event.event == "error":
            raise _stream_error(event.data)
        payload = _load(event.data)
        kind = payload.get("type")
        if kind == "content_block_delta":
            return self._delta(payload)
        if kind == "content_block_start":
            return self._block_start(payload)
        if kind in ("content_block_stop", "ping"):
            return []
        if kind == "message_start":
            message = payload.get("message")
            if isinstance(message, dict) and isinstance(message.get("usage"), dict):
                self._usage.update(message["usage"])
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "message_delta":
            if isinstance(payload.get("usage"), dict):
                self._usage.update({k: v for k, v in payload["usage"].items() if v is not None})
            delta = payload.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, dict) else None
            return [self._chunk({}, finish_reason(reason))]
        if kind == "message_stop":
            self._done = True
            usage = decode_usage(self._usage)
            return [
                {
                    "id": self._id,
                    "object": "chat.completion.chunk",
                    "created": self._created,
                    "model": self._model,
                    "choices": [],
                    "usage": usage,
                }
            ]
        if kind == "error":
            raise _stream_error(event.data)
        return []  # event types added after 2023-06-01 are ignored, as the SDKs do

    def _block_start(self, payload: dict[str, JSON]) -> list[ChatChunk]:
        block = payload.get("content_block")
        if not isinstance(block, dict):
            raise UpstreamError("upstream sent a malformed content_block_start")
        btype = block.get("type")
        if btype == "tool_use":
            tool = self._next_tool
            self._next_tool += 1
            self._tools[count(payload.get("index"))] = tool
            call: ToolCall = {
                "index": tool,
                "id": str(block.get("id") or ""),
                "type": "function",
                "function": {"name": str(block.get("name") or ""), "arguments": ""},
            }
            return [self._chunk({"tool_calls": [call]})]
        if btype == "text" and block.get("text"):
            return [self._chunk({"content": block["text"]})]
        if btype == "thinking" and block.get("thinking"):
            return [self._chunk({"reasoning_content": block["thinking"]})]
        return []

    def _delta(self, payload: dict[str, JSON]) -> list[ChatChunk]:
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            raise UpstreamError("upstream sent a malformed content_block_delta")
        dtype = delta.get("type")
        if dtype == "text_delta":
            text = delta.get("text")
            return [self._chunk({"content": text})] if text else []
        if dtype == "input_json_delta":
            part = delta.get("partial_json")
            if not part:
                return []
            tool = self._tools.get(count(payload.get("index")))
            if tool is None:
                raise UpstreamError("upstream sent tool input outside a tool_use block")
            return [self._chunk({"tool_calls": [{"index": tool, "function": {"arguments": part}}]})]
        if dtype == "thinking_delta":
            thinking = delta.get("thinking")
            return [self._chunk({"reasoning_content": thinking})] if thinking else []
        if dtype == "signature_delta":
            signature = delta.get("signature")
            return [self._chunk({"reasoning_signature": signature})] if signature else []
        return []  # citations_delta and later delta types are not carried

    def close(self) -> list[ChatChunk]:
        if not self._done:
            raise UpstreamError("upstream stream ended before message_stop")
        return []


# client side: chat chunks -> Anthropic events ---------------------------------------------------
class AnthropicStreamEncoder:
    """One per stream. Opens a content block when the kind of delta changes (thinking, text, a
    new tool call), closes the previous one first, so indices stay contiguous and every start
    has its stop. ``message_start`` waits for the first chunk so that an upstream that reports
    prompt tokens early (gemini) gives the real count; otherwise the local estimate."""

    __slots__ = ("content_type", "_ctx", "_started", "_index", "_open", "_tools", "_tool_ids",
                 "_finish", "_usage", "_signed")  # fmt: skip

    def __init__(self, ctx: Ctx) -> None:
        self.content_type = EVENT_STREAM
        self._ctx = ctx
        self._started = False
        self._index = -1  # index of the last block opened
        self._open: str | None = None  # type of the open block ("text", "thinking", "tool_use")
        self._tools: dict[int, int] = {}  # chat tool call index -> block index
        self._tool_ids: dict[int, str] = {}  # chat tool call index -> id
        self._finish: str | None = None
        self._usage: Usage | None = None
        self._signed = False

    def _start(self, usage: Usage | None) -> bytes:
        self._started = True
        message: dict[str, JSON] = {
            "type": "message_start",
            "message": {
                "id": f"msg_{self._ctx.request_id}",
                "type": "message",
                "role": "assistant",
                "model": self._ctx.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": encode_usage(None, self._ctx.prompt_tokens_estimate),
            },
        }
        if usage and usage.get("prompt_tokens"):
            known = encode_usage(usage)
            known["output_tokens"] = 0
            message["message"]["usage"] = known
        return frame(orjson.dumps(message), "message_start") + PING

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return frame(
            orjson.dumps({"type": "content_block_stop", "index": self._index}),
            "content_block_stop",
        )

    def _open_block(self, block: JSON) -> bytes:
        out = self._close()
        self._index += 1
        self._open = block["type"]
        return out + frame(
            orjson.dumps(
                {"type": "content_block_start", "index": self._index, "content_block": block}
            ),
            "content_block_start",
        )

    def _block_delta(self, delta: JSON) -> bytes:
        return frame(
            orjson.dumps({"type": "content_block_delta", "index": self._index, "delta": delta}),
            "content_block_delta",
        )

    def encode(self, chunk: ChatChunk) -> bytes:
        parts: list[bytes] = []
        usage = chunk.get("usage")
        if usage:
            self._usage = usage
        if not self._started:
            parts.append(self._start(usage))
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue  # the Messages API has one candidate
            delta = choice.get("delta") or {}
            thinking = delta.get("reasoning_content")
            if thinking:
                if self._open != "thinking":
                    parts.append(
                        self._open_block({"type": "thinking", "thinking": "", "signature": ""})
                    )
                parts.append(self._block_delta({"type": "thinking_delta", "thinking": thinking}))
            signature = delta.get("reasoning_signature")
            if signature:
                parts.append(self._signature(signature))
            for text in (delta.get("content"), delta.get("refusal")):
                if text:
                    if self._open != "text":
                        parts.append(self._open_block({"type": "text", "text": ""}))
                    parts.append(self._block_delta({"type": "text_delta", "text": text}))
            for call in delta.get("tool_calls") or ():
                parts.append(self._tool_delta(call))
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return b"".join(parts)

    def _signature(self, signature: str) -> bytes:
        self._signed = True
        out = b""
        if self._open != "thinking":
            out = self._open_block({"type": "thinking", "thinking": "", "signature": ""})
        return out + self._block_delta({"type": "signature_delta", "signature": signature})

    def _tool_delta(self, call: ToolCall) -> bytes:
        out = b""
        tool = call.get("index", 0)
        block = self._tools.get(tool)
        function = call.get("function") or {}
        call_id = call.get("id")
        if block is None or (call_id and call_id != self._tool_ids.get(tool)):
            signature = call.get("thought_signature")
            if signature and not self._signed:
                out = self._signature(signature)
            if not call_id:
                call_id = f"toolu_{self._ctx.request_id}_{len(self._tools)}"
            out += self._open_block(
                {
                    "type": "tool_use",
                    "id": call_id,
                    "name": function.get("name") or "",
                    "input": {},
                }  # fmt: skip
            )
            block = self._tools[tool] = self._index
            self._tool_ids[tool] = call_id
        arguments = function.get("arguments")
        if arguments:
            if block != self._index or self._open != "tool_use":
                raise UpstreamError("upstream interleaved the arguments of parallel tool calls")
            out += self._block_delta({"type": "input_json_delta", "partial_json": arguments})
        return out

    def finish(self, usage: Usage | None) -> bytes:
        usage = usage or self._usage
        out = b"" if self._started else self._start(usage)
        out += self._close()
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(self._finish), "stop_sequence": None},
            "usage": encode_usage(usage, self._ctx.prompt_tokens_estimate),
        }
        return out + frame(orjson.dumps(delta), "message_delta") + MESSAGE_STOP

    def error(self, err: GatewayError) -> bytes:
        return frame(orjson.dumps(error_body(err)), "error")


# passthrough ----------------------------------------------------------------------------------
class AnthropicPassthrough(EventPassthrough):
    """Anthropic events forwarded to an anthropic client. Only ``message_start`` and
    ``message_delta`` are parsed (usage, and the model name mapped back to the client's);
    everything else goes out as it came."""

    __slots__ = ("content_type", "usage", "_model", "_raw_usage", "_done")

    def __init__(self, ctx: Ctx) -> None:
        super().__init__()
        self.content_type = EVENT_STREAM
        self.usage: Usage | None = None
        self._model = ctx.model
        self._raw_usage: dict[str, JSON] = {}
        self._done = False

    def feed_event(self, event: SSEEvent) -> bytes:
        name = event.event
        if name == "message_start":
            payload = _load(event.data)
            message = payload.get("message")
            if isinstance(message, dict):
                if isinstance(message.get("usage"), dict):
                    self._raw_usage.update(message["usage"])
                    self.usage = decode_usage(self._raw_usage)
                if message.get("model") != self._model:
                    message["model"] = self._model
                    return frame(orjson.dumps(payload), name)
        elif name == "message_delta":
            payload = _load(event.data)
            if isinstance(payload.get("usage"), dict):
                self._raw_usage.update({k: v for k, v in payload["usage"].items() if v is not None})
                self.usage = decode_usage(self._raw_usage)
        elif name == "message_stop":
            self._done = True
        elif name == "error":
            raise _stream_error(event.data)
        data = event.data
        if b"\n" in data:  # several data: lines, joined by the parser
            data = data.replace(b"\n", b"\ndata: ")
        if name is None:
            return b"data: " + data + b"\n\n"
        return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"

    def end(self) -> bytes:
        if not self._done:
            raise UpstreamError("upstream stream ended before message_stop")
        return b""

    def error_event(self, err: GatewayError) -> bytes:
        return frame(orjson.dumps(error_body(err)), "error")
