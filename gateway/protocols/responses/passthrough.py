"""Responses client, openai channel with ``responses: true``: the body goes to the upstream's
own ``/responses`` with the model renamed and ``store: false`` (the gateway promises that
nothing is kept), and the reply comes back as the upstream sent it, the model name the
client's and the usage read from ``response.completed``.

Stream events go out as they arrive; only the lifecycle events (which carry the response
object, its model and usage) are parsed and written again. The stream is complete when
``response.completed``, ``response.incomplete`` or ``response.failed`` arrived; an ``error``
event before any output fails the attempt, so another channel can be tried. The gateway's own
``error`` event (a stream cut short, a malformed event) continues the upstream's
``sequence_number``s. The upstream's own ``error`` event after output ends the stream as a
gateway error too, so that its message goes out the way every upstream message does (the
relay takes the channel's credentials out of it): it is sent as the upstream wrote it, with
that message.
"""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError, UpstreamError, error_for_status
from gateway.policy.redaction import channel_secrets, redact
from gateway.protocols.base import Ctx, EventPassthrough, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.openai.request import headers
from gateway.protocols.responses.reply import decode_usage
from gateway.protocols.responses.stream import EVENT_STREAM
from gateway.protocols.sse import SSEEvent, frame
from gateway.types import JSON, Usage

LIFECYCLE = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.queued",
        "response.completed",
        "response.incomplete",
        "response.failed",
    }
)
ENDINGS = frozenset({"response.completed", "response.incomplete", "response.failed"})
DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.custom_tool_call_input.delta",
    }
)


def passthrough_request(payload: JSON, route: RouteMatch, target: UpstreamTarget) -> UpstreamCall:
    payload["model"] = target.model
    payload["store"] = False
    return UpstreamCall(
        url=target.base_url + "/responses", headers=headers(target), body=orjson.dumps(payload)
    )


def passthrough_response(payload: JSON, ctx: Ctx) -> tuple[JSON, Usage | None]:
    if not isinstance(payload, dict) or payload.get("object") != "response":
        raise UpstreamError("upstream sent a malformed response object")
    payload["model"] = ctx.model
    return payload, decode_usage(payload.get("usage"))


class ResponsesPassthrough(EventPassthrough):
    """One per stream (see the module docstring)."""

    __slots__ = ("content_type", "usage", "generated", "_model", "_ended", "_output", "_seq",
                 "_failed", "_target")  # fmt: skip

    def __init__(self, ctx: Ctx, target: UpstreamTarget | None = None) -> None:
        super().__init__()
        self._target = target  # its credentials are never in a failed response's error
        self.content_type = EVENT_STREAM
        self.usage: Usage | None = None
        self.generated = 0  # deltas passed: about a token each
        self._model = ctx.model
        self._ended = False
        self._output = False  # an output item was announced
        self._seq = -1  # the last sequence_number the upstream sent
        self._failed: dict[str, JSON] | None = None  # the upstream's error event, after output

    def feed_event(self, event: SSEEvent) -> bytes:
        payload = _load(event.data)
        kind = payload.get("type")
        if not isinstance(kind, str):
            raise UpstreamError("upstream sent a stream event without a type")
        name = event.event or kind
        seq = payload.get("sequence_number")
        if isinstance(seq, int) and not isinstance(seq, bool):
            self._seq = seq
        if kind in LIFECYCLE:
            response = payload.get("response")
            if isinstance(response, dict):
                response["model"] = self._model
                if kind in ENDINGS:
                    self._ended = True
                    self.usage = decode_usage(response.get("usage")) or self.usage
                error = response.get("error")
                if isinstance(error, dict) and isinstance(error.get("message"), str):
                    error["message"] = redact(error["message"], channel_secrets(self._target))
            return frame(orjson.dumps(payload), name)
        if kind == "error":
            if self._output:  # sent by ``error_event``, with the message the relay passes
                self._failed = payload
            raise _stream_error(payload)
        if kind in DELTAS:
            self.generated += 1
        elif kind == "response.output_item.added":
            self._output = True
        return frame(event.data, name)

    def end(self) -> bytes:
        if not self._ended:
            raise UpstreamError("the upstream's stream ended before the response was complete")
        return b""

    def error_event(self, err: GatewayError) -> bytes:
        if self._failed is not None:
            return frame(orjson.dumps({**self._failed, "message": err.message}), "error")
        self._seq += 1
        body = {
            "type": "error",
            "sequence_number": self._seq,
            "code": err.code or err.type,
            "message": err.message,
            "param": None,
        }
        return frame(orjson.dumps(body), "error")


def _load(data: bytes) -> dict[str, JSON]:
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamError("upstream sent a malformed stream event") from None
    if not isinstance(payload, dict):
        raise UpstreamError("upstream sent a malformed stream event")
    return payload


def _stream_error(payload: dict[str, JSON]) -> GatewayError:
    message = str(payload.get("message") or "upstream error")
    code = payload.get("code")
    status = 429 if code in ("rate_limit_exceeded", "rate_limit_error") else 502
    return error_for_status(status, message)
