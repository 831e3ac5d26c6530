"""The ASGI application: the route table and the lifespan that owns the process's resources.

``create_app()`` with no argument reads the configuration named by ``GATEWAY_CONFIG``, so
servers that import the app by path (hypercorn with several workers, uvicorn, granian) build
the same app in each worker. The lifespan opens the store, seeds it from the file, fills the
key cache, starts the usage writer and the upstream pool, and closes all of it in reverse.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from gateway import __version__
from gateway.config import Settings, load_settings
from gateway.edge.asgi import REQUEST_ID, request_headers, send_error
from gateway.edge.request_ids import request_ids
from gateway.edge.routes import Router, RouteSpec, protocol_of_path
from gateway.errors import GatewayError, UnknownURLError
from gateway.local.dashboard import Dashboard
from gateway.local.model_list import ModelLists
from gateway.observe.logs import configure_logging
from gateway.observe.metrics import DIR_ENV as METRICS_DIR_ENV
from gateway.observe.metrics import OWN_PROTOCOL, Metrics, channel_states, registry_for
from gateway.observe.observers import Observers
from gateway.observe.tracing import PROVIDERS
from gateway.operator.console.session import Signer
from gateway.operator.lockout import Lockout
from gateway.policy.affinity import Affinity
from gateway.policy.gate import Gate
from gateway.policy.health import ChannelHealth
from gateway.policy.routing import LiveCatalogue
from gateway.protocols import CLIENTS
from gateway.relay import Relay
from gateway.relay.attempt import Attempts
from gateway.relay.call import CLIENT_GONE, Call
from gateway.server import accept_errors
from gateway.server.gc_tuning import collect_periodically, tune_gc
from gateway.store import Store
from gateway.store.backends import open_store, permanent_problem
from gateway.store.cache import Cache
from gateway.store.cancellation import cancel_and_wait, raise_if_cancelled
from gateway.store.catalogue import CatalogueRecords, view
from gateway.store.journal import Journal
from gateway.store.writer import UsageWriter
from gateway.types import ASGIApp, Receive, Scope, Send
from gateway.upstream import UpstreamPool
from gateway.upstream.auth import ChannelAuths
from gateway.upstream.pool import Upstream

log = logging.getLogger("gateway.app")


@dataclass(slots=True)
class Services:
    """What the process builds once, in ``create_app()``, and hands out: each handler gets
    the parts it uses (``request.app.state.gateway`` for the admin API and the console)."""

    settings: Settings
    store: Store
    cache: Cache
    writer: UsageWriter
    upstream: UpstreamPool
    catalogue: LiveCatalogue  # the catalogue requests are served on, swapped whole
    gate: Gate  # authenticates client requests; ``ready`` once the store answered
    health: ChannelHealth  # this instance's view of each channel, shared through the store
    observers: Observers  # metrics, access log, tracing
    lockout: Lockout  # failed sign-ins and admin-token attempts, counted in the store
    # the client surface (``GatewayApp``) as an ASGI app: the console's try-it box calls it
    # in process, so that its chat is relayed, billed and recorded like any other
    client_surface: ASGIApp | None = None


READY_TIMEOUT = 1.0  # seconds the store has to answer a readiness probe
# a store that does not answer at start-up is retried after this long, doubling up to the max
STORE_RETRY_FIRST = 0.5
STORE_RETRY_MAX = 5.0


def metrics_endpoint(
    settings: Settings, metrics: Metrics
) -> Callable[[Request], Awaitable[Response]]:
    """``GET /metrics``, only with ``Authorization: Bearer <metrics.token>`` when one is set."""
    registry = registry_for(metrics)
    token = settings.metrics.token.encode()

    async def endpoint(request: Request) -> Response:
        if token:
            scheme, _, given = request.headers.get("authorization", "").partition(" ")
            ok = scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token)
            if not ok:
                refused = {
                    "message": "missing or invalid metrics token",
                    "type": "authentication_error",
                    "code": "invalid_metrics_token",
                }
                return JSONResponse(
                    {"error": refused}, status_code=401, headers={"www-authenticate": "Bearer"}
                )
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return endpoint


def openapi_endpoint(
    settings: Settings, lockout: Lockout | None = None
) -> Callable[[Request], Awaitable[Response]]:
    """``GET /openapi.json``: the client surface to anyone, the admin API too with the admin
    token. A wrong token counts as a failed attempt (``lockout``), and past the limit even
    the right one gets the public part, so this is no way around the admin API's limit."""
    from gateway.operator.admin import authorized
    from gateway.operator.openapi import document

    public = orjson.dumps(document(with_admin=False))
    whole = orjson.dumps(document(with_admin=True))

    async def endpoint(request: Request) -> Response:
        header = request.headers.get("authorization", "")
        if not header:
            return Response(public, media_type="application/json")
        names = lockout.names(request.scope) if lockout is not None else []
        admin = authorized(header, settings.admin_token)
        if lockout is not None and lockout.wait(names):
            admin = False
        elif lockout is not None and not admin:
            await lockout.failed(names)
        return Response(whole if admin else public, media_type="application/json")

    return endpoint


async def healthz(request: Request) -> Response:
    """Liveness: 200 while the process serves."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """Readiness: 200 only while the store answers and the settlement journal can be written,
    so a load balancer drains an instance that lost its store, or whose full or read-only
    disk would lose the records of what it serves at a crash."""
    state: Services = request.app.state.gateway
    store = state.store
    if not state.gate.ready:
        return JSONResponse({"status": "starting", "store": "not answering"}, status_code=503)
    if not state.writer.journal_writable():
        return JSONResponse({"status": "unavailable", "journal": "not writable"}, status_code=503)
    try:
        await asyncio.wait_for(store.version(), READY_TIMEOUT)
    except Exception as exc:  # noqa: BLE001 - any failure of the store means not ready
        log.warning("gateway.not_ready error=%s", type(exc).__name__)
        return JSONResponse({"status": "unavailable", "store": "not answering"}, status_code=503)
    return JSONResponse({"status": "ready"})


async def root(request: Request) -> Response:
    """``GET /`` and ``HEAD /``: coding CLIs probe the base URL at start-up."""
    return JSONResponse({"service": "model-gateway", "version": __version__})


async def unrouted(request: Request, exc: Exception) -> Response:
    """A path under a mounted tree (``/admin/...``, ``/console/...``) that none of its routes
    matches: the same JSON 404 as any unknown path, not Starlette's plain text."""
    err = UnknownURLError(f"Unknown request URL: {request.method} {request.url.path}")
    status, body = CLIENTS[protocol_of_path(request.url.path)].encode_error(err)
    return JSONResponse(body, status_code=status)


class NotFoundApp:
    """Unknown paths: 404 in the protocol the path belongs to (any method)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        err = UnknownURLError(f"Unknown request URL: {scope.get('method', '')} {path}")
        await send_error(send, CLIENTS[protocol_of_path(path)], err)


# the endpoint label of the gateway's own paths (anything else outside the client surface is
# "unknown": a path never becomes a label)
OWN_PATHS = {
    "/": "root",
    "/healthz": "healthz",
    "/readyz": "readyz",
    "/metrics": "metrics",
    "/openapi.json": "openapi",
    "/admin": "admin",
    "/console": "console",
}
OWN_TREES = ("/admin/", "/console/")
UNKNOWN = "unknown"


def endpoint_of(path: str) -> tuple[str, str]:
    """(protocol, endpoint) labels of a path outside the client surface's routes."""
    own = OWN_PATHS.get(path)
    if own is None and path.startswith(OWN_TREES):
        own = OWN_PATHS[path[: path.index("/", 1)]]
    if own is not None:
        return OWN_PROTOCOL, own
    return protocol_of_path(path), UNKNOWN


class GatewayApp:
    """The ASGI entry: the client surface (``routes.ROUTES``) goes straight to the relay or
    the model lists (a dict lookup, no middleware on the hot path); everything else (admin,
    health, lifespan, unknown paths) to Starlette. Every request that is not relayed gets its
    x-request-id, its access-log line and its count in the metrics here (the relay's own do
    in the relay)."""

    __slots__ = ("inner", "state", "router", "relay", "handlers", "address", "observers")

    def __init__(self, inner: Starlette, relay: Relay, services: Services) -> None:
        self.inner = inner
        self.state = inner.state
        self.router = Router()
        self.relay = relay
        self.address = services.gate.address
        self.observers = services.observers
        lists = ModelLists(services.gate, services.catalogue)
        dashboard = Dashboard(services.gate, services.store, services.cache)
        # the kinds answered here, not relayed; every other kind goes to the relay
        self.handlers: dict[str, ModelLists | Dashboard] = {
            "models": lists,
            "model": lists,
            "billing_subscription": dashboard,
            "billing_usage": dashboard,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        path = scope["path"]
        try:
            found = self.router.match(scope["method"], path)
        except GatewayError as err:
            protocol = protocol_of_path(path)
            refused = functools.partial(send_error, client=CLIENTS[protocol], err=err)
            await self._elsewhere(protocol, UNKNOWN, refused, scope, send)
            return
        if found is not None and found[0].kind not in self.handlers:
            # the relay sets its reply's x-request-id itself; this frame, alive as long as
            # the request, holds no closure's cells (``_local``)
            await self.relay.handle(found[0], found[1], scope, receive, send)
            return
        await self._local(found, path, scope, receive, send)

    async def _local(
        self,
        found: tuple[RouteSpec, str | None] | None,
        path: str,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """A request answered here (model lists, the dashboard) or by Starlette."""
        if found is not None:
            spec, model = found
            handler = self.handlers[spec.kind]

            async def handled(send: Send) -> None:
                await handler.handle(spec, model, scope, receive, send)

            await self._elsewhere(spec.protocol, spec.kind, handled, scope, send)
            return

        async def inner(send: Send) -> None:
            await self.inner(scope, receive, send)

        await self._elsewhere(*endpoint_of(path), inner, scope, send)

    async def _elsewhere(
        self,
        protocol: str,
        endpoint: str,
        serve: Callable[[Send], Awaitable[None]],
        scope: Scope,
        send: Send,
    ) -> None:
        """A request served outside the relay: ``serve(send)`` with x-request-id added to its
        response, then its count in the metrics and its access-log line."""
        headers = request_headers(scope)
        call = Call.arriving(
            datetime.now(UTC),
            request_ids(headers.get(b"x-request-id")),
            protocol,
            endpoint,
            self.address.range_of(scope.get("client"), headers.get(b"x-forwarded-for")),
        )
        scope[REQUEST_ID] = call.request_id
        header = (b"x-request-id", call.reply_id.encode())
        status = 500  # unless a response starts

        async def sending(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                call.responded = True
                headers = [*message.get("headers", ()), header]
                # a client without a valid key holds no connection past its answer, on every
                # path and method, as the relay's 401s do (HTTP/1: HTTP/2 has no such header)
                if status == 401 and scope.get("http_version") != "2":
                    headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await serve(sending)
        except asyncio.CancelledError:
            if not call.responded:
                status = CLIENT_GONE
            raise
        finally:
            call.status = status
            call.served_elsewhere(self.observers.observed, self.observers.access)


def create_app(
    settings: Settings | None = None, upstream: UpstreamPool | None = None
) -> GatewayApp:
    """The composition root: every service built once, each handler given what it uses.
    With no settings, as a server's worker process builds it from ``GATEWAY_CONFIG``, the
    worker's logging is set up as the config says and its garbage collector is tuned
    (``gc_tuning``). ``upstream``: the pool upstream calls go through (the aiohttp pool; tests
    hand a scripted one), each channel's credentials added on the way (``auth.ChannelAuths``)."""
    if settings is None:
        settings = load_settings()
        configure_logging(settings)  # a worker process: the server's set-up was in its parent
        built = create_app(settings)
        tune_gc()
        return built
    if upstream is None:
        upstream = Upstream(settings.upstream, settings.limits.max_response_bytes)
    services = build_services(settings, ChannelAuths(upstream, settings.channels))
    attempts = Attempts(
        services.upstream,
        services.health,
        settings.upstream.first_byte_timeout,
        services.observers,
    )
    relay = Relay(
        settings,
        services.catalogue,
        services.gate,
        services.cache,
        services.writer,
        attempts,
        services.observers,
    )
    app = Starlette(
        routes=own_routes(services),
        lifespan=Lifespan(services),
        exception_handlers={404: unrouted},
    )
    app.state.gateway = services
    app.state.console = Signer(services.cache, settings.admin_token)
    served = GatewayApp(app, relay, services)
    services.client_surface = served
    return served


def build_services(settings: Settings, upstream: UpstreamPool) -> Services:
    store = open_store(settings.store)
    cache = Cache(store)
    observers = Observers.configured(settings)
    catalogue = LiveCatalogue(settings)
    gate = Gate(settings, cache)
    services = Services(
        settings,
        store,
        cache,
        UsageWriter(store, cache, journal=Journal(settings.journal, settings.store)),
        upstream,
        catalogue,
        gate,
        ChannelHealth(settings.upstream.cooldown_seconds),
        observers,
        Lockout(store, gate.address),
    )

    def use_catalogue(records: CatalogueRecords) -> None:
        """Serve the catalogue these records make (the file's entries over the store's)."""
        served = catalogue.use(view(records, settings))
        observers.metrics.known = frozenset(served.models)  # metrics label these by name

    cache.on_catalogue(use_catalogue)
    affinity = Affinity(services.health, store)  # session pins, written behind with health
    observers.metrics.sessions = affinity.counts
    _observe_state(services)
    return services


def _observe_state(services: Services) -> None:
    """What the metrics read of the process at each scrape: the writer's backlog, the
    channels' states, their providers."""
    metrics, writer = services.observers.metrics, services.writer
    live, health = services.catalogue, services.health
    metrics.gauges = lambda: {
        "usage_writer_backlog": writer.pending,
        "usage_parked_records": writer.parked,
        "journal_writable": 1 if writer.journal_writable() else 0,
    }

    def channels_now() -> tuple[dict[str, str], dict[str, int]]:
        every = live.current.every_channel  # the live catalogue's, disabled ones too
        disabled = [c.name for c in every if c.status != "enabled"]
        states = channel_states([c.name for c in every], health.cooling, disabled)
        return states, health.failures_total

    metrics.channels = channels_now
    metrics.providers = lambda: {
        c.name: PROVIDERS.get(c.type, c.type) for c in live.current.every_channel
    }


def own_routes(services: Services) -> list[BaseRoute]:
    """The gateway's own paths (probes, OpenAPI, metrics, admin, console), served by
    Starlette; the client surface never reaches them."""
    from gateway.operator.admin import admin_routes
    from gateway.operator.console import console_routes
    from gateway.operator.console import page as console_page

    settings = services.settings
    routes: list[BaseRoute] = [
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/openapi.json", openapi_endpoint(settings, services.lockout), methods=["GET"]),
    ]
    if settings.metrics.enabled:
        metrics = services.observers.metrics
        routes.append(Route("/metrics", metrics_endpoint(settings, metrics), methods=["GET"]))
    routes.append(Mount("/admin", routes=admin_routes()))
    routes.append(Route("/console", console_page, methods=["GET"]))
    routes.append(Mount("/console", routes=console_routes()))
    routes.append(Route("/{path:path}", endpoint=NotFoundApp()))
    return routes


class Lifespan:
    """Opens what the process holds and closes it in reverse: the writer (its journal is
    settled once the store answers), the upstream pool, the observers' tasks, then the store
    (retried until it answers: the gateway serves 503 until then)."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.scheme = services.settings.store.split("://", 1)[0]
        self.tasks: list[asyncio.Task[None]] = []

    def __call__(self, app: Starlette) -> contextlib.AbstractAsyncContextManager[None]:
        return self.running()

    async def connect(self) -> None:
        """Open the store, save the file's catalogue, fill the key cache (raises)."""
        s = self.services
        await s.store.open()
        await s.store.seed(s.settings)
        await s.cache.start()

    def serve(self) -> None:
        s = self.services
        s.gate.ready = True
        self.tasks.append(asyncio.create_task(s.health.share_forever(s.store), name="gw.health"))
        log.info("gateway.started store=%s", self.scheme)

    async def connect_later(self) -> None:
        """Until the store answers: retry, then serve; not when it never will."""
        delay = STORE_RETRY_FIRST
        while True:
            await asyncio.sleep(delay)
            try:
                await self.connect()
            except Exception as exc:
                raise_if_cancelled()
                if self.misconfigured(exc):
                    return
                log.warning("gateway.store_unavailable error=%s", type(exc).__name__)
                delay = min(delay * 2, STORE_RETRY_MAX)
            else:
                self.serve()
                return

    def misconfigured(self, exc: BaseException) -> bool:
        """Whether the store can never work as configured (``backends.permanent_problem``),
        said in one line: the gateway stays up, answering 503, and stops retrying."""
        problem = permanent_problem(exc, self.services.settings.store)
        if problem is not None:
            log.error("gateway.store_misconfigured store=%s: %s", self.scheme, problem)
        return problem is not None

    def start_observers(self) -> None:
        observers, tasks = self.services.observers, self.tasks
        if observers.access is not None:
            tasks.append(asyncio.create_task(observers.access.run(), name="gw.access_log"))
        snapshots = os.environ.get(METRICS_DIR_ENV)
        if snapshots:  # one of several workers: the scrape adds every worker's counters
            tasks.append(asyncio.create_task(observers.metrics.write_snapshots(snapshots)))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        s = self.services
        stop_collecting = collect_periodically(asyncio.get_running_loop())
        accept_errors.install(asyncio.get_running_loop())
        try:
            await s.writer.start()
            await s.upstream.start()
            self.start_observers()
            try:
                await self.connect()
            except Exception as exc:
                if not self.misconfigured(exc):
                    log.error(
                        "gateway.store_unavailable store=%s error=%s: not ready, retrying",
                        self.scheme,
                        type(exc).__name__,
                    )
                    task = asyncio.create_task(self.connect_later(), name="gw.connect")
                    self.tasks.append(task)
            else:
                self.serve()
            yield
        finally:
            stop_collecting()
            for task in self.tasks:
                await cancel_and_wait(task)
            await s.upstream.stop()
            await s.writer.stop()
            if s.observers.tracing is not None:
                s.observers.tracing.shutdown()  # the spans still batched go out
            await s.cache.stop()
            await s.store.close()
