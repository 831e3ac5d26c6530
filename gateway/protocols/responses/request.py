"""Responses API requests -> the chat-completions shape.

``instructions`` become the first system message; ``input`` (a string, or a list of items:
messages with ``input_text`` / ``input_image`` / ``output_text`` parts, ``function_call``,
``function_call_output``, ``reasoning``) becomes messages, a function call joining the
assistant message before it so that parallel calls stay one turn, and reasoning items
riding on the assistant message after them (summaries as ``reasoning_content``, an
``encrypted_content`` as the opaque ``reasoning_signature``, one that starts with
``REDACTED`` as Anthropic's ``redacted_reasoning``, so the next turn is accepted). A
reasoning item with no summary right before a function call that shares its turn with other
reasoning is that call's own ``thought_signature`` (how ``reply`` shows Gemini's signature on a
functionCall part). Flat function ``tools``, ``tool_choice``, ``text.format``,
``max_output_tokens``, ``reasoning.effort`` map to their chat-completions fields.

Tools and their names: ``tools``; custom tools, and their ``custom_tool_call`` and
``custom_tool_call_output`` items (a function's call and result): ``custom``.

Refused with a 400 naming the field: what needs a kept response (the gateway keeps nothing:
``previous_response_id``, ``conversation``, ``background``, ``item_reference`` items,
``input_file`` parts), the tools a client runs with item types of their own
(``local_shell``, ``computer_use_preview``), a ``tool_choice`` naming a function not in
``tools``. Dropped on purpose: the tools OpenAI runs itself (``web_search``, ``file_search``,
...: no other provider runs them, and clients such as Codex CLI always offer them), a
``tool_choice`` left without tools, ``store`` (always false), ``include``, ``metadata``,
``truncation``, ``service_tier``, ``user``, ``prompt_cache_key``, ``safety_identifier``
(docs/conversions.md).
"""

from __future__ import annotations

from gateway.protocols.responses.custom import arguments_of
from gateway.protocols.responses.reply import REDACTED
from gateway.protocols.responses.tools import all_tools, bad, decode_tool_choice, tool_name
from gateway.types import JSON, ChatMessage, ChatRequest, ToolCall

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
KEPT_AS_STATE = ("previous_response_id", "conversation")
CALLS = ("function_call", "custom_tool_call")  # tuples: a kind may be any JSON value
CALL_OUTPUTS = ("function_call_output", "custom_tool_call_output")


def decode_request(payload: JSON) -> ChatRequest:
    if not isinstance(payload, dict):
        raise bad("the request body must be a JSON object")
    for name in KEPT_AS_STATE:
        if payload.get(name) is not None:
            raise bad(
                f"'{name}' is not supported: this gateway keeps no responses; send the whole "
                "conversation in 'input' (store: false)"
            )
    if payload.get("background"):
        raise bad("'background' is not supported: responses are not kept")
    messages: list[ChatMessage] = []
    instructions = payload.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad("'instructions' must be a string")
        if instructions:
            messages.append({"role": "system", "content": instructions})
    messages.extend(decode_input(payload.get("input")))
    if not messages:
        raise bad("'input' is required")
    req: ChatRequest = {"model": payload["model"], "messages": messages}
    if payload.get("stream") is True:
        req["stream"] = True
    _sampling(payload, req)
    converted = all_tools(payload)
    if converted:
        req["tools"] = converted
    if payload.get("tool_choice") is not None:
        choice = decode_tool_choice(payload["tool_choice"], converted)
        if choice is not None:
            req["tool_choice"] = choice
    parallel = payload.get("parallel_tool_calls")
    if parallel is not None:
        if not isinstance(parallel, bool):
            raise bad("'parallel_tool_calls' must be a boolean")
        req["parallel_tool_calls"] = parallel
    text = payload.get("text")
    if text is not None:
        fmt = decode_text_format(text)
        if fmt is not None:
            req["response_format"] = fmt
    reasoning = payload.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise bad("'reasoning' must be an object")
        effort = reasoning.get("effort")
        if effort is not None:
            if not isinstance(effort, str):
                raise bad("'reasoning.effort' must be a string")
            req["reasoning_effort"] = effort
    return req


def _sampling(payload: dict[str, JSON], req: ChatRequest) -> None:
    max_tokens = payload.get("max_output_tokens")
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise bad("'max_output_tokens' must be a positive integer")
        req["max_tokens"] = max_tokens
    for name in ("temperature", "top_p"):
        value = payload.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad(f"'{name}' must be a number")
        req[name] = value


def decode_input(value: JSON) -> list[ChatMessage]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise bad("'input' must be a string or a list of items")
    messages: list[ChatMessage] = []
    reasoning: list[dict[str, JSON]] = []  # reasoning items waiting for their turn
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad(f"'{where}' must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "reasoning":
            reasoning.append(item)
            continue
        if kind == "message":
            message = decode_message(item, where)
            if message["role"] == "assistant":
                _carry_reasoning(message, reasoning, where)
                reasoning = []
            messages.append(message)
        elif kind in CALLS:
            call = decode_function_call(item, where)
            last = messages[-1] if messages else None
            joins = last is not None and last["role"] == "assistant"
            signature = _call_signature(reasoning, joins, where)
            if signature is not None:
                call["thought_signature"] = signature
                reasoning.pop()
            if last is not None and joins and not reasoning:
                last.setdefault("tool_calls", []).append(call)
            else:
                turn: ChatMessage = {"role": "assistant", "content": None, "tool_calls": [call]}
                _carry_reasoning(turn, reasoning, where)
                reasoning = []
                messages.append(turn)
        elif kind in CALL_OUTPUTS:
            messages.append(decode_function_output(item, where))
        elif kind == "additional_tools":
            continue  # its tools are the request's (``tools.all_tools``)
        elif kind == "item_reference":
            raise bad(f"'{where}': item references are not supported; send the item itself")
        else:
            raise bad(f"'{where}.type' {kind!r} is not supported")
    return messages


def _summary(item: dict[str, JSON], where: str) -> list[str]:
    summary = item.get("summary") or []
    if not isinstance(summary, list):
        raise bad(f"'{where}': a reasoning item's 'summary' must be a list")
    return [p["text"] for p in summary if isinstance(p, dict) and isinstance(p.get("text"), str)]


def _encrypted(item: dict[str, JSON]) -> str | None:
    encrypted = item.get("encrypted_content")
    return encrypted if isinstance(encrypted, str) and encrypted else None


def _call_signature(reasoning: list[dict[str, JSON]], joins: bool, where: str) -> str | None:
    """The signature a reasoning item right before a function call gives that call (Gemini's
    signature on a functionCall part): one with no summary whose turn has other reasoning, or
    that the call brings into a turn already begun. Alone at the start of a turn, it is the
    turn's (Anthropic's signature of a thinking block with no text; Gemini takes it for the
    turn's first call all the same)."""
    if not reasoning:
        return None
    item = reasoning[-1]
    encrypted = _encrypted(item)
    if encrypted is None or encrypted.startswith(REDACTED) or _summary(item, where):
        return None
    others = [r for r in reasoning[:-1] if not (_encrypted(r) or "").startswith(REDACTED)]
    return encrypted if others or joins else None


def _carry_reasoning(message: ChatMessage, items: list[dict[str, JSON]], where: str) -> None:
    """Reasoning items onto the assistant turn after them: summaries as its thinking, the last
    signature as its signature, redacted thinking (``REDACTED`` data) as its own blocks."""
    texts: list[str] = []
    redacted: list[str] = []
    for item in items:
        texts.extend(_summary(item, where))
        encrypted = _encrypted(item)
        if encrypted is None:
            continue
        if encrypted.startswith(REDACTED):
            redacted.append(encrypted[len(REDACTED) :])
        else:
            message["reasoning_signature"] = encrypted
    if texts:
        message["reasoning_content"] = "\n\n".join(texts)
    if redacted:
        message["redacted_reasoning"] = redacted


def decode_message(item: dict[str, JSON], where: str) -> ChatMessage:
    role = item.get("role")
    role = ROLES.get(role) if isinstance(role, str) else None
    if role is None:
        raise bad(f"'{where}.role' must be one of user, assistant, system, developer")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise bad(f"'{where}.content' must be a string or a list of parts")
    parts: list[JSON] = []
    for j, part in enumerate(content):
        parts.append(decode_part(part, f"{where}.content[{j}]"))
    if role != "user":  # only a user's turn carries images: the others are their text
        return {"role": role, "content": "".join(p["text"] for p in parts if p["type"] == "text")}
    return {"role": role, "content": parts}


def decode_part(part: JSON, where: str) -> dict[str, JSON]:
    if not isinstance(part, dict):
        raise bad(f"'{where}' must be an object")
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text", "refusal"):
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise bad(f"'{where}.text' must be a string")
        return {"type": "text", "text": text}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise bad(f"'{where}.image_url' must be a URL or a data: URL (file ids are not kept)")
        image: dict[str, JSON] = {"url": url}
        detail = part.get("detail")
        if isinstance(detail, str) and detail != "auto":
            image["detail"] = detail
        return {"type": "image_url", "image_url": image}
    raise bad(f"'{where}.type' {kind!r} is not supported")


def decode_function_call(item: dict[str, JSON], where: str) -> ToolCall:
    """A function call, or a custom tool's call (its ``input`` as its function's arguments)."""
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not isinstance(call_id, str) or not call_id:
        raise bad(f"'{where}.call_id' must be a string")
    if not isinstance(name, str) or not name:
        raise bad(f"'{where}.name' must be a string")
    if item.get("type") == "custom_tool_call":
        text = item.get("input")
        if not isinstance(text, str):
            raise bad(f"'{where}.input' must be a string")
        arguments = arguments_of(text)
    elif not isinstance(arguments, str):
        raise bad(f"'{where}.arguments' must be a string of JSON")
    namespace = item.get("namespace")
    if isinstance(namespace, str) and namespace:
        name = tool_name(namespace, name)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def decode_function_output(item: dict[str, JSON], where: str) -> ChatMessage:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or not call_id:
        raise bad(f"'{where}.call_id' must be a string")
    if isinstance(output, list):
        texts = []
        for j, part in enumerate(output):
            decoded = decode_part(part, f"{where}.output[{j}]")
            if decoded["type"] != "text":
                raise bad(f"'{where}.output[{j}]': only text is carried in a function's output")
            texts.append(decoded["text"])
        output = "".join(texts)
    if not isinstance(output, str):
        raise bad(f"'{where}.output' must be a string")
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def decode_text_format(text: JSON) -> JSON:
    if not isinstance(text, dict):
        raise bad("'text' must be an object")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad("'text.format' must be an object")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        name, schema = fmt.get("name"), fmt.get("schema")
        if not isinstance(name, str) or not isinstance(schema, dict):
            raise bad("'text.format' json_schema needs a 'name' and a 'schema' object")
        spec: dict[str, JSON] = {"name": name, "schema": schema}
        for field in ("strict", "description"):
            if fmt.get(field) is not None:
                spec[field] = fmt[field]
        return {"type": "json_schema", "json_schema": spec}
    raise bad("'text.format.type' must be text, json_object or json_schema")
