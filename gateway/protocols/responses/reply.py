"""Chat-completions replies -> Response objects, and the pieces the stream encoder shares.

Output items in the order a Responses model gives them: a ``reasoning`` item (summary from the
thinking text, ``encrypted_content`` the opaque signature), a ``message`` with one
``output_text`` part, then one ``function_call`` per tool call. A reply cut by the token limit
is ``status: incomplete`` with ``incomplete_details.reason: max_output_tokens``. Ids derive
from the request id; nothing is stored (``store: false``).
"""

from __future__ import annotations

from gateway.protocols.base import Ctx, count
from gateway.protocols.responses.tools import split_name
from gateway.types import JSON, ChatResponse, ToolCall, Usage


def response_id(ctx: Ctx) -> str:
    return f"resp_{ctx.request_id}"


def reasoning_item(ctx: Ctx, text: str, signature: str | None) -> dict[str, JSON]:
    summary = [{"type": "summary_text", "text": text}] if text else []
    return {
        "type": "reasoning",
        "id": f"rs_{ctx.request_id}",
        "summary": summary,
        "encrypted_content": signature,
    }


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
    """A function call; one of a namespace tool's functions with its namespace apart."""
    namespace, name = split_name(name, ctx.tool_namespaces)
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
    if not usage:
        return None
    prompt = count(usage.get("prompt_tokens"))
    completion = count(usage.get("completion_tokens"))
    cached = count((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
    reasoning = count((usage.get("completion_tokens_details") or {}).get("reasoning_tokens"))
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
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
    details = usage.get("output_tokens_details")
    if isinstance(details, dict) and details.get("reasoning_tokens"):
        out["completion_tokens_details"] = {"reasoning_tokens": count(details["reasoning_tokens"])}
    return out


def envelope(
    ctx: Ctx, status: str, output: list[JSON], usage: JSON, finish: str | None
) -> dict[str, JSON]:
    """A Response object around its output items."""
    incomplete = {"reason": "max_output_tokens"} if finish == "length" else None
    if incomplete is not None and status == "completed":
        status = "incomplete"
    return {
        "id": response_id(ctx),
        "object": "response",
        "created_at": ctx.created,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
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
    output: list[JSON] = []
    reasoning = message.get("reasoning_content") or ""
    signature = message.get("reasoning_signature")
    if reasoning or signature:
        output.append(reasoning_item(ctx, reasoning, signature))
    content = message.get("content")
    if isinstance(content, list):  # parts: their text
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if content:
        output.append(message_item(ctx, content, "completed"))
    calls: list[ToolCall] = message.get("tool_calls") or []
    for n, call in enumerate(calls):
        function = call.get("function") or {}
        output.append(
            function_item(
                ctx,
                n,
                call.get("id") or f"call_{ctx.request_id}_{n}",
                function.get("name") or "",
                function.get("arguments") or "",
                "completed",
            )
        )
    usage = encode_usage(resp.get("usage"))
    return envelope(ctx, "completed", output, usage, choice.get("finish_reason"))
