"""Gemini request conversion: generate-content requests <-> the chat request shape.

Owns decoding a client's generateContent body (contents, tools, toolConfig, generationConfig,
proto-name keys) into a chat request, encoding a chat request into a generateContent body
toward a gemini-type channel, and the JSON Schema <-> Gemini OpenAPI-subset schema reduction.
``assistant_parts`` is shared with the adapter's reply encoding. The mapping notes and the
fields not carried are in ``gemini``'s docstring; wire pieces shared with streams are in
``gemini_stream``.
"""

from __future__ import annotations

import mimetypes

import orjson

from gateway.errors import InvalidRequestError
from gateway.protocols.gemini_stream import function_call_part
from gateway.types import JSON, ChatMessage, ChatRequest, ToolCall

EFFORT_BUDGET = {"minimal": 512, "low": 1024, "medium": 8192, "high": 24576}
# The OpenAPI schema subset Gemini's `parameters` and `responseSchema` accept.
GEMINI_SCHEMA_KEYS = frozenset(
    "type format title description nullable enum maxItems minItems properties required"
    " minProperties maxProperties minLength maxLength pattern example anyOf propertyOrdering"
    " default items minimum maximum".split()
)


# --- schemas ----------------------------------------------------------------------------


def _has_ref(schema: JSON) -> bool:
    if isinstance(schema, dict):
        return "$ref" in schema or any(_has_ref(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_ref(v) for v in schema)
    return False


def _schema_to_gemini(schema: JSON) -> JSON:
    """JSON Schema -> the OpenAPI subset Gemini's ``parameters``/``responseSchema`` accept."""
    if not isinstance(schema, dict):
        return schema
    out: JSON = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, list):
            kinds = [t for t in value if t != "null"]
            if len(kinds) < len(value):
                out["nullable"] = True
            if len(kinds) == 1:
                out["type"] = kinds[0]
            elif kinds:
                out["anyOf"] = [{"type": t} for t in kinds]
        elif key == "const":
            out["enum"] = [value]
        elif key == "enum" and isinstance(value, list):
            out["enum"] = [v for v in value if v is not None]  # null is said by nullable
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: _schema_to_gemini(s) for name, s in value.items()}
        elif key == "items":
            out["items"] = _schema_to_gemini(value)
        elif key in ("anyOf", "oneOf") and isinstance(value, list):
            out["anyOf"] = [_schema_to_gemini(s) for s in value]
        elif key in GEMINI_SCHEMA_KEYS:
            out[key] = value
    return out


def _schema_to_json(schema: JSON) -> JSON:
    """Gemini's OpenAPI schema (upper-case types, nullable) -> JSON Schema."""
    if not isinstance(schema, dict):
        return schema
    schema = json_fields(schema, "schema")
    out: JSON = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            out["type"] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            out["properties"] = {name: _schema_to_json(s) for name, s in value.items()}
        elif key == "items":
            out["items"] = _schema_to_json(value)
        elif key == "anyOf" and isinstance(value, list):
            out["anyOf"] = [_schema_to_json(s) for s in value]
        elif key not in ("nullable", "propertyOrdering"):
            out[key] = value
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


# --- client side: generateContent request -> chat request --------------------------------


def _require_dict(value: JSON, what: str) -> dict[str, JSON]:
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{what} must be an object")
    return value


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def json_fields(value: JSON, what: str) -> dict[str, JSON]:
    """A Gemini request object with its keys in JSON (lowerCamelCase) spelling.

    Gemini's API, like every proto3 JSON endpoint, accepts a field's proto name
    (``mime_type``) as well as its JSON name (``mimeType``), and google-genai sends nested
    objects that way (``inlineData: {mime_type}``, ``parameters_json_schema``,
    ``thinkingConfig: {thinking_budget}``). Only this object's own keys are renamed: values
    that are free JSON (function args and responses, JSON schemas, property names) are not.
    """
    obj = _require_dict(value, what)
    if not any("_" in key for key in obj):
        return obj
    out: dict[str, JSON] = {}
    for key, item in obj.items():
        name = _camel(key) if "_" in key else key
        if name not in out or name == key:  # the JSON spelling wins over the proto one
            out[name] = item
    return out


def _merged_contents(contents: JSON) -> list[tuple[str, list[JSON]]]:
    if not isinstance(contents, list):
        raise InvalidRequestError("contents must be a list")
    merged: list[tuple[str, list[JSON]]] = []
    for content in contents:
        content = json_fields(content, "contents[]")
        role = content.get("role") or "user"
        if role not in ("user", "model", "function"):
            raise InvalidRequestError(f"contents[].role: unknown role {role!r}")
        role = "model" if role == "model" else "user"
        parts = content.get("parts") or []
        if not isinstance(parts, list):
            raise InvalidRequestError("contents[].parts must be a list")
        if merged and merged[-1][0] == role:
            merged[-1][1].extend(parts)
        else:
            merged.append((role, list(parts)))
    return merged


def _data_part(blob: JSON) -> JSON:
    blob = json_fields(blob, "inlineData")
    mime = str(blob.get("mimeType") or "")
    data = blob.get("data")
    if not isinstance(data, str):
        raise InvalidRequestError("inlineData.data must be a base64 string")
    if mime.startswith("audio/"):
        return {"type": "input_audio", "input_audio": {"data": data, "format": mime[6:]}}
    url = f"data:{mime};base64,{data}"
    if mime.startswith("image/"):
        return {"type": "image_url", "image_url": {"url": url}}
    return {"type": "file", "file": {"file_data": url}}


def _user_content(parts: list[JSON]) -> JSON:
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def decode_contents(payload: dict[str, JSON]) -> list[ChatMessage]:
    messages: list[ChatMessage] = []
    system = payload.get("systemInstruction")
    if system is not None:
        system = json_fields(system, "systemInstruction")
        lines = [p["text"] for p in system.get("parts") or () if isinstance(p.get("text"), str)]
        if lines:
            content: JSON = (
                lines[0] if len(lines) == 1 else [{"type": "text", "text": t} for t in lines]
            )
            messages.append({"role": "system", "content": content})
    unanswered: dict[str, list[str]] = {}  # function name -> call ids awaiting a response
    counter = 0
    for role, parts in _merged_contents(payload.get("contents")):
        if role == "model":
            texts: list[str] = []
            thoughts: list[str] = []
            calls: list[ToolCall] = []
            signature = None
            for part in parts:
                part = json_fields(part, "parts[]")
                call = part.get("functionCall")
                if call is not None:
                    call = json_fields(call, "functionCall")
                    name = str(call.get("name") or "")
                    call_id = call.get("id") or f"call_{counter}"
                    counter += 1
                    tool: ToolCall = {
                        "id": call_id,
                        "type": "function",
                        "function": {
                            "name": name,
                            "arguments": orjson.dumps(call.get("args") or {}).decode(),
                        },
                    }
                    if part.get("thoughtSignature"):
                        tool["thought_signature"] = part["thoughtSignature"]
                    calls.append(tool)
                    unanswered.setdefault(name, []).append(call_id)
                    continue
                if part.get("thoughtSignature"):
                    signature = part["thoughtSignature"]
                text = part.get("text")
                if isinstance(text, str) and text:
                    (thoughts if part.get("thought") else texts).append(text)
            msg: ChatMessage = {"role": "assistant", "content": "".join(texts) or None}
            if not texts and not calls:
                msg["content"] = ""
            if calls:
                msg["tool_calls"] = calls
            if thoughts:
                msg["reasoning_content"] = "".join(thoughts)
            if signature:
                msg["reasoning_signature"] = signature
            messages.append(msg)
            continue
        user_parts: list[JSON] = []
        for part in parts:
            part = json_fields(part, "parts[]")
            response = part.get("functionResponse")
            if response is not None:
                response = json_fields(response, "functionResponse")
                name = str(response.get("name") or "")
                waiting = unanswered.get(name) or []
                call_id = response.get("id")
                if call_id:
                    if call_id in waiting:
                        waiting.remove(call_id)
                elif waiting:
                    call_id = waiting.pop(0)
                else:  # a response to no call we saw: the upstream decides
                    call_id = f"call_{counter}"
                    counter += 1
                body = response.get("response")
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call_id,
                        "content": orjson.dumps(body if body is not None else {}).decode(),
                    }
                )
            elif isinstance(part.get("text"), str):
                user_parts.append({"type": "text", "text": part["text"]})
            elif "inlineData" in part:
                user_parts.append(_data_part(part["inlineData"]))
            elif "fileData" in part:
                uri = json_fields(part["fileData"], "fileData").get("fileUri")
                user_parts.append({"type": "image_url", "image_url": {"url": uri}})
        if user_parts:
            messages.append({"role": "user", "content": _user_content(user_parts)})
    return messages


def decode_tools(payload: dict[str, JSON], req: ChatRequest) -> None:
    tools: list[JSON] = []
    for tool in payload.get("tools") or ():
        for decl in json_fields(tool, "tools[]").get("functionDeclarations") or ():
            decl = json_fields(decl, "functionDeclarations[]")
            function: JSON = {"name": decl.get("name")}
            if decl.get("description"):
                function["description"] = decl["description"]
            if "parametersJsonSchema" in decl:
                function["parameters"] = decl["parametersJsonSchema"]
            elif "parameters" in decl:
                function["parameters"] = _schema_to_json(decl["parameters"])
            else:
                function["parameters"] = {"type": "object", "properties": {}}
            tools.append({"type": "function", "function": function})
    if tools:
        req["tools"] = tools
    config = json_fields(payload.get("toolConfig") or {}, "toolConfig").get("functionCallingConfig")
    if not isinstance(config, dict) or not tools:
        return  # a tool choice without tools is refused by chat-completions upstreams
    config = json_fields(config, "functionCallingConfig")
    mode = config.get("mode")
    names = config.get("allowedFunctionNames") or []
    if mode == "NONE":
        req["tool_choice"] = "none"
    elif mode == "ANY" and len(names) == 1:
        req["tool_choice"] = {"type": "function", "function": {"name": names[0]}}
    elif mode == "ANY":
        req["tool_choice"] = "required"
        if names:
            req["tools"] = [t for t in tools if t["function"]["name"] in names]
    elif mode in ("AUTO", "VALIDATED"):
        req["tool_choice"] = "auto"


def _effort_from_budget(budget: int) -> str:
    if budget == 0:
        return "none"
    if budget < 0 or 1024 < budget <= 8192:
        return "medium"
    return "low" if budget <= 1024 else "high"


def decode_generation(config: JSON, req: ChatRequest) -> None:
    config = json_fields(config, "generationConfig")
    simple = (
        ("temperature", "temperature"),
        ("topP", "top_p"),
        ("topK", "top_k"),
        ("maxOutputTokens", "max_tokens"),
        ("candidateCount", "n"),
        ("seed", "seed"),
        ("presencePenalty", "presence_penalty"),
        ("frequencyPenalty", "frequency_penalty"),
    )
    for src, dst in simple:
        if config.get(src) is not None:
            req[dst] = config[src]  # type: ignore[literal-required]
    if config.get("stopSequences"):
        req["stop"] = list(config["stopSequences"])
    if config.get("responseMimeType") == "application/json":
        if "responseJsonSchema" in config:
            schema = config["responseJsonSchema"]
        elif "responseSchema" in config:
            schema = _schema_to_json(config["responseSchema"])
        else:
            schema = None
        if schema is None:
            req["response_format"] = {"type": "json_object"}
        else:
            req["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": schema},
            }
    thinking = config.get("thinkingConfig")
    if isinstance(thinking, dict):
        thinking = json_fields(thinking, "thinkingConfig")
        if isinstance(thinking.get("thinkingLevel"), str):
            req["reasoning_effort"] = thinking["thinkingLevel"].lower()
        elif isinstance(thinking.get("thinkingBudget"), int):
            req["reasoning_effort"] = _effort_from_budget(thinking["thinkingBudget"])


# --- upstream side: chat request -> generateContent request ------------------------------


def _text_of(content: JSON) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    raise InvalidRequestError("message content must be a string or a list of parts")


def _url_part(url: JSON) -> JSON:
    if not isinstance(url, str) or not url:
        raise InvalidRequestError("image_url.url must be a string")
    if url.startswith("data:"):
        header, sep, data = url.partition(",")
        if not sep or not header.endswith(";base64"):
            raise InvalidRequestError("image_url: only base64 data URLs are supported")
        return {"inlineData": {"mimeType": header[5:-7], "data": data}}
    file_data: JSON = {"fileUri": url}
    mime, _ = mimetypes.guess_type(url.split("?", 1)[0])
    if mime:
        file_data["mimeType"] = mime
    return {"fileData": file_data}


def _user_parts(content: JSON) -> list[JSON]:
    if isinstance(content, str):
        return [{"text": content}]
    if not isinstance(content, list):
        raise InvalidRequestError("message content must be a string or a list of parts")
    parts: list[JSON] = []
    for part in content:
        part = _require_dict(part, "content[]")
        kind = part.get("type")
        if kind == "text":
            parts.append({"text": part.get("text", "")})
        elif kind == "image_url":
            parts.append(_url_part(_require_dict(part.get("image_url"), "image_url").get("url")))
        elif kind == "input_audio":
            audio = _require_dict(part.get("input_audio"), "input_audio")
            mime = f"audio/{audio.get('format') or 'wav'}"
            parts.append({"inlineData": {"mimeType": mime, "data": audio.get("data")}})
        elif kind == "file":
            data = _require_dict(part.get("file"), "file").get("file_data")
            parts.append(_url_part(data))
        else:
            raise InvalidRequestError(f"content part type {kind!r} is not supported by Gemini")
    return parts


def assistant_parts(msg: ChatMessage, *, upstream: bool) -> list[JSON]:
    """An assistant message -> model parts. ``reasoning_signature`` goes where Gemini puts a
    reply's signature: on the first functionCall when that call has none of its own (Gemini
    signs a function-calling turn there and rejects a history whose first call is unsigned;
    clients of other protocols bring the call's signature back this way); else on the text
    part; without text, on the thought part; else on an empty thought part."""
    parts: list[JSON] = []
    signature = msg.get("reasoning_signature")
    calls = msg.get("tool_calls") or ()
    if calls and calls[0].get("thought_signature"):
        pass  # the first call is signed: the reply's signature belongs to the text
    elif calls:
        calls = [{**calls[0], "thought_signature": signature}, *calls[1:]] if signature else calls
        signature = None
    thought: JSON = None
    if msg.get("reasoning_content"):
        thought = {"text": msg["reasoning_content"], "thought": True}
        parts.append(thought)
    text = _text_of(msg.get("content"))
    if text:
        parts.append({"text": text})
    if signature and (text or thought is not None):
        parts[-1]["thoughtSignature"] = signature
        signature = None
    for call in calls:
        function = call.get("function") or {}
        own = call.get("thought_signature")
        parts.append(
            function_call_part(
                call.get("id"),
                function.get("name") or "",
                function.get("arguments") or "",
                own,
                upstream=upstream,
            )
        )
    if signature:
        parts.append({"text": "", "thought": True, "thoughtSignature": signature})
    return parts


def _tool_response(content: JSON) -> JSON:
    text = _text_of(content)
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {"result": text}


def _encode_contents(messages: JSON) -> tuple[list[JSON], list[JSON]]:
    if not isinstance(messages, list):
        raise InvalidRequestError("messages must be a list")
    system: list[JSON] = []
    contents: list[JSON] = []
    names: dict[str, str] = {}  # tool call id -> function name

    def add(role: str, parts: list[JSON]) -> None:
        if not parts:
            return
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"role": role, "parts": parts})

    for msg in messages:
        msg = _require_dict(msg, "messages[]")
        role = msg.get("role")
        if role in ("system", "developer"):
            text = _text_of(msg.get("content"))
            if text:
                system.append({"text": text})
        elif role == "user":
            add("user", _user_parts(msg.get("content")))
        elif role == "assistant":
            for call in msg.get("tool_calls") or ():
                names[str(call.get("id"))] = (call.get("function") or {}).get("name") or ""
            parts = assistant_parts(msg, upstream=True)  # type: ignore[arg-type]
            add("model", parts)
        elif role == "tool":
            call_id = str(msg.get("tool_call_id"))
            if call_id not in names:
                raise InvalidRequestError(f"tool message {call_id!r} answers no earlier tool call")
            response = {"name": names[call_id], "response": _tool_response(msg.get("content"))}
            add("user", [{"functionResponse": response}])
        else:
            raise InvalidRequestError(f"messages[].role: unknown role {role!r}")
    return system, contents


def _encode_tools(req: ChatRequest, body: JSON) -> None:
    declarations: list[JSON] = []
    for tool in req.get("tools") or ():
        if tool.get("type") != "function":
            continue
        function = tool.get("function") or {}
        decl: JSON = {"name": function.get("name")}
        if function.get("description"):
            decl["description"] = function["description"]
        params = function.get("parameters")
        if params and _has_ref(params):
            decl["parametersJsonSchema"] = params
        elif params and (params.get("properties") or params.get("type") != "object"):
            decl["parameters"] = _schema_to_gemini(params)
        declarations.append(decl)
    if declarations:
        body["tools"] = [{"functionDeclarations": declarations}]
    choice = req.get("tool_choice")
    config: JSON = None
    if choice == "auto":
        config = {"mode": "AUTO"}
    elif choice == "none":
        config = {"mode": "NONE"}
    elif choice == "required":
        config = {"mode": "ANY"}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        config = {"mode": "ANY", "allowedFunctionNames": [name]}
    if config is not None and declarations:
        body["toolConfig"] = {"functionCallingConfig": config}


def _encode_generation(req: ChatRequest) -> JSON:
    config: JSON = {}
    simple = (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("top_k", "topK"),
        ("n", "candidateCount"),
        ("seed", "seed"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    )
    for src, dst in simple:
        if req.get(src) is not None:
            config[dst] = req[src]  # type: ignore[literal-required]
    max_tokens = req.get("max_completion_tokens") or req.get("max_tokens")
    if max_tokens:
        config["maxOutputTokens"] = max_tokens
    stop = req.get("stop")
    if stop:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    fmt = req.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        config["responseMimeType"] = "application/json"
        schema = (fmt.get("json_schema") or {}).get("schema")
        if schema is not None and _has_ref(schema):
            config["responseJsonSchema"] = schema
        elif schema is not None:
            config["responseSchema"] = _schema_to_gemini(schema)
    effort = req.get("reasoning_effort")
    if effort == "none":
        config["thinkingConfig"] = {"thinkingBudget": 0}
    elif effort in EFFORT_BUDGET:
        config["thinkingConfig"] = {
            "includeThoughts": True,
            "thinkingBudget": EFFORT_BUDGET[effort],
        }
    return config


def encode_body(req: ChatRequest, *, generation: bool = True) -> JSON:
    system, contents = _encode_contents(req.get("messages"))
    body: JSON = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": system}
    _encode_tools(req, body)
    if generation:
        config = _encode_generation(req)
        if config:
            body["generationConfig"] = config
    return body
