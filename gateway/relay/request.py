"""One request as the relay carries it from admission to settlement.

Built once the request is admitted (its key checked, its body read, its balance held), and
handed whole to the attempts and the stream loop instead of eight to ten parameters each:
what was asked (the kind and its job, the model and its rate), the call record that fills in,
and the client's side of the ASGI connection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gateway.config import Model
from gateway.edge.interrupt import Interrupt
from gateway.kinds.base import Kind
from gateway.policy.billing import Rate
from gateway.protocols.base import Ctx
from gateway.relay.call import Call
from gateway.relay.stream import Quiet
from gateway.types import Receive, Send


@dataclass(slots=True)
class RelayRequest:
    kind: Kind[Any]
    job: Any  # the kind's job: its route (model, stream flag) and its body
    model: Model  # the catalogue model asked for
    rate: Rate | None  # None: not charged (token counting)
    call: Call  # the usage record as it fills in
    ctx: Ctx  # what the adapters may know of the request (ids, model name, usage wanted)
    client_headers: dict[str, str]  # the client's headers an upstream gets (anthropic-beta)
    interrupt: Interrupt  # how the request's timers stop it, and why
    receive: Receive = field(repr=False)
    send: Send = field(repr=False)
    stream: bool = False
    quiet: Quiet | None = None  # a stream's entry in the keep-alive timer, once it has one
    ratio: Fraction | int = 1  # the key's group's price ratio: every bill is multiplied by it
    # the output tokens a stream may produce before its hold must grow (``policy.spend``);
    # None: not metered
    allowance: int | None = None

    @property
    def request_id(self) -> str:
        return self.call.request_id
