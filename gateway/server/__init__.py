"""Running the app: uvicorn by default (README, "Why uvicorn is the default"), hypercorn
(HTTP/2) or granian as options. The app is plain ASGI, so the server is a choice, not a
ceiling.

With one worker the app is built here and served in this process; with several, each worker
imports ``gateway.app:create_app()`` (under hypercorn ``hypercorn_worker_app()``, which mends
hypercorn first), which reads the file named by ``GATEWAY_CONFIG``. With a
``server.probe_port`` the app is wrapped to serve the probes there too (``probes.Probed``;
under uvicorn and granian through ``worker_app()``), on the host named by ``GATEWAY_HOST``.
Every worker process ends with the server process that started it (``parent``): a worker of
any of the three went on serving as an orphan after a SIGKILL of its server. Under hypercorn
and uvicorn each of several workers listens on a socket of its own (``ListenerPerWorker``),
so that the kernel spreads new connections over them; granian's workers share one.

hypercorn is served mended (``mend_hypercorn``; the mends and what start-up does when one
does not fit the installed hypercorn or h11: ``gateway.server.mends``). uvicorn is given a
protocol of the gateway's own (``uvicorn_guard``, through its public ``http=`` option) with
the same header deadline and connection cap; granian has its own header timeout and no cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import math
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from typing import Any, cast

from hypercorn.config import Config, Sockets

from gateway.config import ServerSettings, Settings, load_settings
from gateway.observe.logs import configure_logging
from gateway.observe.metrics import DIR_ENV as METRICS_DIR_ENV
from gateway.server import mends
from gateway.server.defences import CONNECTIONS, default_connection_limit
from gateway.server.header_timeout import HEADER_DEADLINE, HEADER_TIMEOUT
from gateway.server.hypercorn_mend import CONNECTION_CAP, IDLE_CLOSE
from gateway.server.parent import SHUTDOWN_SECONDS, end_with_parent, mark_parent
from gateway.server.probes import Probed
from gateway.store.backends import store_problem
from gateway.types import ASGIApp

SERVERS = ("hypercorn", "uvicorn", "granian")
BACKLOG = 2048
# requests a granian worker serves at once: its default (backlog / workers, 1,024) turned the
# 2,049th concurrent stream away; a gateway holds thousands of long streams per worker
GRANIAN_MAX_CONCURRENT = 65536
APP_FACTORY = "gateway.app:create_app"
HYPERCORN_WORKER_FACTORY = "gateway.server:hypercorn_worker_app"
WORKER_FACTORY = "gateway.server:worker_app"  # uvicorn's and granian's
HOST_ENV = "GATEWAY_HOST"  # the host the workers bind their probe port on


def serve(
    settings: Settings, host: str, port: int, workers: int = 1, server: str = "uvicorn"
) -> None:
    """Serve until SIGINT or SIGTERM. Several workers share a directory of metrics
    snapshots for the run (``gateway.observe.metrics``), removed when the server stops. A
    store that can never work as configured (a Redis database that does not exist) ends
    start-up first with one line and exit code 2 (SystemExit); one that does not answer yet
    is the workers' to retry."""
    configure_logging(settings)
    problem = asyncio.run(store_problem(settings.store))
    if problem is not None:  # retrying would never help: a configuration error
        print(f"gateway: config error: store: {problem}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    os.environ["GATEWAY_CONFIG"] = settings.path
    os.environ[HOST_ENV] = host
    mark_parent()  # each worker process ends with this one
    with contextlib.ExitStack() as run:
        if workers > 1 and not os.environ.get(METRICS_DIR_ENV):  # else the operator's own
            snapshots = run.enter_context(tempfile.TemporaryDirectory(prefix="gateway-metrics-"))
            os.environ[METRICS_DIR_ENV] = snapshots
        if server == "uvicorn":
            limit = settings.server.max_connections or default_connection_limit()
            _uvicorn(host, port, workers, settings, limit)
        elif server == "granian":
            _granian(settings, host, port, workers)
        else:
            _hypercorn(settings, host, port, workers)


def _hypercorn(settings: Settings, host: str, port: int, workers: int) -> None:
    cfg = WorkersConfig() if workers > 1 else ServerConfig()
    cfg.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    cfg.graceful_timeout = settings.server.graceful_seconds
    cfg.keep_alive_timeout = settings.server.keep_alive_seconds
    cfg.accesslog = None
    cfg.errorlog = "-"
    cfg.loglevel = "WARNING"
    cfg.backlog = BACKLOG
    if workers > 1:
        from hypercorn.run import run

        mend_hypercorn(settings.server, apply=False)  # each worker applies them: fail here first
        cfg.application_path = f"{HYPERCORN_WORKER_FACTORY}()"
        cfg.workers = workers
        run(cfg)
        return
    from hypercorn.asyncio import serve as hypercorn_serve

    from gateway.server.gc_tuning import tune_gc

    mend_hypercorn(settings.server)
    app = probed(app_factory()(settings), settings.server.probe_port)
    tune_gc()  # as every other server's worker does in create_app()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(f"gateway: serving on http://{host}:{port}", flush=True)
        await hypercorn_serve(app, cfg, shutdown_trigger=stop.wait)  # type: ignore[arg-type]

    asyncio.run(main())


class ServerConfig(Config):
    """hypercorn's ``Config`` as the gateway serves with it: no ``Server`` header (the gateway
    does not advertise its software). (A class of this module's own, not one made in a
    function: several workers get it pickled.)"""

    include_server_header = False


class WorkersConfig(ServerConfig):
    """The config of several hypercorn workers: each listens on a socket of its own
    (``ListenerPerWorker``) instead of the one hypercorn's parent binds and hands to all."""

    def create_sockets(self) -> Sockets:
        sockets = super().create_sockets()
        if not hasattr(socket, "SO_REUSEPORT"):
            return sockets  # one shared socket, as hypercorn has it
        own: list[socket.socket] = [ListenerPerWorker.of(s) for s in sockets.insecure_sockets]
        return Sockets(sockets.secure_sockets, own, sockets.quic_sockets)


class ListenerPerWorker(socket.socket):
    """The server process's bound socket, which unpickles in each worker it spawns
    (hypercorn's and uvicorn's, both with ``multiprocessing``'s spawn) as a new socket of that
    worker's own, bound to the same address with ``SO_REUSEPORT``; the worker listens on it.

    Both servers bind one socket in the server process and hand it to every worker: one
    accept queue, watched by every worker's event loop, and whichever loop wakes first
    accepts all that waits (asyncio accepts up to the backlog at a time), so a burst of new
    connections went mostly to one worker. With a listening socket per worker the kernel
    gives each its own accept queue and spreads new connections over them by a hash of their
    addresses: each worker gets its share, busy or not (a stalled worker's share waits for
    it). The server process's socket, bound with ``SO_REUSEPORT`` and never listening, only
    holds the port."""

    @classmethod
    def of(cls, sock: socket.socket) -> ListenerPerWorker:
        return cls(sock.family, sock.type, sock.proto, sock.detach())

    def __reduce__(self) -> tuple[Callable[..., socket.socket], tuple[Any, ...]]:
        return worker_listener, (self.family, self.getsockname())


def worker_listener(family: int, address: Any) -> socket.socket:
    """A socket on ``address`` with ``SO_REUSEPORT``, bound as hypercorn binds its own."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.setblocking(False)
    return sock


def mend_hypercorn(server: ServerSettings, *, apply: bool = True) -> None:
    """Put in place the mends this process serves hypercorn with, as ``server`` sets them
    (``gateway.server.mends.start``: one that does not fit stops the process, unless
    ``GATEWAY_UNMENDED`` names it). ``apply=False``: only check them (hypercorn's parent
    process, which serves nothing itself)."""
    needed = [IDLE_CLOSE, CONNECTION_CAP]
    if server.header_timeout_seconds > 0:
        needed.append(HEADER_DEADLINE)
    if apply:
        CONNECTIONS.limit = server.max_connections or default_connection_limit()
        HEADER_TIMEOUT.seconds = server.header_timeout_seconds
    mends.start(needed, apply=apply)


def app_factory() -> Callable[..., ASGIApp]:
    """``create_app`` found by its path, as every server finds it in a worker: the server
    layer knows the app only as an ASGI callable."""
    module, _, name = APP_FACTORY.partition(":")
    return cast(Callable[..., ASGIApp], getattr(importlib.import_module(module), name))


def probed(app: ASGIApp, port: int) -> ASGIApp:
    """The app, serving the probes on ``port`` too when there is one."""
    if not port:
        return app
    return Probed(app, os.environ.get(HOST_ENV, "0.0.0.0"), port)


def worker_app() -> ASGIApp:
    """A uvicorn or granian worker's app, built from ``GATEWAY_CONFIG``, with the probe port
    when ``server.probe_port`` is set; the worker ends with its server (``parent``)."""
    server = load_settings().server
    end_with_parent(server.graceful_seconds + SHUTDOWN_SECONDS)
    return probed(app_factory()(), server.probe_port)


def hypercorn_worker_app() -> ASGIApp:
    """The app of one of several hypercorn workers, each its own process (``mend_hypercorn``
    must run in it): built from ``GATEWAY_CONFIG`` as ``create_app()`` builds it.

    A worker ignores SIGTERM. Its shutdown comes from the parent (an event the parent sets on
    SIGTERM, then hypercorn's graceful shutdown, ``graceful_seconds``), and hypercorn's parent
    sends SIGTERM to every worker as soon as the first has exited: a worker still letting its
    streams finish was killed there, streams, access-log lines and all."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    settings = load_settings()
    # SIGKILL for it (SIGTERM is ignored): the parent is gone
    end_with_parent(settings.server.graceful_seconds + SHUTDOWN_SECONDS)
    configure_logging(settings)  # before create_app() does: a mend's log line is formatted
    mend_hypercorn(settings.server)
    app = app_factory()()  # built as every worker's app is (its gc tuned)
    return probed(app, settings.server.probe_port)


def _uvicorn(host: str, port: int, workers: int, settings: Settings, limit: int) -> None:
    import uvicorn

    print(f"gateway: serving on http://{host}:{port} (uvicorn)", flush=True)
    # uvicorn raises the signal that stopped it again once it has shut down, for the handler
    # found before it ran: the default one ended a clean SIGTERM with status -15 (a failure,
    # to a supervisor). With these the process ends with status 0.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stopped)
    options = uvicorn_options(settings.server, limit)
    if workers == 1 or not hasattr(socket, "SO_REUSEPORT"):
        uvicorn.run(
            WORKER_FACTORY, factory=True, host=host, port=port, workers=workers,
            backlog=BACKLOG, **options,
        )  # fmt: skip
        return
    from uvicorn.supervisors import Multiprocess

    # as uvicorn.run does for several workers, but each worker on a listener of its own
    # (``ListenerPerWorker``): on uvicorn's one shared socket a burst went mostly to one
    config = uvicorn.Config(
        WORKER_FACTORY, factory=True, host=host, port=port, workers=workers, backlog=BACKLOG,
        **options,
    )  # fmt: skip
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    held = worker_listener(family, (host, port))  # the port, held; never listening here
    Multiprocess(config, sockets=[ListenerPerWorker.of(held)]).run()


def _stopped(_signal: int, _frame: object) -> None:
    """A stop signal raised again by uvicorn once it is done: nothing more to do."""


def uvicorn_options(server: ServerSettings, limit: int) -> dict[str, Any]:
    """What uvicorn is told beside the app and the socket (``gateway serve``, and the test
    suite's in-process uvicorn)."""
    # uvicorn, only when it serves
    from gateway.server.uvicorn_body import MEND as DIRECT_BODY
    from gateway.server.uvicorn_guard import UVICORN_GUARD, guard_of, guarded

    guard = guard_of(server.header_timeout_seconds, uvicorn_keep_alive(server), limit)
    # a uvicorn the guard does not fit stops the process here (``mends.start``), unless
    # GATEWAY_UNMENDED names it: it then serves on uvicorn's own protocol, with an error line.
    # The body writer (a speed mend) is left out where it does not fit; each worker puts it
    # in place again when its first stream asks (``body_writers``)
    mends.start([UVICORN_GUARD, DIRECT_BODY])
    fits = not UVICORN_GUARD.problems()  # this uvicorn's, whatever an earlier start found
    return {
        # httptools' protocol with a header deadline and a connection cap at accept
        # (``uvicorn_guard``); it pickles with its settings into each of several workers
        "http": guarded(guard) if fits else "httptools",
        "access_log": False,
        "server_header": False,
        "timeout_keep_alive": uvicorn_keep_alive(server),
        "log_level": "warning",
        "timeout_graceful_shutdown": math.ceil(server.graceful_seconds),
        # uvicorn's own X-Forwarded-For handling (on by default, believing 127.0.0.1 or
        # FORWARDED_ALLOW_IPS) would rewrite the client's address before the gateway sees
        # it: off, so that ``trusted_proxies`` alone decides (``policy.billing.ClientAddress``)
        "proxy_headers": False,
    }


def uvicorn_keep_alive(server: ServerSettings) -> int:
    """The keep-alive uvicorn is given: whole seconds (its config allows no less than 1)."""
    return round(server.keep_alive_seconds)


def _granian(settings: Settings, host: str, port: int, workers: int) -> None:
    from granian import Granian  # type: ignore[import-not-found,unused-ignore]
    from granian.constants import Interfaces  # type: ignore[import-not-found,unused-ignore]
    from granian.http import HTTP1Settings  # type: ignore[import-not-found,unused-ignore]

    http1 = granian_http1(settings.server, HTTP1Settings)
    # on SIGTERM a worker finishes its requests for at most this long, then is killed
    # (granian's default: waited for without end; it takes whole seconds, at least 1)
    grace = max(1, math.ceil(settings.server.graceful_seconds))

    # granian's proxy handling is a wrapper one applies oneself
    # (granian.utils.proxies.wrap_asgi_with_proxy_headers): not applied, so the ASGI client is
    # the socket's and ``trusted_proxies`` alone decides what X-Forwarded-For is believed
    print(f"gateway: serving on http://{host}:{port} (granian)", flush=True)
    Granian(
        WORKER_FACTORY,
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        workers=workers,
        factory=True,
        backlog=BACKLOG,
        backpressure=GRANIAN_MAX_CONCURRENT,
        http1_settings=http1,
        workers_kill_timeout=grace,
    ).serve()


def granian_http1(server: ServerSettings, make: Callable[..., Any]) -> Any:
    """granian's HTTP/1 settings (``make``: its ``HTTP1Settings``): its own header timeout
    (30 s by default; it closes without an answer) set to ``server.header_timeout_seconds``."""
    if server.header_timeout_seconds <= 0:
        return None
    return make(header_read_timeout=round(server.header_timeout_seconds * 1000))
