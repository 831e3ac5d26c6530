"""One request's usage record as it fills in, and the rules for billing and recording it.

A record is handed to the usage writer exactly once per request that passed authentication;
after that it is no longer changed (a stream is recorded before its last bytes leave, so a
client that goes away in the last instant got, and pays for, the whole reply). A request
refused before that (no key, a bad one, the store away) is counted in the metrics and logged
all the same, with no key and no usage record.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any

from gateway.observe.access_log import AccessLog
from gateway.observe.metrics import Metrics
from gateway.policy.billing import FREE, Metered, Rate
from gateway.store import KeyRecord, UsageRecord
from gateway.store.writer import UsageWriter

CLIENT_GONE = 499
# a model name is the one text of a usage record that the client chooses, and an unknown one
# is recorded too (its 404): kept to this many characters, so records stay small
MAX_RECORDED_MODEL = 256


@dataclass(slots=True)
class Call(UsageRecord):
    """One request's usage record as it fills in (metadata only), handed to the writer as it
    is rather than copied into a separate record."""

    started: float = 0.0  # perf_counter() when the request arrived
    reply_id: str = ""  # the reply's x-request-id: the client's own, else request_id
    key: KeyRecord | None = None
    responded: bool = False  # the response's status line has been sent
    recorded: bool = False  # handed to the writer
    held: int = 0  # micro-units held against the balance until the record replaces them
    first_chunk: float | None = None  # a stream's seconds from arrival to its first output
    upstream_started: float = 0.0  # perf_counter() when the attempt that answered began
    upstream_first: float | None = None  # a stream's seconds from then to the upstream's first
    span: Any = None  # the request's trace span, when tracing is configured

    @classmethod
    def arriving(
        cls, at: datetime, ids: tuple[str, str], protocol: str, endpoint: str, ip_range: str
    ) -> Call:
        """A request's record as it arrives (``ids``: ``request_ids()``): no key, model,
        channel or tokens yet."""
        # positional, in the fields' order (``UsageRecord``'s, then ``started``, ``reply_id``):
        # matching 20 keywords costs more than the rest of this request's bookkeeping
        return cls(
            at,  # time
            ids[0],  # request_id
            "",  # account: the key's, once known
            "",  # key_id
            "",  # model
            None,  # channel
            protocol,
            endpoint,
            0,  # prompt_tokens
            0,  # completion_tokens
            0,  # cost
            200,  # status
            0,  # latency_ms
            ip_range,
            0,  # cache_read_tokens
            0,  # cache_write_tokens
            0,  # reasoning_tokens
            0,  # cost_pico
            0,  # cache_write_1h_tokens
            time.perf_counter(),  # started
            ids[1],  # reply_id
        )

    def set_status(self, status: int) -> None:
        """The status the client saw, unless the record was handed to the writer already."""
        if not self.recorded:
            self.status = status

    def bill(self, used: Metered, rate: Rate | None, ratio: Fraction | int = 1) -> None:
        """Tokens (by class) and exact cost of what the request used, times ``ratio`` (its
        group's; ``rate`` None: not charged)."""
        if self.recorded:
            return  # handed to the writer: it is no longer changed
        self.prompt_tokens = used.prompt_tokens  # plausible counts (billing.billable_tokens)
        self.completion_tokens = used.completion_tokens
        self.cache_read_tokens = used.cache_read_tokens  # parts of them (Metered.classified)
        self.cache_write_tokens = used.cache_write_tokens
        self.cache_write_1h_tokens = used.cache_write_1h_tokens
        self.reasoning_tokens = used.reasoning_tokens
        charge = rate.charge(used, ratio) if rate is not None else FREE
        self.cost = charge.micro
        self.cost_pico = charge.pico

    def record(
        self, writer: UsageWriter, metrics: Metrics | None, access: AccessLog | None
    ) -> Awaitable[None] | None:
        """Hand the record to the writer, count it in ``metrics`` and log its line; once
        per request, a no-op after that. A request without a key (refused before one was
        known) is counted and logged, not written. Returns what to await for the record to
        be durable (``UsageWriter.submit``)."""
        if self.recorded:
            return None
        self.recorded = True
        key = self.key
        if key is not None:
            self.account = key.account
            self.key_id = key.id
        if len(self.model) > MAX_RECORDED_MODEL:
            self.model = self.model[:MAX_RECORDED_MODEL]
        now = time.perf_counter()
        seconds = now - self.started
        self.latency_ms = int(seconds * 1000)
        if metrics is not None:
            began = self.upstream_started
            upstream = now - began if began else None
            metrics.observe(self, seconds, self.first_chunk, upstream, self.upstream_first)
        if access is not None:
            access.write(self, self.reply_id)
        if key is None:
            return None
        return writer.submit(self, self.held)

    def served_elsewhere(self, metrics: Metrics | None, access: AccessLog | None) -> None:
        """Count and log a request the relay did not serve (model lists, admin, probes, an
        unknown path), as its status says: no usage record."""
        self.recorded = True
        self.latency_ms = int((time.perf_counter() - self.started) * 1000)
        if metrics is not None:
            metrics.observe_other(self.protocol, self.endpoint, self.status)
        if access is not None:
            access.write(self, self.reply_id)
