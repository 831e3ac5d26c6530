"""Converse requests: a chat request encoded for Bedrock's Converse API,
``{base_url}/model/{id}/converse`` (``/converse-stream`` when streaming). Field names are
those of botocore's ``bedrock-runtime`` service model (``ConverseRequest``).
"""

from __future__ import annotations

import orjson

from gateway.errors import InvalidRequestError
from gateway.protocols.base import UpstreamCall, UpstreamTarget
from gateway.protocols.bedrock import model_path
from gateway.protocols.fields import REQUEST
from gateway.types import JSON, ChatRequest

SYSTEM_ROLES = ("system", "developer")
IMAGE_FORMATS = {  # media type -> ImageFormat
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/jpg": "jpeg",
    "image/gif": "gif",
    "image/webp": "webp",
}
DOCUMENT_FORMATS = {  # media type -> DocumentFormat
    "application/pdf": "pdf",
    "text/csv": "csv",
    "application/msword": "doc",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "application/vnd.ms-excel": "xls",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
    "text/html": "html",
    "text/plain": "txt",
    "text/markdown": "md",
}
EMPTY_SCHEMA = {"type": "object", "properties": {}}


def _data_url(url: str, where: str) -> tuple[str, str]:
    """A base64 data URL -> (media type, base64 data): a blob's JSON form already."""
    header, comma, data = url[5:].partition(",")
    if not url.startswith("data:") or not comma or not header.endswith(";base64"):
        raise InvalidRequestError(f"{where}: Converse takes files as base64 data: URLs")
    return header[: -len(";base64")].lower(), data


def _image(part: dict[str, JSON], where: str) -> JSON:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    media_type, data = _data_url(REQUEST.text(url, where, "image_url.url"), where)
    fmt = IMAGE_FORMATS.get(media_type)
    if fmt is None:
        raise InvalidRequestError(f"{where}: image type {media_type!r} cannot be sent")
    return {"image": {"format": fmt, "source": {"bytes": data}}}


def _document(part: dict[str, JSON], where: str) -> JSON:
    file = REQUEST.obj(part.get("file"), where, "file")
    media_type, data = _data_url(REQUEST.text(file.get("file_data"), where, "file"), where)
    fmt = DOCUMENT_FORMATS.get(media_type)
    if fmt is None:
        raise InvalidRequestError(f"{where}: file type {media_type!r} cannot be sent")
    # a document's name is checked by Bedrock (letters, digits, single spaces, -()[]);
    # the place of the part is always a valid one
    name = "document " + where.replace(".", " ").replace("[", " ").replace("]", "")
    return {"document": {"format": fmt, "name": name, "source": {"bytes": data}}}


def _blocks(content: JSON, where: str) -> list[JSON]:
    """A message's content -> content blocks; empty text is left out (Bedrock rejects
    blank text blocks)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    blocks: list[JSON] = []
    for j, part in enumerate(REQUEST.array(content, where)):
        at = f"{where}[{j}]"
        part = REQUEST.obj(part, at)
        ptype = part.get("type")
        if ptype in ("text", "refusal"):
            text = REQUEST.opt_text(part.get(ptype), at, ptype)
            if text:
                blocks.append({"text": text})
        elif ptype == "image_url":
            blocks.append(_image(part, at))
        elif ptype == "file":
            blocks.append(_document(part, at))
        else:
            raise InvalidRequestError(f"{at}.type: {str(ptype)!r} cannot be sent to this model")
    return blocks


def _assistant(msg: dict[str, JSON], where: str) -> list[JSON]:
    """Reasoning (only with its signature: an unsigned one is refused), redacted reasoning,
    the text, then the tool uses."""
    blocks: list[JSON] = []
    signature = REQUEST.opt_text(msg.get("reasoning_signature"), where, "reasoning_signature")
    if signature:
        text = REQUEST.opt_text(msg.get("reasoning_content"), where, "reasoning_content")
        reasoning = {"reasoningText": {"text": text or "", "signature": signature}}
        blocks.append({"reasoningContent": reasoning})
    for data in REQUEST.opt_array(msg.get("redacted_reasoning"), where, "redacted_reasoning"):
        redacted = REQUEST.text(data, where, "redacted_reasoning")
        blocks.append({"reasoningContent": {"redactedContent": redacted}})
    blocks.extend(_blocks(msg.get("content"), f"{where}.content"))
    for k, call in enumerate(REQUEST.opt_array(msg.get("tool_calls"), where, "tool_calls")):
        at = f"{where}.tool_calls[{k}]"
        call = REQUEST.obj(call, at)
        function = REQUEST.obj(call.get("function"), at, "function")
        arguments = REQUEST.opt_text(function.get("arguments"), at, "function.arguments")
        try:
            args = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError:
            raise InvalidRequestError(f"{at}.function.arguments: not valid JSON") from None
        tool_use = {
            "toolUseId": REQUEST.text(call.get("id"), at, "id"),
            "name": REQUEST.text(function.get("name"), at, "function.name"),
            "input": args if isinstance(args, dict) else {},
        }
        blocks.append({"toolUse": tool_use})
    return blocks


def _tool_result(msg: dict[str, JSON], where: str) -> JSON:
    """A tool message -> a ``toolResult`` block; an empty result has no content blocks (an
    empty text block would be refused)."""
    result: dict[str, JSON] = {
        "toolUseId": REQUEST.text(msg.get("tool_call_id"), where, "tool_call_id"),
        "content": _blocks(msg.get("content"), f"{where}.content"),
    }
    if msg.get("is_error") is True:
        result["status"] = "error"
    return {"toolResult": result}


def encode_messages(messages: list[JSON]) -> tuple[list[JSON], list[JSON]]:
    """Chat messages -> (Converse messages, system blocks). System and developer messages are
    hoisted into ``system``; tool results go in user turns; consecutive turns of one role
    merge (Converse wants them alternating); empty turns are left out."""
    system: list[JSON] = []
    turns: list[JSON] = []
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        msg = REQUEST.obj(msg, where)
        role = msg.get("role")
        if role in SYSTEM_ROLES:
            for block in _blocks(msg.get("content"), f"{where}.content"):
                if "text" not in block:
                    raise InvalidRequestError(f"{where}.content: a system message is text")
                system.append(block)
            continue
        if role == "user":
            blocks = _blocks(msg.get("content"), f"{where}.content")
        elif role == "assistant":
            blocks = _assistant(msg, where)
        elif role in ("tool", "function"):
            blocks, role = [_tool_result(msg, where)], "user"
        else:
            raise InvalidRequestError(f"{where}.role: unknown role {str(role)!r}")
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    return turns, system


def _has_tool_blocks(turns: list[JSON]) -> bool:
    return any("toolUse" in b or "toolResult" in b for turn in turns for b in turn["content"])


def _tool_config(req: ChatRequest, turns: list[JSON]) -> JSON | None:
    """``toolConfig``, or None. Converse has no ``none`` choice: the tools are left out then,
    unless the conversation already holds tool blocks (Bedrock wants ``toolConfig`` with
    them), when they go without a choice."""
    tools: list[JSON] = []
    for i, tool in enumerate(REQUEST.opt_array(req.get("tools"), "tools")):
        at = f"tools[{i}].function"
        function = REQUEST.obj(tool.get("function") if isinstance(tool, dict) else None, at)
        spec: dict[str, JSON] = {"name": REQUEST.text(function.get("name"), at, "name")}
        if function.get("description"):
            spec["description"] = REQUEST.text(function["description"], at, "description")
        schema = REQUEST.opt_obj(function.get("parameters"), at, "parameters")
        spec["inputSchema"] = {"json": schema or EMPTY_SCHEMA}
        if isinstance(function.get("strict"), bool):
            spec["strict"] = function["strict"]
        tools.append({"toolSpec": spec})
    if not tools:
        return None
    choice = req.get("tool_choice")
    config: dict[str, JSON] = {"tools": tools}
    if choice is None or choice == "auto":
        pass
    elif choice == "required":
        config["toolChoice"] = {"any": {}}
    elif choice == "none":
        return config if _has_tool_blocks(turns) else None
    elif isinstance(choice, dict):
        chosen = choice.get("function")
        name = chosen.get("name") if isinstance(chosen, dict) else None
        config["toolChoice"] = {"tool": {"name": REQUEST.text(name, "tool_choice.function.name")}}
    else:
        raise InvalidRequestError(f"tool_choice: unknown value {str(choice)[:40]!r}")
    return config


def _output_config(req: ChatRequest) -> JSON | None:
    """``response_format`` json_schema -> ``outputConfig.textFormat`` (structured output)."""
    fmt = REQUEST.opt_obj(req.get("response_format"), "response_format")
    if not fmt or fmt.get("type") != "json_schema":
        return None
    spec = REQUEST.obj(fmt.get("json_schema"), "response_format", "json_schema")
    schema: dict[str, JSON] = {
        "schema": orjson.dumps(REQUEST.obj(spec.get("schema"), "json_schema", "schema")).decode()
    }
    for key in ("name", "description"):
        if isinstance(spec.get(key), str):
            schema[key] = spec[key]
    return {"textFormat": {"type": "json_schema", "structure": {"jsonSchema": schema}}}


def encode_body(req: ChatRequest) -> dict[str, JSON]:
    turns, system = encode_messages(REQUEST.opt_array(req.get("messages"), "messages"))
    body: dict[str, JSON] = {"messages": turns}
    if system:
        body["system"] = system
    inference: dict[str, JSON] = {}
    max_tokens = REQUEST.opt_integer(
        req.get("max_completion_tokens"), "max_completion_tokens"
    ) or REQUEST.opt_integer(req.get("max_tokens"), "max_tokens")
    if max_tokens:
        inference["maxTokens"] = max_tokens
    if req.get("temperature") is not None:
        inference["temperature"] = REQUEST.number(req["temperature"], "temperature")
    if req.get("top_p") is not None:
        inference["topP"] = REQUEST.number(req["top_p"], "top_p")
    if req.get("stop") is not None:
        stops = [s for s in REQUEST.stop(req["stop"], "stop") if s]
        if stops:
            inference["stopSequences"] = stops
    if inference:
        body["inferenceConfig"] = inference
    tool_config = _tool_config(req, turns)
    if tool_config is not None:
        body["toolConfig"] = tool_config
    output_config = _output_config(req)
    if output_config is not None:
        body["outputConfig"] = output_config
    return body


def upstream_url(target: UpstreamTarget) -> str:
    action = "converse-stream" if target.stream else "converse"
    return f"{target.base_url.rstrip('/')}{model_path(target.model)}/{action}"


def encode_request(req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
    """The call, unsigned: the channel signs it (``gateway.upstream.sigv4``) as it goes."""
    return UpstreamCall(
        url=upstream_url(target),
        headers={"content-type": "application/json"},
        body=orjson.dumps(encode_body(req)),
    )
