"""A local token estimate, for count_tokens where the channel has no counting endpoint and for
protocols that want an input count before the upstream reports one.

The estimate is documented, not exact: about four characters of text per token (the common
rule of thumb for English with BPE tokenizers), plus four tokens of framing per message, the
tool definitions counted as their JSON text, and a flat 85 tokens per image (the cost of a
low-detail image in OpenAI's accounting). Never billed: billing uses what the upstream reports.
"""

from __future__ import annotations

import orjson

from gateway.types import JSON, ChatRequest

CHARS_PER_TOKEN = 4
TOKENS_PER_MESSAGE = 4
TOKENS_PER_IMAGE = 85


def _content_chars(content: JSON) -> tuple[int, int]:
    """(characters of text, number of images) in a message's content."""
    if content is None:
        return 0, 0
    if isinstance(content, str):
        return len(content), 0
    chars = images = 0
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind == "text":
                text = part.get("text")
                chars += len(text) if isinstance(text, str) else 0
            elif kind in ("image_url", "input_image", "image"):
                images += 1
            else:
                chars += len(orjson.dumps(part))
    return chars, images


def _len(value: JSON) -> int:
    return len(value) if isinstance(value, str) else 0


def estimate_prompt_tokens(req: ChatRequest) -> int:
    """Lenient: a field of the wrong type counts nothing here (an estimate is made before the
    channel's encoder reads the request, and that encoder names the field in its 400)."""
    chars = images = 0
    messages = req.get("messages")
    if not isinstance(messages, list):
        return 0
    for m in messages:
        if not isinstance(m, dict):
            continue
        c, i = _content_chars(m.get("content"))
        chars += c
        images += i
        calls = m.get("tool_calls")
        for tc in calls if isinstance(calls, list) else ():
            fn = tc.get("function") if isinstance(tc, dict) else None
            if isinstance(fn, dict):
                chars += _len(fn.get("name")) + _len(fn.get("arguments"))
        chars += _len(m.get("reasoning_content"))
    tools = req.get("tools")
    if tools:
        chars += len(orjson.dumps(tools))
    tokens = -(-chars // CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages)
    return tokens + TOKENS_PER_IMAGE * images


def estimate_text_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)
