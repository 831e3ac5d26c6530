"""AWS Bedrock runtime wire formats: Converse, and Claude's Messages body through ``invoke``.

Paths (POST, every request signed with SigV4 for service ``bedrock``, see ``aws_auth``):
``/model/{id}/converse`` and ``/converse-stream`` (the Converse API), ``/model/{id}/invoke``
and ``/invoke-with-response-stream`` (a model's own body: here Claude's Messages body with
``anthropic_version``, without ``model`` or ``stream``).

Streams are AWS event-stream framing (``application/vnd.amazon.eventstream``), one message per
event, each JSON payload padded with ``p`` as Bedrock pads it. Converse: ``messageStart``;
per block (reasoning, text, each tool use, with contiguous ``contentBlockIndex``) an optional
``contentBlockStart`` (tool use only), ``contentBlockDelta`` pieces, ``contentBlockStop``;
``messageStop`` with ``stopReason``; ``metadata`` with ``usage`` and ``metrics``. Invoke: one
``chunk`` event per Messages stream event, ``{"bytes": <base64 of its JSON>}``, Bedrock's
``amazon-bedrock-invocationMetrics`` in ``message_stop``. An error after the start is an
``exception`` message (``:exception-type`` in lower camel case, ``{"message": ...}``).

Errors are ``{"message": ...}`` with the type in ``x-amzn-ErrorType``; a request the real
service refuses (a conversation that does not alternate or start with the user, blank text,
tool blocks without ``toolConfig``, an invoke body with ``model`` or without
``anthropic_version``) gets its 400 ValidationException.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from bench.fake import anthropic
from bench.fake.incoming import Incoming, RequestShapeError, from_anthropic
from bench.fake.plan import CONTENT, HEAD, TAIL, Plan
from gateway.upstream.eventstream import encode_event, encode_exception

STREAM_TYPE = "application/vnd.amazon.eventstream"
JSON_TYPE = "application/json"
CORAL = ":http://internal.amazon.com/coral/com.amazon.bedrock/"
KINDS = frozenset({"converse", "converse-stream", "invoke", "invoke-with-response-stream"})
STREAMS = frozenset({"converse-stream", "invoke-with-response-stream"})
ERROR_TYPES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}
ERROR_MESSAGES = {
    "ValidationException": "The provided request is not valid",
    "AccessDeniedException": "You don't have access to the model with the specified model ID.",
    "ResourceNotFoundException": "The provided model identifier is invalid.",
    "ModelTimeoutException": "Model has timed out in processing the request.",
    "ThrottlingException": "Too many requests, please wait before trying again.",
    "InternalServerException": "The system encountered an unexpected error during processing.",
    "ServiceUnavailableException": "The service isn't currently available. Try again later.",
    "ModelNotReadyException": "Model is not ready to serve inference requests.",
}
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "stop_sequence": "stop_sequence",
}
PADDING = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
BLANK = (
    "The text field in the ContentBlock object at {} is blank. Add text to the text field, "
    "and try again."
)


def error_type(status: int, given: str | None) -> str:
    return given or ERROR_TYPES.get(status, "InternalServerException")


def error_payload(error_type: str, message: str | None) -> dict[str, Any]:
    return {"message": message or ERROR_MESSAGES.get(error_type, "Error")}


def error_headers(error_type: str) -> dict[str, str]:
    """AWS's error type header (service errors carry the coral namespace, as Bedrock's do)."""
    auth = error_type.endswith(("SignatureException", "ClientException", "TokenException"))
    return {"x-amzn-ErrorType": error_type if auth else error_type + CORAL}


# requests ------------------------------------------------------------------------------------
def _text(value: Any, where: str, chars: list[int]) -> str:
    if not isinstance(value, str) or not value.strip():
        raise RequestShapeError(BLANK.format(where))
    chars[0] += len(value)
    return value


def _blocks(blocks: Any, where: str, chars: list[int], images: list[str]) -> tuple[list[str], bool]:
    """(the texts, whether tool blocks were seen) of a message's content blocks."""
    if not isinstance(blocks, list) or not blocks:
        raise RequestShapeError(f"The content field in the Message object at {where} is empty.")
    texts: list[str] = []
    tools = False
    for j, block in enumerate(blocks):
        at = f"{where}.content.{j}"
        if not isinstance(block, dict) or len(block) != 1:
            raise RequestShapeError(f"The ContentBlock object at {at} must set one field.")
        (key, value), = block.items()  # fmt: skip
        if key == "text":
            texts.append(_text(value, at, chars))
        elif key == "image":
            source = value.get("source") if isinstance(value, dict) else None
            if not isinstance(source, dict) or not source.get("bytes"):
                raise RequestShapeError(f"The image at {at} has no source bytes.")
            images.append(f"image/{value.get('format')}")
        elif key in ("toolUse", "toolResult"):
            tools = True
            chars[0] += len(orjson.dumps(value))
        elif key == "reasoningContent":
            chars[0] += len(orjson.dumps(value))
    return texts, tools


def from_converse(body: dict[str, Any]) -> Incoming:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestShapeError(
            "A conversation must start with a user message. Try again with a conversation "
            "that starts with a user message."
        )
    chars = [0]
    images: list[str] = []
    for i, block in enumerate(body.get("system") or ()):
        _text(block.get("text") if isinstance(block, dict) else None, f"system.{i}", chars)
    last_user: str | None = None
    uses_tools = False
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role not in ("user", "assistant"):
            raise RequestShapeError(
                f"Value '{role}' at 'messages.{i}.member.role' failed to satisfy constraint: "
                "Member must satisfy enum value set: [user, assistant]"
            )
        if (i == 0 and role != "user") or (i and messages[i - 1].get("role") == role):
            raise RequestShapeError(
                "A conversation must alternate between user and assistant roles. Make sure "
                "the conversation alternates between user and assistant roles and try again."
            )
        texts, tools = _blocks(msg.get("content"), f"messages.{i}", chars, images)
        uses_tools = uses_tools or tools
        last_user = "\n".join(texts) if role == "user" and texts else None
    config = body.get("toolConfig")
    if uses_tools and not config:
        raise RequestShapeError(
            "The toolConfig field must be defined when using toolUse and toolResult content blocks."
        )
    first_tool = None
    if isinstance(config, dict) and isinstance(config.get("tools"), list) and config["tools"]:
        spec = config["tools"][0].get("toolSpec") if isinstance(config["tools"][0], dict) else None
        first_tool = spec.get("name") if isinstance(spec, dict) else None
    inference = body.get("inferenceConfig") if isinstance(body.get("inferenceConfig"), dict) else {}
    limit = inference.get("maxTokens")
    stops = inference.get("stopSequences")
    return Incoming(
        messages=len(messages),
        last_user_text=last_user,
        images=tuple(images),
        text_chars=chars[0],
        max_tokens=limit if isinstance(limit, int) else None,
        stop=tuple(s for s in stops if isinstance(s, str)) if isinstance(stops, list) else (),
        first_tool=first_tool if isinstance(first_tool, str) else None,
    )


def from_invoke(body: dict[str, Any]) -> Incoming:
    """Claude's invoke body: the Messages body with ``anthropic_version`` and no ``model``
    or ``stream`` (Bedrock refuses a key it does not know)."""
    for key in ("model", "stream"):
        if key in body:
            raise RequestShapeError(
                f"Malformed input request: #: extraneous key [{key}] is not permitted, please "
                "reformat your input and try again."
            )
    if not isinstance(body.get("anthropic_version"), str):
        raise RequestShapeError(
            "Malformed input request: #: required key [anthropic_version] not found, please "
            "reformat your input and try again."
        )
    return from_anthropic(body, model_required=False)


# replies -------------------------------------------------------------------------------------
def usage(plan: Plan) -> dict[str, Any]:
    """Converse's ``TokenUsage``: the cache writes in all, and by lifetime in
    ``cacheDetails`` (1 hour before 5 minutes, as Bedrock sorts them; empty without writes)."""
    out: dict[str, Any] = {
        "inputTokens": plan.prompt_tokens - plan.cached_tokens - plan.cache_write_tokens,
        "outputTokens": plan.completion_tokens,
        "totalTokens": plan.prompt_tokens + plan.completion_tokens,
    }
    if plan.cached_tokens or plan.cache_write_tokens:
        out["cacheReadInputTokens"] = plan.cached_tokens
        out["cacheWriteInputTokens"] = plan.cache_write_tokens
        hour = plan.cache_write_1h_tokens
        details = [("1h", hour), ("5m", plan.cache_write_tokens - hour)]
        out["cacheDetails"] = [{"ttl": ttl, "inputTokens": n} for ttl, n in details if n]
    return out


def converse_render(plan: Plan) -> bytes:
    content: list[dict[str, Any]] = []
    if plan.reasoning:
        text = {"text": plan.reasoning, "signature": plan.signature}
        content.append({"reasoningContent": {"reasoningText": text}})
    if plan.text or not plan.tool_calls:
        content.append({"text": plan.text})
    for call in plan.tool_calls:
        tool_use = {"toolUseId": f"tooluse_{call.id}", "name": call.name}
        content.append({"toolUse": {**tool_use, "input": orjson.loads(call.arguments)}})
    out = {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": STOP_REASONS[plan.finish],
        "usage": usage(plan),
        "metrics": {"latencyMs": 100},
    }
    return orjson.dumps(out)


def _event(event_type: str, payload: dict[str, Any]) -> bytes:
    """An event message, its payload padded as Bedrock pads it."""
    raw = orjson.dumps(payload)
    padded = payload | {"p": PADDING[: 1 + len(raw) % len(PADDING)]}
    return encode_event(event_type, orjson.dumps(padded))


def converse_stream(plan: Plan) -> list[tuple[int, bytes]]:
    events = [(HEAD, _event("messageStart", {"role": "assistant"}))]
    index = 0

    def block(start: dict[str, Any] | None, deltas: list[tuple[int, dict[str, Any]]]) -> None:
        nonlocal index
        if start is not None:
            payload = {"start": start, "contentBlockIndex": index}
            events.append((HEAD, _event("contentBlockStart", payload)))
        for kind, delta in deltas:
            payload = {"delta": delta, "contentBlockIndex": index}
            events.append((kind, _event("contentBlockDelta", payload)))
        events.append((HEAD, _event("contentBlockStop", {"contentBlockIndex": index})))
        index += 1

    if plan.reasoning:
        deltas = [(CONTENT, {"reasoningContent": {"text": p}}) for p in plan.reasoning_pieces]
        deltas.append((HEAD, {"reasoningContent": {"signature": plan.signature}}))
        block(None, deltas)
    if plan.text or not plan.tool_calls:
        block(None, [(CONTENT, {"text": p}) for p in plan.pieces])
    for call in plan.tool_calls:
        start = {"toolUse": {"toolUseId": f"tooluse_{call.id}", "name": call.name}}
        block(start, [(CONTENT, {"toolUse": {"input": p}}) for p in call.pieces])
    events.append((TAIL, _event("messageStop", {"stopReason": STOP_REASONS[plan.finish]})))
    metadata = {"usage": usage(plan), "metrics": {"latencyMs": 100}}
    events.append((TAIL, _event("metadata", metadata)))
    return events


def invoke_stream(plan: Plan) -> list[tuple[int, bytes]]:
    """The Messages stream's events, each in a ``chunk`` event (pings left out)."""
    events = []
    for kind, sse in anthropic.stream(plan):
        data = sse.split(b"\ndata: ", 1)[1].rstrip(b"\n")
        payload = orjson.loads(data)
        if payload.get("type") == "ping":
            continue
        if payload.get("type") == "message_stop":
            payload["amazon-bedrock-invocationMetrics"] = {
                "inputTokenCount": plan.prompt_tokens,
                "outputTokenCount": plan.completion_tokens,
                "invocationLatency": 100,
                "firstByteLatency": 50,
            }
            data = orjson.dumps(payload)
        events.append((kind, _event("chunk", {"bytes": base64.b64encode(data).decode()})))
    return events


def invoke_headers(plan: Plan) -> dict[str, str]:
    """A whole invoke reply's token counts, as Bedrock gives them in headers."""
    return {
        "X-Amzn-Bedrock-Input-Token-Count": str(plan.prompt_tokens),
        "X-Amzn-Bedrock-Output-Token-Count": str(plan.completion_tokens),
    }


def stream_error(error_type: str | None, message: str | None, written: int) -> bytes:
    """An exception inside a stream (``serviceUnavailableException`` unless one is given)."""
    name = error_type or "ServiceUnavailableException"
    payload = orjson.dumps(error_payload(name, message))
    return encode_exception(name[:1].lower() + name[1:], payload)
