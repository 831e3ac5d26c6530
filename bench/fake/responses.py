"""OpenAI Responses API wire format (``POST /v1/responses``): the request read as the fake's
``Incoming``, the Response object, and its event stream.

Stream, event for event as OpenAI sends it: ``response.created``, ``response.in_progress``,
then per output item ``response.output_item.added``; for a reasoning item
``response.reasoning_summary_part.added``, its ``reasoning_summary_text`` deltas and
``.done``, ``response.reasoning_summary_part.done``; for a message
``response.content_part.added``, its ``output_text`` deltas (with ``logprobs``) and ``.done``,
``response.content_part.done``; for a function call its ``function_call_arguments`` deltas and
``.done`` (a call of a ``custom`` tool of the request is a ``custom_tool_call``, its ``input``
the call's ``input`` argument, with ``custom_tool_call_input`` deltas and ``.done``); then
``response.output_item.done``. Last ``response.completed``
(``response.incomplete`` when cut by the token limit) with the whole response, which echoes the
request's ``tools``, ``tool_choice``, ``parallel_tool_calls`` and ``store``. Every event
carries ``sequence_number``, an ``error`` event too.
"""

from __future__ import annotations

from typing import Any

import orjson

from bench.fake.incoming import Incoming, RequestShapeError, from_openai
from bench.fake.plan import CONTENT, HEAD, TAIL, Plan

SSE_TYPE = "text/event-stream; charset=utf-8"


def incoming(payload: Any) -> Incoming:
    """The request as chat messages, for the fake's counting and its directive."""
    if not isinstance(payload, dict):
        raise RequestShapeError("We could not parse the JSON body of your request.")
    tools = [t for t in payload.get("tools") or () if isinstance(t, dict)]
    chat = {
        "model": payload.get("model"),
        "messages": chat_messages(payload),
        "tools": tools,
        "max_tokens": payload.get("max_output_tokens"),
    }
    return from_openai(chat)


def chat_messages(payload: dict[str, Any]) -> list[Any]:
    """The instructions and input items as chat-completions messages."""
    messages: list[Any] = []
    if isinstance(payload.get("instructions"), str):
        messages.append({"role": "system", "content": payload["instructions"]})
    items = payload.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise RequestShapeError("Missing required parameter: 'input'.", "input")
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, list):
                content = [_chat_part(p) for p in content if isinstance(p, dict)]
            messages.append({"role": item.get("role"), "content": content})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            messages.append({"role": "tool", "content": str(item.get("output"))})
        elif kind in ("function_call", "custom_tool_call"):
            call = {"function": {"arguments": item.get("arguments", item.get("input"))}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    return messages


def _chat_part(part: dict[str, Any]) -> dict[str, Any]:
    """A Responses content part as chat completions has it (text, or an image's URL)."""
    if part.get("type") == "input_image":
        return {"type": "image_url", "image_url": {"url": part.get("image_url")}}
    return {"type": "text", "text": part.get("text", "")}


def _usage(plan: Plan) -> dict[str, Any]:
    return {
        "input_tokens": plan.prompt_tokens,
        "input_tokens_details": {"cached_tokens": plan.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": plan.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": plan.reasoning_tokens},
        "total_tokens": plan.prompt_tokens + plan.completion_tokens,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _custom_names(body: dict[str, Any]) -> frozenset[str]:
    tools = body.get("tools")
    return frozenset(
        t.get("name")
        for t in (tools if isinstance(tools, list) else ())
        if isinstance(t, dict) and t.get("type") == "custom"
    )


def _custom_input(arguments: str) -> str:
    value = orjson.loads(arguments)
    return str(value.get("input", "")) if isinstance(value, dict) else arguments


def _items(plan: Plan, body: dict[str, Any]) -> list[dict[str, Any]]:
    custom = _custom_names(body)
    items: list[dict[str, Any]] = []
    if plan.reasoning:
        summary = [{"type": "summary_text", "text": plan.reasoning}]
        items.append({"type": "reasoning", "id": f"rs_{plan.request_id}", "summary": summary})
    if plan.text or not plan.tool_calls:
        items.append(
            {
                "type": "message",
                "id": f"msg_{plan.request_id}",
                "status": "completed",
                "role": "assistant",
                "content": [_text_part(plan.text)],
            }
        )
    for call in plan.tool_calls:
        if call.name in custom:
            items.append(
                {
                    "type": "custom_tool_call",
                    "id": f"ctc_{call.id}",
                    "call_id": f"call_{call.id}",
                    "name": call.name,
                    "input": _custom_input(call.arguments),
                    "status": "completed",
                }
            )
            continue
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{call.id}",
                "call_id": f"call_{call.id}",
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    return items


def _response(
    plan: Plan, body: dict[str, Any], status: str, output: list[dict[str, Any]], usage: Any
) -> Any:
    """The Response object, with what OpenAI echoes of the request (its tools, tool choice,
    parallel calls, store)."""
    if status == "completed" and plan.finish == "length":
        status = "incomplete"
    tools = body.get("tools")
    return {
        "id": f"resp_{plan.request_id}",
        "object": "response",
        "created_at": plan.created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": plan.model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": tools if isinstance(tools, list) else [],
        "store": body.get("store", True),
        "usage": usage,
    }


def render(plan: Plan, body: dict[str, Any]) -> bytes:
    return orjson.dumps(_response(plan, body, "completed", _items(plan, body), _usage(plan)))


def stream(plan: Plan, body: dict[str, Any]) -> list[tuple[int, bytes]]:
    """The events; each element is one event, its ``sequence_number`` its position."""
    seq = 0

    def event(kind: str, fields: dict[str, Any]) -> bytes:
        nonlocal seq
        data = orjson.dumps({"type": kind, "sequence_number": seq, **fields})
        seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    shell = _response(plan, body, "in_progress", [], None)
    events = [
        (HEAD, event("response.created", {"response": shell})),
        (HEAD, event("response.in_progress", {"response": shell})),
    ]
    for index, item in enumerate(_items(plan, body)):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "reasoning":
            shown = {**item, "summary": []}
            added = {"output_index": index, "item": shown}
            events.append((HEAD, event("response.output_item.added", added)))
            at = {**where, "summary_index": 0}
            part = {**at, "part": {"type": "summary_text", "text": ""}}
            events.append((HEAD, event("response.reasoning_summary_part.added", part)))
            for piece in plan.reasoning_pieces:
                delta = {**at, "delta": piece}
                events.append((CONTENT, event("response.reasoning_summary_text.delta", delta)))
            done = {**at, "text": plan.reasoning}
            events.append((TAIL, event("response.reasoning_summary_text.done", done)))
            part = {**at, "part": {"type": "summary_text", "text": plan.reasoning}}
            events.append((TAIL, event("response.reasoning_summary_part.done", part)))
        elif item["type"] == "message":
            shown = {**item, "status": "in_progress", "content": []}
            added = {"output_index": index, "item": shown}
            events.append((HEAD, event("response.output_item.added", added)))
            at = {**where, "content_index": 0}
            part = _text_part("")
            events.append((HEAD, event("response.content_part.added", {**at, "part": part})))
            for piece in plan.pieces:
                delta = {**at, "delta": piece, "logprobs": []}
                events.append((CONTENT, event("response.output_text.delta", delta)))
            done = {**at, "text": plan.text, "logprobs": []}
            events.append((TAIL, event("response.output_text.done", done)))
            part = _text_part(plan.text)
            events.append((TAIL, event("response.content_part.done", {**at, "part": part})))
        elif item["type"] == "custom_tool_call":
            shown = {**item, "status": "in_progress", "input": ""}
            added = {"output_index": index, "item": shown}
            events.append((HEAD, event("response.output_item.added", added)))
            delta = {**where, "delta": item["input"]}
            events.append((CONTENT, event("response.custom_tool_call_input.delta", delta)))
            done = {**where, "input": item["input"]}
            events.append((TAIL, event("response.custom_tool_call_input.done", done)))
        else:
            shown = {**item, "status": "in_progress", "arguments": ""}
            added = {"output_index": index, "item": shown}
            events.append((HEAD, event("response.output_item.added", added)))
            call = next(c for c in plan.tool_calls if f"fc_{c.id}" == item["id"])
            for piece in call.pieces:
                delta = {**where, "delta": piece}
                events.append((CONTENT, event("response.function_call_arguments.delta", delta)))
            done = {**where, "name": call.name, "arguments": call.arguments}
            events.append((TAIL, event("response.function_call_arguments.done", done)))
        events.append(
            (TAIL, event("response.output_item.done", {"output_index": index, "item": item}))
        )
    final = _response(plan, body, "completed", _items(plan, body), _usage(plan))
    ending = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    events.append((TAIL, event(ending, {"response": final})))
    return events


def stream_error(error_type: str | None, message: str | None, written: int) -> bytes:
    """The ``error`` event after ``written`` events (so its ``sequence_number``)."""
    body = {
        "type": "error",
        "sequence_number": written,
        "code": error_type or "server_error",
        "message": message or "error",
        "param": None,
    }
    return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"
