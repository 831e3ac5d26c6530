"""What a chat request says, read the same way from the three providers' request shapes.

Only what the fake needs: how many messages, the text of the last message when it is the
user's (where a directive lives; system and developer messages after it are passed over), the
image parts, a rough token estimate (about 4 characters a token, 85 per image), the first
declared tool, the output limit and the stop sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

IMAGE_TOKENS = 85
INSTRUCTION_ROLES = frozenset({"system", "developer"})  # skipped to find the last turn


class RequestShapeError(ValueError):
    """A body the real provider would reject with 400; the message is the provider's wording."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class Incoming:
    messages: int
    last_user_text: str | None  # None: the last message is not the user's (e.g. a tool result)
    images: tuple[str, ...]  # one media type (or "url") per image part, in order
    text_chars: int
    max_tokens: int | None
    stop: tuple[str, ...]
    first_tool: str | None

    @property
    def prompt_tokens(self) -> int:
        return max(1, (self.text_chars + 3) // 4 + IMAGE_TOKENS * len(self.images))


class Counter:
    """Characters and image parts counted, the measure of the fake's token estimate."""

    __slots__ = ("chars", "images")

    def __init__(self) -> None:
        self.chars = 0
        self.images: list[str] = []

    @property
    def tokens(self) -> int:
        """The estimate of what was counted, rounded down (a prefix never outgrows the whole
        prompt's ``Incoming.prompt_tokens``)."""
        return self.chars // 4 + IMAGE_TOKENS * len(self.images)

    def text(self, value: Any) -> str:
        if isinstance(value, str):
            self.chars += len(value)
            return value
        return ""


def _stops(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(s for s in value if isinstance(s, str))
    return ()


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _data_url_type(url: Any) -> str:
    if isinstance(url, str) and url.startswith("data:"):
        return url[5:].split(";", 1)[0].split(",", 1)[0] or "url"
    return "url"


def _last_turn(messages: list[Any]) -> int:
    """The index of the last message that is not a system (or developer) message: the turn a
    directive is read from, even when instructions follow it (Claude Code ends its messages
    with a ``system`` one)."""
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if not isinstance(msg, dict) or msg.get("role") not in INSTRUCTION_ROLES:
            return i
    return len(messages) - 1


def openai_message(msg: dict[str, Any], count: Counter) -> list[str]:
    """Count one chat-completions message; its text parts."""
    content = msg.get("content")
    texts: list[str] = []
    if isinstance(content, str):
        texts.append(count.text(content))
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind == "text":
                texts.append(count.text(part.get("text")))
            elif kind == "image_url":
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, dict) else image
                count.images.append(_data_url_type(url))
    for call in msg.get("tool_calls") or ():
        if isinstance(call, dict) and isinstance(call.get("function"), dict):
            count.text(call["function"].get("arguments"))
    return texts


def from_openai(payload: Any) -> Incoming:
    if not isinstance(payload, dict):
        raise RequestShapeError("We could not parse the JSON body of your request.")
    if not payload.get("model"):
        raise RequestShapeError("you must provide a model parameter", "model")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestShapeError("Missing required parameter: 'messages'.", "messages")
    count = Counter()
    last_user: str | None = None
    last = _last_turn(messages)
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise RequestShapeError(f"Invalid type for 'messages[{i}]'.", f"messages[{i}]")
        texts = openai_message(msg, count)
        if i == last:
            last_user = "\n".join(texts) if msg.get("role") == "user" else None
    first_tool = None
    tools = payload.get("tools")
    if isinstance(tools, list) and tools and isinstance(tools[0], dict):
        fn = tools[0].get("function")
        name = fn.get("name") if isinstance(fn, dict) else tools[0].get("name")
        first_tool = name if isinstance(name, str) else None
    limit = _int_or_none(payload.get("max_completion_tokens"))
    if limit is None:
        limit = _int_or_none(payload.get("max_tokens"))
    return Incoming(
        messages=len(messages),
        last_user_text=last_user,
        images=tuple(count.images),
        text_chars=count.chars,
        max_tokens=limit,
        stop=_stops(payload.get("stop")),
        first_tool=first_tool,
    )


def anthropic_blocks(content: Any, count: Counter, texts: list[str] | None) -> None:
    if isinstance(content, str):
        text = count.text(content)
        if texts is not None:
            texts.append(text)
        return
    if not isinstance(content, list):
        return
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            text = count.text(block.get("text"))
            if texts is not None:
                texts.append(text)
        elif kind == "image":
            source = block.get("source")
            media = source.get("media_type") if isinstance(source, dict) else None
            count.images.append(media if isinstance(media, str) else "url")
        elif kind == "tool_result":
            anthropic_blocks(block.get("content"), count, None)
        elif kind == "tool_use":
            count.chars += len(str(block.get("input")))
        elif kind == "thinking":
            count.text(block.get("thinking"))


def from_anthropic(
    payload: Any, *, counting: bool = False, model_required: bool = True
) -> Incoming:
    """``model_required=False``: Bedrock's invoke body, whose model is in the path."""
    if not isinstance(payload, dict):
        raise RequestShapeError("Request body must be a JSON object")
    if model_required and not payload.get("model"):
        raise RequestShapeError("model: Field required")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestShapeError("messages: Field required")
    if not counting and _int_or_none(payload.get("max_tokens")) is None:
        raise RequestShapeError("max_tokens: Field required")
    count = Counter()
    anthropic_blocks(payload.get("system"), count, None)
    last_user: str | None = None
    last = _last_turn(messages)  # Claude Code sends a system message after the user's turn
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise RequestShapeError(f"messages.{i}: Input should be a valid dictionary")
        texts: list[str] = []
        anthropic_blocks(msg.get("content"), count, texts)
        if i == last and msg.get("role") == "user" and texts:
            last_user = "\n".join(texts)
    tools = payload.get("tools")
    first_tool = None
    if isinstance(tools, list) and tools and isinstance(tools[0], dict):
        name = tools[0].get("name")
        first_tool = name if isinstance(name, str) else None
    return Incoming(
        messages=len(messages),
        last_user_text=last_user,
        images=tuple(count.images),
        text_chars=count.chars,
        max_tokens=_int_or_none(payload.get("max_tokens")),
        stop=_stops(payload.get("stop_sequences")),
        first_tool=first_tool,
    )


def gemini_parts(content: Any, count: Counter, texts: list[str] | None) -> None:
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return
    for part in parts:
        if not isinstance(part, dict):
            continue
        if "text" in part:
            text = count.text(part.get("text"))
            if texts is not None and not part.get("thought"):
                texts.append(text)
        for key in ("inlineData", "inline_data", "fileData", "file_data"):
            blob = part.get(key)
            if isinstance(blob, dict):
                media = blob.get("mimeType") or blob.get("mime_type") or ""
                if isinstance(media, str) and media.startswith("image/"):
                    count.images.append(media)
        for key in ("functionCall", "functionResponse"):
            if key in part:
                count.chars += len(str(part[key]))


def from_gemini(payload: Any) -> Incoming:
    if not isinstance(payload, dict):
        raise RequestShapeError("Invalid JSON payload received.")
    if isinstance(payload.get("generateContentRequest"), dict):  # countTokens' other shape
        payload = payload["generateContentRequest"]
    contents = payload.get("contents")
    if not isinstance(contents, list) or not contents:
        raise RequestShapeError("* GenerateContentRequest.contents: contents is not specified\n")
    count = Counter()
    gemini_parts(payload.get("systemInstruction") or payload.get("system_instruction"), count, None)
    last_user: str | None = None
    for i, content in enumerate(contents):
        texts: list[str] = []
        gemini_parts(content, count, texts)
        role = content.get("role") if isinstance(content, dict) else None
        if i == len(contents) - 1 and role in (None, "user") and texts:
            last_user = "\n".join(texts)
    config = payload.get("generationConfig") or payload.get("generation_config") or {}
    first_tool = None
    for tool in payload.get("tools") or ():
        decls = tool.get("functionDeclarations") if isinstance(tool, dict) else None
        if isinstance(decls, list) and decls and isinstance(decls[0], dict):
            name = decls[0].get("name")
            first_tool = name if isinstance(name, str) else None
            break
    return Incoming(
        messages=len(contents),
        last_user_text=last_user,
        images=tuple(count.images),
        text_chars=count.chars,
        max_tokens=_int_or_none(config.get("maxOutputTokens"))
        if isinstance(config, dict)
        else None,
        stop=_stops(config.get("stopSequences")) if isinstance(config, dict) else (),
        first_tool=first_tool,
    )
