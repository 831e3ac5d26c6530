"""Converse replies, whole, toward the chat-completions shape, and the mappings replies and
streams share: stop reasons and usage (``ConverseResponse``, ``TokenUsage``).
"""

from __future__ import annotations

import orjson

from gateway.errors import UpstreamError
from gateway.protocols.base import count
from gateway.protocols.fields import REPLY
from gateway.types import JSON, ChatMessage, ChatResponse, ToolCall, Usage

FINISH_REASONS = {  # Converse stopReason -> chat finish_reason
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}  # malformed_model_output, malformed_tool_use and later ones: "stop"


def finish_reason(stop_reason: JSON) -> str:
    return FINISH_REASONS.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def decode_usage(usage: JSON) -> Usage:
    """``TokenUsage`` -> chat usage. ``inputTokens`` leaves out the prompt tokens read from or
    written to the prompt cache; prompt tokens count them all, as the total does. The writes
    of an hour (``cacheDetails``' entries with ``ttl: 1h``) cost more (cut to the writes where
    they are billed, ``Metered.classified``)."""
    if not isinstance(usage, dict):
        return {}
    fresh = count(usage.get("inputTokens"))
    read = count(usage.get("cacheReadInputTokens"))
    written = count(usage.get("cacheWriteInputTokens"))
    output = count(usage.get("outputTokens"))
    out: Usage = {
        "prompt_tokens": fresh + read + written,
        "completion_tokens": output,
        "total_tokens": fresh + read + written + output,
    }
    if read:
        out["prompt_tokens_details"] = {"cached_tokens": read}
    if written:
        out["cache_creation_tokens"] = written
        details = usage.get("cacheDetails")
        hour = sum(
            max(count(d.get("inputTokens")), 0)
            for d in (details if isinstance(details, list) else ())
            if isinstance(d, dict) and d.get("ttl") == "1h"
        )
        if hour > 0:
            out["cache_creation_1h_tokens"] = hour
    return out


def _reasoning(block: JSON, where: str, msg: ChatMessage, thinking: list[str]) -> None:
    block = REPLY.obj(block, where)
    text = REPLY.opt_obj(block.get("reasoningText"), where, "reasoningText")
    if text is not None:
        thinking.append(REPLY.opt_text(text.get("text"), where, "reasoningText.text") or "")
        signature = REPLY.opt_text(text.get("signature"), where, "reasoningText.signature")
        if signature:
            msg["reasoning_signature"] = signature
    redacted = REPLY.opt_text(block.get("redactedContent"), where, "redactedContent")
    if redacted:
        msg.setdefault("redacted_reasoning", []).append(redacted)


def decode_message(content: JSON) -> ChatMessage:
    """An assistant ``Message``'s content blocks -> a chat assistant message: text joined,
    ``toolUse`` -> tool calls (input as JSON text), ``reasoningContent`` -> reasoning."""
    msg: ChatMessage = {"role": "assistant", "content": None}
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    for j, block in enumerate(REPLY.array(content, "output.message", "content")):
        at = f"output.message.content[{j}]"
        block = REPLY.obj(block, at)
        if "text" in block:
            texts.append(REPLY.text(block["text"], at, "text"))
        elif "toolUse" in block:
            use = REPLY.obj(block["toolUse"], at, "toolUse")
            tool_input = use.get("input")
            calls.append(
                {
                    "id": REPLY.text(use.get("toolUseId"), at, "toolUse.toolUseId"),
                    "type": "function",
                    "function": {
                        "name": REPLY.text(use.get("name"), at, "toolUse.name"),
                        "arguments": orjson.dumps(
                            tool_input if tool_input is not None else {}
                        ).decode(),
                    },
                }
            )
        elif "reasoningContent" in block:
            _reasoning(block["reasoningContent"], f"{at}.reasoningContent", msg, thinking)
        # images, documents, citations, guardrail content: not carried
    if texts or not calls:
        msg["content"] = "".join(texts)
    if calls:
        msg["tool_calls"] = calls
    if any(thinking):
        msg["reasoning_content"] = "".join(thinking)
    return msg


def decode_response(payload: JSON) -> ChatResponse:
    """A ``ConverseResponse`` -> a chat completion (id, time and model are the client
    encoder's: Converse gives none)."""
    if not isinstance(payload, dict):
        raise UpstreamError("upstream sent a malformed Converse reply")
    output = REPLY.obj(payload.get("output"), "output")
    message = REPLY.obj(output.get("message"), "output", "message")
    msg = decode_message(message.get("content"))
    stop = REPLY.opt_text(payload.get("stopReason"), "stopReason")
    return {
        "id": "",
        "object": "chat.completion",
        "created": 0,
        "model": "",
        "choices": [{"index": 0, "message": msg, "finish_reason": finish_reason(stop)}],
        "usage": decode_usage(payload.get("usage")),
    }
