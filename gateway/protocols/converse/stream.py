"""Converse streams (``converse-stream``) toward chat-completions chunks.

The stream is AWS event-stream framing; ``gateway.upstream.eventstream.EventStreamParser``
reads it into ``SSEEvent`` values named by ``:event-type`` (an exception is named
``exception:<type>``, see ``gateway.protocols.bedrock``), which ``ConverseStreamDecoder``
takes. Events (``ConverseStreamOutput``): ``messageStart`` {role}; ``contentBlockStart``
{contentBlockIndex, start.toolUse{toolUseId, name}} (text blocks have none);
``contentBlockDelta`` {contentBlockIndex, delta.text | delta.toolUse.input (JSON text, in
pieces) | delta.reasoningContent{text | signature | redactedContent}}; ``contentBlockStop``;
``messageStop`` {stopReason}; ``metadata`` {usage, metrics}, after ``messageStop``.
"""

from __future__ import annotations

import orjson

from gateway.errors import UpstreamError
from gateway.protocols.base import Ctx, count
from gateway.protocols.bedrock import is_exception, stream_error
from gateway.protocols.converse.reply import decode_usage, finish_reason
from gateway.protocols.fields import REPLY
from gateway.protocols.sse import SSEEvent
from gateway.types import JSON, ChatChunk, Delta, ToolCall


def load_event(data: bytes, name: str) -> dict[str, JSON]:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamError(f"upstream sent a malformed {name} event") from None
    if not isinstance(payload, dict):
        raise UpstreamError(f"upstream sent a malformed {name} event")
    return payload


class ConverseStreamDecoder:
    """One per stream. Text, tool input pieces and reasoning become deltas as they arrive; a
    tool use that streamed no input gets ``{}`` as its arguments when its block stops (as
    the anthropic decoder does); ``messageStop`` gives the finish reason and ``metadata`` one
    final chunk with the usage and ``choices: []``. A stream that ends before
    ``messageStop`` was cut."""

    __slots__ = ("_id", "_created", "_model", "_tools", "_argued", "_stopped")

    def __init__(self, ctx: Ctx) -> None:
        self._id = f"chatcmpl-{ctx.request_id}"
        self._created = ctx.created
        self._model = ctx.model
        self._tools: dict[int, int] = {}  # contentBlockIndex -> tool call index
        self._argued: set[int] = set()  # tool calls that have had arguments
        self._stopped = False

    def _chunk(self, delta: Delta, finish: str | None = None) -> ChatChunk:
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }

    def feed(self, event: SSEEvent) -> list[ChatChunk]:
        name = event.event
        if name == "contentBlockDelta":
            return self._delta(load_event(event.data, name))
        if name == "contentBlockStart":
            return self._block_start(load_event(event.data, name))
        if name == "contentBlockStop":
            return self._block_stop(load_event(event.data, name))
        if name == "messageStart":
            return [self._chunk({"role": "assistant", "content": ""})]
        if name == "messageStop":
            payload = load_event(event.data, name)
            self._stopped = True
            stop = REPLY.opt_text(payload.get("stopReason"), "messageStop", "stopReason")
            return [self._chunk({}, finish_reason(stop))]
        if name == "metadata":
            usage = decode_usage(load_event(event.data, name).get("usage"))
            chunk: ChatChunk = {
                "id": self._id,
                "object": "chat.completion.chunk",
                "created": self._created,
                "model": self._model,
                "choices": [],
                "usage": usage,
            }
            return [chunk]
        if is_exception(event):
            raise stream_error(event)
        return []  # event types added later are ignored, as the SDKs do

    def _block_start(self, payload: dict[str, JSON]) -> list[ChatChunk]:
        start = REPLY.obj(payload.get("start"), "contentBlockStart", "start")
        use = REPLY.opt_obj(start.get("toolUse"), "contentBlockStart.start", "toolUse")
        if use is None:
            return []  # tool results and images of server tools: not carried
        tool = len(self._tools)
        self._tools[count(payload.get("contentBlockIndex"))] = tool
        name = REPLY.text(use.get("name"), "start.toolUse", "name")
        call: ToolCall = {
            "index": tool,
            "id": REPLY.text(use.get("toolUseId"), "start.toolUse", "toolUseId"),
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        return [self._chunk({"tool_calls": [call]})]

    def _block_stop(self, payload: dict[str, JSON]) -> list[ChatChunk]:
        tool = self._tools.get(count(payload.get("contentBlockIndex")))
        if tool is None or tool in self._argued:
            return []
        self._argued.add(tool)
        return [self._arguments(tool, "{}")]

    def _arguments(self, tool: int, part: str) -> ChatChunk:
        return self._chunk({"tool_calls": [{"index": tool, "function": {"arguments": part}}]})

    def _delta(self, payload: dict[str, JSON]) -> list[ChatChunk]:
        delta = REPLY.obj(payload.get("delta"), "contentBlockDelta", "delta")
        if "text" in delta:
            text = REPLY.text(delta["text"], "delta", "text")
            return [self._chunk({"content": text})] if text else []
        if "toolUse" in delta:
            use = REPLY.obj(delta["toolUse"], "delta", "toolUse")
            part = REPLY.opt_text(use.get("input"), "delta.toolUse", "input")
            if not part:
                return []
            tool = self._tools.get(count(payload.get("contentBlockIndex")))
            if tool is None:
                raise UpstreamError("upstream sent tool input outside a toolUse block")
            self._argued.add(tool)
            return [self._arguments(tool, part)]
        if "reasoningContent" in delta:
            return self._reasoning(REPLY.obj(delta["reasoningContent"], "delta", "reasoning"))
        return []  # citations, tool results and images of server tools: not carried

    def _reasoning(self, reasoning: dict[str, JSON]) -> list[ChatChunk]:
        where = "delta.reasoningContent"
        text = REPLY.opt_text(reasoning.get("text"), where, "text")
        if text:
            return [self._chunk({"reasoning_content": text})]
        signature = REPLY.opt_text(reasoning.get("signature"), where, "signature")
        if signature:
            return [self._chunk({"reasoning_signature": signature})]
        redacted = REPLY.opt_text(reasoning.get("redactedContent"), where, "redactedContent")
        if redacted:
            return [self._chunk({"redacted_reasoning": [redacted]})]
        return []

    def close(self) -> list[ChatChunk]:
        if not self._stopped:
            raise UpstreamError("upstream stream ended before messageStop")
        return []
