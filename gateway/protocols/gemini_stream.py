"""Gemini streaming: the upstream decoder, the client encoder, the passthrough re-framer.

Also the small wire pieces both directions share with ``gemini.py`` and ``gemini_request.py``
(usage, finish reasons, the error body, one ``functionCall`` part), so that this module depends
on nothing of the adapter and both import from here.

Framing toward a generate-content client: ``?alt=sse`` gets ``data: {...}`` events;
without it the client gets the JSON array exactly as the Gemini REST API streams it:
``[`` + first object, then ``,\\r\\n`` + each further object, then ``]``, written piece by
piece as chunks arrive. The upstream call always uses ``alt=sse``.
"""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError, InvalidRequestError, UpstreamError, error_for_status
from gateway.protocols.base import Ctx, EventPassthrough, count, field_of
from gateway.sse import SSEEvent, frame
from gateway.types import JSON, ChatChunk, Delta, ToolCall, Usage

# Gemini finishReason -> chat finish_reason. A STOP with functionCall parts becomes tool_calls.
FINISH_FROM_GEMINI = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
    "IMAGE_PROHIBITED_CONTENT": "content_filter",
    "LANGUAGE": "content_filter",
    "MALFORMED_FUNCTION_CALL": "stop",
    "UNEXPECTED_TOOL_CALL": "stop",
    "TOO_MANY_TOOL_CALLS": "stop",
    "OTHER": "stop",
    "FINISH_REASON_UNSPECIFIED": "stop",
}
FINISH_TO_GEMINI = {
    "stop": "STOP",
    "length": "MAX_TOKENS",
    "content_filter": "SAFETY",
    "tool_calls": "STOP",
    "function_call": "STOP",
}

# HTTP status -> google.rpc status name. 402 (balance) is FAILED_PRECONDITION, not
# RESOURCE_EXHAUSTED: clients treat the latter as a rate limit and retry, and waiting does not
# refill a balance. 413 keeps its HTTP code with INVALID_ARGUMENT, Google's name for a body
# the API refuses. 502 (upstream failure) is UNAVAILABLE: the request may succeed later.
GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    402: "FAILED_PRECONDITION",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

# ErrorInfo reasons that mean the channel's own key is bad (fail over, cool the channel down).
CREDENTIAL_REASONS = frozenset({"API_KEY_INVALID", "API_KEY_EXPIRED"})

ARRAY_SEPARATOR = b",\r\n"


def error_body(err: GatewayError) -> JSON:
    name = GOOGLE_STATUS.get(err.status, "INTERNAL" if err.status >= 500 else "INVALID_ARGUMENT")
    return {"error": {"code": err.status, "message": err.message, "status": name}}


def error_from_payload(status: int, payload: JSON) -> GatewayError:
    """A Google error body ({"error": {code, message, status, details}}) -> GatewayError."""
    err = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(err, dict):
        return error_for_status(status, f"upstream returned HTTP {status}")
    message = err.get("message")
    if not isinstance(message, str) or not message:
        message = f"upstream returned HTTP {status}"
    details = err.get("details")
    reasons: set[str] = set()
    retry_after: float | None = None
    if isinstance(details, list):
        for detail in details:
            if not isinstance(detail, dict):
                continue
            kind = detail.get("@type", "")
            if isinstance(kind, str) and kind.endswith("google.rpc.ErrorInfo"):
                reason = detail.get("reason")
                if isinstance(reason, str):
                    reasons.add(reason)
            elif isinstance(kind, str) and kind.endswith("google.rpc.RetryInfo"):
                retry_after = _seconds(detail.get("retryDelay"))
    if reasons & CREDENTIAL_REASONS or err.get("status") == "FAILED_PRECONDITION":
        # FAILED_PRECONDITION: the project cannot use the API (billing, region): the channel's.
        return UpstreamError(
            f"upstream rejected the channel's credentials ({status})", channel_fault=True
        )
    gateway_err = error_for_status(status, message)
    if retry_after is not None:
        gateway_err.retry_after = retry_after
    return gateway_err


def _seconds(value: JSON) -> float | None:
    """google.protobuf.Duration in JSON ("30s", "1.5s") -> seconds."""
    if isinstance(value, str) and value.endswith("s"):
        try:
            return float(value[:-1])
        except ValueError:
            return None
    return None


def decode_usage(meta: JSON) -> Usage:
    """usageMetadata -> usage. completion_tokens includes thoughts (they are billed as output);
    toolUsePromptTokenCount is counted as prompt."""
    if not isinstance(meta, dict):
        raise UpstreamError("upstream usageMetadata is not an object")
    prompt = count(meta.get("promptTokenCount")) + count(meta.get("toolUsePromptTokenCount"))
    thoughts = count(meta.get("thoughtsTokenCount"))
    completion = count(meta.get("candidatesTokenCount")) + thoughts
    usage: Usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": count(meta.get("totalTokenCount")) or prompt + completion,
    }
    cached = count(meta.get("cachedContentTokenCount"))
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    if thoughts:
        usage["completion_tokens_details"] = {"reasoning_tokens": thoughts}
    return usage


def encode_usage(usage: Usage) -> JSON:
    prompt = count(usage.get("prompt_tokens"))
    completion = count(usage.get("completion_tokens"))
    thoughts = count(field_of(usage.get("completion_tokens_details"), "reasoning_tokens"))
    cached = count(field_of(usage.get("prompt_tokens_details"), "cached_tokens"))
    meta: JSON = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": max(completion - thoughts, 0),
        "totalTokenCount": count(usage.get("total_tokens")) or prompt + completion,
    }
    if cached:
        meta["cachedContentTokenCount"] = cached
    if thoughts:
        meta["thoughtsTokenCount"] = thoughts
    return meta


def function_call_part(
    call_id: str | None, name: str, arguments: str, signature: str | None, *, upstream: bool
) -> JSON:
    """One functionCall part with whole args. Toward an upstream the id is left out (Gemini
    matches responses by name and order); toward a client it is kept so its reply can cite it."""
    try:
        args = orjson.loads(arguments) if arguments else {}
    except orjson.JSONDecodeError as exc:
        raise _args_error(upstream, name) from exc
    if not isinstance(args, dict):
        raise _args_error(upstream, name)
    call: JSON = {"name": name, "args": args}
    if call_id and not upstream:
        call["id"] = call_id
    part: JSON = {"functionCall": call}
    if signature:
        part["thoughtSignature"] = signature
    return part


def _args_error(upstream: bool, name: str) -> GatewayError:
    message = f"tool call {name!r}: arguments are not a JSON object"
    return InvalidRequestError(message) if upstream else UpstreamError(message)


def part_deltas(parts: JSON, ctx_calls: list[int], id_prefix: str) -> list[Delta]:
    """One candidate's parts -> chat deltas, in order; adjacent text (or thought) parts merge.

    ``ctx_calls`` is a one-element counter shared across the response, so that generated tool
    call ids (``{id_prefix}{n}``) stay unique. A signature on a text or thought part becomes
    ``reasoning_signature`` (emitted before that part's text); on a functionCall part, the
    call's ``thought_signature``. Other part kinds (inlineData output, executableCode,
    codeExecutionResult) are not carried.
    """
    if not isinstance(parts, list):
        raise UpstreamError("upstream candidate parts is not a list")
    deltas: list[Delta] = []
    for part in parts:
        if not isinstance(part, dict):
            raise UpstreamError("upstream part is not an object")
        signature = part.get("thoughtSignature")
        call = part.get("functionCall")
        if isinstance(call, dict):
            tool: ToolCall = {
                "id": call.get("id") or f"{id_prefix}{ctx_calls[0]}",
                "type": "function",
                "function": {
                    "name": str(call.get("name", "")),
                    "arguments": orjson.dumps(call.get("args") or {}).decode(),
                },
            }
            ctx_calls[0] += 1
            if signature:
                tool["thought_signature"] = signature
            if deltas and "tool_calls" in deltas[-1]:
                deltas[-1]["tool_calls"].append(tool)
            else:
                deltas.append({"tool_calls": [tool]})
            continue
        if signature:
            deltas.append({"reasoning_signature": signature})
        text = part.get("text")
        if not isinstance(text, str) or not text:
            continue
        key = "reasoning_content" if part.get("thought") else "content"
        last = deltas[-1] if deltas else None
        if last is not None and len(last) == 1 and key in last:
            last[key] += text  # type: ignore[literal-required]
        else:
            deltas.append({key: text})  # type: ignore[misc]
    return deltas


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


def _finished(payload: JSON) -> bool:
    for cand in payload.get("candidates") or ():
        if isinstance(cand, dict) and cand.get("finishReason"):
            return True
    feedback = payload.get("promptFeedback")
    return isinstance(feedback, dict) and bool(feedback.get("blockReason"))


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
        for cand in payload.get("candidates") or ():
            index = count(cand.get("index"))
            content = cand.get("content")
            if isinstance(content, dict) and "parts" in content:
                for delta in part_deltas(content["parts"], self._calls, prefix):
                    for call in delta.get("tool_calls") or ():
                        call["index"] = self._tool_slots.get(index, 0)
                        self._tool_slots[index] = call["index"] + 1
                    chunks.append(self._chunk(index, delta))
            reason = cand.get("finishReason")
            if reason:
                finish = FINISH_FROM_GEMINI.get(reason, "stop")
                if finish == "stop" and index in self._tool_slots:
                    finish = "tool_calls"
                chunks.append(self._chunk(index, {}, finish))
                finished_now = True
        feedback = payload.get("promptFeedback")
        if not payload.get("candidates") and isinstance(feedback, dict):
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
        self._sse = sse
        self.content_type = "text/event-stream" if sse else "application/json"
        self._started = False
        self._closed = False
        self._calls: dict[int, dict[int, _PendingCall]] = {}
        self._final: list[JSON] = []
        self._usage_sent = False

    def _write(self, obj: JSON) -> bytes:
        data = orjson.dumps(obj)
        if self._sse:
            return frame(data)
        if self._started:
            return ARRAY_SEPARATOR + data
        self._started = True
        return b"[" + data

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
        if self._sse or self._closed:
            return out
        self._closed = True
        return out + (b"]" if self._started else b"[]")

    def error(self, err: GatewayError) -> bytes:
        data = self._write(error_body(err))
        if self._sse or self._closed:
            return data
        self._closed = True
        return data + b"]"


class GeminiPassthroughStream(EventPassthrough):
    """Upstream Gemini SSE events forwarded to a Gemini client, re-framed for the JSON array
    when the client did not ask for SSE. An event is re-serialised only when its modelVersion
    must be mapped back to the client's model name."""

    def __init__(self, ctx: Ctx, sse: bool) -> None:
        super().__init__()
        self._ctx = ctx
        self._sse = sse
        self.content_type = "text/event-stream" if sse else "application/json"
        self.usage: Usage | None = None
        self._started = False
        self._closed = False
        self._finished = False

    def _write(self, data: bytes) -> bytes:
        if self._sse:
            return frame(data)
        if self._started:
            return ARRAY_SEPARATOR + data
        self._started = True
        return b"[" + data

    def feed_event(self, event: SSEEvent) -> bytes:
        payload = load_event(event)
        if "usageMetadata" in payload:
            self.usage = decode_usage(payload["usageMetadata"])
        if _finished(payload):
            self._finished = True
        data = event.data
        version = payload.get("modelVersion")
        if version is not None and version != self._ctx.model:
            payload["modelVersion"] = self._ctx.model
            data = orjson.dumps(payload)
        return self._write(data)

    def end(self) -> bytes:
        if not self._finished:
            raise UpstreamError("upstream stream ended before a finishReason")
        if self._sse or self._closed:
            return b""
        self._closed = True
        return b"]" if self._started else b"[]"

    def error_event(self, err: GatewayError) -> bytes:
        data = self._write(orjson.dumps(error_body(err)))
        if self._sse or self._closed:
            return data
        self._closed = True
        return data + b"]"
