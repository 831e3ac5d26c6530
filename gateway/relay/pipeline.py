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
from typing import Any

from gateway.config import Channel, ConfigError, Model, Settings
from gateway.edge.asgi import (
    BodyDeadlines,
    ClientGone,
    Watchlist,
    forwarded_headers,
    request_headers,
    send_error,
    too_slow,
)
from gateway.edge.routes import RouteSpec
from gateway.errors import (
    AuthenticationError,
    GatewayError,
    InsufficientBalanceError,
    InternalError,
    NotFoundError,
    PermissionDeniedError,
    UpstreamUnavailableError,
)
from gateway.kinds import KINDS
from gateway.kinds.base import Exchange, Incoming, Kind
from gateway.observe.access_log import AccessLog
from gateway.observe.metrics import Metrics
from gateway.observe.tracing import Tracing
from gateway.policy.auth import address_allowed, check_key, extract_key, key_hash
from gateway.policy.billing import ClientAddress, Metered, Rate
from gateway.policy.health import ChannelHealth
from gateway.policy.routing import Catalogue, candidates
from gateway.protocols import CLIENTS
from gateway.protocols.base import Ctx, UpstreamTarget
from gateway.relay.attempt import Answer, attempt
from gateway.relay.call import CLIENT_GONE, Call, request_ids
from gateway.relay.stream import KeepAlive, Quiet, pump
from gateway.store import MICRO, KeyRecord
from gateway.store.cache import Cache
from gateway.store.catalogue import CatalogueRecords, view
from gateway.store.writer import UsageWriter
from gateway.types import Receive, Scope, Send
from gateway.upstream.pool import Upstream

STORE_RETRY_AFTER = 2.0  # seconds a client is told to wait while the store is away
log = logging.getLogger("gateway.relay")

# seconds before a request starts watching for its client going away (a watching task costs
# far more than an entry in the watchlist); a stream's upstream is closed at most this late,
# plus a watchlist tick, after its client left (streams that end sooner never start one)
STREAM_WATCH_DELAY = 0.1
REPLY_WATCH_DELAY = 1.0


class Relay:
    """Shared by every route: the process's catalogue, cache, writer and upstream pool.

    ``catalogue`` is the one reference to the catalogue the hot path reads: the file's until
    the store answers, then the store's, replaced whole (``use_catalogue``, called by the
    cache when the store's version changed). A request reads it once, so it finishes on the
    catalogue it started with."""

    def __init__(
        self, settings: Settings, cache: Cache, writer: UsageWriter, upstream: Upstream
    ) -> None:
        self.settings = settings
        self.catalogue = Catalogue(settings)
        self.cache = cache
        self.writer = writer
        self.upstream = upstream
        self.address = ClientAddress(settings.trusted_proxies)
        self.health = ChannelHealth(settings.upstream.cooldown_seconds)
        self.rng = random.Random()
        self.watchlist = Watchlist()
        self.retries = settings.upstream.retries
        self.ready = False  # the store answered and the key cache is filled (app.lifespan)
        self.hold_floor = round(settings.limits.hold_floor * MICRO)
        self.store_grace = settings.limits.store_grace or math.inf
        self.first_byte_timeout = settings.upstream.first_byte_timeout
        self.keepalive = KeepAlive(settings.upstream.stream_keepalive_seconds)
        self.bodies = BodyDeadlines(settings.server.body_timeout_seconds)
        self.metrics = Metrics(m.name for m in settings.models)
        # what records are counted in: none when /metrics is off (nothing reads them)
        self.observed = self.metrics if settings.metrics.enabled else None
        logs = settings.logging
        self.access = AccessLog(logs.format) if logs.access else None
        try:
            self.tracing = Tracing.configured(settings.tracing)
        except ImportError:
            raise ConfigError(
                "tracing: OpenTelemetry is not installed (pip install 'model-gateway[otel]')"
            ) from None
        cache.on_catalogue(self.use_catalogue)

    def use_catalogue(self, records: CatalogueRecords) -> None:
        """Serve the catalogue these records make (this file's entries over the store's)."""
        self.catalogue = Catalogue(view(records, self.settings))
        self.metrics.known = frozenset(self.catalogue.models)  # metrics label these by name

    @property
    def rates(self) -> dict[str, Rate]:
        """Each model's rate in the current catalogue."""
        return self.catalogue.rates

    def authenticate(
        self, spec: RouteSpec, scope: Scope, headers: dict[bytes, bytes], now: datetime
    ) -> KeyRecord:
        """The caller's key record (401 when missing, unknown, disabled or expired; 503
        while the gateway has not reached its store yet, or has not heard from it for longer
        than ``limits.store_grace``: keys and balances that old are not trusted)."""
        if not self.ready or time.monotonic() - self.cache.fresh_at > self.store_grace:
            raise UpstreamUnavailableError(
                "The gateway cannot reach its store; try again shortly.",
                retry_after=STORE_RETRY_AFTER,
            )
        secret = extract_key(headers, scope.get("query_string", b""), spec.key_in_query)
        if secret is None:
            raise AuthenticationError("Missing API key.")
        key = check_key(self.cache.key(key_hash(secret)), now)
        if key.allowed_ips is not None:
            ip = self.address.of(scope.get("client"), headers.get(b"x-forwarded-for"))
            if not address_allowed(ip, key.allowed_ips):
                raise PermissionDeniedError("This API key may not be used from this address.")
        return key

    async def handle(
        self, spec: RouteSpec, path_model: str | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        kind: Kind[Any] = KINDS[spec.kind]
        headers = request_headers(scope)
        call = Call.arriving(
            datetime.now(UTC),
            request_ids(headers.get(b"x-request-id")),
            spec.protocol,
            kind.name,
            self.address.range_of(scope.get("client"), headers.get(b"x-forwarded-for")),
        )
        if self.tracing is not None:
            call.span = self.tracing.request(kind.name)
        reading = self.bodies.begin()
        read = False  # the body is read: the connection may serve another request after this
        try:
            call.key = self.authenticate(spec, scope, headers, call.time)
            incoming = Incoming(
                spec,
                path_model,
                scope,
                receive,
                headers,
                self.settings.limits,
                scope.get("query_string", b""),
                reading,
            )
            job = await kind.read(incoming)
            read = True
            call.model = job.route.model or ""
            if call.key.models is not None and call.model not in call.key.models:
                raise NotFoundError(
                    f"The model '{call.model}' does not exist or you do not have access to it."
                )
            balance = self.cache.balance(call.key.account)
            if balance is None or balance <= 0:
                raise InsufficientBalanceError(
                    "Your account balance is exhausted; top it up to continue."
                )
            catalogue = self.catalogue  # once: the whole request sees one catalogue
            channels = candidates(
                catalogue,
                call.key.group,
                call.model,
                kind.capability,
                kind.channel_types(spec.protocol),
                self.rng,
                self.health.cooling,
                time.monotonic(),
            )[: 1 + self.retries]
            model = catalogue.models[call.model]
            rate = catalogue.rates.get(call.model) if kind.billed else None
            if rate is not None:
                self._hold(call, job.expected(model.default_max_tokens), rate, balance)
            await self._attempts(kind, job, channels, model, rate, headers, call, receive, send)
        except GatewayError as err:
            call.set_status(err.status)
            if not call.responded:
                # refused before its body was read (a bad key, too large, too slow): the
                # connection ends with the reply instead of waiting for the rest
                await send_error(send, CLIENTS[spec.protocol], err, call.reply_id, not read)
        except ClientGone:
            call.set_status(CLIENT_GONE)
        except asyncio.CancelledError:
            if reading is None or not reading.timed_out():
                call.set_status(CLIENT_GONE)
                raise
            call.set_status(408)  # an upload that stopped arriving while it streamed
            if not call.responded:
                await send_error(send, CLIENTS[spec.protocol], too_slow(), call.reply_id, True)
        except Exception:
            log.exception("relay.unexpected request_id=%s", call.request_id)
            call.set_status(500)
            if not call.responded:
                await send_error(
                    send, CLIENTS[spec.protocol], InternalError("internal error"), call.reply_id
                )
        finally:
            if reading is not None:
                reading.finish()
            if not call.recorded:
                call.record(self.writer, self.observed, self.access)
            if call.span is not None:
                self.tracing.finish(call.span, call)  # type: ignore[union-attr]

    async def _attempts(
        self,
        kind: Kind[Any],
        job: Any,
        channels: list[Channel],
        model: Model,
        rate: Rate | None,
        headers: dict[bytes, bytes],
        call: Call,
        receive: Receive,
        send: Send,
    ) -> None:
        """Try the channels in order until one answers, and relay its reply."""
        stream = bool(job.route.stream)
        ctx = Ctx(
            request_id=call.request_id.rpartition("/")[2],  # the gateway's own: reply ids
            model=call.model,
            created=int(time.time()),
            include_usage=job.route.include_usage,
            tool_namespaces=job.route.tool_namespaces,
        )
        client_headers = forwarded_headers(headers)
        watch = self.watchlist.watch(receive, STREAM_WATCH_DELAY if stream else REPLY_WATCH_DELAY)
        quiet: Quiet | None = None  # a stream's entry in the keep-alive timer
        try:
            last: GatewayError | None = None
            for i, channel in enumerate(channels):
                target = self._target(channel, model, stream, client_headers, call.model)
                exchange = kind.exchange(job, channel, target, ctx, i == len(channels) - 1)
                call.channel = channel.name
                if exchange.call is None:  # answered without the upstream
                    await self._reply_local(exchange, call, rate, send)
                    return
                if stream and quiet is None:
                    quiet = self.keepalive.open(send, exchange.keepalive)
                tracing = self.tracing
                span = (
                    None if tracing is None else tracing.attempt(call.span, channel, target.model)
                )
                began = time.perf_counter()
                try:
                    answer = await attempt(
                        self.upstream,
                        exchange,
                        channel,
                        self.health,
                        quiet,
                        stream,
                        self.first_byte_timeout,
                        call.request_id,
                    )
                except GatewayError as err:
                    if span is not None:
                        tracing.failed(span, type(err).__name__)  # type: ignore[union-attr]
                    if self.observed is not None:
                        self.observed.attempt_failed(
                            call.model,
                            call.endpoint,
                            channel.name,
                            err.status,
                            time.perf_counter() - began,
                        )
                    last = err
                    if err.retryable and exchange.replayable:
                        continue
                    raise
                finally:
                    if span is not None:
                        span.end()
                job.release()  # no further attempt
                call.upstream_started = began
                if answer.first:  # a stream's first output: the upstream's first chunk came
                    call.upstream_first = time.perf_counter() - began
                try:
                    if answer.reply is not None:
                        reply = answer.reply
                        await self._send_reply(
                            reply.body, reply.content_type, reply.used, call, rate, send
                        )
                    else:
                        await self._stream(answer, exchange, call, rate, quiet, send)
                finally:
                    answer.resp.close()
                return
            raise last if last is not None else UpstreamUnavailableError("no channel answered")
        except asyncio.CancelledError:
            if not watch.client_gone():
                raise
            raise ClientGone() from None
        finally:
            self.keepalive.close(quiet)
            watch.stop()

    def _hold(self, call: Call, expected: Metered, rate: Rate, balance: int) -> None:
        """Hold what the request is expected to cost until its record replaces the hold;
        402 when the balance, less what the account's requests in flight hold, is not above
        zero (a request may overdraw by its own cost, never by how many run at once), and
        likewise for a key's ``quota``."""
        key = call.key
        assert key is not None
        account = key.account
        if balance - self.cache.held(account) <= 0:
            raise InsufficientBalanceError(
                "Your account balance is held by requests in flight; wait for them or top up."
            )
        if key.quota is not None and self.cache.quota_left(key) <= 0:
            raise InsufficientBalanceError("This API key has spent its quota.")
        call.held = max(rate.cost_of(expected), self.hold_floor)
        self.cache.hold(account, key.id, call.held)

    @staticmethod
    def _target(
        channel: Channel, model: Model, stream: bool, client_headers: dict[str, str], name: str
    ) -> UpstreamTarget:
        return UpstreamTarget(
            channel=channel.name,
            base_url=channel.base_url,
            api_key=channel.api_key,
            model=channel.upstream_model(name),
            default_max_tokens=model.default_max_tokens,
            stream=stream,
            client_headers=client_headers,
        )

    async def _reply_local(
        self, exchange: Exchange, call: Call, rate: Rate | None, send: Send
    ) -> None:
        call.channel = None
        reply = exchange.reply(b"", {})
        await self._send_reply(reply.body, reply.content_type, reply.used, call, rate, send)

    async def _send_reply(
        self,
        body: bytes,
        content_type: bytes,
        used: Metered,
        call: Call,
        rate: Rate | None,
        send: Send,
    ) -> None:
        call.bill(used, rate)
        durable = call.record(self.writer, self.observed, self.access)
        if durable is not None:
            await durable  # the record survives the process before the reply is complete
        call.responded = True
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-request-id", call.reply_id.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _stream(
        self,
        answer: Answer,
        exchange: Exchange,
        call: Call,
        rate: Rate | None,
        quiet: Quiet | None,
        send: Send,
    ) -> None:
        stream = answer.stream
        assert stream is not None

        def settle(status: int) -> Awaitable[None] | None:
            # what was generated, even when the stream ended on an error
            call.bill(exchange.used(stream, status == 200), rate)
            call.set_status(status)
            return call.record(self.writer, self.observed, self.access)

        call.responded = True
        call.first_chunk = time.perf_counter() - call.started
        metrics = self.metrics
        metrics.open_streams += 1
        try:
            err = await pump(
                answer.resp,
                stream,
                answer.first,
                answer.ended,
                answer.failure,
                send,
                settle,
                quiet,
                call.reply_id.encode(),
            )
        except asyncio.CancelledError:
            # the client left, or the server's grace period ended: what was generated is billed
            call.bill(exchange.used(stream, False), rate)
            raise
        finally:
            metrics.open_streams -= 1
        if err is not None:
            log.warning(
                "relay.stream_error request_id=%s channel=%s status=%d",
                call.request_id,
                call.channel,
                err.status,
            )
