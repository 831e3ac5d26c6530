"""Mends of hypercorn (written for 0.18): a connection its client closed while idle is let go
at once instead of after the keep-alive (``hypercorn.idle_close``, correctness), and a cap on
the connections one process holds (``hypercorn.connection_cap``, safety). Each is a
``gateway.server.mends.Mend``: checked before it is applied, in the registry there.

``idle_close`` is kept because hypercorn leaks: its ``TCPServer`` runs a connection in a
TaskGroup that holds, between requests, an idle task sleeping ``keep_alive_timeout``. When the
client closes an idle connection, the read loop ends, but the idle task is only stopped in the
``finally`` that runs after the TaskGroup exits, and the TaskGroup waits for it: the socket
stays in CLOSE_WAIT and the connection's objects (TaskGroup, tasks, StreamWriter, the
tracebacks of its cancelled tasks) stay alive for the whole keep-alive (bench/RESULTS.md,
"Mends", has what that cost). The mend stops the idle task as soon as the read
loop has ended: nothing can arrive on the connection any more, so nothing is lost, and a
request still being answered is not touched (the read loop closed its stream, as before).

``connection_cap`` is kept because hypercorn has no limit on connections: enough idle or
half-open ones (20,000 seen) use every file descriptor, and then the probes and every client
fail. It counts the connections of ``TCPServer.run``; past the cap a new one gets a short 503
in the OpenAI error shape with ``Retry-After`` and ``Connection: close`` before anything is
read, and is closed (the count and the 503 are ``defences``', shared with uvicorn's guard).

hypercorn's speed mends (a ``Date`` header formatted once a second, the lean app queue,
events and drain waiters, and h11's cheaper header check) were removed when the default
server became uvicorn: a mend of a library's private parts is kept only where hypercorn's
users need it to be safe or correct (``gateway.server.mends.REMOVED``).
"""

from __future__ import annotations

from typing import Any

from hypercorn.config import Config

from gateway.server.defences import CONNECTIONS, ConnectionCap, refusal, refused
from gateway.server.mends import Mend, Needs, mended, wrapping

WRITTEN_FOR = "0.18"


def tcp_server_class() -> Any:
    """hypercorn's ``TCPServer`` (one per connection), or None without that module."""
    try:
        from hypercorn.asyncio import tcp_server
    except ImportError:
        return None
    return getattr(tcp_server, "TCPServer", None)


def tcp_server(needs: Needs) -> tuple[Any, Any]:
    """hypercorn's ``TCPServer``, and one made as hypercorn makes one per connection (with
    stand-ins for the app, loop, lifespan state and socket), to check what its ``__init__``
    sets; None for what cannot be had (``needs`` says why)."""
    module = needs.module("hypercorn.asyncio.tcp_server")
    server_class = needs.attr(module, "TCPServer", "hypercorn.asyncio.tcp_server")
    context = needs.module("hypercorn.asyncio.worker_context")
    context_class = needs.attr(context, "WorkerContext", "hypercorn.asyncio.worker_context")
    if server_class is None or context_class is None:
        return server_class, None
    try:  # as hypercorn.asyncio.run: (app, loop, config, context, state, reader, writer)
        sample = server_class(None, None, Config(), context_class(None), None, None, None)
    except Exception as exc:  # a changed __init__, whatever it raises
        needs.missing.append(f"TCPServer(...) cannot be made: {type(exc).__name__}: {exc}")
        return server_class, None
    return server_class, sample


# ---- hypercorn.idle_close ----------------------------------------------------------------

_IDLE_CLOSE = "hypercorn.idle_close"


def _check_idle_close() -> list[str]:
    needs = Needs()
    server_class, sample = tcp_server(needs)
    needs.function(server_class, "_read_data", "TCPServer", ["self"], coroutine=True)
    idle_task = needs.attr(sample, "idle_task", "TCPServer()")
    needs.function(idle_task, "stop", "TCPServer().idle_task", [], coroutine=True)
    return needs.missing


def _apply_idle_close() -> None:
    server_class = tcp_server_class()
    read_data = server_class._read_data

    async def _read_data(self: Any) -> None:
        await read_data(self)
        await self.idle_task.stop()

    server_class._read_data = wrapping(_IDLE_CLOSE, read_data, _read_data)


IDLE_CLOSE = Mend(
    name=_IDLE_CLOSE,
    library="hypercorn",
    written_for=WRITTEN_FOR,
    kind="correctness",
    fixes="a connection its client closed stays in CLOSE_WAIT for the whole keep-alive",
    check=_check_idle_close,
    apply=_apply_idle_close,
    in_place=lambda: mended(getattr(tcp_server_class(), "_read_data", None), _IDLE_CLOSE),
)


# ---- hypercorn.connection_cap --------------------------------------------------------------

_CONNECTION_CAP = "hypercorn.connection_cap"


def _check_connection_cap() -> list[str]:
    needs = Needs()
    server_class, sample = tcp_server(needs)
    needs.function(server_class, "run", "TCPServer", ["self"], coroutine=True)
    # hypercorn starts a connection by awaiting its TCPServer, which runs ``self.run()``
    needs.uses(getattr(server_class, "__await__", None), ["run"], "TCPServer.__await__")
    needs.attr(sample, "writer", "TCPServer()")  # the connection's StreamWriter, to refuse on
    return needs.missing


def _apply_connection_cap() -> None:
    server_class = tcp_server_class()
    run = server_class.run

    async def capped_run(self: Any) -> None:
        cap = CONNECTIONS
        if cap.limit and cap.open >= cap.limit:
            await _refuse(self.writer, cap)
            return
        cap.open += 1
        try:
            await run(self)
        finally:
            cap.open -= 1

    server_class.run = wrapping(_CONNECTION_CAP, run, capped_run)


async def _refuse(writer: Any, cap: ConnectionCap) -> None:
    request_id = refused(cap, cap.open)
    try:
        writer.write(refusal(request_id))
        await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


CONNECTION_CAP = Mend(
    name=_CONNECTION_CAP,
    library="hypercorn",
    written_for=WRITTEN_FOR,
    kind="safety",
    fixes="no limit on connections: a flood of them uses every file descriptor",
    check=_check_connection_cap,
    apply=_apply_connection_cap,
    in_place=lambda: mended(getattr(tcp_server_class(), "run", None), _CONNECTION_CAP),
)


MENDS = (IDLE_CLOSE, CONNECTION_CAP)
