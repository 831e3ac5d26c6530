"""anthropic client, anthropic channel: the request with only its model renamed, the reply and
its events as they came (``message_start`` rewritten only when the model name differs), usage
read on the way.
"""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError, InvalidRequestError, UpstreamError
from gateway.protocols.anthropic.reply import decode_usage, error_body, stream_error
from gateway.protocols.anthropic.request import upstream_headers, upstream_url
from gateway.protocols.anthropic.stream import EVENT_STREAM, load_event
from gateway.protocols.base import (
    CHARS_PER_TOKEN,
    Ctx,
    EventParser,
    EventPassthrough,
    RouteMatch,
    UpstreamCall,
    UpstreamTarget,
)
from gateway.protocols.sse import SSEEvent, frame
from gateway.types import JSON, Usage

# the JSON around a delta's text: {"type":"content_block_delta","index":0,"delta":{"type":
# "text_delta","text":""}}
DELTA_FRAMING = 75


def passthrough_request(payload: JSON, route: RouteMatch, target: UpstreamTarget) -> UpstreamCall:
    if not isinstance(payload, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    payload["model"] = target.model
    return UpstreamCall(
        url=upstream_url(target, count=route.capability == "count_tokens"),
        headers=upstream_headers(target),
        body=orjson.dumps(payload),
    )


def passthrough_response(payload: JSON, ctx: Ctx) -> tuple[JSON, Usage | None]:
    # a message has its content blocks, as ``reply.decode_message`` requires of a converted
    # one (a count_tokens reply, its ``input_tokens``): an object with neither (``{}``) is no
    # reply, and fails over like any garbage instead of reaching the client billed nothing
    if not isinstance(payload, dict) or not (
        isinstance(payload.get("content"), list) or type(payload.get("input_tokens")) is int
    ):
        raise UpstreamError("upstream sent a malformed message")
    if "model" in payload:
        payload["model"] = ctx.model
    usage = payload.get("usage")
    return payload, decode_usage(usage) if isinstance(usage, dict) else None


class AnthropicPassthrough(EventPassthrough):
    """Anthropic events forwarded to an anthropic client. Only ``message_start`` and
    ``message_delta`` are parsed (usage, and the model name mapped back to the client's);
    everything else goes out as it came. What the deltas carry is counted by their size, for
    a stream cut short before its final usage."""

    __slots__ = ("content_type", "usage", "_model", "_raw_usage", "_done", "_chars")

    def __init__(self, ctx: Ctx, parser: EventParser | None = None) -> None:
        super().__init__(parser)
        self.content_type = EVENT_STREAM
        self.usage: Usage | None = None
        self._model = ctx.model
        self._raw_usage: dict[str, JSON] = {}
        self._done = False
        self._chars = 0  # of the deltas' text, their JSON framing left out (unparsed)

    @property
    def generated(self) -> int:  # type: ignore[override]
        return -(-self._chars // CHARS_PER_TOKEN)

    def feed_event(self, event: SSEEvent) -> bytes:
        name = event.event
        if name == "message_start":
            payload = load_event(event.data)
            message = payload.get("message")
            if isinstance(message, dict):
                if isinstance(message.get("usage"), dict):
                    self._raw_usage.update(message["usage"])
                    self.usage = decode_usage(self._raw_usage)
                if message.get("model") != self._model:
                    message["model"] = self._model
                    return frame(orjson.dumps(payload), name)
        elif name == "message_delta":
            payload = load_event(event.data)
            if isinstance(payload.get("usage"), dict):
                self._raw_usage.update({k: v for k, v in payload["usage"].items() if v is not None})
                self.usage = decode_usage(self._raw_usage)
        elif name == "content_block_delta":
            self._chars += max(len(event.data) - DELTA_FRAMING, 1)
        elif name == "message_stop":
            self._done = True
        elif name == "error":
            raise stream_error(event.data)
        data = event.data
        if 10 in data:  # several data: lines, joined by the parser (an LF looked for by memchr)
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
