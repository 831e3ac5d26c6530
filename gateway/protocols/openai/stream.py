"""Chat-completions streams: chunks written for a client (``[DONE]`` last, the usage chunk
only when asked for), and an openai channel's events read (already the internal shape).
"""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError, UpstreamError
from gateway.protocols.base import Ctx
from gateway.protocols.fields import REPLY
from gateway.protocols.openai.reply import (
    check_message,
    check_usage,
    encode_usage,
    error_body,
    stream_error,
)
from gateway.protocols.sse import DONE, SSEEvent, frame
from gateway.types import JSON, ChatChunk, Usage

EVENT_STREAM = "text/event-stream"


class OpenAIStreamEncoder:
    """Chat chunks -> chat-completions SSE, ``[DONE]`` last; usage only when asked for."""

    __slots__ = ("content_type", "_model", "_include_usage")

    def __init__(self, ctx: Ctx) -> None:
        self.content_type = EVENT_STREAM
        self._model = ctx.model
        self._include_usage = ctx.include_usage

    def encode(self, chunk: ChatChunk) -> bytes:
        usage = chunk.get("usage")
        if usage is not None:
            if not self._include_usage:
                if not chunk.get("choices"):
                    return b""
                chunk = {k: v for k, v in chunk.items() if k != "usage"}  # type: ignore[assignment]
            elif usage:
                chunk["usage"] = encode_usage(usage)
        elif self._include_usage and "usage" not in chunk:
            chunk["usage"] = None
        chunk["model"] = self._model
        return frame(orjson.dumps(chunk))

    def finish(self, usage: Usage | None) -> bytes:
        return DONE

    def error(self, err: GatewayError) -> bytes:
        return frame(orjson.dumps(error_body(err)))


class OpenAIStreamDecoder:
    """chat-completions SSE -> chat chunks (already the internal shape)."""

    __slots__ = ("_done", "_finished")

    def __init__(self) -> None:
        self._done = False
        self._finished = False

    def feed(self, event: SSEEvent) -> list[ChatChunk]:
        data = event.data
        if data == b"[DONE]":
            self._done = True
            return []
        chunk = load_chunk(data)
        if "error" in chunk:
            raise stream_error(chunk)
        for i, choice in enumerate(REPLY.opt_array(chunk.get("choices"), "choices")):
            where = f"choices[{i}]"
            choice = REPLY.obj(choice, where)
            REPLY.opt_integer(choice.get("index"), where, "index")
            delta = REPLY.opt_obj(choice.get("delta"), where, "delta")
            if delta is not None:
                check_message(delta, f"{where}.delta")
                # a delta's content is text (a whole message's may be a list of parts)
                REPLY.opt_text(delta.get("content"), f"{where}.delta", "content")
            if REPLY.opt_text(choice.get("finish_reason"), where, "finish_reason"):
                self._finished = True
        check_usage(chunk.get("usage"))
        return [chunk]

    def close(self) -> list[ChatChunk]:
        if not (self._done or self._finished):
            raise UpstreamError("upstream stream ended before it was complete")
        return []


def load_chunk(data: bytes) -> JSON:
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamError("upstream sent a malformed stream chunk") from None
    if not isinstance(chunk, dict):
        raise UpstreamError("upstream sent a malformed stream chunk")
    return chunk
