"""Messages API streams, both ways.

- ``AnthropicStreamDecoder``: an anthropic channel's events -> chat chunks, as they arrive.
- ``AnthropicStreamEncoder``: chat chunks -> the exact Messages event sequence for a client:
  ``message_start``, ``ping``, ``content_block_start/delta/stop`` (indices contiguous, every
  start paired with a stop), ``message_delta`` (stop reason, usage), ``message_stop``.
"""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError, UpstreamError
from gateway.protocols.anthropic.reply import (
    decode_usage,
    encode_usage,
    error_body,
    finish_reason,
    stop_reason,
    stream_error,
)
from gateway.protocols.base import Ctx, count
from gateway.protocols.fields import REPLY
from gateway.protocols.sse import SSEEvent, frame
from gateway.types import JSON, ChatChunk, Delta, ToolCall, Usage

EVENT_STREAM = "text/event-stream"
PING = frame(b'{"type":"ping"}', "ping")
MESSAGE_STOP = frame(b'{"type":"message_stop"}', "message_stop")


def load_event(data: bytes) -> dict[str, JSON]:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamError("upstream sent a malformed stream event") from None
    if not isinstance(payload, dict):
        raise UpstreamError("upstream sent a malformed stream event")
    return payload


# upstream side: Anthropic events -> chat chunks -----------------------------------------------
class AnthropicStreamDecoder:
    """One per stream. Text, tool use (``input_json_delta`` -> argument deltas), thinking,
    signatures and redacted thinking become deltas as they arrive; usage (input from
    ``message_start``, output from ``message_delta``) becomes one final chunk with
    ``choices: []`` at ``message_stop``. A tool use that streamed no input (a tool without
    parameters) gets ``{}`` as its arguments when its block stops, as OpenAI streams such a
    call and as the whole reply gives it (its ``input``): ``""`` is no JSON to a client."""

    __slots__ = ("_id", "_created", "_model", "_tools", "_next_tool", "_argued", "_usage",
                 "_done")  # fmt: skip

    def __init__(self, ctx: Ctx) -> None:
        self._id = f"chatcmpl-{ctx.request_id}"
        self._created = ctx.created
        self._model = ctx.model
        self._tools: dict[int, int] = {}  # Anthropic block index -> tool call index
        self._next_tool = 0
        self._argued: set[int] = set()  # tool calls that have had arguments
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
            raise stream_error(event.data)
        payload = load_event(event.data)
        kind = payload.get("type")
        if kind == "content_block_delta":
            return self._delta(payload)
        if kind == "content_block_start":
            return self._block_start(payload)
        if kind == "content_block_stop":
            return self._block_stop(payload)
        if kind == "ping":
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
            raise stream_error(event.data)
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
                "id": REPLY.opt_text(block.get("id"), "content_block", "id") or "",
                "type": "function",
                "function": {
                    "name": REPLY.opt_text(block.get("name"), "content_block", "name") or "",
                    "arguments": "",
                },
            }
            return [self._chunk({"tool_calls": [call]})]
        if btype == "text":
            text = REPLY.opt_text(block.get("text"), "content_block", "text")
            return [self._chunk({"content": text})] if text else []
        if btype == "thinking":
            thinking = REPLY.opt_text(block.get("thinking"), "content_block", "thinking")
            return [self._chunk({"reasoning_content": thinking})] if thinking else []
        if btype == "redacted_thinking":  # whole in its start event
            data = REPLY.opt_text(block.get("data"), "content_block", "data")
            return [self._chunk({"redacted_reasoning": [data]})] if data else []
        return []

    def _block_stop(self, payload: dict[str, JSON]) -> list[ChatChunk]:
        tool = self._tools.get(count(payload.get("index")))
        if tool is None or tool in self._argued:
            return []
        self._argued.add(tool)
        return [self._arguments(tool, "{}")]

    def _arguments(self, tool: int, part: str) -> ChatChunk:
        return self._chunk({"tool_calls": [{"index": tool, "function": {"arguments": part}}]})

    def _delta(self, payload: dict[str, JSON]) -> list[ChatChunk]:
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            raise UpstreamError("upstream sent a malformed content_block_delta")
        dtype = delta.get("type")
        if dtype == "text_delta":
            text = REPLY.opt_text(delta.get("text"), "delta", "text")
            return [self._chunk({"content": text})] if text else []
        if dtype == "input_json_delta":
            part = REPLY.opt_text(delta.get("partial_json"), "delta", "partial_json")
            if not part:
                return []
            tool = self._tools.get(count(payload.get("index")))
            if tool is None:
                raise UpstreamError("upstream sent tool input outside a tool_use block")
            self._argued.add(tool)
            return [self._arguments(tool, part)]
        if dtype == "thinking_delta":
            thinking = REPLY.opt_text(delta.get("thinking"), "delta", "thinking")
            return [self._chunk({"reasoning_content": thinking})] if thinking else []
        if dtype == "signature_delta":
            signature = REPLY.opt_text(delta.get("signature"), "delta", "signature")
            return [self._chunk({"reasoning_signature": signature})] if signature else []
        return []  # citations_delta and later delta types are not carried

    def close(self) -> list[ChatChunk]:
        if not self._done:
            raise UpstreamError("upstream stream ended before message_stop")
        return []

    def usage_so_far(self) -> Usage | None:
        """``message_start``'s usage (the prompt's count) and any ``message_delta``'s since:
        what bills a stream cut short (``base.HoldsUsage``)."""
        return decode_usage(self._usage) if self._usage else None


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
            for data in delta.get("redacted_reasoning") or ():
                parts.append(self._open_block({"type": "redacted_thinking", "data": data}))
                parts.append(self._close())
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
