"""gemini client, gemini channel: the request with only its model (in the URL) renamed and its
inline bytes in standard base64, the reply and its events as they came (re-framed for the
JSON array when the client did not ask for SSE), usage read on the way.
"""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError, UpstreamError
from gateway.protocols.base import (
    CHARS_PER_TOKEN,
    Ctx,
    EventPassthrough,
    RouteMatch,
    UpstreamCall,
    UpstreamTarget,
)
from gateway.protocols.gemini.dialect import standard_base64
from gateway.protocols.gemini.reply import check_reply, decode_usage, error_body
from gateway.protocols.gemini.request import upstream_headers, upstream_url
from gateway.protocols.gemini.stream import Framing, load_event
from gateway.protocols.sse import SSEEvent
from gateway.types import JSON, Usage


def standard_inline_data(payload: dict[str, JSON]) -> None:
    """Every ``inlineData.data`` of a generate-content body's contents in standard base64, in
    place: Gemini takes google-genai's URL-safe form, but channels that relay to other APIs
    may not."""
    for body in (payload, payload.get("generateContentRequest")):
        contents = body.get("contents") if isinstance(body, dict) else None
        for content in contents if isinstance(contents, list) else ():
            parts = content.get("parts") if isinstance(content, dict) else None
            for part in parts if isinstance(parts, list) else ():
                if not isinstance(part, dict):
                    continue
                blob = part.get("inlineData") or part.get("inline_data")
                if isinstance(blob, dict) and isinstance(blob.get("data"), str):
                    blob["data"] = standard_base64(blob["data"])


def passthrough_request(payload: JSON, route: RouteMatch, target: UpstreamTarget) -> UpstreamCall:
    if route.capability == "count_tokens":
        method = "countTokens"
        inner = payload.get("generateContentRequest") if isinstance(payload, dict) else None
        if isinstance(inner, dict) and "model" in inner:
            inner = {**inner, "model": f"models/{target.model}"}
            payload = {**payload, "generateContentRequest": inner}
    elif target.stream:
        method = "streamGenerateContent"
    else:
        method = "generateContent"
    if isinstance(payload, dict):
        standard_inline_data(payload)
    return UpstreamCall(
        url=upstream_url(target.base_url, target.model, method),
        headers=upstream_headers(target),
        body=orjson.dumps(payload),
    )


def passthrough_response(payload: JSON, ctx: Ctx) -> tuple[JSON, Usage | None]:
    payload = check_reply(payload)
    usage = decode_usage(payload["usageMetadata"]) if "usageMetadata" in payload else None
    if "modelVersion" in payload and payload["modelVersion"] != ctx.model:
        payload = {**payload, "modelVersion": ctx.model}
    return payload, usage


def _finishes(payload: JSON) -> bool:
    candidates = payload.get("candidates")
    for cand in candidates if isinstance(candidates, list) else ():
        if isinstance(cand, dict) and cand.get("finishReason"):
            return True
    feedback = payload.get("promptFeedback")
    return isinstance(feedback, dict) and bool(feedback.get("blockReason"))


def _part_chars(payload: JSON) -> int:
    """Characters of text and function-call arguments in a reply chunk's parts."""
    chars = 0
    candidates = payload.get("candidates")
    for candidate in candidates if isinstance(candidates, list) else ():
        content = candidate.get("content") if isinstance(candidate, dict) else None
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else ():
            if not isinstance(part, dict):
                continue
            text = part.get("text")
            if isinstance(text, str):
                chars += len(text)
            call = part.get("functionCall")
            if isinstance(call, dict) and call.get("args") is not None:
                chars += len(orjson.dumps(call["args"]))
    return chars


class GeminiPassthroughStream(EventPassthrough):
    """Upstream Gemini SSE events forwarded to a Gemini client, re-framed for the JSON array
    when the client did not ask for SSE. An event is re-serialised only when its modelVersion
    must be mapped back to the client's model name."""

    def __init__(self, ctx: Ctx, sse: bool) -> None:
        super().__init__()
        self._ctx = ctx
        self._framing = Framing(sse)
        self.content_type = self._framing.content_type
        self.usage: Usage | None = None
        self._finished = False
        self._chars = 0  # of the parts' text and call arguments, for a stream cut short

    @property
    def generated(self) -> int:  # type: ignore[override]
        return -(-self._chars // CHARS_PER_TOKEN)

    def feed_event(self, event: SSEEvent) -> bytes:
        payload = load_event(event)
        if "usageMetadata" in payload:
            self.usage = decode_usage(payload["usageMetadata"])
        self._chars += _part_chars(payload)
        if _finishes(payload):
            self._finished = True
        data = event.data
        version = payload.get("modelVersion")
        if version is not None and version != self._ctx.model:
            payload["modelVersion"] = self._ctx.model
            data = orjson.dumps(payload)
        return self._framing.write(data)

    def end(self) -> bytes:
        if not self._finished:
            raise UpstreamError("upstream stream ended before a finishReason")
        return self._framing.close()

    def error_event(self, err: GatewayError) -> bytes:
        return self._framing.error(orjson.dumps(error_body(err)))
