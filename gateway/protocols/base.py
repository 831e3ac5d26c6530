"""The adapter interface: what every protocol module implements, and the values it exchanges.

The internal shape is the chat-completions dict (``gateway.types``). ``decode_*`` moves toward
it, ``encode_*`` away from it. Each protocol implements both sides once:

- client side (the protocol the client speaks): ``match`` (the request's facts: model, stream
  flag, framing, usage wanted), ``decode_request``, ``encode_response``, ``stream_encoder``,
  ``encode_error``;
- upstream side (the protocol the channel speaks): ``encode_request``, ``decode_response``,
  ``stream_decoder``, ``decode_error``.

Optional abilities are separate protocols that an adapter implements or not, never stubs that
fail at request time: ``Counting`` (client side: the protocol has a count endpoint),
``Counter`` (upstream side: the channel can count tokens), ``Passthrough`` (client protocol ==
channel type: the body goes through unconverted, only the model name is mapped, stream events
are forwarded as they are and usage is read as they pass).

Adapters are pure: they never await, log, read the clock or touch the store. Ids and times come
in through ``Ctx``. A malformed body or chunk raises a ``GatewayError``; nothing is skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

from gateway.errors import GatewayError
from gateway.protocols.sse import SSEEvent, SSEParser
from gateway.types import JSON, ChatChunk, ChatRequest, ChatResponse, ChunkChoice, Usage


# Built per request, so not frozen: a frozen dataclass's __init__ sets each field through
# object.__setattr__, which costs several times a plain one. Treated as read-only, but for
# Upstream.request, which swaps a call's body for a right-sized copy.
@dataclass(slots=True)
class RouteMatch:
    """What the path says: the client's protocol, the capability, and path-borne parameters."""

    protocol: str  # "openai" | "anthropic" | "gemini"
    capability: str  # the endpoint kind: "chat" | "count_tokens" | "embeddings" | ...
    model: str | None = None  # the model the client asked for (from the path or the body)
    stream: bool | None = None  # whether the reply streams (from the path or the body)
    sse: bool = True  # generate-content stream framing: SSE (?alt=sse) or a JSON array
    include_usage: bool = False  # chat-completions stream_options.include_usage
    action: str = ""  # a generate-content path's action ("embedContent", ...); else ""
    tool_namespaces: tuple[str, ...] = ()  # a Responses request's namespace tools
    custom_tools: tuple[str, ...] = ()  # a Responses request's custom tools (function names)
    # the session the body names (``prompt_cache_key``, the messages protocol's
    # ``metadata.user_id``), "" for none; ``session_late``: it ranks after Codex's
    # ``session_id`` header (``policy/affinity.session_of`` has the whole order)
    session: str = ""
    session_late: bool = False


@dataclass(slots=True)
class UpstreamTarget:
    """Where and how one attempt goes: the channel resolved for one model."""

    channel: str  # channel name (for logs and records)
    base_url: str  # as configured: openai includes /v1, anthropic and gemini are roots
    api_key: str = field(repr=False)
    model: str  # the upstream's model name (after model_map)
    default_max_tokens: int  # from the catalogue, for protocols that require max tokens
    stream: bool
    client_headers: dict[str, str] = field(default_factory=dict)  # anthropic-version/-beta
    # the channel's ``prompt_cache: auto``: a messages-protocol request converted from a
    # protocol without cache markers gets breakpoints (``anthropic/cache.py``)
    prompt_cache: bool = False
    # chat completions: where the output limit goes (``max_completion_tokens`` for the models
    # that take only that: the channel says, ``config.Channel.output_limit_field``)
    max_tokens_field: str = "max_tokens"


@dataclass(slots=True)
class UpstreamCall:
    url: str
    headers: dict[str, str] = field(repr=False)  # the channel's credential among them
    body: bytes = field(repr=False)  # the prompt


@dataclass(slots=True)
class Ctx:
    """Per-request values an adapter may put into what it writes."""

    request_id: str  # unique; adapters derive response ids from it (chatcmpl-, msg_)
    model: str  # the model name the client asked for; replies carry it
    created: int  # unix seconds
    include_usage: bool = False  # chat-completions stream_options.include_usage
    prompt_tokens_estimate: int = 0  # local estimate, for protocols that want it up front
    tool_namespaces: tuple[str, ...] = ()  # Responses: the request's namespace tools
    custom_tools: tuple[str, ...] = ()  # Responses: its custom tools, as function names


class StreamDecoder(Protocol):
    """Upstream SSE events -> chat-completions chunks. One per stream; owns its state."""

    def feed(self, event: SSEEvent) -> list[ChatChunk]: ...

    def close(self) -> list[ChatChunk]:
        """At upstream EOF. Raises UpstreamError if the stream was cut before its end."""
        ...


class EventParser(Protocol):
    """Upstream stream bytes -> events: ``SSEParser``, or another framing read into the same
    events (AWS event streams: ``gateway.upstream.eventstream.EventStreamParser``)."""

    def feed(self, raw: bytes) -> list[SSEEvent]: ...

    def close(self) -> list[SSEEvent]: ...


class StreamEncoder(Protocol):
    """Chat-completions chunks -> the client's stream bytes. One per stream; owns its state.

    A chunk with ``usage`` (and usually no choices) reports usage; the encoder decides whether
    its protocol shows it (chat-completions only when ``include_usage``).
    """

    content_type: str

    def encode(self, chunk: ChatChunk) -> bytes: ...

    def finish(self, usage: Usage | None) -> bytes: ...

    def error(self, err: GatewayError) -> bytes: ...


class RelayStream(Protocol):
    """A reply stream as the relay drives it, converted or passed through alike: fed the
    upstream's bytes as they arrive, it returns what to send the client now; ``finish`` at
    upstream EOF, ``error`` for a failure after the stream started; ``usage`` as read so far.
    ``ConvertedStream`` (parser, decoder, encoder) and each protocol's pass-through are one."""

    content_type: str
    usage: Usage | None

    @property
    def generated(self) -> int:
        """An estimate of the tokens generated so far, from what passed: billed for a stream
        cut short before the upstream counted them."""
        ...

    def feed(self, raw: bytes) -> bytes: ...

    def finish(self) -> bytes:
        """At upstream EOF. Raises UpstreamError if the stream was cut before its end."""
        ...

    def error(self, err: GatewayError) -> bytes: ...


class EventPassthrough:
    """A passthrough that looks at every event: owns the SSE parser (or ``parser``, for another
    framing) and hands each event to
    ``feed_event``; ``end`` is called at EOF after the last event. When an event raises, the
    events before it in the same read still go out, ahead of the error event. ``generated``
    is what a subclass counted, 0 where the upstream's usage says it."""

    generated = 0

    __slots__ = ("_parser", "_before_error")

    def __init__(self, parser: EventParser | None = None) -> None:
        self._parser: EventParser = parser if parser is not None else SSEParser()
        self._before_error = b""

    def feed(self, raw: bytes) -> bytes:
        events = self._parser.feed(raw)
        return self._events(events) if events else b""

    def finish(self) -> bytes:
        return self._events(self._parser.close()) + self.end()

    def _events(self, events: list[SSEEvent]) -> bytes:
        out: list[bytes] = []
        try:
            for event in events:
                out.append(self.feed_event(event))
        except GatewayError:
            self._before_error = b"".join(out)
            raise
        return b"".join(out)

    def error(self, err: GatewayError) -> bytes:
        return self._before_error + self.error_event(err)

    def feed_event(self, event: SSEEvent) -> bytes:
        raise NotImplementedError

    def end(self) -> bytes:
        raise NotImplementedError

    def error_event(self, err: GatewayError) -> bytes:
        raise NotImplementedError


class ClientSide(Protocol):
    """A protocol as clients speak it: their requests toward the chat-completions shape, the
    replies and streams away from it, errors in its shape."""

    name: ClassVar[str]  # "openai" | "anthropic" | "gemini" | ...

    def match(
        self, kind: str, payload: JSON, path_model: str | None, query: bytes, stream: bool | None
    ) -> RouteMatch:
        """The request's facts: the model (``path_model`` from a generate-content path, else
        the body's), the stream flag (``stream`` when the path fixes it, else the body's), the
        stream framing (``query``) and whether a chat-completions stream wants usage.
        InvalidRequestError when the body lacks what the protocol requires (the model)."""
        ...

    def decode_request(self, payload: JSON, route: RouteMatch) -> ChatRequest: ...
    def encode_response(self, resp: ChatResponse, ctx: Ctx) -> JSON: ...
    def stream_encoder(self, ctx: Ctx, route: RouteMatch) -> StreamEncoder: ...
    def encode_error(self, err: GatewayError) -> tuple[int, JSON]: ...


class UpstreamSide(Protocol):
    """A protocol as channels speak it: requests from the chat-completions shape, replies and
    streams toward it, errors into gateway errors."""

    name: ClassVar[str]

    def encode_request(self, req: ChatRequest, target: UpstreamTarget) -> UpstreamCall: ...
    def decode_response(self, payload: JSON) -> ChatResponse: ...
    def stream_decoder(self, ctx: Ctx) -> StreamDecoder: ...
    def decode_error(self, status: int, raw: bytes) -> GatewayError: ...


class Adapter(ClientSide, UpstreamSide, Protocol):
    """A chat protocol both sides speak (a channel type). The optional abilities are the
    protocols below."""


@runtime_checkable
class Counting(Protocol):
    """Client side: the protocol has a token-count endpoint."""

    def encode_count(self, tokens: int, ctx: Ctx) -> JSON: ...


@runtime_checkable
class Counter(Protocol):
    """Upstream side: the channel's protocol can count a request's tokens."""

    def count_request(self, req: ChatRequest, target: UpstreamTarget) -> UpstreamCall: ...
    def decode_count(self, payload: JSON) -> int: ...


@runtime_checkable
class HoldsUsage(Protocol):
    """Upstream side, a stream decoder's option: it reads usage before it passes it on (in the
    stream's last chunk) and can say what it read so far: for a stream cut short, the
    upstream's own prompt count instead of the local estimate."""

    def usage_so_far(self) -> Usage | None: ...


@runtime_checkable
class Passthrough(Protocol):
    """Client protocol == channel type: the body goes through with only the model renamed."""

    def passthrough_request(
        self, payload: JSON, route: RouteMatch, target: UpstreamTarget
    ) -> UpstreamCall: ...
    def passthrough_response(self, payload: JSON, ctx: Ctx) -> tuple[JSON, Usage | None]: ...
    def passthrough_stream(
        self, ctx: Ctx, route: RouteMatch, target: UpstreamTarget
    ) -> RelayStream: ...


CHARS_PER_TOKEN = 4  # the local estimate's rule (gateway.policy.tokens), for text that passed


def delta_chars(choices: list[ChunkChoice]) -> int:
    """Characters of text, reasoning and tool arguments in a chunk's deltas."""
    chars = 0
    for choice in choices:
        delta = choice.get("delta")
        if not delta:
            continue
        content = delta.get("content")
        if content:
            chars += len(content)
        reasoning = delta.get("reasoning_content")
        if reasoning:
            chars += len(reasoning)
        for call in delta.get("tool_calls") or ():
            arguments = (call.get("function") or {}).get("arguments")
            if arguments:
                chars += len(arguments)
    return chars


COUNT_MAX = 2**53  # a count past this is no count (and would not fit the JSON written back)


def count(value: object) -> int:
    """A whole-number field of an upstream's JSON (a token count, an index) as an int: a
    float is cut to its whole part; anything else (missing, text, a bool, NaN, infinite,
    beyond ``COUNT_MAX`` either way) is 0, so a broken upstream's odd value cannot stop a
    conversion halfway."""
    if type(value) is float and math.isfinite(value):
        value = int(value)
    if type(value) is int and -COUNT_MAX <= value <= COUNT_MAX:
        return value
    return 0


def text_field(obj: object, key: str) -> str:
    """``obj[key]`` if ``obj`` is a JSON object and that is a string, else "" (a session's
    name in a body: never a reason to refuse it)."""
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, str) else ""


def field_of(obj: object, key: str) -> object:
    """``obj[key]`` if ``obj`` is a JSON object, else None (for nested usage details)."""
    return obj.get(key) if isinstance(obj, dict) else None


@dataclass(frozen=True, slots=True)
class UsageParts:
    """A chat-completions usage object's counts as a client encoder writes them: each at least
    0, and the classes cut to fit their totals (cache reads at most the prompt, cache writes at
    most what is left of it, reasoning at most the output), so that no client is shown a part
    larger than its whole or a token twice."""

    prompt: int  # cache reads and writes included
    completion: int  # reasoning included
    cache_read: int
    cache_write: int
    reasoning: int

    @property
    def fresh(self) -> int:
        """The prompt tokens neither read from nor written to a cache."""
        return self.prompt - self.cache_read - self.cache_write


def usage_parts(usage: Usage) -> UsageParts:
    """The counts of a usage object in the internal shape (``gateway.types.Usage``)."""
    prompt = max(count(usage.get("prompt_tokens")), 0)
    completion = max(count(usage.get("completion_tokens")), 0)
    read = max(count(field_of(usage.get("prompt_tokens_details"), "cached_tokens")), 0)
    read = min(read, prompt)
    write = min(max(count(usage.get("cache_creation_tokens")), 0), prompt - read)
    reasoning = max(count(field_of(usage.get("completion_tokens_details"), "reasoning_tokens")), 0)
    return UsageParts(prompt, completion, read, write, min(reasoning, completion))


class ConvertedStream:
    """A ``RelayStream`` that converts: upstream bytes -> SSE events (or the events of
    ``parser``'s framing) -> the channel protocol's decoder -> chat-completions chunks -> the
    client protocol's encoder -> bytes. Usage is the last a chunk reported. When a chunk
    raises, what the chunks before it in the same read became still goes out, ahead of the
    error event."""

    __slots__ = (
        "content_type", "usage", "_parser", "_decoder", "_encoder", "_before_error", "_chars",
    )  # fmt: skip

    def __init__(
        self, decoder: StreamDecoder, encoder: StreamEncoder, parser: EventParser | None = None
    ) -> None:
        self.content_type = encoder.content_type
        self.usage: Usage | None = None
        self._parser: EventParser = parser if parser is not None else SSEParser()
        self._decoder = decoder
        self._encoder = encoder
        self._before_error = b""
        self._chars = 0  # of text, reasoning and tool arguments generated

    @property
    def generated(self) -> int:
        return -(-self._chars // CHARS_PER_TOKEN)

    def feed(self, raw: bytes) -> bytes:
        events = self._parser.feed(raw)
        return self._convert(events, False) if events else b""

    def finish(self) -> bytes:
        return self._convert(self._parser.close(), True)

    def error(self, err: GatewayError) -> bytes:
        return self._before_error + self._encoder.error(err)

    def reported(self) -> Usage | None:
        """The usage as the upstream reported it so far: the last a chunk carried, else what
        the decoder read and holds for the stream's end (``HoldsUsage``). Read once, when a
        stream is billed."""
        if self.usage is not None:
            return self.usage
        decoder = self._decoder
        return decoder.usage_so_far() if isinstance(decoder, HoldsUsage) else None

    def _convert(self, events: list[SSEEvent], last: bool) -> bytes:
        out: list[bytes] = []
        encode = self._encoder.encode
        try:
            for event in events:
                for chunk in self._decoder.feed(event):
                    if chunk.get("usage"):
                        self.usage = chunk["usage"]
                    choices = chunk.get("choices")
                    if choices:
                        self._chars += delta_chars(choices)
                    out.append(encode(chunk))
            if last:
                for chunk in self._decoder.close():
                    if chunk.get("usage"):
                        self.usage = chunk["usage"]
                    out.append(encode(chunk))
                out.append(self._encoder.finish(self.usage))
        except GatewayError:
            self._before_error = b"".join(out)
            raise
        return b"".join(out)
