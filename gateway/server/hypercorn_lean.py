"""Mends of hypercorn (written for 0.18) that make each connection it holds smaller: its app
queue (``hypercorn.lean_app_queue``), its events (``hypercorn.lean_events``), its stream
writer's drain waiters (``hypercorn.lean_drain_waiters``) and its read loop's wait
(``hypercorn.lean_read``), all of kind ``speed`` (they only
make a connection cheaper: bench/RESULTS.md, "Memory per open stream"). Each is a
``gateway.server.mends.Mend``: checked before it is applied, in the registry there; one that
does not fit is left out with a warning, and hypercorn keeps its own.

Why: an open stream holds hypercorn's per-request app queue (an ``asyncio.Queue``: three
``collections.deque`` and an ``asyncio.Event`` with a fourth) and the connection's ``can_read``
event (an ``asyncio.Event``, one more deque). A deque allocates a block of 64 slots as it is
made, so each costs about 600 bytes empty; these five were a tenth of a stream's memory.

- ``AppQueue`` is what hypercorn's app queue is used for, and no more: ``put`` by the server
  (a request's body, its disconnect), ``get`` by the app (``receive``), with the bound of
  ``config.max_app_queue_size`` and the cancellation rules of ``asyncio.Queue`` (a getter
  cancelled after it was woken wakes the next; nothing put is lost). Its lists are made only
  when something waits. hypercorn makes the queue as ``asyncio.Queue(...)`` in
  ``hypercorn.asyncio.task_group``; the mend gives that module an ``asyncio`` of its own, the
  same module in every name but ``Queue``. hypercorn's other queues (the lifespan's) are
  untouched.
- ``LeanEvent`` is hypercorn's ``Event`` (``hypercorn.typing.Event``: ``clear``, ``wait``,
  ``set``, ``is_set``) over a flag, with a list of waiters made only when one waits. hypercorn
  makes its events through ``WorkerContext.event_class``, which the mend sets.
- asyncio's stream writer keeps its drain waiters (``FlowControlMixin._drain_waiters``) in a
  deque made with it, and only appends to it, removes from it and goes through it: a list
  does that alike. hypercorn makes one writer per connection, and hands it to ``TCPServer``,
  whose ``__init__`` the mend wraps to swap the empty deque for a list.
- hypercorn's read loop (``TCPServer._read_data``) awaits each read as
  ``asyncio.wait_for(reader.read(...), config.read_timeout)``, and a connection spends its
  life in that wait. With no ``read_timeout`` (hypercorn's default, and the gateway's: its
  own header deadline is ``hypercorn.header_timeout``), ``asyncio.wait_for`` only awaits the
  read, in a coroutine of its own (about 0.2 KiB) held as long as the wait. The mend gives
  ``hypercorn.asyncio.tcp_server`` an ``asyncio`` of its own, the same module in every name
  but ``wait_for``, which hands back the read itself when there is no timeout (the loop
  awaits it, as ``asyncio.wait_for`` would) and is ``asyncio.wait_for`` otherwise.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
from typing import Any

from gateway.server.hypercorn_mend import tcp_server, tcp_server_class
from gateway.server.mends import DEQUE_ONLY, Mend, Needs, mended, module_but, wrapping

WRITTEN_FOR = "0.18"


def _wake_next(waiters: list[asyncio.Future[None]] | None) -> None:
    """Wake the first waiter still waiting (``asyncio.Queue._wakeup_next``)."""
    while waiters:
        waiter = waiters.pop(0)
        if not waiter.done():
            waiter.set_result(None)
            break


class AppQueue:
    """hypercorn's app queue: ``asyncio.Queue``'s ``put`` and ``get``, first in first out,
    bounded by ``maxsize`` (0: unbounded), without its deques (module docstring)."""

    __slots__ = ("_maxsize", "_items", "_getters", "_putters")

    def __init__(self, maxsize: int = 0) -> None:
        self._maxsize = maxsize
        self._items: list[Any] = []
        self._getters: list[asyncio.Future[None]] | None = None
        self._putters: list[asyncio.Future[None]] | None = None

    def _full(self) -> bool:
        return 0 < self._maxsize <= len(self._items)

    async def put(self, item: Any) -> None:
        while self._full():
            putter = asyncio.get_running_loop().create_future()
            if self._putters is None:
                self._putters = []
            self._putters.append(putter)
            try:
                await putter
            except BaseException:
                putter.cancel()  # not yet done, perhaps
                if putter in self._putters:
                    self._putters.remove(putter)
                if not self._full() and not putter.cancelled():
                    _wake_next(self._putters)  # it was woken: the next one takes its turn
                raise
        self._items.append(item)
        _wake_next(self._getters)

    async def get(self) -> Any:
        while not self._items:
            getter = asyncio.get_running_loop().create_future()
            if self._getters is None:
                self._getters = []
            self._getters.append(getter)
            try:
                await getter
            except BaseException:
                getter.cancel()
                if getter in self._getters:
                    self._getters.remove(getter)
                if self._items and not getter.cancelled():
                    _wake_next(self._getters)
                raise
        item = self._items.pop(0)
        _wake_next(self._putters)
        return item


class LeanEvent:
    """hypercorn's ``Event`` over a flag; waiters are listed only while there are some."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    async def clear(self) -> None:
        self._set = False

    async def wait(self) -> None:
        if self._set:
            return
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            self._waiters.remove(waiter)
            if not self._waiters:
                self._waiters = None

    async def set(self) -> None:
        if self._set:
            return
        self._set = True
        for waiter in self._waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def is_set(self) -> bool:
        return self._set


# ---- hypercorn.lean_app_queue --------------------------------------------------------------

_APP_QUEUE = "hypercorn.lean_app_queue"


# asyncio as hypercorn's task_group module sees it under the mend: but for its Queue
_ASYNCIO = module_but(asyncio, Queue=AppQueue)


def _task_group_module() -> Any:
    try:
        from hypercorn.asyncio import task_group
    except ImportError:
        return None
    return task_group


def _check_app_queue() -> list[str]:
    needs = Needs()
    module = needs.module("hypercorn.asyncio.task_group")
    where = "hypercorn.asyncio.task_group"
    found = needs.attr(module, "asyncio", where)
    needs.require(
        found is None or found is asyncio or found is _ASYNCIO,
        f"{where}.asyncio is not the asyncio module",
    )
    group = needs.attr(module, "TaskGroup", where)
    params = ["self", "app", "config", "scope", "send"]
    spawn_app = needs.function(group, "spawn_app", "TaskGroup", params, coroutine=True)
    # it makes the queue as asyncio.Queue(config.max_app_queue_size), hands the app its get
    # as receive and returns its put, and uses it no other way
    needs.uses(spawn_app, ["asyncio", "Queue", "max_app_queue_size", "get", "put"], "spawn_app")
    if spawn_app is not None:
        code = spawn_app.__code__
        others = {"qsize", "empty", "full", "put_nowait", "get_nowait", "join", "task_done"}
        needs.require(not others & set(code.co_names), "TaskGroup.spawn_app uses more of its queue")
    queue_params = list(inspect.signature(asyncio.Queue).parameters)
    needs.require(queue_params[:1] == ["maxsize"], "asyncio.Queue takes no maxsize first")
    return needs.missing


def _apply_app_queue() -> None:
    _task_group_module().asyncio = _ASYNCIO


LEAN_APP_QUEUE = Mend(
    name=_APP_QUEUE,
    library="hypercorn",
    written_for=WRITTEN_FOR,
    kind="speed",
    fixes="each request's app queue holds four deques (about 2.5 KiB) for as long as it lasts",
    check=_check_app_queue,
    apply=_apply_app_queue,
    in_place=lambda: getattr(_task_group_module(), "asyncio", None) is _ASYNCIO,
)


# ---- hypercorn.lean_events -----------------------------------------------------------------

_EVENTS = "hypercorn.lean_events"
EVENT_METHODS = {"clear": True, "wait": True, "set": True, "is_set": False}  # coroutine?


def _worker_context_class() -> Any:
    try:
        from hypercorn.asyncio.worker_context import WorkerContext
    except ImportError:
        return None
    return WorkerContext


def _check_events() -> list[str]:
    needs = Needs()
    where = "hypercorn.asyncio.worker_context"
    module = needs.module(where)
    context = needs.attr(module, "WorkerContext", where)
    wrapper = needs.attr(module, "EventWrapper", where)
    needs.attr(context, "event_class", "WorkerContext")
    # the events hypercorn makes are its Event protocol's, of these methods and no others
    protocol = needs.attr(needs.module("hypercorn.typing"), "Event", "hypercorn.typing")
    if protocol is not None:
        methods = {n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")}
        needs.require(
            methods == set(EVENT_METHODS),
            f"hypercorn.typing.Event has ({', '.join(sorted(methods))}), "
            f"not ({', '.join(sorted(EVENT_METHODS))})",
        )
    for name, coroutine in EVENT_METHODS.items():
        needs.function(wrapper, name, "EventWrapper", ["self"], coroutine=coroutine)
    # a connection's can_read is made through the context's event_class
    h11 = needs.attr(needs.module("hypercorn.protocol.h11"), "H11Protocol", "hypercorn")
    needs.uses(getattr(h11, "__init__", None), ["event_class"], "H11Protocol.__init__")
    return needs.missing


def _apply_events() -> None:
    _worker_context_class().event_class = LeanEvent


LEAN_EVENTS = Mend(
    name=_EVENTS,
    library="hypercorn",
    written_for=WRITTEN_FOR,
    kind="speed",
    fixes="each connection's events hold a deque (about 600 bytes) for as long as it lasts",
    check=_check_events,
    apply=_apply_events,
    in_place=lambda: getattr(_worker_context_class(), "event_class", None) is LeanEvent,
)


# ---- hypercorn.lean_drain_waiters ----------------------------------------------------------

_DRAIN = "hypercorn.lean_drain_waiters"


def _check_drain_waiters() -> list[str]:
    needs = Needs()
    server_class, sample = tcp_server(needs)
    params = ["self", "app", "loop", "config", "context", "state", "reader", "writer"]
    needs.function(server_class, "__init__", "TCPServer", params, coroutine=False)
    needs.attr(sample, "writer", "TCPServer()")  # the connection's StreamWriter
    mixin = needs.attr(asyncio.streams, "FlowControlMixin", "asyncio.streams")
    if mixin is not None:
        waiters = getattr(mixin(loop=object()), "_drain_waiters", None)  # the loop: kept only
        needs.require(
            isinstance(waiters, collections.deque) and not waiters,
            "asyncio.streams.FlowControlMixin()._drain_waiters is missing or not an empty deque",
        )
        for name, func in vars(mixin).items():
            code = getattr(func, "__code__", None)
            used = DEQUE_ONLY & set(code.co_names) if code is not None else set()
            needs.require(not used, f"FlowControlMixin.{name} uses {', '.join(sorted(used))}")
    return needs.missing


def _apply_drain_waiters() -> None:
    server_class = tcp_server_class()
    init = server_class.__init__

    def __init__(self: Any, *args: Any) -> None:
        init(self, *args)
        writer = self.writer
        if writer is not None:  # None in the mends' own samples
            protocol = writer.transport.get_protocol()
            if type(getattr(protocol, "_drain_waiters", None)) is collections.deque:
                protocol._drain_waiters = []

    server_class.__init__ = wrapping(_DRAIN, init, __init__)


LEAN_DRAIN_WAITERS = Mend(
    name=_DRAIN,
    library="hypercorn",
    written_for=WRITTEN_FOR,
    kind="speed",
    fixes="each connection's stream writer holds an empty deque (about 600 bytes) as long as "
    "it lasts",
    check=_check_drain_waiters,
    apply=_apply_drain_waiters,
    in_place=lambda: mended(getattr(tcp_server_class(), "__init__", None), _DRAIN),
)


# ---- hypercorn.lean_read -------------------------------------------------------------------

_READ = "hypercorn.lean_read"


def _wait_for(aw: Any, timeout: float | None) -> Any:
    """``asyncio.wait_for`` as ``hypercorn.asyncio.tcp_server`` sees it under the mend: with
    no timeout, ``aw`` itself, for the caller to await; else asyncio's own."""
    if timeout is None:
        return aw
    return asyncio.wait_for(aw, timeout)


# asyncio as hypercorn's tcp_server module sees it under the mend: but for its wait_for
_TCP_ASYNCIO = module_but(asyncio, wait_for=_wait_for)


def _tcp_server_module() -> Any:
    try:
        from hypercorn.asyncio import tcp_server as module
    except ImportError:
        return None
    return module


def _check_read() -> list[str]:
    needs = Needs()
    where = "hypercorn.asyncio.tcp_server"
    module = needs.module(where)
    found = needs.attr(module, "asyncio", where)
    needs.require(
        found is None or found is asyncio or found is _TCP_ASYNCIO,
        f"{where}.asyncio is not the asyncio module",
    )
    server_class = needs.attr(module, "TCPServer", where)
    read_data = needs.function(server_class, "_read_data", "TCPServer", ["self"], coroutine=True)
    # it awaits each read as asyncio.wait_for(self.reader.read(...), config.read_timeout)
    needs.uses(read_data, ["asyncio", "wait_for", "read", "read_timeout"], "TCPServer._read_data")
    params = list(inspect.signature(asyncio.wait_for).parameters)
    needs.require(params == ["fut", "timeout"], "asyncio.wait_for takes other than (fut, timeout)")
    return needs.missing


def _apply_read() -> None:
    _tcp_server_module().asyncio = _TCP_ASYNCIO


LEAN_READ = Mend(
    name=_READ,
    library="hypercorn",
    written_for=WRITTEN_FOR,
    kind="speed",
    fixes="each connection's read waits in a coroutine of asyncio.wait_for (about 0.2 KiB) "
    "that has no timeout to keep",
    check=_check_read,
    apply=_apply_read,
    in_place=lambda: getattr(_tcp_server_module(), "asyncio", None) is _TCP_ASYNCIO,
)

MENDS = (LEAN_APP_QUEUE, LEAN_EVENTS, LEAN_DRAIN_WAITERS, LEAN_READ)
