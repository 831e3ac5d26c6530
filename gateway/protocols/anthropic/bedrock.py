"""Claude on AWS Bedrock: the Messages API in Bedrock's ``invoke`` envelope (``bedrock``
channels, upstream model ids containing ``anthropic.``).

- The body is the Messages body without ``model`` and ``stream`` (the path says both), with
  ``anthropic_version: bedrock-2023-05-31`` and, when the client sent ``anthropic-beta``,
  its values as the ``anthropic_beta`` list; it goes to ``{base_url}/model/{id}/invoke`` or
  ``/invoke-with-response-stream``, unsigned (the channel signs it, ``gateway.upstream.sigv4``).
- A whole reply is the Messages reply as it is: the anthropic adapter's ``decode_response``
  and ``passthrough_response`` read it.
- A stream is AWS event-stream framing (``gateway.upstream.eventstream.EventStreamParser``
  reads it into events) whose ``chunk`` events carry ``{"bytes": <base64 of one Messages
  stream event's JSON>}`` (and Bedrock's padding, ``p``); ``messages_event`` unwraps one into
  the Messages event it carries, and an exception into a Messages ``error`` event.
  ``InvokeStreamDecoder`` (chat chunks, for other clients) and ``InvokePassthrough`` (the
  Messages stream as it came, for anthropic clients) are the anthropic ones fed those events.
- Errors are Bedrock's (``gateway.protocols.bedrock``).

Not carried, beyond what the anthropic adapter leaves out: nothing of the body is dropped
but ``model`` and ``stream``; fields Bedrock does not take are its to refuse (upstream rules
apply). Bedrock's ``amazon-bedrock-invocationMetrics`` on ``message_stop`` passes through to
an anthropic client and is ignored by the decoder.
"""

from __future__ import annotations

import binascii
from binascii import a2b_base64
from collections.abc import Callable
from typing import ClassVar

import orjson

from gateway.errors import GatewayError, InvalidRequestError, UpstreamError
from gateway.protocols import bedrock
from gateway.protocols.anthropic.passthrough import AnthropicPassthrough, passthrough_response
from gateway.protocols.anthropic.reply import decode_message, error_body
from gateway.protocols.anthropic.request import encode_messages_body
from gateway.protocols.anthropic.stream import AnthropicStreamDecoder
from gateway.protocols.base import Ctx, EventParser, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.bedrock import is_exception, model_path, stream_error
from gateway.protocols.sse import SSEEvent
from gateway.types import JSON, ChatChunk, ChatRequest, ChatResponse, Usage

BEDROCK_VERSION = "bedrock-2023-05-31"
DROPPED = frozenset({"model", "stream"})
HEADERS = {"content-type": "application/json", "accept": "application/json"}
TYPE_PREFIX = b'{"type":"'  # how Anthropic's events begin
TYPE_START = len(TYPE_PREFIX)
BYTES_PREFIX = b'{"bytes":"'  # how Bedrock's chunk events begin
BYTES_START = len(BYTES_PREFIX)
CHUNK = "chunk"  # the event type of an invoke stream's Messages events


def invoke_body(body: dict[str, JSON], beta: str | None = None) -> dict[str, JSON]:
    """A Messages request body -> Bedrock's invoke body; ``beta``: the client's
    ``anthropic-beta`` header (comma-separated)."""
    out = {k: v for k, v in body.items() if k not in DROPPED}
    out.setdefault("anthropic_version", BEDROCK_VERSION)
    betas = [b.strip() for b in beta.split(",") if b.strip()] if beta else []
    if betas:
        out["anthropic_beta"] = betas
    return out


def invoke_url(target: UpstreamTarget) -> str:
    action = "invoke-with-response-stream" if target.stream else "invoke"
    return f"{target.base_url.rstrip('/')}{model_path(target.model)}/{action}"


def encode_request(req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
    """A chat request -> the invoke call (the anthropic adapter's Messages body, rewrapped)."""
    body = invoke_body(
        encode_messages_body(req, target), target.client_headers.get("anthropic-beta")
    )
    return UpstreamCall(url=invoke_url(target), headers=dict(HEADERS), body=orjson.dumps(body))


def passthrough_request(payload: JSON, route: RouteMatch, target: UpstreamTarget) -> UpstreamCall:
    """An anthropic client's Messages body -> the invoke call, nothing else changed."""
    if not isinstance(payload, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    body = invoke_body(payload, target.client_headers.get("anthropic-beta"))
    return UpstreamCall(url=invoke_url(target), headers=dict(HEADERS), body=orjson.dumps(body))


def _event_name(data: bytes) -> str | None:
    """The ``type`` of a Messages event, read without parsing when it comes first (as
    Anthropic writes it); None when it does not."""
    if data.startswith(TYPE_PREFIX):
        end = data.find(b'"', TYPE_START)
        if end > 0:
            return data[TYPE_START:end].decode()
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamError("upstream sent a malformed stream event") from None
    kind = payload.get("type") if isinstance(payload, dict) else None
    return kind if isinstance(kind, str) else None


def chunk_payload(data: bytes) -> bytes:
    """A ``chunk`` event's payload -> the Messages stream event's JSON it carries. Its
    ``bytes`` is read without parsing when it comes first, as Bedrock writes it (base64 holds
    no quote or escape), else from the JSON."""
    try:
        if data.startswith(BYTES_PREFIX) and (end := data.find(b'"', BYTES_START)) > 0:
            return a2b_base64(data[BYTES_START:end], strict_mode=True)
        text = orjson.loads(data)["bytes"]
        if not isinstance(text, str):
            raise TypeError("bytes")
        return a2b_base64(text, strict_mode=True)
    except (orjson.JSONDecodeError, binascii.Error, KeyError, TypeError, ValueError):
        raise UpstreamError("upstream sent a malformed chunk event") from None


def chunk_event(data: bytes) -> SSEEvent:
    """A ``chunk`` event's payload -> the Messages stream event it carries, named."""
    inner = chunk_payload(data)
    return SSEEvent(_event_name(inner), inner)


def messages_event(event: SSEEvent) -> SSEEvent | None:
    """One event of an invoke stream -> the Messages stream event it carries (named by its
    ``type``), an exception -> a Messages ``error`` event; None for other events."""
    if event.event == CHUNK:
        return chunk_event(event.data)
    if is_exception(event):
        return SSEEvent("error", orjson.dumps(error_body(stream_error(event))))
    return None


class InvokeStreamDecoder:
    """An invoke stream -> chat chunks: the anthropic decoder fed the Messages events; an
    exception raises Bedrock's error as it is (not through the Messages error types). The
    events go to the decoder unnamed: it reads a Messages event's ``type`` from its JSON (an
    ``error`` and a ``ping`` too), so the name is not read out of each."""

    __slots__ = ("_inner", "_feed")

    def __init__(self, ctx: Ctx) -> None:
        self._inner = AnthropicStreamDecoder(ctx)
        self._feed = self._inner.feed

    def feed(self, event: SSEEvent) -> list[ChatChunk]:
        if event.event == CHUNK:  # nearly every event: looked at first
            return self._feed(SSEEvent(None, chunk_payload(event.data)))
        if is_exception(event):
            raise stream_error(event)
        return []

    def close(self) -> list[ChatChunk]:
        return self._inner.close()


class InvokePassthrough(AnthropicPassthrough):
    """An invoke stream to an anthropic client: the Messages events as they came (only the
    model name in ``message_start`` mapped back), usage read on the way. Built with the
    event-stream parser: ``InvokePassthrough(ctx, EventStreamParser())``."""

    __slots__ = ()

    def __init__(self, ctx: Ctx, parser: EventParser) -> None:
        super().__init__(ctx, parser)

    def feed_event(self, event: SSEEvent) -> bytes:
        inner = messages_event(event)
        return super().feed_event(inner) if inner is not None else b""


class InvokeAdapter:
    """Claude on Bedrock through ``invoke``: the upstream side (``UpstreamSide``) and the
    pass-through for anthropic clients (``Passthrough``). ``framing`` makes the event-stream
    parser of a stream (``gateway.upstream.eventstream.EventStreamParser``: protocols do no
    I/O and import nothing of ``upstream``, so the composition root hands it in)."""

    name: ClassVar[str] = "anthropic-invoke"

    __slots__ = ("_framing",)

    def __init__(self, framing: Callable[[], EventParser]) -> None:
        self._framing = framing

    def encode_request(self, req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
        return encode_request(req, target)

    def decode_response(self, payload: JSON) -> ChatResponse:
        return decode_message(payload)

    def stream_decoder(self, ctx: Ctx) -> InvokeStreamDecoder:
        return InvokeStreamDecoder(ctx)

    def decode_error(self, status: int, raw: bytes, header: str | None = None) -> GatewayError:
        """``header``: the reply's ``x-amzn-errortype``, which names the error."""
        return bedrock.decode_error(status, raw, header)

    def passthrough_request(
        self, payload: JSON, route: RouteMatch, target: UpstreamTarget
    ) -> UpstreamCall:
        return passthrough_request(payload, route, target)

    def passthrough_response(self, payload: JSON, ctx: Ctx) -> tuple[JSON, Usage | None]:
        return passthrough_response(payload, ctx)

    def passthrough_stream(
        self, ctx: Ctx, route: RouteMatch, target: UpstreamTarget
    ) -> InvokePassthrough:
        return InvokePassthrough(ctx, self._framing())
