"""The hot path: one request pipeline for every endpoint kind and client protocol.

Authenticate (401), let the route's kind read the body (413, 400), check the balance (402),
choose the channels (404, 503), then try them in order: a failure before the first byte
reaches the client moves on to the next channel (``attempt.open_attempt`` classifies it and
keeps channel health). The reply is relayed whole or as a stream, billed from what the
upstream reported, and recorded: every request that passed authentication leaves exactly one
usage record, handed to the writer without awaiting; every request, refused or not, is counted
in the metrics and has its access-log line.

A second task watches for the client going away (``asgi.Watchlist``, after a short delay so
that quick replies never pay for it) and cancels the request, whose upstream response is then
closed at once; what was generated until then is billed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable
from datetime import UTC, datetime
from fractions import Fraction
from functools import partial
from typing import Any

from gateway.config import Channel, Settings
from gateway.edge.asgi import (
    BodyDeadlines,
    ClientGone,
    Watchlist,
    forwarded_headers,
    request_headers,
    send_error,
    too_slow,
)
from gateway.edge.interrupt import BODY_LATE, CLIENT_GONE, Interrupt
from gateway.edge.request_ids import request_ids
from gateway.edge.routes import RouteSpec
from gateway.errors import (
    GatewayError,
    InsufficientBalanceError,
    InternalError,
    NotFoundError,
    UpstreamUnavailableError,
)
from gateway.kinds import KINDS
from gateway.kinds.base import Exchange, Incoming, Kind, Reply
from gateway.observe.observers import Observers
from gateway.policy.affinity import pin_id, session_of
from gateway.policy.billing import Metered, Rate
from gateway.policy.gate import Gate
from gateway.policy.routing import LiveCatalogue, candidates
from gateway.policy.spend import Meter, allowance, micro_for, tokens_for
from gateway.protocols import CLIENTS
from gateway.protocols.base import Ctx, RelayStream, UpstreamTarget
from gateway.relay.attempt import Answer, Attempts
from gateway.relay.call import CLIENT_GONE as CLIENT_GONE_STATUS
from gateway.relay.call import Call
from gateway.relay.request import RelayRequest
from gateway.relay.stream import KeepAlive, pump, send_last
from gateway.store import MICRO
from gateway.store.cache import Cache
from gateway.store.writer import UsageWriter
from gateway.types import Receive, Scope, Send

log = logging.getLogger("gateway.relay")

# seconds before a request starts watching for its client going away (a watching task costs
# far more than an entry in the watchlist); a stream's upstream is closed at most this late,
# plus a watchlist tick, after its client left (streams that end sooner never start one)
STREAM_WATCH_DELAY = 0.1
REPLY_WATCH_DELAY = 1.0
TOP_UP = "top up in the console (/console)"  # where a 402 sends its reader


class Relay:
    """The pipeline, shared by every relayed route. It holds what the composition root
    (``app.create_app``) hands it and nothing it builds itself but its timers."""

    def __init__(
        self,
        settings: Settings,
        catalogue: LiveCatalogue,
        gate: Gate,
        cache: Cache,
        writer: UsageWriter,
        attempts: Attempts,
        observers: Observers,
    ) -> None:
        self.limits = settings.limits
        self.catalogue = catalogue
        self.gate = gate
        self.cache = cache
        self.writer = writer
        self.attempts = attempts
        self.observers = observers
        self.health = attempts.health
        self.rng = random.Random()
        self.watchlist = Watchlist()
        self.retries = settings.upstream.retries
        self.hold_floor = round(settings.limits.hold_floor * MICRO)
        upstream = settings.upstream
        self.keepalive = KeepAlive(
            upstream.stream_keepalive_seconds, upstream.stream_commit_seconds
        )
        self.bodies = BodyDeadlines(settings.server.body_timeout_seconds)

    async def handle(
        self, spec: RouteSpec, path_model: str | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        kind: Kind[Any] = KINDS[spec.kind]
        headers = request_headers(scope)
        observers = self.observers
        call = Call.arriving(
            datetime.now(UTC),
            request_ids(headers.get(b"x-request-id")),
            spec.protocol,
            kind.name,
            self.gate.address.range_of(scope.get("client"), headers.get(b"x-forwarded-for")),
        )
        if observers.tracing is not None:
            call.span = observers.tracing.request(kind.name)
        interrupt = Interrupt(asyncio.current_task())
        reading = self.bodies.begin(interrupt)
        read = False  # the body is read: the connection may serve another request after this
        client = CLIENTS[spec.protocol]
        try:
            call.key = self.gate.authenticate(spec, scope, headers, call.time)
            incoming = Incoming(
                spec, path_model, scope, receive, headers, self.limits,
                scope.get("query_string", b""), reading,
            )  # fmt: skip
            job = await kind.read(incoming)
            read = True
            req, channels = await self._admit(kind, job, call, headers, interrupt, receive, send)
            del incoming, headers  # this frame lasts as long as the reply: it holds neither
            await self._attempts(req, channels)
        except GatewayError as err:
            call.set_status(err.status)
            if not call.responded:
                # refused before its body was read (a bad key, too large, too slow): the
                # connection ends with the reply instead of waiting for the rest
                await send_error(send, client, err, call.reply_id, not read)
        except ClientGone:  # seen on the body's receive
            call.set_status(CLIENT_GONE_STATUS)
        except asyncio.CancelledError:
            # the one place a request's interrupt is read for the causes that end it
            if interrupt.absorb(BODY_LATE):  # the upload stopped arriving, even mid-relay
                call.set_status(408)
                if not call.responded:
                    await send_error(send, client, too_slow(), call.reply_id, True)
            elif interrupt.absorb(CLIENT_GONE):
                call.set_status(CLIENT_GONE_STATUS)
            else:  # not ours: the server is shutting down
                call.set_status(CLIENT_GONE_STATUS)
                raise
        except Exception:
            log.exception("relay.unexpected request_id=%s", call.request_id)
            call.set_status(500)
            if not call.responded:
                await send_error(send, client, InternalError("internal error"), call.reply_id)
        finally:
            interrupt.release()
            if reading is not None:
                reading.finish()
            if not call.recorded:
                call.record(self.writer, observers.observed, observers.access)
            if call.span is not None:
                observers.tracing.finish(call.span, call)  # type: ignore[union-attr]

    async def _admit(
        self,
        kind: Kind[Any],
        job: Any,
        call: Call,
        headers: dict[bytes, bytes],
        interrupt: Interrupt,
        receive: Receive,
        send: Send,
    ) -> tuple[RelayRequest, list[Channel]]:
        """The request as the attempts carry it, and the channels to try in order: 404 for a
        model outside the key's, 402 for an exhausted balance or quota, 404/503 when no
        channel serves it; what it is expected to cost is held against the balance."""
        key = call.key
        assert key is not None
        call.model = job.route.model or ""  # as asked: the record's and the reply's
        catalogue = self.catalogue.current  # once: the whole request sees one catalogue
        name = catalogue.resolve(key.group, call.model)  # the model an alias means
        if key.models is not None and name not in key.models:
            raise NotFoundError(
                f"The model '{call.model}' does not exist or you do not have access to it."
            )
        balance = self.cache.balance(key.account)
        if balance is None or balance <= 0:
            raise InsufficientBalanceError(
                f"Your account balance is exhausted; {TOP_UP} to continue."
            )
        now = time.monotonic()
        channels = candidates(
            catalogue,
            key.group,
            name,
            kind.capability,
            kind.channel_types(call.protocol),
            self.rng,
            self.health.cooling,
            now,
        )
        # -- session affinity and upstream keys (policy/affinity.py, policy/upstream_keys.py)
        affinity = self.health.affinity
        if affinity is not None:
            session = session_of(headers, job.route)
            if session:
                pid = pin_id(key.account, name, session)
                channels = await affinity.place(pid, name, channels, now)
            else:
                channels = affinity.with_keys(channels, now)
        channels = channels[: 1 + self.retries]
        # --
        model = catalogue.models[name]
        rate = catalogue.rates.get(name) if kind.billed else None
        # -- group ratio (CONTRACT §2, §5b): the key's group's price ratio multiplies the
        # hold, what a metered stream may spend, and every bill of this request (``req.ratio``;
        # ``Rate.charge`` applies it)
        ratio = catalogue.ratio(key.group)
        allowed = None
        if rate is not None:
            expected = job.expected(model.default_max_tokens)
            spendable = self._hold(call, expected, rate, balance, ratio)
            allowed = allowance(
                spendable, expected.completion_tokens, rate, job.output_ceiling(), ratio
            )
        route = job.route
        ctx = Ctx(
            request_id=call.request_id.rpartition("/")[2],  # the gateway's own: reply ids
            model=call.model,
            created=int(time.time()),
            include_usage=route.include_usage,
            tool_namespaces=route.tool_namespaces,
            custom_tools=route.custom_tools,
        )
        req = RelayRequest(
            kind, job, model, rate, call, ctx, forwarded_headers(headers), interrupt, receive,
            send, bool(route.stream), allowance=allowed, ratio=ratio,
        )  # fmt: skip
        return req, channels

    async def _attempts(self, req: RelayRequest, channels: list[Channel]) -> None:
        """Try the channels in order until one answers, and relay its reply."""
        call = req.call
        delay = STREAM_WATCH_DELAY if req.stream else REPLY_WATCH_DELAY
        watch = self.watchlist.watch(req.receive, delay, req.interrupt)
        try:
            last: GatewayError | None = None
            for i, channel in enumerate(channels):
                target = _target(channel, req)
                exchange = req.kind.exchange(
                    req.job, channel, target, req.ctx, i == len(channels) - 1
                )
                call.channel = channel.name
                if exchange.call is None:  # answered without the upstream
                    await self._reply_local(exchange, req)
                    return
                quiet = req.quiet
                if req.stream and quiet is None:
                    quiet = req.quiet = self.keepalive.open(
                        req.send, exchange.keepalive, req.interrupt, call
                    )
                if quiet is not None:
                    quiet.exchange = exchange
                try:
                    answer = await self.attempts.run(req, exchange, channel)
                except GatewayError as err:
                    last = err
                    if quiet is not None and quiet.started:  # committed: nowhere else to go
                        await self._fail_committed(err, exchange, req)
                        return
                    if err.retryable and exchange.replayable:
                        continue
                    raise
                req.job.release()  # no further attempt
                try:
                    if answer.reply is not None:
                        await self._send_reply(answer.reply, req)
                    else:  # the stream's loop runs in this frame: one coroutine less held
                        settlement = self._open_stream(answer, exchange, req)
                        try:
                            failed = await pump(
                                answer, req.send, settlement.settle, req.quiet,
                                call.reply_id.encode(), settlement.meter,
                            )  # fmt: skip
                        except asyncio.CancelledError:
                            settlement.cancelled()
                            raise
                        finally:
                            self.observers.metrics.open_streams -= 1
                        self._stream_ended(failed, answer, channel.name, call)
                finally:
                    answer.resp.close()
                return
            raise last if last is not None else UpstreamUnavailableError("no channel answered")
        finally:
            self.keepalive.close(req.quiet)
            watch.stop()

    async def _fail_committed(
        self, err: GatewayError, exchange: Exchange, req: RelayRequest
    ) -> None:
        """A stream committed while its upstream withheld its status (``stream.KeepAlive``)
        whose upstream then failed: the error goes inside the stream, in the client's
        protocol, as one after the first byte would; nothing was generated, nothing is
        billed."""
        call = req.call
        call.set_status(err.status)
        durable = call.record(self.writer, self.observers.observed, self.observers.access)
        if durable is not None:
            await durable
        await send_last(req.send, req.quiet, exchange.stream({}).error(err))
        log.warning(
            "relay.stream_error request_id=%s channel=%s status=%d committed=1",
            call.request_id,
            call.channel,
            err.status,
        )

    def _extend(self, req: RelayRequest, needed: int, covered: int) -> int:
        """A metered stream past what it was covered for: its hold grows by ``needed`` output
        tokens, or doubles if that is more, within what its account (and key) has unheld,
        as an admission would see it (at its group's ratio); the tokens granted (0: nothing
        left: it is cut)."""
        rate, call, ratio = req.rate, req.call, req.ratio
        key = call.key
        assert rate is not None and key is not None
        cache = self.cache
        left = (cache.balance(key.account) or 0) - cache.held(key.account)
        if key.quota is not None:
            left = min(left, cache.quota_left(key))
        granted = min(max(needed, covered), tokens_for(left, rate, ratio))
        if granted <= 0:
            return 0
        amount = micro_for(granted, rate, ratio)
        call.held += amount
        cache.hold(key.account, key.id, amount)
        return granted

    def _hold(
        self, call: Call, expected: Metered, rate: Rate, balance: int, ratio: Fraction | int
    ) -> int:
        """Hold what the request is expected to cost until its record replaces the hold;
        402 when the balance, less what the account's requests in flight hold, is not above
        zero (a request may overdraw by its own cost, never by how many run at once), and
        likewise for a key's ``quota``. Returns what the request could spend (its share of
        the balance and quota: what the others do not hold), which bounds a stream's cost
        (``policy.spend``)."""
        key = call.key
        assert key is not None
        account = key.account
        spendable = balance - self.cache.held(account)
        if spendable <= 0:
            raise InsufficientBalanceError(
                f"Your account balance is held by requests in flight; wait for them or {TOP_UP}."
            )
        if key.quota is not None:
            left = self.cache.quota_left(key)
            if left <= 0:
                raise InsufficientBalanceError("This API key has spent its quota.")
            spendable = min(spendable, left)
        call.held = max(math.ceil(rate.cost_of(expected) * ratio), self.hold_floor)
        self.cache.hold(account, key.id, call.held)
        return spendable

    async def _reply_local(self, exchange: Exchange, req: RelayRequest) -> None:
        req.call.channel = None
        await self._send_reply(exchange.reply(b"", {}), req)

    async def _send_reply(self, reply: Reply, req: RelayRequest) -> None:
        call = req.call
        call.bill(reply.used, req.rate, req.ratio)
        durable = call.record(self.writer, self.observers.observed, self.observers.access)
        if durable is not None:
            await durable  # the record survives the process before the reply is complete
        call.responded = True
        send = req.send
        body = reply.body
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", reply.content_type),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-request-id", call.reply_id.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _open_stream(self, answer: Answer, exchange: Exchange, req: RelayRequest) -> Settlement:
        """A stream about to be relayed (by ``pump``, in ``_attempts``): counted open, and
        how it will be settled."""
        stream = answer.stream
        assert stream is not None
        call = req.call
        meter = None
        if req.allowance is not None:
            meter = Meter(req.allowance, partial(self._extend, req), req.job.output_ceiling())
        call.responded = True
        call.first_chunk = time.perf_counter() - call.started
        self.observers.metrics.open_streams += 1
        return Settlement(self, req, exchange, stream, meter)

    def _stream_ended(
        self, err: GatewayError | None, answer: Answer, channel: str, call: Call
    ) -> None:
        """A stream's end tells the channel's health: a stream that ended well is a success;
        one the upstream failed (silent past the channel's idle timeout, the connection
        lost, an error event) counts toward the channel's cooldown as a failure before the
        first byte does, so that a channel whose streams stall is left for the others; a
        stream its client left tells nothing (``pump`` does not return then)."""
        if err is None:  # the stream ended well: its channel (or key) answered
            if answer.channel is not None:
                self.health.of(answer.channel).succeeded(channel, answer.resp.headers)
            else:
                self.health.succeeded(channel)
            return
        log.warning(
            "relay.stream_error request_id=%s channel=%s status=%d",
            call.request_id,
            channel,
            err.status,
        )
        self.health.failed(channel, err, call.request_id)


class Settlement:
    """How a stream is billed and recorded once it ends (``settle``, pump's), and what it
    used so far (``used``): one small object held while the stream lasts, where two closures
    held a cell for each name they read."""

    __slots__ = ("relay", "req", "exchange", "stream", "meter")

    def __init__(
        self,
        relay: Relay,
        req: RelayRequest,
        exchange: Exchange,
        stream: RelayStream,
        meter: Meter | None,
    ) -> None:
        self.relay, self.req, self.exchange = relay, req, exchange
        self.stream, self.meter = stream, meter

    def used(self, complete: bool) -> Metered:
        spent = self.exchange.used(self.stream, complete)
        return spent if self.meter is None else self.meter.bound(spent)

    def cancelled(self) -> None:
        """The client left, or the server's grace period ended: what was generated is billed."""
        req = self.req
        req.call.bill(self.used(False), req.rate, req.ratio)

    def settle(self, status: int) -> Awaitable[None] | None:
        # what was generated, even when the stream ended on an error
        req, observers = self.req, self.relay.observers
        call = req.call
        call.bill(self.used(status == 200), req.rate, req.ratio)
        call.set_status(status)
        return call.record(self.relay.writer, observers.observed, observers.access)


def _target(channel: Channel, req: RelayRequest) -> UpstreamTarget:
    return UpstreamTarget(
        channel=channel.name,
        base_url=channel.base_url,
        api_key=channel.api_key,
        model=channel.upstream_model(req.model.name),
        default_max_tokens=req.model.default_max_tokens,
        stream=req.stream,
        client_headers=req.client_headers,
        prompt_cache=channel.prompt_cache,
    )
