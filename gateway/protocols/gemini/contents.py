"""Gemini contents <-> chat messages, both ways, for requests and replies alike: a client's
contents (with systemInstruction) become chat messages and chat messages become contents
toward a gemini channel; a candidate's parts become chat deltas and an assistant message
becomes model parts. Call ids, signatures and tool results are paired here (the mapping
notes are in the package's docstring).
"""

from __future__ import annotations

import mimetypes

import orjson

from gateway.errors import GatewayError, InvalidRequestError, UpstreamError
from gateway.protocols.fields import REPLY, REQUEST, Reader
from gateway.protocols.gemini.dialect import json_fields, require_dict, standard_base64
from gateway.types import JSON, ChatMessage, Delta, ToolCall

# --- a client's contents -> chat messages -------------------------------------------------


def _merged_contents(contents: JSON) -> list[tuple[str, list[JSON]]]:
    if not isinstance(contents, list):
        raise InvalidRequestError("contents must be a list")
    merged: list[tuple[str, list[JSON]]] = []
    for i, content in enumerate(contents):
        content = json_fields(content, f"contents[{i}]")
        role = REQUEST.opt_text(content.get("role"), f"contents[{i}]", "role") or "user"
        if role not in ("user", "model", "function"):
            raise InvalidRequestError(f"contents[{i}].role: unknown role {role!r}")
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
    mime = REQUEST.opt_text(blob.get("mimeType"), "inlineData", "mimeType") or ""
    data = blob.get("data")
    if not isinstance(data, str):
        raise InvalidRequestError("inlineData.data must be a base64 string")
    data = standard_base64(data)
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


def _system_message(system: JSON) -> ChatMessage | None:
    """systemInstruction's text parts -> one system message (none without text)."""
    system = json_fields(system, "systemInstruction")
    lines = []
    for k, p in enumerate(REQUEST.opt_array(system.get("parts"), "systemInstruction.parts")):
        text = json_fields(p, f"systemInstruction.parts[{k}]").get("text")
        if text is not None:
            lines.append(REQUEST.text(text, f"systemInstruction.parts[{k}]", "text"))
    if not lines:
        return None
    content: JSON = lines[0] if len(lines) == 1 else [{"type": "text", "text": t} for t in lines]
    return {"role": "system", "content": content}


class _CallIds:
    """The call ids of one request's contents, pairing each functionResponse with a functionCall
    before it. Every call takes the next ``call_{n}`` (its id if it has none of its own); a
    response without an id answers the oldest unanswered call of its name, else takes the next
    number too."""

    def __init__(self) -> None:
        self.unanswered: dict[str, list[str]] = {}  # function name -> call ids awaiting a response
        self.counter = 0

    def fresh(self) -> str:
        call_id = f"call_{self.counter}"
        self.counter += 1
        return call_id

    def called(self, name: str, call_id: str) -> None:
        self.unanswered.setdefault(name, []).append(call_id)

    def answered(self, name: str, call_id: str | None) -> str:
        waiting = self.unanswered.get(name) or []
        if call_id:
            if call_id in waiting:
                waiting.remove(call_id)
            return call_id
        if waiting:
            return waiting.pop(0)
        return self.fresh()  # a response to no call we saw: the upstream decides


def _signature(part: dict[str, JSON]) -> str | None:
    signed = REQUEST.opt_text(part.get("thoughtSignature"), "parts[]", "thoughtSignature")
    return standard_base64(signed) if signed else None


def _tool_call(part: dict[str, JSON], call: JSON, ids: _CallIds) -> ToolCall:
    """A model part's functionCall -> a chat tool call (its signature on it)."""
    call = json_fields(call, "functionCall")
    name = REQUEST.text(call.get("name"), "functionCall", "name")
    number = ids.fresh()  # taken whether or not the call has an id of its own
    call_id = REQUEST.opt_text(call.get("id"), "functionCall", "id") or number
    args = REQUEST.opt_obj(call.get("args"), "functionCall", "args")
    tool: ToolCall = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(args or {}).decode()},
    }
    signature = _signature(part)
    if signature:
        tool["thought_signature"] = signature
    ids.called(name, call_id)
    return tool


def _assistant_message(parts: list[JSON], ids: _CallIds) -> ChatMessage:
    """A model turn's parts -> one assistant message: text, thoughts, tool calls, signature."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    signature = None
    for part in parts:
        part = json_fields(part, "parts[]")
        call = part.get("functionCall")
        if call is not None:
            calls.append(_tool_call(part, call, ids))
            continue
        signature = _signature(part) or signature
        text = REQUEST.opt_text(part.get("text"), "parts[]", "text")
        if text:
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
    return msg


def _tool_message(response: JSON, ids: _CallIds) -> ChatMessage:
    """A functionResponse -> a tool message answering the call it pairs with."""
    response = json_fields(response, "functionResponse")
    name = REQUEST.opt_text(response.get("name"), "functionResponse", "name") or ""
    call_id = ids.answered(name, REQUEST.opt_text(response.get("id"), "functionResponse", "id"))
    body = response.get("response")
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": orjson.dumps(body if body is not None else {}).decode(),
    }


def _user_part(part: dict[str, JSON]) -> JSON:
    """A user part (text, inlineData or fileData) -> a chat content part; None for another kind."""
    if isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if "inlineData" in part:
        return _data_part(part["inlineData"])
    if part.get("text") is not None:
        raise REQUEST.bad("parts[]", "text", "a string")
    if "fileData" in part:
        uri = json_fields(part["fileData"], "fileData").get("fileUri")
        uri = REQUEST.text(uri, "fileData", "fileUri")
        if not uri:
            raise InvalidRequestError("fileData.fileUri must not be empty")
        return {"type": "image_url", "image_url": {"url": uri}}
    return None


def _user_messages(parts: list[JSON], ids: _CallIds) -> list[ChatMessage]:
    """A user turn's parts -> a tool message per functionResponse, in order, then one user
    message with the other parts (none if there are none)."""
    messages: list[ChatMessage] = []
    user_parts: list[JSON] = []
    for part in parts:
        part = json_fields(part, "parts[]")
        response = part.get("functionResponse")
        if response is not None:
            messages.append(_tool_message(response, ids))
            continue
        content = _user_part(part)
        if content is not None:
            user_parts.append(content)
    if user_parts:
        messages.append({"role": "user", "content": _user_content(user_parts)})
    return messages


def decode_contents(payload: dict[str, JSON]) -> list[ChatMessage]:
    """A client's systemInstruction and contents -> chat messages."""
    messages: list[ChatMessage] = []
    system = payload.get("systemInstruction")
    if system is not None:
        message = _system_message(system)
        if message is not None:
            messages.append(message)
    ids = _CallIds()
    for role, parts in _merged_contents(payload.get("contents")):
        if role == "model":
            messages.append(_assistant_message(parts, ids))
        else:
            messages.extend(_user_messages(parts, ids))
    return messages


# --- chat messages -> contents toward a gemini channel ------------------------------------


def text_of(content: JSON, fields: Reader = REQUEST, where: str = "message") -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            fields.opt_text(p.get("text"), f"{where}.content[{k}]", "text") or ""
            for k, p in enumerate(content)
            if isinstance(p, dict)
        )
    raise fields.bad(where, "content", "a string or a list of parts")


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
        part = require_dict(part, "content[]")
        kind = part.get("type")
        if kind == "text":
            parts.append({"text": REQUEST.opt_text(part.get("text"), "content[]", "text") or ""})
        elif kind == "image_url":
            parts.append(_url_part(require_dict(part.get("image_url"), "image_url").get("url")))
        elif kind == "input_audio":
            audio = require_dict(part.get("input_audio"), "input_audio")
            mime = (
                f"audio/{REQUEST.opt_text(audio.get('format'), 'input_audio', 'format') or 'wav'}"
            )
            data = REQUEST.text(audio.get("data"), "input_audio", "data")
            parts.append({"inlineData": {"mimeType": mime, "data": data}})
        elif kind == "file":
            parts.append(_url_part(require_dict(part.get("file"), "file").get("file_data")))
        else:
            raise InvalidRequestError(
                f"content part type {str(kind)[:40]!r} is not supported by Gemini"
            )
    return parts


def assistant_parts(msg: ChatMessage, *, upstream: bool) -> list[JSON]:
    """An assistant message -> model parts. ``reasoning_signature`` goes where Gemini puts a
    reply's signature: on the first functionCall when that call has none of its own (Gemini
    signs a function-calling turn there and rejects a history whose first call is unsigned;
    clients of other protocols bring the call's signature back this way); else on the text
    part; without text, on the thought part; else on an empty thought part. A field of the
    wrong type is the client's 400 toward an ``upstream``, else the upstream's bad reply."""
    fields = REQUEST if upstream else REPLY
    parts: list[JSON] = []
    signature = fields.opt_text(msg.get("reasoning_signature"), "message", "reasoning_signature")
    calls = fields.opt_array(msg.get("tool_calls"), "message", "tool_calls")
    for k, call in enumerate(calls):
        call = fields.obj(call, "message.tool_calls", k)
        fields.opt_text(
            call.get("thought_signature"), f"message.tool_calls[{k}]", "thought_signature"
        )
    if calls and calls[0].get("thought_signature"):
        pass  # the first call is signed: the reply's signature belongs to the text
    elif calls:
        calls = [{**calls[0], "thought_signature": signature}, *calls[1:]] if signature else calls
        signature = None
    thought: JSON = None
    reasoning = fields.opt_text(msg.get("reasoning_content"), "message", "reasoning_content")
    if reasoning:
        thought = {"text": reasoning, "thought": True}
        parts.append(thought)
    text = text_of(msg.get("content"), fields)
    if text:
        parts.append({"text": text})
    if signature and (text or thought is not None):
        parts[-1]["thoughtSignature"] = signature
        signature = None
    for k, call in enumerate(calls):
        at = f"message.tool_calls[{k}]"
        function = fields.opt_obj(call.get("function"), at, "function") or {}
        parts.append(
            function_call_part(
                fields.opt_text(call.get("id"), at, "id"),
                fields.opt_text(function.get("name"), at, "function.name") or "",
                fields.opt_text(function.get("arguments"), at, "function.arguments") or "",
                call.get("thought_signature"),
                upstream=upstream,
            )
        )
    if signature:
        parts.append({"text": "", "thought": True, "thoughtSignature": signature})
    return parts


def _tool_response(content: JSON) -> JSON:
    text = text_of(content)
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {"result": text}


def encode_contents(messages: JSON) -> tuple[list[JSON], list[JSON]]:
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

    for i, msg in enumerate(messages):
        msg = require_dict(msg, f"messages[{i}]")
        role = msg.get("role")
        if role in ("system", "developer"):  # wherever it stands (Gemini has one place)
            content = msg.get("content")
            # a part each: text parts of one message are not run together
            for piece in [[p] for p in content] if isinstance(content, list) else [content]:
                text = text_of(piece)
                if text:
                    system.append({"text": text})
        elif role == "user":
            add("user", _user_parts(msg.get("content")))
        elif role == "assistant":
            parts = assistant_parts(msg, upstream=True)  # type: ignore[arg-type]
            for call in msg.get("tool_calls") or ():  # read by assistant_parts: objects
                function = call.get("function") or {}
                names[str(call.get("id"))] = function.get("name") or ""
            add("model", parts)
        elif role == "tool":
            call_id = REQUEST.text(msg.get("tool_call_id"), f"messages[{i}]", "tool_call_id")
            if call_id not in names:
                raise InvalidRequestError(
                    f"messages[{i}].tool_call_id {call_id!r} answers no earlier tool call"
                )
            response = {"name": names[call_id], "response": _tool_response(msg.get("content"))}
            add("user", [{"functionResponse": response}])
        else:
            raise InvalidRequestError(f"messages[{i}].role: unknown role {str(role)[:40]!r}")
    return system, contents


# --- parts, in replies and streams --------------------------------------------------------


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
        signature = REPLY.opt_text(part.get("thoughtSignature"), "part", "thoughtSignature")
        call = part.get("functionCall")
        if isinstance(call, dict):
            args = REPLY.opt_obj(call.get("args"), "functionCall", "args")
            tool: ToolCall = {
                "id": REPLY.opt_text(call.get("id"), "functionCall", "id")
                or f"{id_prefix}{ctx_calls[0]}",
                "type": "function",
                "function": {
                    "name": REPLY.opt_text(call.get("name"), "functionCall", "name") or "",
                    "arguments": orjson.dumps(args or {}).decode(),
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
        text = REPLY.opt_text(part.get("text"), "part", "text")
        if not text:
            continue
        key = "reasoning_content" if part.get("thought") else "content"
        last = deltas[-1] if deltas else None
        if last is not None and len(last) == 1 and key in last:
            last[key] += text  # type: ignore[literal-required]
        else:
            deltas.append({key: text})  # type: ignore[misc]
    return deltas
