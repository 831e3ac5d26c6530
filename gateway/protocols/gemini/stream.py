"""Generate-content streams, both ways: a gemini channel's ``alt=sse`` events decoded into
chat chunks, and chat chunks encoded for a client, framed as SSE events or as a JSON array.

Framing toward a generate-content client: ``?alt=sse`` gets ``data: {...}`` events; without it
the client gets the JSON array exactly as the Gemini REST API streams it: ``[`` + first object,
then ``,\\r\\n`` + each further object, then ``]``, written piece by piece as chunks arrive.
The upstream call always uses ``alt=sse``.
"""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError, UpstreamError
from gateway.protocols.base import Ctx, count
from gateway.protocols.fields import REPLY
from gateway.protocols.gemini.contents import function_call_part, part_deltas
from gateway.protocols.gemini.reply import (
    FINISH_TO_GEMINI,
    decode_usage,
    encode_usage,
    error_body,
    error_from_payload,
    finish_of,
)
from gateway.protocols.sse import SSEEvent, frame
from gateway.types import JSON, ChatChunk, Delta, ToolCall, Usage

ARRAY_SEPARATOR = b",\r\n"


class Framing:
    """One stream's framing toward a generate-content client: each object as an SSE event, or
    as the next element of the JSON array (closed once, by ``close`` or ``error``)."""

    __slots__ = ("content_type", "_sse", "_started", "_closed")

    def __init__(self, sse: bool) -> None:
        self.content_type = "text/event-stream" if sse else "application/json"
        self._sse = sse
        self._started = False
        self._closed = False

    def write(self, data: bytes) -> bytes:
        if self._sse:
            return frame(data)
        if self._started:
            return ARRAY_SEPARATOR + data
        self._started = True
        return b"[" + data

    def close(self) -> bytes:
        """The end of the array (nothing for SSE, or when closed already)."""
        if self._sse or self._closed:
            return b""
        self._closed = True
        return b"]" if self._started else b"[]"

    def error(self, data: bytes) -> bytes:
        """An error object as the stream's last element."""
        return self.write(data) + self.close()


def load_event(event: SSEEvent) -> JSON:
    try:
        payload = orjson.loads(event.data)
    except orjson.JSONDecodeError as exc:
        raise UpstreamError("upstream sent a malformed stream event") from exc
    if not isinstance(payload, dict):
        raise UpstreamError("upstream stream event is not an object")
    if "error" in payload:
        err = payload["error"]
        code = err.get("code") if isinstance(err, dict) else None
        raise error_from_payload(code if isinstance(code, int) else 500, payload)
    return payload


class GeminiStreamDecoder:
    """Upstream ``alt=sse`` events -> chat chunks, each event as it arrives."""

    def __init__(self, ctx: Ctx) -> None:
        self._ctx = ctx
        self._id = f"chatcmpl-{ctx.request_id}"
        self._calls = [0]
        self._started: set[int] = set()
        self._tool_slots: dict[int, int] = {}  # choice index -> tool calls so far
        self._finished = False
        self._usage: Usage | None = None

    def _chunk(self, index: int, delta: Delta, finish: str | None = None) -> ChatChunk:
        if index not in self._started:
            self._started.add(index)
            delta = {"role": "assistant", **delta}
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._ctx.created,
            "model": self._ctx.model,
            "choices": [{"index": index, "delta": delta, "finish_reason": finish}],
        }

    def feed(self, event: SSEEvent) -> list[ChatChunk]:
        payload = load_event(event)
        chunks: list[ChatChunk] = []
        prefix = f"call_{self._ctx.request_id}_"
        finished_now = False
        candidates = REPLY.opt_array(payload.get("candidates"), "candidates")
        for cand in candidates:
            cand = REPLY.obj(cand, "candidates[]")
            index = count(cand.get("index"))
            content = cand.get("content")
            if isinstance(content, dict) and "parts" in content:
                for delta in part_deltas(content["parts"], self._calls, prefix):
                    for call in delta.get("tool_calls") or ():
                        call["index"] = self._tool_slots.get(index, 0)
                        self._tool_slots[index] = call["index"] + 1
                    chunks.append(self._chunk(index, delta))
            finish = finish_of(cand, "candidates[]")
            if finish:
                if finish == "stop" and index in self._tool_slots:
                    finish = "tool_calls"
                chunks.append(self._chunk(index, {}, finish))
                finished_now = True
        feedback = payload.get("promptFeedback")
        if not candidates and isinstance(feedback, dict):
            if feedback.get("blockReason"):
                chunks.append(self._chunk(0, {"content": ""}, "content_filter"))
                finished_now = True
        if "usageMetadata" in payload:
            self._usage = decode_usage(payload["usageMetadata"])
        if finished_now:
            self._finished = True
            if self._usage is not None:
                chunks.append(self._usage_chunk(self._usage))
                self._usage = None
        return chunks

    def _usage_chunk(self, usage: Usage) -> ChatChunk:
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._ctx.created,
            "model": self._ctx.model,
            "choices": [],
            "usage": usage,
        }

    def usage_so_far(self) -> Usage | None:
        """The last usageMetadata, not yet passed on (it goes with the finishing chunk): what
        bills a stream cut short (``base.HoldsUsage``)."""
        return self._usage

    def close(self) -> list[ChatChunk]:
        if not self._finished:
            raise UpstreamError("upstream stream ended before a finishReason")
        if self._usage is not None:  # usage that came after the finishing event
            usage, self._usage = self._usage, None
            return [self._usage_chunk(usage)]
        return []


class _PendingCall:
    __slots__ = ("id", "name", "args", "signature")

    def __init__(self, call: ToolCall) -> None:
        function = call.get("function") or {}
        self.id = call.get("id")
        self.name = function.get("name") or ""
        self.args: list[str] = [function.get("arguments") or ""]
        self.signature = call.get("thought_signature")


class GeminiStreamEncoder:
    """Chat chunks -> GenerateContentResponse chunks, one per chat chunk that carries anything.

    Tool call argument deltas are held until the call is complete (the next call, text, or
    the finish), since a functionCall part carries whole args. The finishing chunk is held
    until usage is known, so that it carries usageMetadata like Gemini's last chunk does.
    """

    def __init__(self, ctx: Ctx, sse: bool) -> None:
        self._ctx = ctx
        self._framing = Framing(sse)
        self.content_type = self._framing.content_type
        self._calls: dict[int, dict[int, _PendingCall]] = {}
        self._final: list[JSON] = []
        self._usage_sent = False

    def _write(self, obj: JSON) -> bytes:
        return self._framing.write(orjson.dumps(obj))

    def _response(self, candidates: list[JSON], usage: Usage | None = None) -> JSON:
        obj: JSON = {"candidates": candidates}
        if usage is not None:
            obj["usageMetadata"] = encode_usage(usage)
        obj["modelVersion"] = self._ctx.model
        obj["responseId"] = self._ctx.request_id
        return obj

    def _flush_calls(self, index: int, parts: list[JSON]) -> None:
        pending = self._calls.pop(index, None)
        if pending:
            for call in pending.values():
                parts.append(
                    function_call_part(
                        call.id, call.name, "".join(call.args), call.signature, upstream=False
                    )
                )

    def encode(self, chunk: ChatChunk) -> bytes:
        out: list[bytes] = []
        candidates: list[JSON] = []
        for choice in chunk.get("choices") or ():
            index = choice.get("index", 0)
            delta = choice.get("delta") or {}
            parts: list[JSON] = []
            reasoning = delta.get("reasoning_content")
            text = delta.get("content")
            signature = delta.get("reasoning_signature")
            if reasoning or text or signature:
                self._flush_calls(index, parts)
            if reasoning:
                parts.append({"text": reasoning, "thought": True})
            if signature:
                parts.append({"text": "", "thought": True, "thoughtSignature": signature})
            if text:
                parts.append({"text": text})
            for call in delta.get("tool_calls") or ():
                pending = self._calls.setdefault(index, {})
                slot = call.get("index", 0)
                known = pending.get(slot)
                if known is None:
                    self._flush_calls(index, parts)
                    self._calls[index] = {slot: _PendingCall(call)}
                    continue
                function = call.get("function") or {}
                if function.get("arguments"):
                    known.args.append(function["arguments"])
                if function.get("name"):
                    known.name += function["name"]
                if call.get("thought_signature"):
                    known.signature = call["thought_signature"]
            finish = choice.get("finish_reason")
            candidate: JSON = {}
            if finish:
                self._flush_calls(index, parts)
                # Gemini's last chunk always has content, an empty text part when nothing is left
                candidate["content"] = {"parts": parts or [{"text": ""}], "role": "model"}
            elif parts:
                candidate["content"] = {"parts": parts, "role": "model"}
            if finish:
                candidate["finishReason"] = FINISH_TO_GEMINI.get(finish, "OTHER")
                candidate["index"] = index
                self._final.append(candidate)
            elif parts:
                candidate["index"] = index
                candidates.append(candidate)
        if candidates:
            out.append(self._write(self._response(candidates)))
        usage = chunk.get("usage")
        if usage and not self._usage_sent:
            out.append(self._write(self._response(self._final, usage)))
            self._final = []
            self._usage_sent = True
        return b"".join(out)

    def finish(self, usage: Usage | None) -> bytes:
        out = b""
        if self._final or (usage and not self._usage_sent):
            out = self._write(self._response(self._final, None if self._usage_sent else usage))
            self._final = []
        return out + self._framing.close()

    def error(self, err: GatewayError) -> bytes:
        return self._framing.error(orjson.dumps(error_body(err)))
