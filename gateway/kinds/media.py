"""The openai-only kinds with JSON requests: images, rerank and speech.

Each goes to an openai-type channel (``{base_url}/images/generations``, ``/rerank``,
``/audio/speech``) with only the model renamed; images and speech to azure channels too (at
Azure's deployment addresses); no other channel type has these endpoints.

- images: the reply (``b64_json`` or ``url`` items) comes back as it is. Billed by the tokens
  the upstream reports (``usage.input_tokens``/``output_tokens``, as gpt-image models do),
  else per image returned (the catalogue's ``image`` price).
- rerank: ``{model, query, documents, top_n}`` at ``/v1/rerank``, and Cohere's v2 shape at
  ``/v2/rerank`` (the same fields, documents as strings; Cohere's SDK's ``v2.rerank``); the
  reply carries the client's model name and its results best first, the rest as the upstream
  sent it (Jina's ``usage``, Cohere's ``id`` and ``meta``); billed by the tokens reported
  (``usage.prompt_tokens`` or ``total_tokens``, Cohere's ``meta.billed_units.input_tokens``),
  plus the ``request`` price.
- speech: the binary audio is streamed back as it arrives with the upstream's content type;
  billed per character of ``input`` (the ``speech_char`` price, per million characters).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Mapping
from dataclasses import dataclass

import orjson

from gateway.config import Channel
from gateway.edge.asgi import parse_json, read_body
from gateway.errors import GatewayError, InvalidRequestError, UpstreamError
from gateway.kinds.base import JSON_TYPE, Incoming, Reply, ReplyHeaders
from gateway.kinds.chat import upstream_json
from gateway.kinds.wire import openai_call, openai_errors
from gateway.policy.billing import MAX_IMAGES, MAX_SPEECH_CHARS, Metered, billable_tokens
from gateway.protocols.base import Ctx, RelayStream, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.fields import REQUEST
from gateway.types import JSON, Usage

OPENAI_ONLY = frozenset({"openai"})
OPENAI_TYPES = frozenset({"openai", "azure"})  # chat completions' endpoints, Azure's too
NO_CHANNEL: frozenset[str] = frozenset()


def openai_headers(target: UpstreamTarget) -> dict[str, str]:
    return {"Content-Type": "application/json", "Authorization": f"Bearer {target.api_key}"}


def json_object(payload: JSON) -> dict[str, JSON]:
    if not isinstance(payload, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return payload


def body_model(payload: dict[str, JSON]) -> str:
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' is required and must be a string")
    return model


@dataclass(slots=True)
class MediaJob:
    route: RouteMatch
    payload: dict[str, JSON] | None
    used: Metered  # what the request itself says it will use (speech: its characters)

    def release(self) -> None:
        self.payload = None

    def expected(self, default_output: int) -> Metered:
        return self.used

    def output_ceiling(self) -> int | None:
        return 0  # billed by what it sends or receives, not by output tokens


class RawStream:
    """A ``RelayStream`` of bytes passed on as they came (binary audio)."""

    __slots__ = ("content_type", "usage", "generated")

    def __init__(self, content_type: str) -> None:
        self.content_type = content_type
        self.usage: Usage | None = None
        self.generated = 0  # audio is billed by what was asked, not what passed

    def feed(self, raw: bytes) -> bytes:
        return raw

    def finish(self) -> bytes:
        return b""

    def error(self, err: GatewayError) -> bytes:
        return b""  # audio has no in-band error: the stream just ends short


class MediaExchange:
    __slots__ = ("call", "upload", "replayable", "keepalive", "_kind", "_job", "_ctx", "_errors")

    def __init__(
        self, kind: MediaKind, job: MediaJob, channel: Channel, target: UpstreamTarget, ctx: Ctx
    ) -> None:
        assert job.payload is not None
        body = dict(job.payload)
        body["model"] = target.model
        call = UpstreamCall(
            url=target.base_url + kind.path, headers=openai_headers(target), body=orjson.dumps(body)
        )
        address = openai_call(channel, target)
        self.call: UpstreamCall | None = call if address is None else address(call)
        self.upload: AsyncIterable[bytes] | None = None
        self.replayable = True
        self.keepalive = b""
        self._kind = kind
        self._job = job
        self._ctx = ctx
        self._errors = openai_errors(channel)

    def decode_error(self, status: int, raw: bytes, headers: ReplyHeaders = None) -> GatewayError:
        return self._errors(status, raw)

    def reply(self, raw: bytes, headers: Mapping[str, str]) -> Reply:
        payload = upstream_json(raw)
        if not isinstance(payload, dict):
            raise UpstreamError("the upstream sent a reply that is not a JSON object")
        used = self._kind.meter(payload, self._job.used)
        if "model" in payload:
            payload["model"] = self._ctx.model
        return Reply(orjson.dumps(payload), JSON_TYPE, used)

    def stream(self, headers: Mapping[str, str]) -> RelayStream:
        return RawStream(headers.get("content-type", "application/octet-stream"))

    def used(self, stream: RelayStream, complete: bool) -> Metered:
        return self._job.used


def images_used(reply: dict[str, JSON], asked: Metered) -> Metered:
    usage = reply.get("usage")
    if isinstance(usage, dict) and ("input_tokens" in usage or "output_tokens" in usage):
        return Metered(
            prompt_tokens=billable_tokens(usage.get("input_tokens")),
            completion_tokens=billable_tokens(usage.get("output_tokens")),
        )
    data = reply.get("data")
    return Metered(images=min(len(data), MAX_IMAGES) if isinstance(data, list) else 0)


def _relevance(result: dict[str, JSON]) -> float:
    score = result.get("relevance_score")
    if isinstance(score, int | float) and not isinstance(score, bool):
        return float(score)
    return float("-inf")


def rerank_used(reply: dict[str, JSON], asked: Metered) -> Metered:
    results = reply.get("results")
    if isinstance(results, list) and all(isinstance(r, dict) for r in results):
        results.sort(key=_relevance, reverse=True)  # best first, whatever the upstream's order
    usage = reply.get("usage")
    tokens = 0
    if isinstance(usage, dict):
        tokens = billable_tokens(usage.get("prompt_tokens")) or billable_tokens(
            usage.get("total_tokens")
        )
    meta = reply.get("meta")  # Cohere's: meta.billed_units.input_tokens
    units = meta.get("billed_units") if isinstance(meta, dict) else None
    if not tokens and isinstance(units, dict):
        tokens = billable_tokens(units.get("input_tokens"))
    return Metered(prompt_tokens=tokens)


def speech_used(reply: dict[str, JSON], asked: Metered) -> Metered:
    return asked


def speech_asks(payload: dict[str, JSON]) -> Metered:
    text = payload.get("input")
    if not isinstance(text, str) or not text:
        raise InvalidRequestError("'input' is required and must be a string")
    for key in ("response_format", "instructions"):
        REQUEST.opt_text(payload.get(key), key)
    REQUEST.opt_bool(payload.get("stream"), "stream")
    return Metered(speech_chars=min(len(text), MAX_SPEECH_CHARS))


def nothing_asked(payload: dict[str, JSON]) -> Metered:
    return Metered()


def images_asks(payload: dict[str, JSON]) -> Metered:
    """The fields of an images request of known type, checked (the body goes as it came)."""
    REQUEST.text(payload.get("prompt"), "prompt")
    REQUEST.opt_integer(payload.get("n"), "n")
    for key in ("size", "quality", "response_format", "style", "user"):
        REQUEST.opt_text(payload.get(key), key)
    return Metered()


def rerank_asks(payload: dict[str, JSON]) -> Metered:
    """``{model, query, documents, top_n}``: a query string, a list of documents (strings, or
    objects as the Cohere-compatible APIs take), a top_n integer."""
    REQUEST.text(payload.get("query"), "query")
    for i, document in enumerate(REQUEST.array(payload.get("documents"), "documents")):
        if not isinstance(document, str | dict):
            raise REQUEST.bad("documents", i, "a string or an object")
    REQUEST.opt_integer(payload.get("top_n"), "top_n")
    return Metered()


class MediaKind:
    """An openai-only kind whose request is a JSON object naming its model."""

    billed = True

    def __init__(
        self,
        name: str,
        capability: str,
        path: str,
        meter: Callable[[dict[str, JSON], Metered], Metered],
        asks: Callable[[dict[str, JSON]], Metered] = nothing_asked,
        streams: bool = False,
        types: frozenset[str] = OPENAI_TYPES,
    ) -> None:
        self.name = name
        self.capability = capability
        self.path = path
        self.meter = meter
        self.asks = asks
        self.streams = streams  # the reply is always relayed as it arrives
        self.types = types  # the channel types with the endpoint

    def channel_types(self, protocol: str) -> frozenset[str]:
        return self.types if protocol == "openai" else NO_CHANNEL

    async def read(self, incoming: Incoming) -> MediaJob:
        raw = await read_body(
            incoming.receive,
            incoming.limits.max_request_bytes,
            incoming.headers.get(b"content-length"),
            incoming.reading,
        )
        return self.job(parse_json(raw), incoming.spec.protocol)

    def job(self, payload: JSON, protocol: str = "openai") -> MediaJob:
        """The request read from its parsed body (pure: what ``read`` does past the bytes)."""
        body = json_object(payload)
        route = RouteMatch(
            protocol=protocol, capability=self.name, model=body_model(body), stream=self.streams
        )
        return MediaJob(route, body, self.asks(body))

    def exchange(
        self, job: MediaJob, channel: Channel, target: UpstreamTarget, ctx: Ctx, last: bool
    ) -> MediaExchange:
        return MediaExchange(self, job, channel, target, ctx)


IMAGES = MediaKind("images", "images", "/images/generations", images_used, asks=images_asks)
RERANK = MediaKind(
    "rerank", "rerank", "/rerank", rerank_used, asks=rerank_asks, types=OPENAI_ONLY
)  # Azure OpenAI has no rerank
SPEECH = MediaKind(
    "audio_speech", "audio", "/audio/speech", speech_used, asks=speech_asks, streams=True
)
