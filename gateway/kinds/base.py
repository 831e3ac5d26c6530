"""What an endpoint kind is to the relay: how it reads its request, and how one attempt on
one channel sends it and reads the reply.

The relay's pipeline knows no kind and no protocol by name. For a request it asks the route's
``Kind`` to ``read`` the body into a ``Job`` (the request understood: its model, whether the
reply streams), which channel types the kind can reach from the client's protocol, and, per
channel tried, an ``Exchange``: the upstream call, how to decode the upstream's error, and
either a whole ``Reply`` or a ``RelayStream``. What a request used comes back as ``Metered``
and is priced by the catalogue (``billing.Rate``).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from gateway.config import Channel, Limits
from gateway.edge.asgi import BodyRead, Headers
from gateway.edge.routes import RouteSpec
from gateway.errors import GatewayError
from gateway.policy.billing import Metered
from gateway.protocols.base import Ctx, RelayStream, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.types import Receive, Scope

JSON_TYPE = b"application/json"
ReplyHeaders = Mapping[str, str] | None  # an upstream reply's headers, where a caller has them


@dataclass(slots=True)
class Incoming:
    """A request as the pipeline hands it to its kind, body not yet read."""

    spec: RouteSpec
    path_model: str | None  # the ``{model}`` of a generate-content path
    # the client's key is among the headers (and the scope's): in no repr
    scope: Scope = field(repr=False)
    receive: Receive = field(repr=False)
    headers: Headers = field(repr=False)  # the headers the relay reads (asgi.RELAY_HEADERS)
    limits: Limits
    query: bytes  # the query string
    reading: BodyRead | None = None  # the body's deadline (asgi.BodyDeadlines)


class Job(Protocol):
    """One request of a kind, read and understood: what every attempt starts from."""

    route: RouteMatch  # the model asked for, whether the reply streams, ...

    def release(self) -> None:
        """Let go of the request's body: an attempt succeeded and no other will follow (a
        stream may last minutes, and the bodies of thousands would add up)."""
        ...

    def expected(self, default_output: int) -> Metered:
        """The most the request is expected to use, held against the balance while it runs
        (``default_output``: the model's output tokens when the request sets no maximum)."""
        ...

    def output_ceiling(self) -> int | None:
        """The most output tokens the request can be billed (its maximum, set by the client:
        ``policy.spend``); None when it sets none; 0 for a kind billed otherwise."""
        ...


@dataclass(slots=True)
class Reply:
    """A whole reply, as the client gets it."""

    body: bytes
    content_type: bytes
    used: Metered


class Exchange(Protocol):
    """One attempt of a job on one channel."""

    call: UpstreamCall | None  # None: answered without the upstream (``reply(b"", {})``)
    upload: AsyncIterable[bytes] | None  # a body streamed as it arrives instead of call.body
    keepalive: bytes  # what a quiet stream sends its client now and then (b"": nothing)

    @property
    def replayable(self) -> bool:
        """Whether another channel may still be tried after this attempt failed."""
        ...

    def decode_error(self, status: int, raw: bytes, headers: ReplyHeaders = None) -> GatewayError:
        """An upstream's error reply; ``headers``: its headers (Bedrock names the error in
        one)."""
        ...

    def reply(self, raw: bytes, headers: Mapping[str, str]) -> Reply:
        """The client's reply from the upstream's whole body."""
        ...

    def stream(self, headers: Mapping[str, str]) -> RelayStream:
        """The stream object that turns the upstream's stream into the client's."""
        ...

    def used(self, stream: RelayStream, complete: bool) -> Metered:
        """What a stream used: as the upstream counted it when ``complete``, else at least
        what passed (an error, the client gone, the server stopping)."""
        ...


J = TypeVar("J", bound=Job)


class Kind(Protocol[J]):
    name: str  # the usage record's ``endpoint``
    capability: str  # the catalogue capability a model needs for it
    billed: bool  # False: recorded with its tokens, never charged (token counting)

    def channel_types(self, protocol: str) -> frozenset[str]:
        """The channel types that can serve this kind for a client of ``protocol``."""
        ...

    async def read(self, incoming: Incoming) -> J:
        """Read and understand the body: 413 past the limit, 400 for a malformed one."""
        ...

    def exchange(
        self, job: J, channel: Channel, target: UpstreamTarget, ctx: Ctx, last: bool
    ) -> Exchange:
        """One attempt on ``channel``; ``last``: no attempt follows, the job's body may be
        used up."""
        ...
