"""The answer to one chat request, resolved before any protocol renders it.

A ``Plan`` holds the text already split into stream pieces, the tool calls with ids and their
arguments as JSON text, the finish reason in neutral words and the token counts, so each
protocol module only has to lay it out in its own wire format.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import re
from dataclasses import dataclass

import orjson

from bench.fake.incoming import Incoming
from bench.fake.reply import Reply

LOREM = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
    "incididunt ut labore et dolore magna aliqua"
).split()
_WORD = re.compile(r"\s*\S+\s*")

# kinds of stream events: drop_after / error_after act before a CONTENT or TAIL event
HEAD, CONTENT, TAIL = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Defaults:
    """Server-wide pacing, used where a reply leaves the field at None."""

    chunks: int | None = None
    first_ms: float = 0.0
    delay_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text
    pieces: tuple[str, ...]  # the arguments split for streaming


@dataclass(frozen=True, slots=True)
class Plan:
    model: str
    request_id: str  # unique per request, used in every id
    created: int
    text: str
    pieces: tuple[str, ...]
    reasoning: str
    reasoning_pieces: tuple[str, ...]
    signature: str
    call_signature: str  # Gemini: on the first functionCall part
    redacted: str  # Anthropic: a redacted_thinking block's data
    tool_calls: tuple[ToolCall, ...]
    finish: str  # stop | length | tool_calls | stop_sequence
    stop_sequence: str | None
    prompt_tokens: int  # cached included
    completion_tokens: int  # reasoning included
    cached_tokens: int  # read from the prompt cache
    reasoning_tokens: int
    cache_write_tokens: int = 0  # written to the prompt cache
    cache_write_1h_tokens: int = 0  # of those, written for an hour (Anthropic's ttl "1h")


@functools.lru_cache(maxsize=256)
def demo_text(messages: int, min_words: int = 0) -> str:
    noun = "message" if messages == 1 else "messages"
    text = f"Hello from the demo upstream. You sent {messages} {noun}."
    words = text.split()
    extra = [LOREM[i % len(LOREM)] for i in range(max(0, min_words - len(words)))]
    return " ".join(words + extra)


def image_text(images: tuple[str, ...]) -> str:
    if not images:
        return "I received 0 image parts."
    noun = "part" if len(images) == 1 else "parts"
    return f"I received {len(images)} image {noun}: {', '.join(images)}."


@functools.lru_cache(maxsize=1024)
def split_text(text: str, chunks: int | None) -> tuple[str, ...]:
    """One piece per word, or ``chunks`` pieces as even as the words (or characters) allow."""
    words = _WORD.findall(text)
    if not words:
        return ()
    if chunks is None or chunks == len(words):
        return tuple(words)
    n = max(1, chunks)
    units: list[str] = words if n <= len(words) else list(text)
    n = min(n, len(units))
    return tuple("".join(units[i * len(units) // n : (i + 1) * len(units) // n]) for i in range(n))


def _split_args(arguments: str) -> tuple[str, ...]:
    if len(arguments) < 6:
        return (arguments,)
    third = len(arguments) // 3
    return (arguments[:third], arguments[third : 2 * third], arguments[2 * third :])


def make_plan(
    reply: Reply, incoming: Incoming, defaults: Defaults, model: str, request_id: str, now: int
) -> Plan:
    chunks = reply.chunks if reply.chunks is not None else defaults.chunks
    if reply.echo:
        text = incoming.last_user_text or ""
    elif reply.image:
        text = image_text(incoming.images)
    elif reply.text is not None:
        text = reply.text
    elif reply.tool_calls:
        text = ""
    else:
        text = demo_text(incoming.messages, chunks or 0)
    finish = reply.finish
    words = len(split_text(text, None))
    if finish is None and incoming.max_tokens is not None and words > incoming.max_tokens:
        kept = split_text(text, None)[: max(0, incoming.max_tokens)]
        text = "".join(kept).rstrip()
        finish = "length"
        words = len(kept)
    calls = tuple(
        ToolCall(
            id=f"{request_id}{i}",
            name=name,
            arguments=args_text,
            pieces=_split_args(args_text),
        )
        for i, (name, args) in enumerate(reply.tool_calls)
        for args_text in (orjson.dumps(args).decode(),)
    )
    if finish is None:
        finish = "tool_calls" if calls else "stop"
    stop_sequence = None
    if finish == "stop_sequence":
        stop_sequence = incoming.stop[0] if incoming.stop else "###"
    reasoning = reply.reasoning or ""
    reasoning_tokens = len(reasoning.split())
    completion = words + reasoning_tokens + sum((len(c.arguments) + 3) // 4 for c in calls)
    if reply.completion_tokens is not None:
        completion = reply.completion_tokens
    prompt = reply.prompt_tokens if reply.prompt_tokens is not None else incoming.prompt_tokens
    cached = min(reply.cached_tokens or 0, prompt)
    written = min(reply.cache_write_tokens or 0, prompt - cached)
    written_1h = min(reply.cache_write_1h_tokens or 0, written)
    signature = ""
    if reasoning:
        digest = hashlib.sha256(reasoning.encode()).digest()[:24]
        signature = base64.b64encode(b"fake-signature:" + digest).decode()
    return Plan(
        model=model,
        request_id=request_id,
        created=now,
        text=text,
        pieces=split_text(text, chunks),
        reasoning=reasoning,
        reasoning_pieces=split_text(reasoning, None),
        signature=signature,
        call_signature=reply.call_signature or signature,
        redacted=reply.redacted or "",
        tool_calls=calls,
        finish=finish,
        stop_sequence=stop_sequence,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        reasoning_tokens=min(reasoning_tokens, completion),
        cache_write_tokens=written,
        cache_write_1h_tokens=written_1h,
    )
