"""Chat-completions replies -> Response objects, and the pieces the stream encoder shares.

Output items in the order a Responses model gives them: a ``reasoning`` item (summary from the
thinking text, ``encrypted_content`` the opaque signature), one ``reasoning`` item per
Anthropic ``redacted_thinking`` block (``encrypted_content`` its data after ``REDACTED``, so
that it goes back as that block), a ``message`` with one ``output_text`` part, then one
``function_call`` per tool call (a ``custom_tool_call`` for a custom tool's), a call that
carries Gemini's ``thought_signature`` preceded by a ``reasoning`` item with no summary whose
``encrypted_content`` is that signature (it goes back to that call, see ``request``). A reply
cut by the token limit is ``status: incomplete`` with ``incomplete_details.reason:
max_output_tokens``, one stopped by a content filter (Gemini SAFETY and the like, Anthropic's
refusal) with ``content_filter``; its last item, the one the cut fell in, is ``incomplete`` too
when it is a message or a call (as OpenAI marks it). Ids derive from the request id; nothing is
stored (``store: false``).
"""

from __future__ import annotations

from gateway.errors import GatewayError
from gateway.protocols.base import Ctx, count, usage_parts
from gateway.protocols.responses.custom import input_of
from gateway.protocols.responses.tools import split_name
from gateway.types import JSON, ChatResponse, ToolCall, Usage

# ``encrypted_content`` of a reasoning item that stands for an Anthropic ``redacted_thinking``
# block: a prefix no signature starts with (signatures are base64, without ':')
REDACTED = "redacted_thinking:"
# why a reply is incomplete, by its chat finish reason
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
# ResponseError.code by status (the SDK's list has no code for the others)
ERROR_CODES = {400: "invalid_prompt", 413: "invalid_prompt", 429: "rate_limit_exceeded"}


def response_id(ctx: Ctx) -> str:
    return f"resp_{ctx.request_id}"


def reasoning_item(item_id: str, text: str, signature: str | None) -> dict[str, JSON]:
    summary = [{"type": "summary_text", "text": text}] if text else []
    return {"type": "reasoning", "id": item_id, "summary": summary, "encrypted_content": signature}


def message_item(ctx: Ctx, text: str, status: str) -> dict[str, JSON]:
    return {
        "type": "message",
        "id": f"msg_{ctx.request_id}",
        "status": status,
        "role": "assistant",
        "content": [output_text(text)] if status != "in_progress" else [],
    }


def output_text(text: str) -> dict[str, JSON]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_item(ctx: Ctx, n: int, call_id: str, name: str, arguments: str, status: str) -> JSON:
    """A function call; one of a namespace tool's functions with its namespace apart; the call
    of a custom tool's function as that tool's ``custom_tool_call``, its ``input`` the text of
    the function's one parameter (``custom``)."""
    custom = name in ctx.custom_tools
    namespace, name = split_name(name, ctx.tool_namespaces)
    if custom:
        item = {
            "type": "custom_tool_call",
            "id": f"ctc_{ctx.request_id}_{n}",
            "call_id": call_id,
            "name": name,
            "input": input_of(arguments),
            "status": status,
        }
    else:
        item = {
            "type": "function_call",
            "id": f"fc_{ctx.request_id}_{n}",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": status,
        }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def encode_usage(usage: Usage | None) -> JSON:
    """A ResponseUsage with every field the SDK's type requires (cache writes: Anthropic's)."""
    if not usage:
        return None
    parts = usage_parts(usage)
    return {
        "input_tokens": parts.prompt,
        "input_tokens_details": {
            "cached_tokens": parts.cache_read,
            "cache_write_tokens": parts.cache_write,
        },
        "output_tokens": parts.completion,
        "output_tokens_details": {"reasoning_tokens": parts.reasoning},
        "total_tokens": parts.prompt + parts.completion,
    }


def decode_usage(usage: JSON) -> Usage | None:
    """A Responses usage object (a pass-through's) in the chat-completions shape."""
    if not isinstance(usage, dict):
        return None
    out: Usage = {
        "prompt_tokens": count(usage.get("input_tokens")),
        "completion_tokens": count(usage.get("output_tokens")),
    }
    out["total_tokens"] = out["prompt_tokens"] + out["completion_tokens"]
    details = usage.get("input_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens"):
        out["prompt_tokens_details"] = {"cached_tokens": count(details["cached_tokens"])}
    if isinstance(details, dict) and details.get("cache_write_tokens"):
        out["cache_creation_tokens"] = count(details["cache_write_tokens"])
    details = usage.get("output_tokens_details")
    if isinstance(details, dict) and details.get("reasoning_tokens"):
        out["completion_tokens_details"] = {"reasoning_tokens": count(details["reasoning_tokens"])}
    return out


def error_object(err: GatewayError) -> dict[str, JSON]:
    """A failed response's ``error``: a code from the SDK's ``ResponseError.code`` list."""
    return {"code": ERROR_CODES.get(err.status, "server_error"), "message": err.message}


def envelope(
    ctx: Ctx, status: str, output: list[JSON], usage: JSON, finish: str | None
) -> dict[str, JSON]:
    """A Response object around its output items."""
    reason = INCOMPLETE.get(finish) if finish else None
    if reason is not None and status == "completed":
        status = "incomplete"
    return {
        "id": response_id(ctx),
        "object": "response",
        "created_at": ctx.created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": reason} if reason is not None else None,
        "model": ctx.model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "store": False,
        "usage": usage,
    }


def encode_response(resp: ChatResponse, ctx: Ctx) -> JSON:
    choices = resp.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    rid = ctx.request_id
    output: list[JSON] = []
    reasoning = message.get("reasoning_content") or ""
    signature = message.get("reasoning_signature")
    if reasoning or signature:
        output.append(reasoning_item(f"rs_{rid}", reasoning, signature))
    for k, data in enumerate(message.get("redacted_reasoning") or ()):
        output.append(reasoning_item(f"rs_{rid}_redacted_{k}", "", REDACTED + data))
    content = message.get("content")
    if isinstance(content, list):  # parts: their text
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    finish = choice.get("finish_reason")
    cut = bool(finish) and finish in INCOMPLETE
    calls: list[ToolCall] = message.get("tool_calls") or []
    if content:
        status = "incomplete" if cut and not calls else "completed"
        output.append(message_item(ctx, content, status))
    for n, call in enumerate(calls):
        function = call.get("function") or {}
        signed = call.get("thought_signature")
        if signed:
            output.append(reasoning_item(f"rs_{rid}_call_{n}", "", signed))
        output.append(
            function_item(
                ctx,
                n,
                call.get("id") or f"call_{rid}_{n}",
                function.get("name") or "",
                function.get("arguments") or "",
                "incomplete" if cut and n == len(calls) - 1 else "completed",
            )
        )
    usage = encode_usage(resp.get("usage"))
    return envelope(ctx, "completed", output, usage, finish)
