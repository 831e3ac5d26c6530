"""The embeddings kind: ``POST /v1/embeddings`` and generate-content's ``:embedContent`` and
``:batchEmbedContents``, served by openai, azure (OpenAI's shape, at Azure's addresses),
gemini and vertex (Google's embedding models through ``:predict``, ``protocols.
vertex_embeddings``) channels.

The request is decoded once at arrival (so a malformed one is a 400 whichever channel would
have served it). Same protocol on both sides: the body goes through with the model renamed;
otherwise through the internal shape (``protocols.embeddings``). Billed by the prompt tokens
the upstream reports; Gemini usually reports none, and then the local estimate (about four
characters a token, ``tokens.CHARS_PER_TOKEN``) is billed and shown to the client as usage.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass

import orjson

from gateway.config import Channel
from gateway.edge.asgi import parse_json, read_body
from gateway.errors import GatewayError, UpstreamError
from gateway.kinds.base import JSON_TYPE, Incoming, Reply, ReplyHeaders
from gateway.kinds.chat import upstream_json
from gateway.kinds.wire import embeddings_call, embeddings_errors
from gateway.policy.billing import Metered, billable_tokens
from gateway.policy.tokens import CHARS_PER_TOKEN
from gateway.protocols.base import Ctx, RelayStream, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.embeddings import EmbeddingsAdapter, EmbeddingsRequest, EmbeddingsUpstream
from gateway.protocols.gemini.embeddings import GEMINI_EMBEDDINGS
from gateway.protocols.openai.embeddings import OPENAI_EMBEDDINGS
from gateway.protocols.vertex_embeddings import VERTEX_EMBEDDINGS
from gateway.types import JSON

EMBEDDINGS: dict[str, EmbeddingsAdapter] = {
    "openai": OPENAI_EMBEDDINGS,
    "gemini": GEMINI_EMBEDDINGS,
}
# the channel types and the protocol each speaks for embeddings
SPOKEN: dict[str, EmbeddingsUpstream] = {
    "openai": OPENAI_EMBEDDINGS,
    "azure": OPENAI_EMBEDDINGS,
    "gemini": GEMINI_EMBEDDINGS,
    "vertex": VERTEX_EMBEDDINGS,
}
CHANNEL_TYPES = frozenset(SPOKEN)


def estimate_tokens(req: EmbeddingsRequest) -> int:
    """The local estimate of an embeddings request's tokens (token arrays: their length)."""
    tokens = 0
    for item in req["input"]:
        tokens += len(item) if isinstance(item, list) else -(-len(item) // CHARS_PER_TOKEN)
    return tokens


@dataclass(slots=True)
class EmbeddingsJob:
    client: EmbeddingsAdapter
    route: RouteMatch
    payload: JSON
    req: EmbeddingsRequest
    estimate: int

    def release(self) -> None:
        self.payload = None

    def expected(self, default_output: int) -> Metered:
        return Metered(prompt_tokens=self.estimate)

    def output_ceiling(self) -> int | None:
        return 0  # no output tokens


class EmbeddingsExchange:
    """One attempt: through the body as it is (same protocol) or converted."""

    __slots__ = (
        "call", "upload", "replayable", "keepalive", "_job", "_upstream", "_ctx", "_same",
        "_errors",
    )  # fmt: skip

    def __init__(
        self, job: EmbeddingsJob, channel: Channel, target: UpstreamTarget, ctx: Ctx, last: bool
    ) -> None:
        upstream = SPOKEN[channel.type]
        self._same = upstream is job.client
        if self._same:
            payload = job.payload if last else orjson.loads(orjson.dumps(job.payload))
            call = job.client.embeddings_passthrough(payload, job.route, target)
        else:
            call = upstream.embeddings_request(job.req, target)
        address = embeddings_call(channel, target)
        self.call: UpstreamCall | None = call if address is None else address(call)
        self._errors = embeddings_errors(channel) or upstream.decode_error
        self.upload: AsyncIterable[bytes] | None = None
        self.replayable = True
        self.keepalive = b""
        self._job = job
        self._upstream = upstream
        self._ctx = ctx

    def decode_error(self, status: int, raw: bytes, headers: ReplyHeaders = None) -> GatewayError:
        return self._errors(status, raw)

    def reply(self, raw: bytes, headers: Mapping[str, str]) -> Reply:
        payload = upstream_json(raw)
        job = self._job
        if self._same:
            out, usage = job.client.embeddings_passthrough_response(payload, self._ctx)
            tokens = usage["prompt_tokens"] if usage else job.estimate
        else:
            resp = self._upstream.decode_embeddings_response(payload, job.req)
            if "usage" not in resp:
                resp["usage"] = {"prompt_tokens": job.estimate, "total_tokens": job.estimate}
            tokens = resp["usage"]["prompt_tokens"]
            out = job.client.encode_embeddings(resp, job.req, self._ctx)
        return Reply(orjson.dumps(out), JSON_TYPE, Metered(prompt_tokens=billable_tokens(tokens)))

    def stream(self, headers: Mapping[str, str]) -> RelayStream:
        # never called: EmbeddingsKind.read makes every request a whole reply
        raise UpstreamError("embeddings do not stream")

    def used(self, stream: RelayStream, complete: bool) -> Metered:
        return Metered()


class EmbeddingsKind:
    name = "embeddings"
    capability = "embeddings"
    billed = True

    def channel_types(self, protocol: str) -> frozenset[str]:
        return CHANNEL_TYPES if protocol in EMBEDDINGS else frozenset()

    async def read(self, incoming: Incoming) -> EmbeddingsJob:
        spec = incoming.spec
        raw = await read_body(
            incoming.receive,
            incoming.limits.max_request_bytes,
            incoming.headers.get(b"content-length"),
            incoming.reading,
        )
        payload = parse_json(raw)
        client = EMBEDDINGS[spec.protocol]
        route = client.match_embeddings(
            payload,
            RouteMatch(
                protocol=spec.protocol,
                capability=self.name,
                model=incoming.path_model,
                stream=False,
                action=spec.action,
            ),
        )
        req = client.decode_embeddings(payload, route)
        return EmbeddingsJob(client, route, payload, req, estimate_tokens(req))

    def exchange(
        self, job: EmbeddingsJob, channel: Channel, target: UpstreamTarget, ctx: Ctx, last: bool
    ) -> EmbeddingsExchange:
        return EmbeddingsExchange(job, channel, target, ctx, last)
