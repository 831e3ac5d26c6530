"""What the fake upstream answers: the ``Reply`` script and the ``[[fake ...]]`` directive.

A ``Reply`` comes from ``FakeUpstream.queue`` (first in, first out) or, when the queue is empty,
from a directive in the text of the request's last message when that message is the user's
(system and developer messages after it do not count: Claude Code ends its messages with a
``system`` one).
A field left at ``None`` takes the server's default (``--chunks``, ``--first-ms``,
``--delay-ms``) or the deterministic demo behaviour.

Directive grammar: ``[[fake key=value key=value flag]]``. A value is a bare word, a quoted
string (``text="two words"``) or a JSON object or array (``args={"city": "Paris"}``); a key
without a value is a flag set to true. Keys mirror the fields below, plus ``tool`` (a call's
name), ``args`` (its arguments) and ``tools`` (how many calls, in parallel).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

FINISHES = frozenset({"stop", "length", "tool_calls", "stop_sequence"})
DEFAULT_REASONING = "Let me think about this step by step. The answer follows from the question."
DEFAULT_TOOL = "get_weather"
CITIES = ("Paris", "London", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Seoul")
MARK = "[[fake"

_INT_KEYS = frozenset(
    {
        "status",
        "chunks",
        "drop_after",
        "error_after",
        "prompt_tokens",
        "completion_tokens",
        "cached_tokens",
        "cache_write_tokens",
        "cache_write_1h_tokens",
        "retry_after",
        "tools",
    }
)
_FLOAT_KEYS = frozenset({"first_ms", "delay_ms"})
_BOOL_KEYS = frozenset({"hang", "echo", "image"})
_STR_KEYS = frozenset(
    {
        "text",
        "error_type",
        "error_message",
        "finish",
        "reasoning",
        "tool",
        "call_signature",
        "redacted",
    }
)
_JSON_KEYS = frozenset({"args"})
_YES = frozenset({"", "1", "yes", "true", "on"})


class DirectiveError(ValueError):
    """A ``[[fake ...]]`` directive that cannot be read; answered with the provider's 400."""


@dataclass(frozen=True, slots=True)
class Reply:
    """One scripted answer. ``status >= 400`` answers with the provider's error body."""

    status: int = 200
    error_type: str | None = None  # provider's error type (Gemini: its status, e.g. UNAVAILABLE;
    # Bedrock: the exception, e.g. ThrottlingException)
    error_message: str | None = None
    text: str | None = None  # None: the demo sentence (or nothing when tool calls are given)
    tool_calls: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    reasoning: str | None = None  # thinking text
    # Gemini: the first functionCall part's thoughtSignature (Gemini 3 signs a function-calling
    # turn there, whether or not it shows its thinking); by default the thinking's signature
    call_signature: str | None = None
    redacted: str | None = None  # Anthropic: a redacted_thinking block with this data
    chunks: int | None = None  # pieces to split the text into; None: one per word
    first_ms: float | None = None  # wait before the status line
    delay_ms: float | None = None  # wait between stream pieces
    hang: bool = False  # accept the request, never answer
    drop_after: int | None = None  # close the connection after N content pieces
    error_after: int | None = None  # send the in-stream error event after N content pieces
    finish: str | None = None  # stop | length | tool_calls | stop_sequence
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # read from the prompt cache (None: the fake's cache)
    cache_write_tokens: int | None = None  # written to it (Anthropic, Bedrock Converse)
    cache_write_1h_tokens: int | None = None  # of those, written for an hour (Anthropic)
    headers: Mapping[str, str] = field(default_factory=dict)
    retry_after: int | None = None  # seconds, on 429 (Gemini puts it in RetryInfo)
    echo: bool = False  # reply with the last user text, directive removed
    image: bool = False  # reply describing the image parts received

    def __post_init__(self) -> None:
        if self.finish is not None and self.finish not in FINISHES:
            raise ValueError(f"finish must be one of {sorted(FINISHES)}, not {self.finish!r}")
        calls = tuple((str(name), dict(args)) for name, args in self.tool_calls)
        object.__setattr__(self, "tool_calls", calls)


@dataclass(frozen=True, slots=True)
class Directive:
    """A directive found in a text: the reply it asks for and the text without it."""

    reply: Reply
    rest: str


def find_directive(text: str, default_tool: str | None) -> Directive | None:
    """The last ``[[fake ...]]`` in ``text``, or None. Raises ``DirectiveError`` on bad syntax."""
    start = text.rfind(MARK)
    if start < 0:
        return None
    pos = start + len(MARK)
    if pos < len(text) and text[pos] not in " \t\r\n]":
        return None  # e.g. "[[fakery" is not a directive
    fields: dict[str, str | bool | Any] = {}
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if text.startswith("]]", pos):
            end = pos + 2
            break
        if pos >= len(text):
            raise DirectiveError("fake directive: missing ']]'")
        key_start = pos
        while pos < len(text) and (text[pos].isalnum() or text[pos] == "_"):
            pos += 1
        key = text[key_start:pos]
        if not key:
            raise DirectiveError(f"fake directive: unexpected {text[pos]!r}")
        if pos < len(text) and text[pos] == "=":
            value, pos = _read_value(text, pos + 1)
            fields[key] = value
        else:
            fields[key] = True
    rest = (text[:start] + text[end:]).strip()
    return Directive(_reply_from_fields(fields, default_tool), rest)


def _read_value(text: str, pos: int) -> tuple[str, int]:
    if pos >= len(text):
        return "", pos
    first = text[pos]
    if first in "{[":
        depth = 0
        in_str = False
        i = pos
        while i < len(text):
            ch = text[i]
            if in_str:
                if ch == "\\":
                    i += 1
                elif ch == '"':
                    in_str = False
            elif ch == '"':
                in_str = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    return text[pos : i + 1], i + 1
            i += 1
        raise DirectiveError("fake directive: unbalanced JSON value")
    if first in "\"'":
        end = text.find(first, pos + 1)
        if end < 0:
            raise DirectiveError("fake directive: unterminated quoted value")
        return text[pos + 1 : end], end + 1
    i = pos
    while i < len(text) and not text[i].isspace() and not text.startswith("]]", i):
        i += 1
    return text[pos:i], i


def _reply_from_fields(fields: dict[str, Any], default_tool: str | None) -> Reply:
    kwargs: dict[str, Any] = {}
    tool: str | None = None
    args: Mapping[str, Any] | None = None
    count: int | None = None
    for key, raw in fields.items():
        value = "" if raw is True else raw
        try:
            if key in _INT_KEYS:
                number = int(value)
                if key == "tools":
                    count = number
                else:
                    kwargs[key] = number
            elif key in _FLOAT_KEYS:
                kwargs[key] = float(value)
            elif key in _BOOL_KEYS:
                kwargs[key] = str(value).lower() in _YES
            elif key in _JSON_KEYS:
                parsed = orjson.loads(value)
                if not isinstance(parsed, dict):
                    raise DirectiveError("fake directive: args must be a JSON object")
                args = parsed
            elif key in _STR_KEYS:
                if key == "tool":
                    tool = str(value)
                elif key == "reasoning":
                    if raw is True or str(value).lower() in _YES:
                        kwargs[key] = DEFAULT_REASONING
                    elif str(value).lower() not in ("no", "false", "0", "off"):
                        kwargs[key] = str(value)
                else:
                    kwargs[key] = str(value)
            else:
                raise DirectiveError(f"fake directive: unknown key {key!r}")
        except (ValueError, orjson.JSONDecodeError) as exc:
            if isinstance(exc, DirectiveError):
                raise
            raise DirectiveError(f"fake directive: bad value for {key!r}") from exc
    if tool is not None or args is not None or count is not None:
        name = tool or default_tool or DEFAULT_TOOL
        n = 1 if count is None else count
        calls = tuple(
            (name, dict(args) if args is not None else {"city": CITIES[i % len(CITIES)]})
            for i in range(n)
        )
        kwargs["tool_calls"] = calls
    try:
        return Reply(**kwargs)
    except ValueError as exc:
        raise DirectiveError(f"fake directive: {exc}") from exc
