"""The chat kind (chat-completions, messages, generate-content) and token counting.

Every chat protocol reaches every channel type. When the client's protocol is the channel's,
the body goes through with only the model renamed (``Passthrough``); otherwise it is decoded
once into the chat-completions shape, shared by every attempt, and encoded for each channel.
Token counting asks the channel where its protocol can count (``Counter``) and estimates
locally where it cannot; it is recorded with its tokens and never charged.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass

import orjson

from gateway.config import CHANNEL_TYPES as TYPES
from gateway.config import Channel
from gateway.edge.asgi import parse_json, read_body
from gateway.errors import GatewayError, UpstreamError
from gateway.kinds.base import JSON_TYPE, Incoming, Reply, ReplyHeaders
from gateway.kinds.wire import Wire, chat_target, wire_for
from gateway.policy.billing import MAX_TOKENS, Metered, billable_tokens, usage_classes
from gateway.policy.tokens import CHARS_PER_TOKEN, estimate_prompt_tokens
from gateway.protocols import CLIENTS, ClientSide
from gateway.protocols.base import (
    ConvertedStream,
    Counter,
    Counting,
    Ctx,
    Passthrough,
    RelayStream,
    RouteMatch,
    UpstreamCall,
    UpstreamTarget,
)
from gateway.types import JSON, ChatRequest, Usage

CHANNEL_TYPES = frozenset(TYPES)  # every type serves chat (kinds.wire: how)
# what a quiet stream sends, by the client's protocol (and, for generate-content, its framing):
# an SSE comment for chat completions; the messages protocol's own ping event; for
# generate-content a blank line, which an SSE parser reads as no event and the JSON-array
# framing as whitespace (google-genai fails on an SSE comment)
KEEPALIVES = {
    ("openai", True): b": keep-alive\n\n",
    ("responses", True): b": keep-alive\n\n",
    ("anthropic", True): b'event: ping\ndata: {"type": "ping"}\n\n',
    ("gemini", True): b"\n",
    ("gemini", False): b"\n",
}
# the optional ability, looked up once: isinstance() against a Protocol walks its members
COUNTING: dict[str, Counting] = {n: a for n, a in CLIENTS.items() if isinstance(a, Counting)}


@dataclass(slots=True)
class ChatJob:
    client: ClientSide
    route: RouteMatch
    payload: JSON  # the client's body as parsed
    req: ChatRequest | None = None  # its chat-completions form, once a conversion needs it
    estimate: int | None = None  # the local estimate of its prompt tokens, once made
    size: int = 0  # bytes of the client's body
    most: int = 0  # its maximum output, every choice's (``most_output``); 0: none set
    ceiling: int | None = None  # the most output it is billed (``output_ceiling``)
    # the call a pass-through sent it in (its body: the same request, model renamed), from
    # which the prompt's estimate is made if one is wanted once the parsed form has gone
    sent: UpstreamCall | None = None

    def expected(self, default_output: int) -> Metered:
        """Its body's bytes as prompt tokens (no decoding: an over-estimate, which only
        holds more), and its maximum output (every choice's)."""
        return Metered(
            prompt_tokens=-(-self.size // CHARS_PER_TOKEN),
            completion_tokens=self.most or default_output,
        )

    def output_ceiling(self) -> int | None:
        return self.ceiling

    def bounded(self, used: Metered) -> Metered:
        """``used``, its output no more than the request's maximum: an upstream that reports
        more did not generate it (``policy.spend``)."""
        ceiling = self.ceiling
        if ceiling is not None and used.completion_tokens > ceiling:
            used.completion_tokens = ceiling
            used.classified()
        return used

    def release(self) -> None:
        """The decoded form goes, and the parsed body: a prompt with no estimate yet (a
        stream cut short before the upstream counted it is billed from one) keeps only the
        bytes its pass-through sent, a fraction of the parsed form's memory, for as long as
        the stream lasts."""
        self.req = None
        if self.estimate is not None or self.sent is not None:
            self.payload = None

    def decoded(self, ctx: Ctx) -> ChatRequest:
        """The request in the chat-completions shape, decoded once for every attempt; the
        local prompt estimate goes into ``ctx`` for the protocols that want it up front."""
        if self.req is None:
            self.req = self.client.decode_request(self.payload, self.route)
            ctx.prompt_tokens_estimate = self.estimate = estimate_prompt_tokens(self.req)
        return self.req

    def prompt_estimate(self) -> int:
        """The local estimate of the prompt's tokens, for when the upstream never said."""
        if self.estimate is None:
            payload, sent = self.payload, self.sent
            if payload is None and sent is None:
                return 0
            try:
                if payload is None and sent is not None:  # parsed again, for a cut stream only
                    payload = sent_body(sent)
                req = self.client.decode_request(payload, self.route)
            except GatewayError:
                return 0
            self.estimate = estimate_prompt_tokens(req)
        return self.estimate


def stream_used(stream: RelayStream, job: ChatJob, complete: bool) -> Metered:
    """What a stream used: the upstream's counts, those it reported before a cut too (a
    converted stream's decoder holds them for the stream's end: ``ConvertedStream.reported``);
    where it never sent one (a stream cut short before the upstream counted), the local
    estimate of the prompt; and for a stream that did not complete, at least what passed
    (the upstream's count so far may be a first, partial one)."""
    usage = stream.reported() if isinstance(stream, ConvertedStream) else stream.usage
    used = chat_used(usage)
    # a count, even an odd one, is the upstream's; a usage that is no object counts nothing
    if not isinstance(usage, dict) or "prompt_tokens" not in usage:
        used.prompt_tokens = job.prompt_estimate()
    if not complete:
        used.completion_tokens = max(used.completion_tokens, min(stream.generated, MAX_TOKENS))
    # an estimated prompt may be smaller than the cache's parts
    return job.bounded(used.classified())


async def read_chat(incoming: Incoming, kind: str) -> ChatJob:
    spec = incoming.spec
    raw = await read_body(
        incoming.receive,
        incoming.limits.max_request_bytes,
        incoming.headers.get(b"content-length"),
        incoming.reading,
    )
    payload = parse_json(raw)
    client = CLIENTS[spec.protocol]
    route = client.match(kind, payload, incoming.path_model, incoming.query, spec.stream)
    most = most_output(payload)
    ceiling = output_ceiling(payload, most)
    return ChatJob(client, route, payload, size=len(raw), most=most, ceiling=ceiling)


# where each protocol puts the reply's maximum length: chat-completions (both names), messages,
# Responses; generate-content's is in generationConfig
MAX_OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def max_output(payload: JSON) -> int:
    """The maximum output tokens a request asks for, 0 when it sets none (or an odd one)."""
    if not isinstance(payload, dict):
        return 0
    for name in MAX_OUTPUT_FIELDS:
        value = payload.get(name)
        if value is not None:
            return billable_tokens(value)
    config = payload.get("generationConfig")
    if isinstance(config, dict):
        return billable_tokens(config.get("maxOutputTokens"))
    return 0


# the most choices one request may ask for (OpenAI's limit on ``n``)
MAX_CHOICES = 128


def most_output(payload: JSON) -> int:
    """The most output tokens a request can have generated: its maximum times the choices it
    asks for (chat-completions' ``n``, generate-content's ``candidateCount``: an upstream
    counts every choice's output); 0 when it sets no maximum."""
    most = max_output(payload)
    if not most or not isinstance(payload, dict):
        return 0
    n = payload.get("n")
    config = payload.get("generationConfig")
    if n is None and isinstance(config, dict):
        n = config.get("candidateCount")
    return most * (n if type(n) is int and 1 <= n <= MAX_CHOICES else 1)


def output_ceiling(payload: JSON, most: int) -> int | None:
    """The most output a request is billed (``policy.spend``): its ``most``; None when it
    sets no maximum, or asks for a predicted output (OpenAI bills the prediction's rejected
    tokens as output, beyond the maximum)."""
    if not most or (isinstance(payload, dict) and payload.get("prediction") is not None):
        return None
    return most


def chat_used(usage: Usage | None) -> Metered:
    return usage_classes(usage)


def sent_body(sent: UpstreamCall) -> JSON:
    """A pass-through's body, as its client's protocol reads it, near enough to estimate its
    prompt from: Bedrock's and Vertex's Messages bodies name their model in the URL, not in
    the body, where the Messages protocol wants one (its name counts for nothing)."""
    payload = upstream_json(sent.body)
    if isinstance(payload, dict) and "messages" in payload:
        payload.setdefault("model", "-")
    return payload


def upstream_json(raw: bytes) -> JSON:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise UpstreamError("the upstream sent a reply that is not JSON") from None


class PassthroughChat:
    """Client protocol == channel type: the body and the reply go through, model renamed."""

    __slots__ = (
        "call", "upload", "replayable", "keepalive", "_adapter", "_wire", "_job", "_ctx",
        "_target",
    )  # fmt: skip

    def __init__(
        self,
        adapter: Passthrough,
        wire: Wire,
        job: ChatJob,
        ctx: Ctx,
        target: UpstreamTarget,
        last: bool,
    ) -> None:
        payload = job.payload if last else dict(job.payload)  # renamed in place
        self.call: UpstreamCall | None = adapter.passthrough_request(payload, job.route, target)
        job.sent = self.call  # the last made is the one answered when the job is released
        self.upload: AsyncIterable[bytes] | None = None
        self.replayable = True
        self.keepalive = KEEPALIVES.get((job.route.protocol, job.route.sse), b"")
        self._adapter = adapter
        self._wire = wire
        self._job = job
        self._ctx = ctx
        self._target = target

    def decode_error(self, status: int, raw: bytes, headers: ReplyHeaders = None) -> GatewayError:
        return self._wire.errors(status, raw, headers)

    def reply(self, raw: bytes, headers: Mapping[str, str]) -> Reply:
        out, usage = self._adapter.passthrough_response(upstream_json(raw), self._ctx)
        return Reply(orjson.dumps(out), JSON_TYPE, self._job.bounded(chat_used(usage)))

    def stream(self, headers: Mapping[str, str]) -> RelayStream:
        return self._adapter.passthrough_stream(self._ctx, self._job.route, self._target)

    def used(self, stream: RelayStream, complete: bool) -> Metered:
        return stream_used(stream, self._job, complete)


class ConvertedChat:
    """Client protocol != channel type: through the chat-completions shape both ways."""

    __slots__ = (
        "call",
        "upload",
        "replayable",
        "keepalive",
        "_client",
        "_wire",
        "_job",
        "_ctx",
    )

    def __init__(self, wire: Wire, job: ChatJob, ctx: Ctx, target: UpstreamTarget) -> None:
        self.call: UpstreamCall | None = wire.upstream.encode_request(job.decoded(ctx), target)
        self.upload: AsyncIterable[bytes] | None = None
        self.replayable = True
        self.keepalive = KEEPALIVES.get((job.route.protocol, job.route.sse), b"")
        self._client = job.client
        self._wire = wire
        self._job = job
        self._ctx = ctx

    def decode_error(self, status: int, raw: bytes, headers: ReplyHeaders = None) -> GatewayError:
        return self._wire.errors(status, raw, headers)

    def reply(self, raw: bytes, headers: Mapping[str, str]) -> Reply:
        resp = self._wire.upstream.decode_response(upstream_json(raw))
        usage = resp.get("usage")
        out = self._client.encode_response(resp, self._ctx)
        return Reply(orjson.dumps(out), JSON_TYPE, self._job.bounded(chat_used(usage)))

    def stream(self, headers: Mapping[str, str]) -> RelayStream:
        return self._wire.stream(
            self._wire.upstream.stream_decoder(self._ctx),
            self._client.stream_encoder(self._ctx, self._job.route),
        )

    def used(self, stream: RelayStream, complete: bool) -> Metered:
        return stream_used(stream, self._job, complete)


class ChatKind:
    name = "chat"
    capability = "chat"
    billed = True

    def channel_types(self, protocol: str) -> frozenset[str]:
        return CHANNEL_TYPES

    async def read(self, incoming: Incoming) -> ChatJob:
        return await read_chat(incoming, self.name)

    def exchange(
        self, job: ChatJob, channel: Channel, target: UpstreamTarget, ctx: Ctx, last: bool
    ) -> PassthroughChat | ConvertedChat:
        target = chat_target(channel, target)
        wire = wire_for(channel, target)
        same = wire.passthrough.get(job.route.protocol)
        if same is not None:
            return PassthroughChat(same, wire, job, ctx, target, last)
        return ConvertedChat(wire, job, ctx, target)


class Count:
    """One count: asked of a channel that can count, else the local estimate."""

    __slots__ = (
        "call",
        "upload",
        "replayable",
        "keepalive",
        "_client",
        "_wire",
        "_counter",
        "_ctx",
    )

    def __init__(
        self, client: Counting, wire: Wire, req: ChatRequest, ctx: Ctx, target: UpstreamTarget
    ) -> None:
        counter: Counter | None = wire.counter
        self.call: UpstreamCall | None = (
            counter.count_request(req, target) if counter is not None else None
        )
        self._counter = counter
        self.keepalive = b""
        self.upload: AsyncIterable[bytes] | None = None
        self.replayable = True
        self._client = client
        self._wire = wire
        self._ctx = ctx

    def decode_error(self, status: int, raw: bytes, headers: ReplyHeaders = None) -> GatewayError:
        return self._wire.errors(status, raw, headers)

    def reply(self, raw: bytes, headers: Mapping[str, str]) -> Reply:
        tokens = self._ctx.prompt_tokens_estimate
        if self._counter is not None:
            tokens = self._counter.decode_count(upstream_json(raw))
        body = orjson.dumps(self._client.encode_count(tokens, self._ctx))
        return Reply(body, JSON_TYPE, Metered(prompt_tokens=billable_tokens(tokens)))

    def stream(self, headers: Mapping[str, str]) -> RelayStream:
        # never called: CountKind.read makes every count a whole reply
        raise UpstreamError("a token count does not stream")

    def used(self, stream: RelayStream, complete: bool) -> Metered:
        return Metered()


class CountKind:
    name = "count_tokens"
    capability = "chat"
    billed = False

    def channel_types(self, protocol: str) -> frozenset[str]:
        return CHANNEL_TYPES if protocol in COUNTING else frozenset()

    async def read(self, incoming: Incoming) -> ChatJob:
        job = await read_chat(incoming, self.name)
        job.route.stream = False
        return job

    def exchange(
        self, job: ChatJob, channel: Channel, target: UpstreamTarget, ctx: Ctx, last: bool
    ) -> Count:
        client = COUNTING[job.route.protocol]  # channel_types() admits no other client
        target = chat_target(channel, target)
        return Count(client, wire_for(channel, target), job.decoded(ctx), ctx, target)
