"""Chat-completions chunks -> the Responses API's event sequence, event by event.

``response.created`` and ``response.in_progress`` open the stream; each output item is
announced (``response.output_item.added``), filled (``response.reasoning_summary_*``,
``response.content_part.added`` + ``response.output_text.delta``,
``response.function_call_arguments.delta``) and closed (the matching ``.done`` events and
``response.output_item.done``) before the next is announced, as OpenAI streams them; the stream
ends with ``response.completed`` (``response.incomplete`` when the token limit or a content
filter cut it, and the last item, the one the cut fell in, ``incomplete`` when it is a message
or a call) carrying every item and the usage, or ``response.failed`` for an error after it
started (with the items so far and the usage billed so far). A reasoning item gets a summary
part only once there is summary text (a signature alone has none). Every event has a
``sequence_number`` counting from 0, and an SSE ``event:`` line naming it.

Function calls: one streams live. A custom tool's call (``custom_tool_call``) shows its input
only once its function's arguments are whole: its one ``response.custom_tool_call_input.delta``
is that input, the text inside the arguments' JSON. When the next call starts, the live one is
closed if its arguments are already a whole JSON value (an upstream that sends calls one after
another, as all of them do); otherwise the upstream interleaves them, and the later calls wait,
their arguments buffered, until the live one is whole (or the stream ends), then go out in
order. A call with Gemini's ``thought_signature`` is preceded by a reasoning item carrying it,
and an Anthropic ``redacted_thinking`` block is a reasoning item of its own (``reply``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from gateway.errors import GatewayError, UpstreamError
from gateway.protocols.base import CHARS_PER_TOKEN, Ctx, count
from gateway.protocols.responses.reply import (
    INCOMPLETE,
    REDACTED,
    encode_usage,
    envelope,
    error_object,
    function_item,
    message_item,
    output_text,
    reasoning_item,
)
from gateway.protocols.sse import frame
from gateway.types import JSON, ChatChunk, Delta, ToolCall, Usage

EVENT_STREAM = "text/event-stream"


@dataclass(slots=True)
class _Item:
    """An output item being streamed: which kind, where, and what it holds so far."""

    kind: str  # reasoning | message | function_call
    index: int  # its output_index (-1: a call not announced yet)
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

    __slots__ = ("_ctx", "_seq", "_started", "_items", "_open", "_calls", "_live", "_waiting",
                 "_finish", "_usage", "_cut")  # fmt: skip

    def __init__(self, ctx: Ctx) -> None:
        self._ctx = ctx
        self._seq = 0
        self._started = False
        self._items: list[_Item] = []  # announced, in output order
        self._open: _Item | None = None  # the reasoning or message item being written
        self._calls: dict[int, _Item] = {}  # chat tool call index -> its function_call item
        self._live: _Item | None = None  # the call streaming now
        self._waiting: list[_Item] = []  # calls started while the live one was unfinished
        self._finish: str | None = None
        self._usage: Usage | None = None
        self._cut = False  # closing the items at the end of a reply the limit or a filter cut

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
            for data in delta.get("redacted_reasoning") or ():
                out.append(self._redacted(data))
            content = delta.get("content")
            if content:
                out.append(self._text(content))
            for call in delta.get("tool_calls") or ():
                out.append(self._call(call))
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
        return b"".join(out)

    # -- items -----------------------------------------------------------------------------

    def _announce(self, item: _Item, prefix: str, shown: JSON) -> bytes:
        n = len(self._items)
        item.index, item.id = n, f"{prefix}_{self._ctx.request_id}_{n}"
        self._items.append(item)
        body = {"output_index": n, "item": {**shown, "id": item.id}}
        return self._event("response.output_item.added", body)

    def _where(self, item: _Item) -> dict[str, JSON]:
        return {"item_id": item.id, "output_index": item.index}

    def _reasoning(self, text: str, signature: str | None) -> bytes:
        out = b""
        item = self._open
        if item is None or item.kind != "reasoning":
            out += self._close_all()
            item = self._open = _Item("reasoning", -1, "")
            out += self._announce(item, "rs", reasoning_item("", "", None))
        if signature:
            item.signature = signature
        if text:
            where = {**self._where(item), "summary_index": 0}
            if not item.text:  # the summary's part, once there is text for it
                part = {"type": "summary_text", "text": ""}
                out += self._event("response.reasoning_summary_part.added", {**where, "part": part})
            item.text.append(text)
            out += self._event("response.reasoning_summary_text.delta", {**where, "delta": text})
        return out

    def _redacted(self, data: str) -> bytes:
        """A redacted thinking block: a whole reasoning item at once."""
        out = self._close_all()
        item = _Item("reasoning", -1, "", signature=REDACTED + data)
        out += self._announce(item, "rs", reasoning_item("", "", item.signature))
        return out + self._close(item)

    def _text(self, text: str) -> bytes:
        out = b""
        item = self._open
        if item is None or item.kind != "message":
            out += self._close_all()
            item = self._open = _Item("message", -1, "")
            out += self._announce(item, "msg", message_item(self._ctx, "", "in_progress"))
            where = {**self._where(item), "content_index": 0}
            out += self._event("response.content_part.added", {**where, "part": output_text("")})
        item.text.append(text)
        delta = {**self._where(item), "content_index": 0, "delta": text, "logprobs": []}
        return out + self._event("response.output_text.delta", delta)

    def _call(self, call: ToolCall) -> bytes:
        out = b""
        n = call.get("index", len(self._calls))
        function = call.get("function") or {}
        arguments = function.get("arguments")
        item = self._calls.get(n)
        if item is None:
            item = self._calls[n] = _Item("function_call", -1, "", number=n)
            item.call_id = call.get("id") or f"call_{self._ctx.request_id}_{n}"
            item.name = function.get("name") or ""
            item.signature = call.get("thought_signature")
            if arguments:
                item.text.append(arguments)
                arguments = None  # sent with the call's announcement
            live = self._live
            if live is not None and not self._waiting and _whole(live):
                out += self._close(live)
                live = self._live = None
            if live is None and not self._waiting:
                out += self._close_open() + self._go_live(item)
            else:
                self._waiting.append(item)
        elif item.index < 0:  # waiting: what it has so far is its first delta when it goes out
            item.name = item.name or function.get("name") or ""
            item.signature = item.signature or call.get("thought_signature")
        elif item.done is not None:
            if arguments and arguments.strip():
                raise UpstreamError("upstream sent arguments for a tool call after it ended")
            return b""
        if arguments:
            item.text.append(arguments)
            if item is self._live:
                if not self._custom(item):
                    delta = {**self._where(item), "delta": arguments}
                    out += self._event("response.function_call_arguments.delta", delta)
                if self._waiting and arguments.rstrip()[-1:] in ("}", "]") and _whole(item):
                    out += self._close(item)
                    self._live = None
                    out += self._next_calls(False)
        return out

    def _custom(self, item: _Item) -> bool:
        return item.name in self._ctx.custom_tools

    def _go_live(self, item: _Item) -> bytes:
        """Announce a call (after the reasoning item carrying its signature), with the
        arguments it has so far as its first delta."""
        out = b""
        if item.signature:
            signed = _Item("reasoning", -1, "", signature=item.signature)
            out += self._announce(signed, "rs", reasoning_item("", "", item.signature))
            out += self._close(signed)
        shown = function_item(self._ctx, item.number, item.call_id, item.name, "", "in_progress")
        out += self._announce(item, "ctc" if self._custom(item) else "fc", shown)
        self._live = item
        if item.text and not self._custom(item):
            delta = {**self._where(item), "delta": "".join(item.text)}
            out += self._event("response.function_call_arguments.delta", delta)
        return out

    def _next_calls(self, all_of_them: bool) -> bytes:
        """The waiting calls go out in order: each one whole is closed at once; the first
        unfinished one stays live (unless ``all_of_them``, at the end)."""
        out = b""
        while self._waiting:
            item = self._waiting.pop(0)
            out += self._go_live(item)
            if not (all_of_them or _whole(item)):
                return out
            out += self._close(item)
            self._live = None
        return out

    def _close_all(self) -> bytes:
        """Before another kind of item: the open one and every call, in order."""
        out = self._close_open()
        if self._live is not None:
            out += self._close(self._live)
            self._live = None
        return out + self._next_calls(True)

    def _close_open(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        return self._close(item)

    def _close(self, item: _Item) -> bytes:
        text = "".join(item.text)
        where = self._where(item)
        out = b""
        # the item a cut fell in: the last one, with nothing left to announce after it
        last = item.index == len(self._items) - 1 and not self._waiting
        status = "incomplete" if self._cut and last else "completed"
        if item.kind == "reasoning":
            item.done = reasoning_item(item.id, text, item.signature)
            if text:
                where["summary_index"] = 0
                part = {"type": "summary_text", "text": text}
                out += self._event("response.reasoning_summary_text.done", {**where, "text": text})
                out += self._event("response.reasoning_summary_part.done", {**where, "part": part})
        elif item.kind == "message":
            item.done = {**message_item(self._ctx, text, status), "id": item.id}
            where["content_index"] = 0
            done = {**where, "text": text, "logprobs": []}
            out += self._event("response.output_text.done", done)
            out += self._event("response.content_part.done", {**where, "part": output_text(text)})
        elif self._custom(item):
            shown = function_item(self._ctx, item.number, item.call_id, item.name, text, status)
            item.done = {**shown, "id": item.id}
            if shown["input"]:
                delta = {**where, "delta": shown["input"]}
                out += self._event("response.custom_tool_call_input.delta", delta)
            done = {**where, "input": shown["input"]}
            out += self._event("response.custom_tool_call_input.done", done)
        else:
            shown = function_item(self._ctx, item.number, item.call_id, item.name, text, status)
            item.done = {**shown, "id": item.id}
            done = {**where, "name": shown["name"], "arguments": text}
            out += self._event("response.function_call_arguments.done", done)
        done_item = {"output_index": item.index, "item": item.done}
        return out + self._event("response.output_item.done", done_item)

    # -- the end ---------------------------------------------------------------------------

    def finish(self, usage: Usage | None) -> bytes:
        self._cut = self._finish in INCOMPLETE
        out = [self._start(), self._close_all()]
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
        failed = envelope(self._ctx, "failed", output, self._billed(), None)
        failed["error"] = error_object(err)
        return out + self._event("response.failed", {"response": failed})

    def _billed(self) -> JSON:
        """The usage of a stream that failed, as it is billed: the upstream's counts so far,
        the prompt's local estimate where it sent none, and at least what was generated."""
        usage: Usage = {**self._usage} if self._usage else {}
        if "prompt_tokens" not in usage:
            usage["prompt_tokens"] = self._ctx.prompt_tokens_estimate
        items = [*self._items, *self._waiting]
        chars = sum(len(piece) for item in items for piece in item.text)
        generated = -(-chars // CHARS_PER_TOKEN)
        usage["completion_tokens"] = max(count(usage.get("completion_tokens")), generated)
        return encode_usage(usage)

    def _partial(self, item: _Item) -> JSON:
        """An item the error cut short, as far as it got (``status: incomplete``)."""
        text = "".join(item.text)
        if item.kind == "reasoning":
            return reasoning_item(item.id, text, item.signature)
        if item.kind == "message":
            return {**message_item(self._ctx, text, "incomplete"), "id": item.id}
        ctx, n = self._ctx, item.number
        return {**function_item(ctx, n, item.call_id, item.name, text, "incomplete"), "id": item.id}


def _whole(item: _Item) -> bool:
    """Whether a call's arguments so far are a whole JSON object or array (nothing can follow)."""
    try:
        value = orjson.loads("".join(item.text))
    except orjson.JSONDecodeError:
        return False
    return isinstance(value, dict | list)
