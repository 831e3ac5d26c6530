"""Prompt-cache breakpoints for a request converted to the messages protocol (pure).

Anthropic caches a prompt's prefix only up to a block marked ``cache_control: {"type":
"ephemeral"}``, at most four marks a request; clients of other protocols (chat completions,
Responses, generate-content) have no such marks, and OpenAI and Google cache prefixes without
them. So a request converted for a channel with ``prompt_cache: auto`` (``UpstreamTarget``)
gets the marks where a prefix repeats from one request of a conversation to the next:

1. the last system block (the instructions, the same every turn);
2. the last tool definition (tools come before the system prompt in Anthropic's prefix order:
   tools, system, messages; one mark after each keeps either cached when the other changes);
3. the last block of the second-to-last user turn: where the previous request's prompt ended,
   so this request reads the conversation so far from the cache;
4. the last block of the last message: written now, read by the next turn.

A mark is never put on a thinking block (Anthropic refuses it there): the block before it
takes it. A request that carries marks of its own (``cache_control`` in a message part or a
tool) is left as it is, and so is every passthrough (an Anthropic client's body goes through
unchanged). Marks below the model's minimum cacheable length are ignored by Anthropic, not
refused. The body is changed by copying the blocks marked, never the caller's request.
"""

from __future__ import annotations

from gateway.types import JSON, ChatRequest

EPHEMERAL: dict[str, JSON] = {"type": "ephemeral"}
MAX_BREAKPOINTS = 4
UNMARKABLE = frozenset({"thinking", "redacted_thinking"})


def has_markers(req: ChatRequest) -> bool:
    """Whether the client set cache marks of its own (on a message part or a tool)."""
    for msg in req.get("messages") or ():
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and "cache_control" in part:
                    return True
    for tool in req.get("tools") or ():
        if isinstance(tool, dict) and "cache_control" in tool:
            return True
    return False


def _marked(block: JSON) -> JSON:
    return {**block, "cache_control": EPHEMERAL}


def _mark_last_block(message: dict[str, JSON]) -> bool:
    """Mark the message's last block that takes a mark (a string content becomes one text
    block); whether one was marked."""
    content = message.get("content")
    if isinstance(content, str):
        if not content:
            return False
        message["content"] = [{"type": "text", "text": content, "cache_control": EPHEMERAL}]
        return True
    if not isinstance(content, list):
        return False
    for i in range(len(content) - 1, -1, -1):
        block = content[i]
        if isinstance(block, dict) and block.get("type") not in UNMARKABLE:
            message["content"] = [*content[:i], _marked(block), *content[i + 1 :]]
            return True
    return False


def add_breakpoints(body: dict[str, JSON]) -> None:
    """Put the marks in a messages-protocol body (see the module docstring), at most
    ``MAX_BREAKPOINTS``. ``body`` is the encoder's own; the blocks marked are copies."""
    left = MAX_BREAKPOINTS
    system = body.get("system")
    if isinstance(system, str) and system:
        body["system"] = [{"type": "text", "text": system, "cache_control": EPHEMERAL}]
        left -= 1
    elif isinstance(system, list) and system and isinstance(system[-1], dict):
        body["system"] = [*system[:-1], _marked(system[-1])]
        left -= 1
    tools = body.get("tools")
    if isinstance(tools, list) and tools and isinstance(tools[-1], dict):
        body["tools"] = [*tools[:-1], _marked(tools[-1])]
        left -= 1
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return
    messages = body["messages"] = [dict(m) if isinstance(m, dict) else m for m in messages]
    chosen: list[int] = [len(messages) - 1]  # the last message, written for the next turn
    users = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "user"]
    if len(users) >= 2 and users[-2] != chosen[0]:
        chosen.append(users[-2])  # where the previous request's prompt ended: read now
    for i in chosen[:left]:
        message = messages[i]
        if isinstance(message, dict):
            _mark_last_block(message)
