"""The embeddings endpoint kind: its internal shape and the interface each protocol implements.

The internal shape is OpenAI's embeddings request and reply with every vector as floats:
``decode_*`` moves toward it, ``encode_*`` away from it, as for chat. A client protocol that
asked for base64 (the ``openai`` SDK does by default) gets its vectors encoded on the way out
when the channel answered floats. Adapters are pure, like the chat ones.
"""

from __future__ import annotations

from array import array
from typing import ClassVar, NotRequired, Protocol, TypedDict

from gateway.errors import GatewayError, UpstreamError
from gateway.protocols.base import Ctx, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.types import JSON


class EmbeddingsRequest(TypedDict):
    model: str  # the name the client asked for
    input: list[str] | list[list[int]]  # texts, or token arrays (openai channels only)
    encoding_format: NotRequired[str]  # "float" | "base64": what the client wants back
    dimensions: NotRequired[int]
    task_type: NotRequired[str]  # gemini's taskType, carried when the client sent one
    single: NotRequired[bool]  # gemini embedContent (one vector) rather than a batch


class Embedding(TypedDict):
    index: int
    embedding: list[float]


class EmbeddingsUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(TypedDict):
    data: list[Embedding]
    usage: NotRequired[EmbeddingsUsage]  # absent when the upstream reports none


class EmbeddingsUpstream(Protocol):
    """The upstream side: what a channel's embeddings protocol needs (``vertex``'s has only
    this side: no client speaks it)."""

    name: ClassVar[str]  # "openai" | "gemini" | "vertex"

    def embeddings_request(
        self, req: EmbeddingsRequest, target: UpstreamTarget
    ) -> UpstreamCall: ...

    def decode_embeddings_response(
        self, payload: JSON, req: EmbeddingsRequest
    ) -> EmbeddingsResponse: ...

    def decode_error(self, status: int, raw: bytes) -> GatewayError: ...


class EmbeddingsAdapter(EmbeddingsUpstream, Protocol):
    """Both sides, for the protocols clients speak (``openai``, ``gemini``)."""

    # client side
    def match_embeddings(self, payload: JSON, route: RouteMatch) -> RouteMatch:
        """The request's facts (the model from the body or ``route.model``); stream False.
        InvalidRequestError when the body is not an object or lacks the model."""
        ...

    def decode_embeddings(self, payload: JSON, route: RouteMatch) -> EmbeddingsRequest: ...

    def encode_embeddings(
        self, resp: EmbeddingsResponse, req: EmbeddingsRequest, ctx: Ctx
    ) -> JSON: ...

    # same protocol on both sides: the body goes through, only the model renamed
    def embeddings_passthrough(
        self, payload: JSON, route: RouteMatch, target: UpstreamTarget
    ) -> UpstreamCall: ...

    def embeddings_passthrough_response(
        self, payload: JSON, ctx: Ctx
    ) -> tuple[JSON, EmbeddingsUsage | None]: ...


def vector(value: JSON, what: str) -> list[float]:
    """An upstream's vector, checked to be an array of numbers (kept as it came)."""
    if not isinstance(value, list):
        raise UpstreamError(f"upstream sent a malformed embedding ({what})")
    try:
        array("d", value)  # one pass in C: every item a number
    except (TypeError, OverflowError):
        raise UpstreamError(f"upstream sent a malformed embedding ({what})") from None
    return value


def check_order(data: list[Embedding], inputs: int) -> list[Embedding]:
    """The embeddings sorted by index, one per input, indices 0..n-1; else UpstreamError."""
    data.sort(key=lambda e: e["index"])
    if len(data) != inputs:
        raise UpstreamError(f"upstream sent {len(data)} embeddings for {inputs} inputs")
    for position, item in enumerate(data):
        if item["index"] != position:
            raise UpstreamError("upstream sent embeddings with duplicate or missing indices")
    return data
