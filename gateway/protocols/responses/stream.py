"""Chat-completions chunks -> the Responses API's event sequence, event by event.

``response.created`` and ``response.in_progress`` open the stream; each output item is
announced (``response.output_item.added``), filled (``response.reasoning_summary_*``,
``response.content_part.added`` + ``response.output_text.delta``,
``response.function_call_arguments.delta``) and closed (the matching ``.done`` events and
``response.output_item.done``) as the upstream moves from thinking to text to tool calls; the
stream ends with ``response.completed`` (``response.incomplete`` when the token limit cut it)
carrying every item and the usage, or ``response.failed`` for an error after it started.
Every event has a ``sequence_number`` counting from 0, and an SSE ``event:`` line naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from gateway.errors import GatewayError
from gateway.protocols.base import Ctx
from gateway.protocols.responses.reply import (
    encode_usage,
    envelope,
    function_item,
    message_item,
    output_text,
    reasoning_item,
)
from gateway.sse import frame
from gateway.types import JSON, ChatChunk, Delta, Usage

EVENT_STREAM = "text/event-stream"


@dataclass(slots=True)
class _Item:
    """An output item being streamed: which kind, where, and what it holds so far."""

    kind: str  # reasoning | message | function_call
    index: int  # its output_index
    id: str
    text: list[str] = field(default_factory=list)  # text, summary or arguments so far
    signature: str | None = None
    call_id: str = ""
    name: str = ""
    number: int = 0  # a function call's index among the tool calls
    done: JSON = None  # the finished item


class ResponsesStreamEncoder:
    """One per stream: chat chunks in, Responses events out."""

    content_type = EVENT_STREAM

    __slots__ = ("_ctx", "_seq", "_started", "_items", "_open", "_calls", "_finish", "_usage")

    def __init__(self, ctx: Ctx) -> None:
        self._ctx = ctx
        self._seq = 0
        self._started = False
        self._items: list[_Item] = []
        self._open: _Item | None = None  # the reasoning or message item being written
        self._calls: dict[int, _Item] = {}  # chat tool call index -> its function_call item
        self._finish: str | None = None
        self._usage: Usage | None = None

    def _event(self, kind: str, body: dict[str, JSON]) -> bytes:
        body = {"type": kind, "sequence_number": self._seq, **body}
        self._seq += 1
        return frame(orjson.dumps(body), kind)

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        shell = envelope(self._ctx, "in_progress", [], None, None)
        return self._event("response.created", {"response": shell}) + self._event(
            "response.in_progress", {"response": shell}
        )

    def encode(self, chunk: ChatChunk) -> bytes:
        out = [self._start()]
        usage = chunk.get("usage")
        if usage:
            self._usage = usage
        for choice in chunk.get("choices") or ():
            delta: Delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content")
            if reasoning or delta.get("reasoning_signature"):
                out.append(self._reasoning(reasoning or "", delta.get("reasoning_signature")))
            content = delta.get("content")
            if content:
                out.append(self._text(content))
            for call in delta.get("tool_calls") or ():
                out.append(self._call(call))
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return b"".join(out)

    # -- items -----------------------------------------------------------------------------

    def _add(self, kind: str, prefix: str) -> _Item:
        n = len(self._items)
        item = _Item(kind, n, f"{prefix}_{self._ctx.request_id}_{n}")
        self._items.append(item)
        return item

    def _added(self, item: _Item, shown: JSON) -> bytes:
        body = {"output_index": item.index, "item": {**shown, "id": item.id}}
        return self._event("response.output_item.added", body)

    def _reasoning(self, text: str, signature: str | None) -> bytes:
        out = b""
        item = self._open
        if item is None or item.kind != "reasoning":
            out += self._close_open()
            item = self._open = self._add("reasoning", "rs")
            out += self._added(item, reasoning_item(self._ctx, "", None))
            part = {"type": "summary_text", "text": ""}
            where = {"item_id": item.id, "output_index": item.index, "summary_index": 0}
            out += self._event("response.reasoning_summary_part.added", {**where, "part": part})
        if signature:
            item.signature = signature
        if text:
            item.text.append(text)
            where = {"item_id": item.id, "output_index": item.index, "summary_index": 0}
            out += self._event("response.reasoning_summary_text.delta", {**where, "delta": text})
        return out

    def _text(self, text: str) -> bytes:
        out = b""
        item = self._open
        where: dict[str, JSON]
        if item is None or item.kind != "message":
            out += self._close_open()
            item = self._open = self._add("message", "msg")
            out += self._added(item, message_item(self._ctx, "", "in_progress"))
            where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
            out += self._event("response.content_part.added", {**where, "part": output_text("")})
        item.text.append(text)
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        delta = {**where, "delta": text, "logprobs": []}
        return out + self._event("response.output_text.delta", delta)

    def _call(self, call: JSON) -> bytes:
        out = b""
        n = call.get("index", len(self._calls))
        function = call.get("function") or {}
        item = self._calls.get(n)
        if item is None:
            out += self._close_open()
            item = self._calls[n] = self._add("function_call", "fc")
            item.number = n
            item.call_id = call.get("id") or f"call_{self._ctx.request_id}_{n}"
            item.name = function.get("name") or ""
            shown = function_item(self._ctx, n, item.call_id, item.name, "", "in_progress")
            out += self._added(item, shown)
        arguments = function.get("arguments")
        if arguments:
            item.text.append(arguments)
            delta = {"item_id": item.id, "output_index": item.index, "delta": arguments}
            out += self._event("response.function_call_arguments.delta", delta)
        return out

    def _close_open(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        return self._close(item)

    def _close(self, item: _Item) -> bytes:
        text = "".join(item.text)
        where: dict[str, JSON] = {"item_id": item.id, "output_index": item.index}
        if item.kind == "reasoning":
            item.done = {**reasoning_item(self._ctx, text, item.signature), "id": item.id}
            where["summary_index"] = 0
            part = {"type": "summary_text", "text": text}
            out = self._event("response.reasoning_summary_text.done", {**where, "text": text})
            out += self._event("response.reasoning_summary_part.done", {**where, "part": part})
        elif item.kind == "message":
            item.done = {**message_item(self._ctx, text, "completed"), "id": item.id}
            where["content_index"] = 0
            done = {**where, "text": text, "logprobs": []}
            out = self._event("response.output_text.done", done)
            out += self._event("response.content_part.done", {**where, "part": output_text(text)})
        else:
            shown = function_item(
                self._ctx, item.number, item.call_id, item.name, text, "completed"
            )
            item.done = {**shown, "id": item.id}
            done = {**where, "name": shown["name"], "arguments": text}
            out = self._event("response.function_call_arguments.done", done)
        done_item = {"output_index": item.index, "item": item.done}
        return out + self._event("response.output_item.done", done_item)

    # -- the end ---------------------------------------------------------------------------

    def finish(self, usage: Usage | None) -> bytes:
        out = [self._start(), self._close_open()]
        for item in self._calls.values():
            out.append(self._close(item))
        output = [item.done for item in self._items]
        final = envelope(
            self._ctx, "completed", output, encode_usage(usage or self._usage), self._finish
        )
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        out.append(self._event(kind, {"response": final}))
        return b"".join(out)

    def error(self, err: GatewayError) -> bytes:
        out = self._start()
        output = [
            item.done if item.done is not None else self._partial(item) for item in self._items
        ]
        failed = envelope(self._ctx, "failed", output, encode_usage(self._usage), None)
        failed["error"] = {"code": err.code or err.type, "message": err.message}
        return out + self._event("response.failed", {"response": failed})

    def _partial(self, item: _Item) -> JSON:
        """An item the error cut short, as far as it got (``status: incomplete``)."""
        text = "".join(item.text)
        if item.kind == "reasoning":
            return {**reasoning_item(self._ctx, text, item.signature), "id": item.id}
        if item.kind == "message":
            return {**message_item(self._ctx, text, "incomplete"), "id": item.id}
        ctx, n = self._ctx, item.number
        return {**function_item(ctx, n, item.call_id, item.name, text, "incomplete"), "id": item.id}
