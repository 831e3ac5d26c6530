"""The hot path: authenticate, route, convert, relay, bill. A plain ASGI callable per route.

One request: look the key up in the cache (401), read the body (413 past the limit), parse
it once with orjson (400), check the balance (402), pick the channels (404/503), then try them
in order until one answers: a failure before the first byte reaches the client moves on to the
next channel (and cools a channel down whose credentials were refused). The reply is converted
by the adapters, or passed through when the client's protocol is the channel's.

Streams run in one loop in this task: ``iter_any()`` feeds the SSE parser, the decoder, the
encoder (or, when the protocols match, the pass-through, which forwards the bytes as they
came), then ``await send``; a slow client blocks ``send``, the loop stops reading and aiohttp
pauses the upstream socket. A second task, started after a short delay, only waits for
``http.disconnect`` and cancels the loop, whose ``finally`` closes the upstream response at
once. Every request that passed authentication leaves exactly one usage record, handed to the
writer without awaiting.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson

from gateway.asgi import (
    JSON_HEADERS,
    ClientGone,
    DisconnectWatch,
    Headers,
    Watchlist,
    forwarded_headers,
    parse_json,
    read_body,
    request_headers,
    send_error,
    send_json,
)
from gateway.auth import check_key, extract_key, key_hash
from gateway.billing import ClientAddress, Rate, billable_tokens, usage_tokens
from gateway.config import Channel, Settings
from gateway.errors import (
    AuthenticationError,
    GatewayError,
    GatewayOverloadedError,
    InsufficientBalanceError,
    InternalError,
    InvalidRequestError,
    NotFoundError,
    UpstreamError,
    UpstreamUnavailableError,
)
from gateway.model_list import (
    anthropic_list,
    anthropic_model,
    gemini_list,
    gemini_model,
    openai_list,
)
from gateway.model_list import openai_model as openai_model_entry
from gateway.protocols import ADAPTERS
from gateway.protocols.base import Adapter, Ctx, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.openai import usage_wanted
from gateway.routes import RouteSpec
from gateway.routing import Catalogue, candidates
from gateway.sse import SSEParser
from gateway.store import KeyRecord, UsageRecord
from gateway.store.cache import Cache
from gateway.store.writer import UsageWriter
from gateway.tokens import estimate_prompt_tokens
from gateway.types import JSON, Receive, Scope, Send, Usage
from gateway.upstream import Upstream, read_error

log = logging.getLogger("gateway.relay")

# a reverse proxy in front (nginx) must not buffer a stream; no cache-control: replies to
# POST are not cached anyway, and every header costs a validation pass in the server
STREAM_HEADERS = [(b"x-accel-buffering", b"no")]
CLIENT_GONE = 499
LIST_ENDPOINTS = ("models", "model")  # answered from the catalogue: no usage record
# seconds before a request starts watching for its client going away (a watching task costs
# far more than an entry in the watchlist); a stream's upstream is closed at most this late,
# plus a watchlist tick, after its client left (streams that end sooner never start one)
STREAM_WATCH_DELAY = 0.1
REPLY_WATCH_DELAY = 1.0
# a model name is the one text of a usage record that the client chooses, and an unknown one
# is recorded too (its 404): kept to this many characters, so records stay small
MAX_RECORDED_MODEL = 256
FAILURES_BEFORE_COOLDOWN = 3
FAILURE_COOLDOWN_SECONDS = 5.0
_REQUEST_IDS = itertools.count(1)
_PROCESS_TAG = os.urandom(4).hex()


def path_model(scope: Scope) -> str:
    """The model named in a generate-content path (``models/`` prefix allowed)."""
    name = str(scope.get("path_params", {}).get("model", ""))
    return name.removeprefix("models/")


def new_request_id() -> str:
    return f"{_PROCESS_TAG}{next(_REQUEST_IDS):08x}"


@dataclass(slots=True)
class Call(UsageRecord):
    """One request's usage record as it fills in (metadata only), handed to the writer as it
    is: building a separate record cost ~12k instructions a request."""

    started: float = 0.0  # perf_counter() when the request arrived
    key: KeyRecord | None = None
    responded: bool = False  # the response's status line has been sent
    recorded: bool = False  # handed to the writer

    @classmethod
    def arriving(
        cls, at: datetime, request_id: str, protocol: str, endpoint: str, ip_range: str
    ) -> Call:
        """A request's record as it arrives: no key, model, channel or tokens yet."""
        return cls(
            time=at,
            request_id=request_id,
            account="",  # the key's, once known
            key_id="",
            model="",
            channel=None,
            protocol=protocol,
            endpoint=endpoint,
            prompt_tokens=0,
            completion_tokens=0,
            cost=0,
            status=200,
            latency_ms=0,
            ip_range=ip_range,
            started=time.perf_counter(),
        )


def _set_status(call: Call, status: int) -> None:
    """The status the client saw, unless the record was handed to the writer already (a
    stream is recorded before its last byte leaves: a client that then goes away got it)."""
    if not call.recorded:
        call.status = status


class Relay:
    """Shared by every route: the process's catalogue, cache, writer and upstream pool."""

    def __init__(
        self, settings: Settings, cache: Cache, writer: UsageWriter, upstream: Upstream
    ) -> None:
        self.settings = settings
        self.catalogue = Catalogue(settings)
        self.cache = cache
        self.writer = writer
        self.upstream = upstream
        self.address = ClientAddress(settings.trusted_proxies)
        self.rates = {m.name: Rate.from_price(m.price) for m in settings.models}
        self.cooling: dict[str, float] = {}  # channel -> monotonic time it may serve again
        self.failures: dict[str, int] = {}  # channel -> failures in a row
        self.rng = random.Random()
        self.watchlist = Watchlist()
        self.max_body = settings.limits.max_request_bytes
        self.retries = settings.upstream.retries
        self.cooldown = settings.upstream.cooldown_seconds

    def endpoint(self, spec: RouteSpec) -> RelayEndpoint:
        return RelayEndpoint(self, spec)

    # ------------------------------------------------------------------ request handling
    async def handle(self, spec: RouteSpec, scope: Scope, receive: Receive, send: Send) -> None:
        client = ADAPTERS[spec.protocol]
        headers = request_headers(scope)
        call = Call.arriving(
            datetime.now(UTC),
            new_request_id(),
            spec.protocol,
            spec.endpoint,
            self.address.range_of(scope.get("client"), headers.get(b"x-forwarded-for")),
        )
        try:
            if scope["method"] != spec.method:
                raise GatewayError(
                    f"Method {scope['method']} is not allowed on {scope['path']}.",
                    status=405,
                )
            secret = extract_key(
                headers, scope.get("query_string", b""), allow_query=spec.protocol == "gemini"
            )
            if secret is None:
                raise AuthenticationError("Missing API key.")
            call.key = check_key(self.cache.key(key_hash(secret)), call.time)
            if spec.endpoint in LIST_ENDPOINTS:
                await self._models(spec, scope, headers, call.key, send)
                return
            await self._relay(spec, scope, headers, receive, send, client, call)
        except GatewayError as err:
            _set_status(call, err.status)
            if not call.responded:
                await send_error(send, client, err)
        except ClientGone:
            _set_status(call, CLIENT_GONE)
        except asyncio.CancelledError:
            _set_status(call, CLIENT_GONE)
            raise
        except Exception:
            log.exception("relay.unexpected request_id=%s", call.request_id)
            _set_status(call, 500)
            if not call.responded:
                await send_error(send, client, InternalError("internal error"))
        finally:
            if call.key is not None and spec.endpoint not in LIST_ENDPOINTS:
                self._record(call)  # once per request: a no-op if already recorded

    async def _read_request(
        self, spec: RouteSpec, scope: Scope, headers: Headers, receive: Receive, call: Call
    ) -> JSON:
        """The parsed body of a request whose key may spend: 413, 400, then 402."""
        assert call.key is not None
        raw = await read_body(receive, self.max_body, headers.get(b"content-length"))
        payload = parse_json(raw)
        call.model = self._model_name(spec, scope, payload)
        balance = self.cache.balance(call.key.account)
        if balance is None or balance <= 0:
            raise InsufficientBalanceError(
                "Your account balance is exhausted; top it up to continue."
            )
        return payload

    def _model_name(self, spec: RouteSpec, scope: Scope, payload: JSON) -> str:
        if spec.protocol == "gemini":
            return path_model(scope)
        model = payload.get("model") if isinstance(payload, dict) else None
        if not isinstance(model, str) or not model:
            raise InvalidRequestError("'model' is required and must be a string")
        return model

    def _record(self, call: Call) -> None:
        key = call.key
        if key is None or call.recorded:
            return
        call.recorded = True
        if len(call.model) > MAX_RECORDED_MODEL:
            call.model = call.model[:MAX_RECORDED_MODEL]
        call.account = key.account
        call.key_id = key.id
        call.latency_ms = int((time.perf_counter() - call.started) * 1000)
        self.writer.submit(call)

    def _bill(self, call: Call, usage: Usage | None) -> None:
        if call.recorded:
            return  # handed to the writer: it is no longer changed
        p, c = usage_tokens(usage)
        call.prompt_tokens, call.completion_tokens = p, c
        call.cost = self.rates[call.model].cost(p, c) if call.model in self.rates else 0

    # ------------------------------------------------------------------ model lists
    async def _models(
        self, spec: RouteSpec, scope: Scope, headers: Headers, key: KeyRecord, send: Send
    ) -> None:
        """The key's models in the shape of the asking SDK: /v1/models serves three of them
        (anthropic-version: Anthropic's; only x-goog-api-key: google-genai's default v1)."""
        models = self.catalogue.group_models(key.group)
        shape = spec.protocol
        if shape == "openai":
            if b"anthropic-version" in headers:
                shape = "anthropic"
            elif b"x-goog-api-key" in headers and b"authorization" not in headers:
                shape = "gemini"
        if spec.endpoint == "model":
            name = path_model(scope)
            found = next((m for m in models if m.name == name), None)
            if found is None:
                raise NotFoundError(f"The model '{name}' does not exist.")
            if shape == "gemini":
                body = gemini_model(found)
            elif shape == "anthropic":
                body = anthropic_model(found)
            else:
                body = openai_model_entry(found)
        elif shape == "gemini":
            body = gemini_list(models)
        elif shape == "anthropic":
            body = anthropic_list(models)
        else:
            body = openai_list(models)
        await send_json(send, 200, body)

    # ------------------------------------------------------------------ relaying
    async def _relay(
        self,
        spec: RouteSpec,
        scope: Scope,
        headers: Headers,
        receive: Receive,
        send: Send,
        client: Adapter,
        call: Call,
    ) -> None:
        """Try the channels in order until one answers. The request (its bytes, its parsed
        body and its upstream form) is let go once one did: a stream may last minutes, and
        long prompts held by thousands of streams would add up."""
        assert call.key is not None
        payload = await self._read_request(spec, scope, headers, receive, call)
        qs = scope.get("query_string", b"")
        route = RouteMatch(
            protocol=spec.protocol,
            capability=spec.endpoint,
            model=call.model if spec.protocol == "gemini" else None,
            stream=spec.stream,
            sse=b"alt=sse" in qs if spec.protocol == "gemini" else True,
        )
        if not isinstance(payload, dict):
            raise InvalidRequestError("the request body must be a JSON object")
        stream = spec.stream if spec.stream is not None else payload.get("stream") is True
        now = time.monotonic()
        channels = candidates(
            self.catalogue,
            call.key.group,
            call.model,
            spec.endpoint,
            self.rng,
            self.cooling,
            now,
        )
        channels = channels[: 1 + self.retries]
        model = self.catalogue.models[call.model]
        client_headers = forwarded_headers(headers)
        req = None
        needs_decode = spec.endpoint == "count_tokens" or any(
            ch.type != spec.protocol for ch in channels
        )
        if needs_decode:
            # the one conversion toward the internal shape, shared by every attempt
            req = client.decode_request(payload, route)
        include_usage = spec.protocol == "openai" and usage_wanted(payload)
        ctx = Ctx(
            request_id=call.request_id,
            model=call.model,
            created=int(time.time()),  # the same second as call.time, read for less
            include_usage=include_usage,
            prompt_tokens_estimate=estimate_prompt_tokens(req) if req is not None else 0,
        )
        if spec.endpoint == "count_tokens":
            assert req is not None
            await self._count(
                channels[0], model.default_max_tokens, req, client, ctx, client_headers, call, send
            )
            return
        # a client that goes away stops the upstream call: a stream within ~0.1 s, a reply
        # within ~1 s (most replies come sooner, and a watchlist entry costs less than a task)
        watch = self.watchlist.watch(receive, STREAM_WATCH_DELAY if stream else REPLY_WATCH_DELAY)
        body_payload: JSON = None
        try:
            last: GatewayError | None = None
            for channel in channels:
                upstream = ADAPTERS[channel.type]
                target = UpstreamTarget(
                    channel=channel.name,
                    base_url=channel.base_url,
                    api_key=channel.api_key,
                    model=channel.upstream_model(call.model),
                    default_max_tokens=model.default_max_tokens,
                    stream=stream,
                    client_headers=client_headers,
                )
                passthrough = channel.type == spec.protocol
                if passthrough:
                    body_payload = payload if len(channels) == 1 else dict(payload)
                    up_call = upstream.passthrough_request(body_payload, route, target)
                else:
                    assert req is not None
                    up_call = upstream.encode_request(req, target)
                call.channel = channel.name
                try:
                    resp = await self._open(up_call, upstream, channel)
                except GatewayError as err:
                    last = err
                    if err.retryable:
                        continue
                    raise
                del payload, req, body_payload, up_call  # no further attempt: let them go
                try:
                    if stream:
                        await self._stream(
                            resp,
                            route,
                            target,
                            client,
                            upstream,
                            passthrough,
                            ctx,
                            call,
                            watch,
                            send,
                        )
                    else:
                        await self._reply(resp, client, upstream, passthrough, ctx, call, send)
                finally:
                    resp.close()
                return
            raise last if last is not None else UpstreamUnavailableError("no channel answered")
        except asyncio.CancelledError:
            if not watch.client_gone():
                raise
            raise ClientGone() from None
        finally:
            watch.stop()

    async def _open(
        self, up_call: UpstreamCall, upstream: Adapter, channel: Channel
    ) -> aiohttp.ClientResponse:
        """The upstream response once its status is known and is a success."""
        try:
            resp = await self.upstream.open(up_call)
        except GatewayOverloadedError:
            raise  # our own exhaustion: the channel is not to blame
        except GatewayError:
            self._failed(channel)
            raise
        if resp.status < 400:
            if self.failures:
                self.failures.pop(channel.name, None)
            return resp
        try:
            raw = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise read_error(exc) from None
        finally:
            resp.release()
        err = upstream.decode_error(resp.status, raw)
        log.warning("relay.upstream_status channel=%s status=%d", channel.name, resp.status)
        if err.channel_fault:
            self._cool(channel, self.cooldown)
        elif err.status >= 500:
            self._failed(channel)
        retry_after = resp.headers.get("retry-after")
        if err.status == 429 and err.retry_after is None and retry_after:
            try:
                err.retry_after = float(retry_after)
            except ValueError:
                pass
        raise err

    def _cool(self, channel: Channel, seconds: float) -> None:
        if seconds > 0:
            self.cooling[channel.name] = time.monotonic() + seconds
            log.warning("relay.channel_cooling channel=%s seconds=%g", channel.name, seconds)

    def _failed(self, channel: Channel) -> None:
        """An unreachable or failing channel cools down only after several failures in a row:
        one timeout under load must not turn a single-channel model into 503s."""
        n = self.failures.get(channel.name, 0) + 1
        if n >= FAILURES_BEFORE_COOLDOWN:
            self.failures.pop(channel.name, None)
            self._cool(channel, min(self.cooldown, FAILURE_COOLDOWN_SECONDS))
        else:
            self.failures[channel.name] = n

    async def _reply(
        self,
        resp: aiohttp.ClientResponse,
        client: Adapter,
        upstream: Adapter,
        passthrough: bool,
        ctx: Ctx,
        call: Call,
        send: Send,
    ) -> None:
        try:
            raw = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise read_error(exc) from None
        try:
            up_payload = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise UpstreamError("the upstream sent a reply that is not JSON") from None
        if passthrough:
            out, usage = client.passthrough_response(up_payload, ctx)
        else:
            chat = upstream.decode_response(up_payload)
            usage = chat.get("usage")
            out = client.encode_response(chat, ctx)
        self._bill(call, usage)
        body = orjson.dumps(out)
        self._record(call)
        call.responded = True
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [*JSON_HEADERS, (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _stream(
        self,
        resp: aiohttp.ClientResponse,
        route: RouteMatch,
        target: UpstreamTarget,
        client: Adapter,
        upstream: Adapter,
        passthrough: bool,
        ctx: Ctx,
        call: Call,
        watch: DisconnectWatch,
        send: Send,
    ) -> None:
        usage: Usage | None = None
        if passthrough:
            ps = client.passthrough_stream(ctx, route, target)
            content_type = ps.content_type
        else:
            parser = SSEParser()
            decoder = upstream.stream_decoder(ctx)
            encoder = client.stream_encoder(ctx, route)
            content_type = encoder.content_type
        call.responded = True
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", content_type.encode()), *STREAM_HEADERS],
            }
        )
        out = b""  # bytes converted but not yet sent: flushed before an error event too
        content = resp.content
        try:
            try:
                async for raw in content.iter_any():
                    if passthrough:
                        out += ps.feed(raw)
                    else:
                        for event in parser.feed(raw):
                            for chunk in decoder.feed(event):
                                if chunk.get("usage"):
                                    usage = chunk["usage"]
                                out += encoder.encode(chunk)
                    # the upstream's last read goes out with the end of the response: one
                    # send (one write, one chunk frame) less per stream
                    if out and not content.at_eof():
                        body, out = out, b""
                        await send({"type": "http.response.body", "body": body, "more_body": True})
                if passthrough:
                    out += ps.finish()
                    usage = ps.usage
                else:
                    for event in parser.close():
                        for chunk in decoder.feed(event):
                            usage = chunk.get("usage") or usage
                            out += encoder.encode(chunk)
                    for chunk in decoder.close():
                        usage = chunk.get("usage") or usage
                        out += encoder.encode(chunk)
                    out += encoder.finish(usage)
                self._bill(call, usage)
                # recorded before the last byte leaves, so a client that reads its balance
                # right after the stream ends sees this request's cost
                self._record(call)
                body, out = out, b""
                await send({"type": "http.response.body", "body": body, "more_body": False})
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise read_error(exc) from None
        except GatewayError as err:
            usage = ps.usage if passthrough else usage
            self._bill(call, usage)  # what was generated before the failure is billed
            _set_status(call, err.status)
            tail = ps.error(err) if passthrough else encoder.error(err)
            self._record(call)
            await send({"type": "http.response.body", "body": out + tail, "more_body": False})
            log.warning("relay.stream_error channel=%s status=%d", target.channel, err.status)
        except asyncio.CancelledError:
            if not watch.client_gone():
                raise
            self._bill(call, ps.usage if passthrough else usage)
            raise ClientGone() from None
        finally:
            resp.close()

    async def _count(
        self,
        channel: Channel,
        default_max_tokens: int,
        req: JSON,
        client: Adapter,
        ctx: Ctx,
        client_headers: dict[str, str],
        call: Call,
        send: Send,
    ) -> None:
        """count_tokens: asked of the upstream where its protocol can count, else estimated.
        Never billed."""
        upstream = ADAPTERS[channel.type]
        target = UpstreamTarget(
            channel=channel.name,
            base_url=channel.base_url,
            api_key=channel.api_key,
            model=channel.upstream_model(call.model),
            default_max_tokens=default_max_tokens,
            stream=False,
            client_headers=client_headers,
        )
        tokens = ctx.prompt_tokens_estimate
        up_call = upstream.count_request(req, target)
        if up_call is not None:
            call.channel = channel.name
            resp = await self._open(up_call, upstream, channel)
            try:
                raw = await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise read_error(exc) from None
            finally:
                resp.close()
            try:
                tokens = upstream.decode_count(orjson.loads(raw))
            except orjson.JSONDecodeError:
                raise UpstreamError("the upstream sent a count that is not JSON") from None
        call.prompt_tokens = billable_tokens(tokens)
        call.responded = True
        await send_json(send, 200, client.encode_count(tokens, ctx))


class RelayEndpoint:
    """The ASGI app of one route: binds the route's spec to the shared relay."""

    __slots__ = ("relay", "spec")

    def __init__(self, relay: Relay, spec: RouteSpec) -> None:
        self.relay = relay
        self.spec = spec

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Coroutine[Any, Any, None]:
        # the relay's coroutine itself, not one more awaiting it: one frame less per request
        return self.relay.handle(self.spec, scope, receive, send)
