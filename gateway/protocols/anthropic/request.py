"""Messages API requests, both ways: a client's Messages request decoded into the
chat-completions shape, and a chat request encoded for an anthropic channel
(``{base_url}/v1/messages``, and ``/v1/messages/count_tokens`` for a count).
"""

from __future__ import annotations

import orjson

from gateway.errors import GatewayError, InvalidRequestError
from gateway.protocols.anthropic.cache import add_breakpoints, has_markers
from gateway.protocols.anthropic.reply import assistant_blocks, decode_assistant_blocks
from gateway.protocols.base import RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.fields import REQUEST
from gateway.types import JSON, ChatMessage, ChatRequest

DEFAULT_VERSION = "2023-06-01"
EFFORT_BUDGETS = {"minimal": 1024, "low": 1024, "medium": 4096, "high": 16384}
MIN_BUDGET = 1024
COUNT_FIELDS = ("model", "messages", "system", "tools", "tool_choice", "thinking")
SYSTEM_ROLES = ("system", "developer")


# Messages -> chat (client side) -----------------------------------------------------------
def _text_of(blocks: JSON, where: str) -> list[str]:
    if isinstance(blocks, str):
        return [blocks]
    if not isinstance(blocks, list):
        raise InvalidRequestError(f"{where}: must be a string or a list of text blocks")
    texts = []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or not isinstance(block.get("text"), str):
            raise InvalidRequestError(f"{where}.{i}: must be a text block")
        texts.append(block["text"])
    return texts


def _decode_system(blocks: JSON, where: str) -> list[ChatMessage]:
    """System text (a string or text blocks) -> one chat system message; none when empty."""
    texts = _text_of(blocks, where)
    if len(texts) == 1:
        return [{"role": "system", "content": texts[0]}]
    if texts:
        return [{"role": "system", "content": [{"type": "text", "text": t} for t in texts]}]
    return []


def _decode_media(block: dict[str, JSON], where: str) -> JSON:
    """An image or document block -> a chat content part."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise InvalidRequestError(f"{where}.source: required")
    stype = source.get("type")
    if stype == "base64":
        REQUEST.text(source.get("media_type"), f"{where}.source", "media_type")
        REQUEST.text(source.get("data"), f"{where}.source", "data")
    if block["type"] == "image":
        if stype == "base64":
            url = f"data:{source.get('media_type')};base64,{source.get('data')}"
            return {"type": "image_url", "image_url": {"url": url}}
        if stype == "url" and isinstance(source.get("url"), str):
            return {"type": "image_url", "image_url": {"url": source["url"]}}
    else:  # document
        if stype == "base64":
            data = f"data:{source.get('media_type')};base64,{source.get('data')}"
            part: dict[str, JSON] = {"file_data": data}
            if isinstance(block.get("title"), str):
                part["filename"] = block["title"]
            return {"type": "file", "file": part}
        if stype == "text" and isinstance(source.get("data"), str):
            return {"type": "text", "text": source["data"]}
    raise InvalidRequestError(f"{where}.source.type: {str(stype)!r} cannot be sent to this model")


def _decode_parts(blocks: list[JSON], where: str) -> list[JSON]:
    parts: list[JSON] = []
    for j, block in enumerate(blocks):
        btype = block.get("type") if isinstance(block, dict) else None
        if btype == "text":
            text = REQUEST.opt_text(block.get("text"), f"{where}.{j}", "text")
            parts.append({"type": "text", "text": text or ""})
        elif btype in ("image", "document"):
            parts.append(_decode_media(block, f"{where}.{j}"))
        elif btype is None:
            raise InvalidRequestError(f"{where}.{j}: must be a content block with a type")
        # other block types (server tools, search results, ...) are not carried
    return parts


def _simplify(parts: list[JSON]) -> JSON:
    """A lone text part becomes a plain string, as most chat clients write it."""
    if len(parts) == 1 and parts[0].get("type") == "text":
        return parts[0]["text"]
    return parts


def _decode_user(content: JSON, where: str) -> list[ChatMessage]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[ChatMessage] = []
    rest: list[JSON] = []
    for j, block in enumerate(content):
        if isinstance(block, dict) and block.get("type") == "tool_result":
            at = f"{where}.{j}"
            result = block.get("content")
            if isinstance(result, list):
                result = _simplify(_decode_parts(result, f"{at}.content"))
            elif result is not None and not isinstance(result, str):
                raise REQUEST.bad(at, "content", "a string or a list of blocks")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": REQUEST.text(block.get("tool_use_id"), at, "tool_use_id"),
                    "content": result if result is not None else "",
                }
            )
        else:
            rest.append(block)
    if rest:
        parts = _decode_parts(rest, where)
        if parts:
            out.append({"role": "user", "content": _simplify(parts)})
    return out


def _decode_tool_choice(choice: JSON, req: ChatRequest) -> None:
    if not isinstance(choice, dict):
        raise InvalidRequestError("tool_choice: must be an object")
    ctype = choice.get("type")
    if ctype == "auto":
        req["tool_choice"] = "auto"
    elif ctype == "any":
        req["tool_choice"] = "required"
    elif ctype == "none":
        req["tool_choice"] = "none"
    elif ctype == "tool":
        name = REQUEST.text(choice.get("name"), "tool_choice", "name")
        req["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise InvalidRequestError(f"tool_choice.type: unknown value {str(ctype)!r}")
    if choice.get("disable_parallel_tool_use") is True:
        req["parallel_tool_calls"] = False


def _effort(thinking: JSON) -> str | None:
    if not isinstance(thinking, dict):
        return None
    if thinking.get("type") == "adaptive":
        return "medium"
    if thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    if type(budget) is not int:
        raise InvalidRequestError("thinking.budget_tokens: must be an integer")
    return "low" if budget <= 2048 else "medium" if budget <= 8192 else "high"


def decode_messages_request(payload: JSON, route: RouteMatch) -> ChatRequest:
    if not isinstance(payload, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("model: Field required")
    raw_messages = payload.get("messages")
    if not isinstance(raw_messages, list):
        raise InvalidRequestError("messages: Field required")
    req: ChatRequest = {"model": model}
    messages: list[ChatMessage] = []
    if payload.get("system") is not None:
        messages.extend(_decode_system(payload["system"], "system"))
    for i, m in enumerate(raw_messages):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise InvalidRequestError(f"{where}: must be an object")
        content = m.get("content")
        if not isinstance(content, str | list):
            raise InvalidRequestError(f"{where}.content: must be a string or a list of blocks")
        role = m.get("role")
        if role == "user":
            messages.extend(_decode_user(content, f"{where}.content"))
        elif role == "assistant":
            messages.append(decode_assistant_blocks(content, f"{where}.content"))
        elif role == "system":  # mid-conversation (Claude Code): kept where it stands
            messages.extend(_decode_system(content, f"{where}.content"))
        else:
            raise InvalidRequestError(f"{where}.role: must be 'user', 'assistant' or 'system'")
    req["messages"] = messages
    if route.capability == "chat":
        max_tokens = payload.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            raise InvalidRequestError("max_tokens: Field required")
        req["max_tokens"] = max_tokens
        if payload.get("stream") is True:
            req["stream"] = True
    for key in ("temperature", "top_p"):
        if payload.get(key) is not None:
            req[key] = REQUEST.number(payload[key], key)
    if payload.get("top_k") is not None:
        req["top_k"] = REQUEST.integer(payload["top_k"], "top_k")
    stops = REQUEST.opt_array(payload.get("stop_sequences"), "stop_sequences")
    if stops:
        req["stop"] = REQUEST.texts(stops, "stop_sequences")
    tools = REQUEST.opt_array(payload.get("tools"), "tools")
    if tools:
        converted = []
        for i, t in enumerate(tools):
            t = REQUEST.obj(t, "tools", i)
            if t.get("type") not in (None, "custom"):
                continue
            at = f"tools.{i}"
            function: dict[str, JSON] = {"name": REQUEST.text(t.get("name"), at, "name")}
            description = REQUEST.opt_text(t.get("description"), at, "description")
            if description is not None:
                function["description"] = description
            schema = REQUEST.opt_obj(t.get("input_schema"), at, "input_schema")
            if schema is not None:
                function["parameters"] = schema
            converted.append({"type": "function", "function": function})
        if converted:
            req["tools"] = converted
            if payload.get("tool_choice") is not None:
                _decode_tool_choice(payload["tool_choice"], req)
    metadata = REQUEST.opt_obj(payload.get("metadata"), "metadata")
    if metadata is not None and metadata.get("user_id") is not None:
        req["user"] = REQUEST.text(metadata["user_id"], "metadata", "user_id")
    effort = _effort(payload.get("thinking"))
    if effort:
        req["reasoning_effort"] = effort
    return req


# chat -> Messages (upstream side) -----------------------------------------------------------
def _parse_data_url(url: str, where: str) -> tuple[str, str]:
    header, comma, data = url[5:].partition(",")
    if not comma or not header.endswith(";base64"):
        raise InvalidRequestError(f"{where}: only base64 data URLs are supported")
    return header[: -len(";base64")], data


def _encode_part(part: JSON, where: str) -> JSON | None:
    if isinstance(part, str):
        return {"type": "text", "text": part} if part else None
    if not isinstance(part, dict):
        raise InvalidRequestError(f"{where}: must be a content part")
    ptype = part.get("type")
    if ptype in ("text", "refusal"):
        text = REQUEST.opt_text(part.get(ptype), where, ptype)
        return {"type": "text", "text": text} if text else None
    if ptype == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str):
            raise InvalidRequestError(f"{where}.image_url.url: required")
        if url.startswith("data:"):
            media_type, data = _parse_data_url(url, f"{where}.image_url.url")
            source = {"type": "base64", "media_type": media_type, "data": data}
            return {"type": "image", "source": source}
        return {"type": "image", "source": {"type": "url", "url": url}}
    if ptype == "file":
        file = part.get("file")
        data_url = file.get("file_data") if isinstance(file, dict) else None
        if not isinstance(data_url, str) or not data_url.startswith("data:"):
            raise InvalidRequestError(f"{where}.file: only inline file_data is supported")
        media_type, data = _parse_data_url(data_url, f"{where}.file.file_data")
        source = {"type": "base64", "media_type": media_type, "data": data}
        block: dict[str, JSON] = {"type": "document", "source": source}
        if isinstance(file, dict) and isinstance(file.get("filename"), str):
            block["title"] = file["filename"]
        return block
    raise InvalidRequestError(f"{where}.type: {str(ptype)!r} cannot be sent to this model")


def _encode_content(content: JSON, where: str) -> list[JSON]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}: must be a string or a list of parts")
    blocks = [_encode_part(p, f"{where}.{j}") for j, p in enumerate(content)]
    return [b for b in blocks if b is not None]


def _encode_assistant(msg: ChatMessage, where: str) -> list[JSON]:
    """An assistant message of the history -> its blocks. Thinking goes only with its
    signature: the Messages API refuses unsigned thinking."""
    signature = msg.get("reasoning_signature")

    def bad_arguments(k: int) -> GatewayError:
        return InvalidRequestError(f"{where}.tool_calls.{k}.function.arguments: not valid JSON")

    content = _encode_content(msg.get("content"), f"{where}.content")
    thinking = msg.get("reasoning_content") if signature else None
    return assistant_blocks(msg, content, thinking, signature, bad_arguments, REQUEST, where)


def _encode_messages(messages: list[ChatMessage]) -> tuple[list[JSON], list[str]]:
    """Chat messages -> (Messages turns, system texts). Consecutive same-role turns merge."""
    system: list[str] = []
    turns: list[tuple[str, list[JSON]]] = []
    for i, msg in enumerate(messages):
        where = f"messages.{i}"
        role = msg.get("role")
        if role in SYSTEM_ROLES:
            content = msg.get("content")
            blocks = _encode_content(content, f"{where}.content")
            system.extend(b["text"] for b in blocks if b.get("type") == "text")
            continue
        if role == "user":
            blocks = _encode_content(msg.get("content"), f"{where}.content")
        elif role == "assistant":
            blocks = _encode_assistant(msg, where)
        elif role in ("tool", "function"):
            result = msg.get("content")
            call_id = REQUEST.text(msg.get("tool_call_id"), where, "tool_call_id")
            block: dict[str, JSON] = {"type": "tool_result", "tool_use_id": call_id}
            if isinstance(result, list):
                block["content"] = _encode_content(result, f"{where}.content")
            elif result:
                block["content"] = REQUEST.text(result, where, "content")
            blocks, role = [block], "user"
        else:
            raise InvalidRequestError(f"{where}.role: unknown role {str(role)!r}")
        if not blocks:
            continue  # the Messages API rejects empty turns
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    out: list[JSON] = []
    for role, blocks in turns:
        if len(blocks) == 1 and blocks[0].get("type") == "text":
            out.append({"role": role, "content": blocks[0]["text"]})
        else:
            out.append({"role": role, "content": blocks})
    return out, system


def _encode_tools(req: ChatRequest, body: dict[str, JSON]) -> None:
    tools = []
    for i, tool in enumerate(REQUEST.opt_array(req.get("tools"), "tools")):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not function.get("name"):
            raise InvalidRequestError("tools: each tool must be a function with a name")
        at = f"tools[{i}].function"
        out: dict[str, JSON] = {"name": REQUEST.text(function["name"], at, "name")}
        if function.get("description"):
            out["description"] = REQUEST.text(function["description"], at, "description")
        out["input_schema"] = REQUEST.opt_obj(function.get("parameters"), at, "parameters") or {
            "type": "object",
            "properties": {},
        }
        tools.append(out)
    if not tools:
        return
    body["tools"] = tools
    choice = req.get("tool_choice")
    encoded: dict[str, JSON] | None = None
    if choice == "auto":
        encoded = {"type": "auto"}
    elif choice == "required":
        encoded = {"type": "any"}
    elif choice == "none":
        encoded = {"type": "none"}
    elif isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not name or not isinstance(name, str):
            raise InvalidRequestError("tool_choice.function.name: required, a string")
        encoded = {"type": "tool", "name": name}
    elif choice is not None:
        raise InvalidRequestError(f"tool_choice: unknown value {str(choice)[:40]!r}")
    if req.get("parallel_tool_calls") is False and (encoded or {}).get("type") != "none":
        encoded = encoded or {"type": "auto"}
        encoded["disable_parallel_tool_use"] = True
    if encoded is not None:
        body["tool_choice"] = encoded


def encode_messages_body(req: ChatRequest, target: UpstreamTarget) -> dict[str, JSON]:
    messages, system = _encode_messages(REQUEST.opt_array(req.get("messages"), "messages"))
    max_tokens = REQUEST.opt_integer(
        req.get("max_completion_tokens"), "max_completion_tokens"
    ) or REQUEST.opt_integer(req.get("max_tokens"), "max_tokens")
    if not max_tokens:
        max_tokens = target.default_max_tokens
    body: dict[str, JSON] = {"model": target.model, "max_tokens": max_tokens}
    if len(system) == 1:
        body["system"] = system[0]
    elif system:
        body["system"] = [{"type": "text", "text": t} for t in system]
    body["messages"] = messages
    for key in ("temperature", "top_p"):
        if req.get(key) is not None:
            body[key] = REQUEST.number(req[key], key)
    if req.get("top_k") is not None:
        body["top_k"] = REQUEST.integer(req["top_k"], "top_k")
    stop = req.get("stop")
    if stop is not None:
        stops = REQUEST.stop(stop, "stop")
        if stops:
            body["stop_sequences"] = stops
    _encode_tools(req, body)
    budget = EFFORT_BUDGETS.get(
        REQUEST.opt_text(req.get("reasoning_effort"), "reasoning_effort") or ""
    )
    if budget:
        budget = min(budget, max_tokens - 1)
        if budget >= MIN_BUDGET:
            body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    if req.get("user"):
        body["metadata"] = {"user_id": REQUEST.text(req["user"], "user")}
    if target.stream:
        body["stream"] = True
    if target.prompt_cache and not has_markers(req):
        add_breakpoints(body)  # the channel's prompt_cache: auto (``cache.py``)
    return body


def upstream_headers(target: UpstreamTarget) -> dict[str, str]:
    headers = {
        "x-api-key": target.api_key,
        "anthropic-version": target.client_headers.get("anthropic-version") or DEFAULT_VERSION,
        "content-type": "application/json",
    }
    beta = target.client_headers.get("anthropic-beta")
    if beta:
        headers["anthropic-beta"] = beta
    return headers


def upstream_url(target: UpstreamTarget, count: bool = False) -> str:
    base = target.base_url.rstrip("/")
    return f"{base}/v1/messages/count_tokens" if count else f"{base}/v1/messages"


def encode_request(req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
    body = encode_messages_body(req, target)
    return UpstreamCall(
        url=upstream_url(target), headers=upstream_headers(target), body=orjson.dumps(body)
    )


def count_request(req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
    """The count request: the fields ``count_tokens`` takes of the Messages request."""
    full = encode_messages_body(req, target)
    body = {k: full[k] for k in COUNT_FIELDS if k in full}
    return UpstreamCall(
        url=upstream_url(target, count=True),
        headers=upstream_headers(target),
        body=orjson.dumps(body),
    )
