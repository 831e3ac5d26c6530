"""What a channel speaks to one of its upstream models: the adapter that converts a chat
request for it, the client protocols that pass through to it unconverted, whether it counts
tokens, how its streams are framed, how its errors read, and where its calls go. Pure: the
channel's credentials are added per attempt by ``gateway.upstream.auth``.

| channel type | upstream model              | wire                                             |
|--------------|-----------------------------|--------------------------------------------------|
| openai       | any                         | chat completions (Responses too: ``responses``)  |
| anthropic    | any                         | the Messages API                                 |
| gemini       | any                         | generate-content                                 |
| azure        | any (the deployment)        | chat completions (and Responses), Azure's        |
|              |                             | addresses (``protocols.azure``)                  |
| bedrock      | an id holding ``anthropic.``| the Messages API through ``invoke``              |
|              |                             | (``protocols.anthropic.bedrock``)                |
| bedrock      | any other                   | the Converse API (``protocols.converse``)        |
| vertex       | a name starting ``claude``  | the Messages API at Vertex's ``rawPredict``      |
| vertex       | any other                   | generate-content at Vertex's addresses           |

(The last four rows are the providers' own addressing rules, CONTRACT §2, not guesses about
models.) Bedrock's streams are AWS event-stream framing (``EventStreamParser``), and Bedrock
names an error in its ``x-amzn-errortype`` header, which ``errors`` reads. Vertex counts tokens
for both publishers; Bedrock and Azure do not (the local estimate answers).

The openai-type kinds (embeddings, images, audio, completions) reach ``azure`` channels
through ``openai_call`` and ``openai_errors``; embeddings reach ``vertex`` channels at
``:predict`` through ``embeddings_call`` and ``embeddings_errors``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from gateway.config import OPENAI_TYPES, Channel
from gateway.errors import GatewayError
from gateway.protocols import ADAPTERS, CLIENTS, azure, bedrock, vertex, vertex_embeddings
from gateway.protocols.anthropic.bedrock import InvokeAdapter
from gateway.protocols.base import (
    ConvertedStream,
    Counter,
    Ctx,
    EventParser,
    Passthrough,
    RelayStream,
    RouteMatch,
    StreamDecoder,
    StreamEncoder,
    UpstreamCall,
    UpstreamSide,
    UpstreamTarget,
)
from gateway.protocols.converse import ConverseAdapter
from gateway.protocols.openai.reply import decode_error as openai_decode_error
from gateway.types import JSON, ChatRequest, ChatResponse, Usage
from gateway.upstream.eventstream import EventStreamParser

Headers = Mapping[str, str] | None
ErrorDecoder = Callable[[int, bytes, Headers], GatewayError]
Address = Callable[[UpstreamCall], UpstreamCall]

# the optional abilities, looked up once: isinstance() against a Protocol walks its members
PASSTHROUGH: dict[str, Passthrough] = {
    name: a for name, a in CLIENTS.items() if isinstance(a, Passthrough)
}
COUNTERS: dict[str, Counter] = {n: a for n, a in ADAPTERS.items() if isinstance(a, Counter)}
BEDROCK_CLAUDE = "anthropic."  # in a Bedrock model id: Claude, through invoke
INVOKE = InvokeAdapter(EventStreamParser)
CONVERSE = ConverseAdapter()


@dataclass(frozen=True, slots=True)
class Wire:
    """How one attempt reaches its channel's upstream model."""

    upstream: UpstreamSide  # converts a chat request and its reply or stream
    errors: ErrorDecoder  # an error reply (status, body, headers) -> the gateway error
    passthrough: Mapping[str, Passthrough] = field(default_factory=dict)  # by client protocol
    counter: Counter | None = None  # None: the local estimate counts
    framing: Callable[[], EventParser] | None = None  # a stream's framing; None: SSE

    def stream(self, decoder: StreamDecoder, encoder: StreamEncoder) -> RelayStream:
        """A converted stream, read in the wire's framing."""
        parser = self.framing() if self.framing is not None else None
        return ConvertedStream(decoder, encoder, parser)


def _plain_errors(side: UpstreamSide) -> ErrorDecoder:
    def errors(status: int, raw: bytes, headers: Headers) -> GatewayError:
        return side.decode_error(status, raw)

    return errors


def _bedrock_errors(status: int, raw: bytes, headers: Headers) -> GatewayError:
    header = headers.get(bedrock.ERROR_TYPE_HEADER) if headers is not None else None
    return bedrock.decode_error(status, raw, header)


def _vertex_errors(status: int, raw: bytes, headers: Headers) -> GatewayError:
    return vertex.decode_error(status, raw)


def _azure_errors(status: int, raw: bytes, headers: Headers) -> GatewayError:
    return azure.decode_error(status, raw)


class AddressedSide:
    """An adapter's upstream side whose calls are sent where a cloud takes them."""

    name: ClassVar[str] = "addressed"
    __slots__ = ("_inner", "_address")

    def __init__(self, inner: UpstreamSide, address: Address) -> None:
        self._inner = inner
        self._address = address

    def encode_request(self, req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
        return self._address(self._inner.encode_request(req, target))

    def decode_response(self, payload: JSON) -> ChatResponse:
        return self._inner.decode_response(payload)

    def stream_decoder(self, ctx: Ctx) -> StreamDecoder:
        return self._inner.stream_decoder(ctx)

    def decode_error(self, status: int, raw: bytes) -> GatewayError:
        return self._inner.decode_error(status, raw)


class AddressedPassthrough:
    """A pass-through whose calls are sent where a cloud takes them."""

    __slots__ = ("_inner", "_address")

    def __init__(self, inner: Passthrough, address: Address) -> None:
        self._inner = inner
        self._address = address

    def passthrough_request(
        self, payload: JSON, route: RouteMatch, target: UpstreamTarget
    ) -> UpstreamCall:
        return self._address(self._inner.passthrough_request(payload, route, target))

    def passthrough_response(self, payload: JSON, ctx: Ctx) -> tuple[JSON, Usage | None]:
        return self._inner.passthrough_response(payload, ctx)

    def passthrough_stream(
        self, ctx: Ctx, route: RouteMatch, target: UpstreamTarget
    ) -> RelayStream:
        return self._inner.passthrough_stream(ctx, route, target)


class AddressedCounter:
    """A token counter whose calls are sent where a cloud takes them."""

    __slots__ = ("_inner", "_address")

    def __init__(self, inner: Counter, address: Address) -> None:
        self._inner = inner
        self._address = address

    def count_request(self, req: ChatRequest, target: UpstreamTarget) -> UpstreamCall:
        return self._address(self._inner.count_request(req, target))

    def decode_count(self, payload: JSON) -> int:
        return self._inner.decode_count(payload)


def _plain(ctype: str, speaks: frozenset[str]) -> Wire:
    side = ADAPTERS[ctype]
    return Wire(
        upstream=side,
        errors=_plain_errors(side),
        passthrough={p: PASSTHROUGH[p] for p in speaks if p in PASSTHROUGH},
        counter=COUNTERS.get(ctype),
    )


# the wires of the types that need nothing per attempt, by (type, speaks): made once
_PLAIN: dict[tuple[str, frozenset[str]], Wire] = {}


def _addressed(
    adapter: str, speaks: frozenset[str], address: Address, errors: ErrorDecoder
) -> Wire:
    counter = COUNTERS.get(adapter)
    return Wire(
        upstream=AddressedSide(ADAPTERS[adapter], address),
        errors=errors,
        passthrough={p: AddressedPassthrough(PASSTHROUGH[p], address) for p in speaks},
        counter=AddressedCounter(counter, address) if counter is not None else None,
    )


def openai_call(channel: Channel, target: UpstreamTarget) -> Address | None:
    """Where an openai-type channel's calls go: None (as encoded) for openai channels,
    Azure's deployment addresses for azure ones."""
    if channel.type != "azure":
        return None
    site = azure.AzureSite(channel.base_url, channel.cloud.api_version)
    deployment, key = target.model, target.api_key

    def address(call: UpstreamCall) -> UpstreamCall:
        return azure.azure_call(call, site, deployment, key)

    return address


def openai_errors(channel: Channel) -> Callable[[int, bytes], GatewayError]:
    """How an openai-type channel's error replies read."""
    return azure.decode_error if channel.type == "azure" else openai_decode_error


def embeddings_call(channel: Channel, target: UpstreamTarget) -> Address | None:
    """Where a channel's embeddings calls go: None (as encoded) for openai and gemini
    channels, Azure's deployment addresses, Vertex's ``:predict`` in the channel's project."""
    if channel.type != "vertex":
        return openai_call(channel, target)
    site = vertex.VertexSite(channel.cloud.project, channel.cloud.region, channel.base_url)
    model = target.model

    def address(call: UpstreamCall) -> UpstreamCall:
        return vertex_embeddings.predict_call(call, site, model)

    return address


def embeddings_errors(channel: Channel) -> Callable[[int, bytes], GatewayError] | None:
    """How a cloud channel's embeddings errors read; None: as its protocol's."""
    if channel.type == "vertex":
        return vertex.decode_error
    return azure.decode_error if channel.type == "azure" else None


def _vertex(channel: Channel, target: UpstreamTarget) -> Wire:
    site = vertex.VertexSite(channel.cloud.project, channel.cloud.region, channel.base_url)
    model = target.model
    if vertex.publisher(model) == "anthropic":

        def claude(call: UpstreamCall) -> UpstreamCall:
            return vertex.claude_call(call, site, model)

        return _addressed("anthropic", frozenset({"anthropic"}), claude, _vertex_errors)

    def gemini(call: UpstreamCall) -> UpstreamCall:
        return vertex.gemini_call(call, site, model)

    return _addressed("gemini", frozenset({"gemini"}), gemini, _vertex_errors)


def wire_for(channel: Channel, target: UpstreamTarget) -> Wire:
    """The wire of one attempt on ``channel`` (``target``: its upstream model and key)."""
    ctype = channel.type
    if ctype == "bedrock":
        if BEDROCK_CLAUDE in target.model:
            return Wire(INVOKE, _bedrock_errors, {"anthropic": INVOKE}, None, EventStreamParser)
        return Wire(CONVERSE, _bedrock_errors, {}, None, EventStreamParser)
    if ctype == "vertex":
        return _vertex(channel, target)
    address = openai_call(channel, target)
    if address is not None:  # azure
        return _addressed("openai", channel.speaks, address, _azure_errors)
    key = (ctype, channel.speaks)
    wire = _PLAIN.get(key)
    if wire is None:
        wire = _PLAIN[key] = _plain(ctype, channel.speaks)
    return wire


def chat_target(channel: Channel, target: UpstreamTarget) -> UpstreamTarget:
    """The target with what the channel says of its model: where an openai-type channel
    puts the output limit (``Channel.output_limit_field``)."""
    if channel.type in OPENAI_TYPES:
        target.max_tokens_field = channel.output_limit_field(target.model)
    return target
