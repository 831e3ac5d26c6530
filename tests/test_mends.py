"""The mends of third-party internals (``gateway.server.mends``): each fits the installed
(pinned) hypercorn, h11 and aiohttp, and start-up puts each in place. A library whose internals
differ, simulated here one missing or changed part at a time, fails the mend's check with a
message naming the mend and the part; start-up then stops (a correctness or safety mend),
unless ``GATEWAY_UNMENDED`` names it, or goes on without it (a speed mend)."""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import aiohttp.client_reqrep
import aiohttp.streams
import h11
import hypercorn.events
import pytest
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import BaseConnector
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.asyncio.worker_context import AsyncioSingleTask
from hypercorn.config import Config
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h11 import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

import gateway.server as server
from gateway.config import UpstreamSettings, load_settings
from gateway.server import mends, uvicorn_body, uvicorn_guard
from gateway.server.defences import CONNECTIONS
from gateway.server.header_timeout import HEADER_TIMEOUT
from gateway.upstream import direct_reads, lean_request_info, lean_send
from gateway.upstream.lean_connect import LeanConnector
from gateway.upstream.pool import RecentFirstConnector, Upstream

KINDS = {
    "hypercorn.idle_close": "correctness",
    "hypercorn.connection_cap": "safety",
    "hypercorn.header_timeout": "safety",
    "uvicorn.guard": "safety",
    "uvicorn.direct_body": "speed",
    "aiohttp.recent_first": "speed",
    "aiohttp.lean_buffers": "speed",
    "aiohttp.lean_request_info": "speed",
    "aiohttp.direct_reads": "speed",
    "aiohttp.lean_send": "speed",
    "aiohttp.lean_connect": "speed",
}
# what the mends change, put back as it was after each test of this module
OWNERS: list[Any] = [TCPServer, RecentFirstConnector, ProtocolWrapper, aiohttp.streams]
OWNERS += [lean_request_info, direct_reads, uvicorn_guard, uvicorn_body, RequestResponseCycle]
OWNERS += [lean_send, aiohttp.ClientResponse, aiohttp.ClientRequest, ResponseHandler]
OWNERS += [LeanConnector]


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    """Set up before ``monkeypatch``, so undone after it: whatever a test applied or broke,
    the libraries, the settings the mends read and the environment are as they were."""
    saved = [(owner, dict(vars(owner))) for owner in OWNERS]
    settings = (CONNECTIONS.limit, HEADER_TIMEOUT.seconds, set(mends._left_out))
    unmended = os.environ.pop(mends.UNMENDED_ENV, None)
    yield
    for owner, before in saved:
        now = vars(owner)
        for name in set(now) - set(before):
            delattr(owner, name)
        for name, value in before.items():
            if now.get(name) is not value:
                setattr(owner, name, value)
    CONNECTIONS.limit, HEADER_TIMEOUT.seconds, left_out = settings
    mends._left_out.clear()
    mends._left_out.update(left_out)
    os.environ.pop(mends.UNMENDED_ENV, None)
    if unmended is not None:
        os.environ[mends.UNMENDED_ENV] = unmended


def config(tmp_path: Path, header_timeout: float = 5.0) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        f"store: sqlite:///{tmp_path}/gateway.db\n"
        "admin_token: test-admin-token\ngroups: [default]\n"
        "models: []\nchannels: []\n"
        f"server: {{max_connections: 123, header_timeout_seconds: {header_timeout}}}\n"
    )
    return path


# ---- on the installed versions ----------------------------------------------------------------


def test_the_registry_holds_every_mend_with_its_kind() -> None:
    found = mends.registry()
    assert {name: mend.kind for name, mend in found.items()} == KINDS
    for mend in found.values():
        assert mend.name.startswith(mend.library.lower() + ".")
        assert mend.written_for and mend.fixes


@pytest.mark.parametrize("name", list(KINDS))
def test_every_mend_fits_the_installed_libraries(name: str) -> None:
    """Fails, naming the mend and what is missing, when a library is changed under it."""
    mend = mends.registry()[name]
    problems = mend.problems()
    assert problems == [], str(mends.MendError(mend, problems))


# a fresh process: the gateway's start-up under hypercorn (up to serving: the app and the
# loop are stand-ins), then the upstream pool's, each mend's state before and after them
START_UP = """
import asyncio, json, sys
import h11._connection, h11._headers
from hypercorn.asyncio import task_group
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.asyncio.worker_context import WorkerContext
from hypercorn.protocol import ProtocolWrapper
import aiohttp.streams
import gateway.server as server
from gateway.config import UpstreamSettings, load_settings
from gateway.server import gc_tuning, mends
from gateway.server.header_timeout import HEADER_TIMEOUT
from gateway.server.defences import CONNECTIONS
from gateway.upstream.lean_connect import LeanConnector
from gateway.upstream.pool import RecentFirstConnector, Upstream
from aiohttp.client_proto import ResponseHandler

settings = load_settings(sys.argv[1])
found = mends.registry()
before = [name for name, mend in found.items() if mend.in_place()]
server.app_factory = lambda: lambda settings: None
gc_tuning.tune_gc = lambda: None
run, asyncio.run = asyncio.run, lambda main: main.close()
server._hypercorn(settings, "127.0.0.1", 0, 1)
asyncio.run = run
server.uvicorn_options(settings.server, 100)

async def pool():
    upstream = Upstream(settings.upstream)
    await upstream.start()
    await upstream.stop()

asyncio.run(pool())
parts = {
    "TCPServer._read_data": TCPServer._read_data,
    "ProtocolWrapper.handle": ProtocolWrapper.handle,
    "TCPServer.run": TCPServer.run,
    "TCPServer.protocol_send": TCPServer.protocol_send,
    "TCPServer._idle_timeout": TCPServer._idle_timeout,
    "TCPServer.__init__": TCPServer.__init__,
    "h11._headers.normalize_and_validate": h11._headers.normalize_and_validate,
    "h11._connection.set_comma_header": h11._connection.set_comma_header,
    "RecentFirstConnector._get": vars(RecentFirstConnector).get("_get"),
    "LeanConnector._wrap_create_connection": vars(LeanConnector).get("_wrap_create_connection"),
}
print(json.dumps({
    "before": before,
    "after": [name for name, mend in found.items() if mend.in_place()],
    "parts": {
        part: sorted(name for name in found if mends.mended(func, name))
        for part, func in parts.items()
    },
    "wrapped": {part: mends.original(func).__module__ for part, func in parts.items()},
    "limits": [CONNECTIONS.limit, HEADER_TIMEOUT.seconds],
    "made": [type(task_group.asyncio.Queue()).__name__, WorkerContext.event_class.__name__,
             type(aiohttp.streams.collections.deque()).__name__],
}))
"""


def test_start_up_puts_every_mend_in_place(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", START_UP, str(config(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["before"] == []
    assert seen["after"] == list(KINDS)
    # each part the gateway changes is the gateway's wrapper, over the library's own
    assert seen["parts"] == {
        "TCPServer._read_data": ["hypercorn.idle_close"],
        "ProtocolWrapper.handle": ["hypercorn.header_timeout"],
        "TCPServer.run": ["hypercorn.connection_cap"],
        "TCPServer.protocol_send": ["hypercorn.header_timeout"],
        "TCPServer._idle_timeout": ["hypercorn.header_timeout"],
        # hypercorn's speed mends are gone: these are the libraries' own
        "TCPServer.__init__": [],
        "h11._headers.normalize_and_validate": [],
        "h11._connection.set_comma_header": [],
        "RecentFirstConnector._get": ["aiohttp.recent_first"],
        "LeanConnector._wrap_create_connection": ["aiohttp.lean_connect"],
    }
    assert seen["wrapped"] == {
        "TCPServer._read_data": "hypercorn.asyncio.tcp_server",
        "ProtocolWrapper.handle": "hypercorn.protocol",
        "TCPServer.run": "hypercorn.asyncio.tcp_server",
        "TCPServer.protocol_send": "hypercorn.asyncio.tcp_server",
        "TCPServer._idle_timeout": "hypercorn.asyncio.tcp_server",
        "TCPServer.__init__": "hypercorn.asyncio.tcp_server",
        "h11._headers.normalize_and_validate": "h11._headers",
        "h11._connection.set_comma_header": "h11._headers",
        "RecentFirstConnector._get": "aiohttp.connector",
        "LeanConnector._wrap_create_connection": "aiohttp.connector",
    }
    assert seen["limits"] == [123, 5.0]
    # hypercorn's own queue and events; aiohttp's response buffers leaner (a speed mend kept)
    assert seen["made"] == ["Queue", "EventWrapper", "LeanDeque"]
    assert "server.mend" not in done.stderr  # nothing left out


def test_without_a_header_timeout_its_mend_is_not_needed(tmp_path: Path) -> None:
    settings = load_settings(config(tmp_path, header_timeout=0))
    needed: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mends, "start", lambda mended, apply: needed.extend(m.name for m in mended))
        server.mend_hypercorn(settings.server)
    assert "hypercorn.header_timeout" not in needed and "hypercorn.idle_close" in needed


# ---- a library whose internals differ ---------------------------------------------------------


def _gone(owner: Any, name: str) -> Callable[[pytest.MonkeyPatch], None]:
    return lambda patch: patch.delattr(owner, name)


def _set(owner: Any, name: str, value: Any) -> Callable[[pytest.MonkeyPatch], None]:
    return lambda patch: patch.setattr(owner, name, value)


def _without(attribute: str) -> Callable[[pytest.MonkeyPatch], None]:
    """A TCPServer whose ``__init__`` no longer sets ``attribute``."""
    init = TCPServer.__init__

    def __init__(self: Any, *args: Any) -> None:
        init(self, *args)
        del self.__dict__[attribute]

    return _set(TCPServer, "__init__", __init__)


async def _takes_more(self: Any, extra: Any) -> None:
    pass


async def _takes_less(self: Any, key: Any) -> None:
    pass


async def _no_task_group(self: Any) -> None:
    self.protocol = self.idle_task = None  # sets no _task_group, starts no idle task


def _awaits_serve(self: Any) -> Any:
    return self.serve().__await__()


def _keeps_no_send(patch: pytest.MonkeyPatch) -> None:
    """A protocol that does not keep the send it was given (the mend finds its connection
    by it)."""
    init = ProtocolWrapper.__init__

    def __init__(self: Any, *args: Any) -> None:
        init(self, *args)
        del self.send

    patch.setattr(ProtocolWrapper, "__init__", __init__)


def _not_h11(patch: pytest.MonkeyPatch) -> None:
    """An HTTP/1.1 protocol that keeps no h11.Connection where the mend reads it."""
    init = H11Protocol.__init__

    def __init__(self: Any, *args: Any) -> None:
        init(self, *args)
        self.connection = object()

    patch.setattr(H11Protocol, "__init__", __init__)


@dataclass(frozen=True)
class Renamed(hypercorn.events.Event):
    waiting: bool


def _plain_dict_pool(patch: pytest.MonkeyPatch) -> None:
    init = BaseConnector.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self._conns = dict(self._conns)

    patch.setattr(BaseConnector, "__init__", __init__)


async def _from_the_right(self: Any, key: Any, traces: Any) -> Any:
    conns = self._conns.get(key)
    return conns.pop() if conns else None


async def _connects_otherwise(self: Any, req: Any, traces: Any, timeout: Any) -> Any:
    return await self._take(req.connection_key, traces)


class FiveFields(NamedTuple):
    url: Any
    method: str
    headers: Any
    real_url: Any
    body: bytes


def _keeps_info_otherwise(self: Any, *args: Any, **kwargs: Any) -> None:
    self._request = kwargs.get("request_info")  # under another name


def _ends_otherwise(self: Any) -> None:
    self._eof = True
    self._done.set()  # the end said to readers some other way than through its waiter


def _reads_otherwise(self: Any) -> bytes:
    return b""


async def _sends_otherwise(self: Any, message: Any) -> None:
    """An ASGI send with no flow control of its own."""
    self.transport.write(message.get("body", b""))


def _with_a_slot(reader: Any) -> Any:
    """A subclass whose instances differ in layout from the library's (a slot of its own)."""
    return type("Wider", (reader,), {"__slots__": ("extra",)})


async def _starts_otherwise(self: Any) -> Any:
    return self  # a response started without the connection it reads from


def _fingerprint_otherwise(self: Any, req: Any) -> Any:
    return req.fingerprint  # a request field the lean path's connecting stand-in lacks


def _params_otherwise(self: Any, *, timer: Any = None, skip_payload: bool = False) -> None:
    """A parser set up from fewer settings than the lean path hands it."""


def _completes_otherwise(self: Any) -> None:
    self.keep_alive_timer = None  # the keep-alive's timer under another name


async def _connects_by_address(self: Any, *args: Any, address: Any, **kwargs: Any) -> None:
    pass


async def _connects_plainly(self: Any, *args: Any, addr_infos: Any, req: Any, timeout: Any,
                            client_error: Any = None, **kwargs: Any) -> None:  # fmt: skip
    """The parameters aiohttp's own takes, without the happy eyeballs it uses."""


def _makes_lists(self: Any, *args: Any) -> None:
    self._buffer = []  # its buffer made otherwise than by the collections it was given


def _rotates(patch: pytest.MonkeyPatch) -> None:
    """An aiohttp.streams that turns one of its deques, which a list cannot do."""

    def rotating(self: Any) -> None:
        self._buffer.rotate(1)

    rotating.__module__ = "aiohttp.streams"
    patch.setattr(aiohttp.streams.DataQueue, "rotating", rotating, raising=False)


CHANGES: list[tuple[str, Callable[[pytest.MonkeyPatch], None], str]] = [
    ("hypercorn.idle_close", _gone(TCPServer, "_read_data"), "TCPServer._read_data is missing"),
    ("hypercorn.idle_close", _set(TCPServer, "_read_data", _takes_more), "takes (self, extra)"),
    ("hypercorn.idle_close", _without("idle_task"), "TCPServer().idle_task is missing"),
    ("hypercorn.idle_close", _gone(AsyncioSingleTask, "stop"), "idle_task.stop is missing"),
    ("hypercorn.connection_cap", _set(TCPServer, "run", _takes_more), "TCPServer.run takes"),
    ("hypercorn.connection_cap", _set(TCPServer, "__await__", _awaits_serve), "uses run"),
    ("hypercorn.connection_cap", _without("writer"), "TCPServer().writer is missing"),
    ("hypercorn.header_timeout", _gone(TCPServer, "_idle_timeout"), "_idle_timeout is missing"),
    ("hypercorn.header_timeout", _gone(TCPServer, "_initiate_server_close"), "_initiate_server"),
    ("hypercorn.header_timeout", _set(TCPServer, "protocol_send", _takes_more), "protocol_send"),
    ("hypercorn.header_timeout", _set(TCPServer, "run", _no_task_group), "uses _task_group"),
    ("hypercorn.header_timeout", _gone(AsyncioSingleTask, "restart"), "idle_task.restart is"),
    ("hypercorn.header_timeout", _set(hypercorn.events, "Updated", Renamed), "no field idle"),
    ("hypercorn.header_timeout", _not_h11, "protocol.connection is missing or not an h11"),
    ("hypercorn.header_timeout", _keeps_no_send, "send is missing or not the send it was"),
    ("hypercorn.header_timeout", _set(h11.Connection, "trailing_data", b""), "trailing_data"),
    ("hypercorn.header_timeout", _gone(Config, "keep_alive_timeout"), "keep_alive_timeout is"),
    ("aiohttp.recent_first", _gone(BaseConnector, "_get"), "TCPConnector._get is missing"),
    ("aiohttp.recent_first", _set(BaseConnector, "_get", _takes_less), "takes (self, key)"),
    ("aiohttp.recent_first", _set(BaseConnector, "_get", _from_the_right), "uses popleft"),
    ("aiohttp.recent_first", _set(BaseConnector, "connect", _connects_otherwise), "uses _get"),
    ("aiohttp.recent_first", _plain_dict_pool, "_conns is missing or not a dict of deques"),
    ("aiohttp.lean_buffers", _set(aiohttp.streams, "collections", os), "not the collections"),
    (
        "aiohttp.lean_buffers",
        _set(aiohttp.streams.DataQueue, "__init__", _makes_lists),
        "DataQueue.__init__ no longer uses collections",
    ),  # fmt: skip
    ("aiohttp.lean_buffers", _rotates, "uses its deques' rotate"),
    (
        "aiohttp.lean_request_info",
        _set(aiohttp.client_reqrep, "RequestInfo", FiveFields),
        "RequestInfo is not a tuple of (url, method, headers, real_url)",
    ),  # fmt: skip
    (
        "aiohttp.lean_request_info",
        _set(aiohttp.ClientResponse, "__init__", _keeps_info_otherwise),
        "ClientResponse.__init__ no longer uses _request_info",
    ),  # fmt: skip
    (
        "aiohttp.lean_request_info",
        _set(aiohttp.ClientResponse, "request_info", None),
        "ClientResponse.request_info is not a property",
    ),  # fmt: skip
    (
        "uvicorn.guard",
        _set(HttpToolsProtocol, "on_response_complete", _completes_otherwise),
        "HttpToolsProtocol.on_response_complete no longer uses timeout_keep_alive_task",
    ),  # fmt: skip
    (
        "uvicorn.guard",
        _set(HttpToolsProtocol, "data_received", _reads_otherwise),
        "HttpToolsProtocol.data_received takes (self), not (self, data)",
    ),  # fmt: skip
    (
        "aiohttp.direct_reads",
        _set(aiohttp.streams.StreamReader, "__slots__", ("_buffer", "_eof", "_exception")),
        "StreamReader has no slot _waiter",
    ),  # fmt: skip
    (
        "aiohttp.direct_reads",
        _set(aiohttp.streams.StreamReader, "feed_eof", _ends_otherwise),
        "StreamReader.feed_eof no longer uses _waiter",
    ),  # fmt: skip
    (
        "aiohttp.direct_reads",
        _set(aiohttp.streams.StreamReader, "feed_data", _reads_otherwise),
        "StreamReader.feed_data takes (self), not (self, data, size)",
    ),  # fmt: skip
    (
        "uvicorn.direct_body",
        _set(RequestResponseCycle, "send", _sends_otherwise),
        "RequestResponseCycle.send no longer uses write_paused",
    ),  # fmt: skip
    (
        "aiohttp.lean_send",
        _set(aiohttp.ClientResponse, "start", _starts_otherwise),
        "ClientResponse.start takes (self), not (self, connection)",
    ),  # fmt: skip
    (
        "aiohttp.lean_send",
        _set(ResponseHandler, "set_response_params", _params_otherwise),
        "ResponseHandler.set_response_params takes (self, timer, skip_payload)",
    ),  # fmt: skip
    (
        "aiohttp.lean_send",
        _set(aiohttp.ClientRequest, "DEFAULT_HEADERS", {"Accept": "*/*"}),
        "ClientRequest.DEFAULT_HEADERS is not Accept and Accept-Encoding",
    ),  # fmt: skip
    (
        "aiohttp.lean_send",
        _set(aiohttp.TCPConnector, "_get_fingerprint", _fingerprint_otherwise),
        "TCPConnector._get_fingerprint reads what a connecting request does not hold: "
        "['fingerprint']",
    ),  # fmt: skip
    (
        "aiohttp.lean_connect",
        _set(aiohttp.TCPConnector, "_wrap_create_connection", _connects_by_address),
        "TCPConnector._wrap_create_connection takes (self, args, address, kwargs)",
    ),  # fmt: skip
    (
        "aiohttp.lean_connect",
        _set(aiohttp.TCPConnector, "_wrap_create_connection", _connects_plainly),
        "TCPConnector._wrap_create_connection no longer uses start_connection",
    ),  # fmt: skip
    (
        "aiohttp.direct_reads",
        _set(direct_reads, "_taking", _with_a_slot),
        "StreamReader's instances cannot change class",
    ),  # fmt: skip
]


@pytest.mark.parametrize(
    ("name", "change", "missing"), CHANGES, ids=[f"{n}-{m}" for n, _, m in CHANGES]
)
def test_a_changed_library_fails_the_mend_s_check(
    monkeypatch: pytest.MonkeyPatch, name: str, change: Any, missing: str
) -> None:
    mend = mends.registry()[name]
    change(monkeypatch)
    with pytest.raises(mends.MendError) as err:
        mends.put_in_place(mend)
    message = str(err.value)
    assert message.startswith(f"mend {name} ({mend.kind}: "), message
    assert missing in message, message
    assert f"written for {mend.written_for}" in message


def test_every_mend_has_a_changed_library_case() -> None:
    assert {name for name, _, _ in CHANGES} == set(KINDS)


# ---- what start-up does then ------------------------------------------------------------------

REFUSED = [  # a correctness or safety mend, and a change that makes it not fit
    ("hypercorn.idle_close", _gone(TCPServer, "_read_data"), "_read_data"),
    ("hypercorn.connection_cap", _set(TCPServer, "run", _takes_more), "TCPServer.run takes"),
    ("hypercorn.header_timeout", _gone(TCPServer, "_idle_timeout"), "_idle_timeout"),
]


@pytest.mark.parametrize(("name", "change", "missing"), REFUSED, ids=[n for n, _, _ in REFUSED])
def test_a_correctness_or_safety_mend_that_does_not_fit_stops_start_up(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    name: str,
    change: Any,
    missing: str,
) -> None:
    settings = load_settings(config(tmp_path))
    change(monkeypatch)
    with caplog.at_level(logging.WARNING, "gateway.server"), pytest.raises(SystemExit) as exit:
        server.mend_hypercorn(settings.server)
    assert exit.value.code == 1
    (line,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    text = line.getMessage()
    assert line.levelno == logging.CRITICAL and text.startswith(f"server.mend_refused mend {name}")
    assert missing in text and f"GATEWAY_UNMENDED={name}" in text


def test_hypercorn_s_parent_refuses_before_it_starts_workers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    import hypercorn.run

    settings = load_settings(config(tmp_path))
    started: list[object] = []
    monkeypatch.setattr(hypercorn.run, "run", started.append)
    monkeypatch.delattr(TCPServer, "_idle_timeout")
    before = dict(vars(TCPServer))
    with caplog.at_level(logging.WARNING, "gateway.server"), pytest.raises(SystemExit):
        server._hypercorn(settings, "127.0.0.1", 0, 2)
    assert started == []
    assert "server.mend_refused mend hypercorn.header_timeout" in caplog.text
    assert dict(vars(TCPServer)) == before  # checked, not applied: the workers apply them


def test_a_uvicorn_the_guard_does_not_fit_stops_start_up(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    settings = load_settings(config(tmp_path))
    monkeypatch.setattr(HttpToolsProtocol, "on_response_complete", _completes_otherwise)
    with caplog.at_level(logging.WARNING, "gateway.server"), pytest.raises(SystemExit) as exit:
        server.uvicorn_options(settings.server, 100)
    assert exit.value.code == 1
    (line,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.getMessage().startswith("server.mend_refused mend uvicorn.guard (safety")
    assert "GATEWAY_UNMENDED=uvicorn.guard" in line.getMessage()


def test_gateway_unmended_serves_uvicorn_on_its_own_protocol_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    settings = load_settings(config(tmp_path))
    monkeypatch.setattr(HttpToolsProtocol, "on_response_complete", _completes_otherwise)
    monkeypatch.setenv(mends.UNMENDED_ENV, "uvicorn.guard")
    with caplog.at_level(logging.WARNING, "gateway.server"):
        options = server.uvicorn_options(settings.server, 100)
    assert options["http"] == "httptools"  # uvicorn's own, unguarded
    (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.levelno == logging.ERROR
    assert line.getMessage().startswith("server.serving_unmended mend uvicorn.guard")


@pytest.mark.parametrize("unmended", ["hypercorn.header_timeout", "all"])
def test_gateway_unmended_serves_without_the_mend_it_names(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path, unmended: str
) -> None:
    settings = load_settings(config(tmp_path))
    monkeypatch.setenv(mends.UNMENDED_ENV, unmended)
    monkeypatch.delattr(TCPServer, "_idle_timeout")
    with caplog.at_level(logging.WARNING, "gateway.server"):
        server.mend_hypercorn(settings.server)
    found = mends.registry()
    assert not found["hypercorn.header_timeout"].in_place()
    assert found["hypercorn.idle_close"].in_place() and found["hypercorn.connection_cap"].in_place()
    (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.levelno == logging.ERROR
    assert line.getMessage().startswith("server.serving_unmended mend hypercorn.header_timeout")


def test_gateway_unmended_names_only_what_it_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings = load_settings(config(tmp_path))
    monkeypatch.setenv(mends.UNMENDED_ENV, "hypercorn.header_timeout")
    monkeypatch.delattr(TCPServer, "_read_data")  # idle_close does not fit, and is not named
    with pytest.raises(SystemExit):
        server.mend_hypercorn(settings.server)


def test_a_speed_mend_that_does_not_fit_is_left_out_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """hypercorn has none left (``mends.REMOVED``); start-up treats any speed mend so."""
    monkeypatch.setattr(aiohttp.streams, "collections", collections)  # not yet in place
    _rotates(monkeypatch)
    found = mends.registry()
    with caplog.at_level(logging.WARNING, "gateway.server"):
        mends.start([found["aiohttp.lean_buffers"], found["hypercorn.connection_cap"]])
    assert not found["aiohttp.lean_buffers"].in_place()
    assert found["hypercorn.connection_cap"].in_place()
    (line,) = caplog.records
    assert line.levelno == logging.WARNING
    assert line.getMessage().startswith("server.mend_left_out mend aiohttp.lean_buffers (speed")


REMOVED_SAID = "a mend the gateway no longer has (a speed mend of hypercorn's, removed when"


@pytest.mark.parametrize(
    ("unmended", "said"),
    [
        ("h11.header_check", [f"names h11.header_check, {REMOVED_SAID}"]),
        (
            "hypercorn.date_header, hypercorn.lean_events,hypercorn.header_timeout",
            [
                f"names hypercorn.date_header, {REMOVED_SAID}",
                f"names hypercorn.lean_events, {REMOVED_SAID}",
            ],
        ),  # fmt: skip
        ("hypercorn.header-timeout", ["names hypercorn.header-timeout, which is no mend"]),
        ("all", []),
        ("", []),
    ],
)
def test_gateway_unmended_naming_no_mend_is_said_and_start_up_goes_on(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    unmended: str,
    said: list[str],
) -> None:
    """An operator upgrading with a removed mend's name still set (it never changed anything:
    a speed mend never stopped start-up) is told so, once a name, and serves as before."""
    settings = load_settings(config(tmp_path))
    monkeypatch.setenv(mends.UNMENDED_ENV, unmended)
    with caplog.at_level(logging.WARNING, "gateway.server"):
        server.mend_hypercorn(settings.server)  # no SystemExit
    found = mends.registry()
    assert all(found[name].in_place() for name in KINDS if name.startswith("hypercorn."))
    lines = [r.getMessage() for r in caplog.records]
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert len(lines) == len(said)
    for line, part in zip(lines, said, strict=True):
        assert line.startswith(f"server.unmended_unknown {mends.UNMENDED_ENV} ") and part in line


async def test_the_pool_without_its_mend_is_aiohttp_s_own_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp works as before (what the mend checks changed, not what aiohttp needs): the
    pool is aiohttp's, first-in first-out, and one warning says so."""
    release = aiohttp.TCPConnector._release

    def _release(self: Any, *args: Any, **kwargs: Any) -> Any:  # no longer appends itself
        return release(self, *args, **kwargs)

    monkeypatch.setattr(BaseConnector, "_release", _release)
    if "_get" in vars(RecentFirstConnector):  # put there by an earlier test: not yet, here
        monkeypatch.delattr(RecentFirstConnector, "_get")
    with caplog.at_level(logging.WARNING, "gateway.server"):
        for _ in range(2):
            upstream = Upstream(UpstreamSettings())
            await upstream.start()
            await upstream.stop()
    assert "_get" not in vars(RecentFirstConnector)
    (line,) = caplog.records
    assert line.getMessage().startswith("server.mend_left_out mend aiohttp.recent_first (speed")
    assert "_release no longer uses append" in line.getMessage()


# ---- the header deadline over hypercorn's own wait --------------------------------------------


async def closed_after(header: float, keep_alive: float, wait: str, terminate: bool) -> float:
    """Seconds until the mended idle task of a connection (waiting for ``wait``) closes it."""
    from hypercorn.asyncio.worker_context import WorkerContext

    mends.put_in_place(mends.registry()["hypercorn.header_timeout"])
    HEADER_TIMEOUT.seconds = header
    settings = Config()
    settings.keep_alive_timeout = keep_alive
    connection = TCPServer(None, None, settings, WorkerContext(None), None, None, None)
    connection._gw_wait = wait
    closed = asyncio.Event()

    async def close() -> None:  # hypercorn's, less the socket there is none of
        closed.set()

    connection._initiate_server_close = close
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = asyncio.create_task(connection._idle_timeout())
    if terminate:
        await connection.context.terminated.set()
    await asyncio.wait_for(closed.wait(), 10)
    await task
    return loop.time() - started


@pytest.mark.parametrize(
    ("header", "keep_alive", "wait", "terminate", "at_least", "before"),
    [
        (0.2, 3.0, "headers", False, 0.2, 2.0),  # the header deadline, well before the keep-alive
        (3.0, 0.4, "headers", False, 0.4, 2.0),  # no shorter than the keep-alive: the keep-alive
        (0.2, 0.4, "idle", False, 0.4, 2.0),  # between requests: the keep-alive
        (3.0, 3.0, "headers", True, 0.0, 2.0),  # the server stopping: at once
    ],
)
async def test_the_header_deadline_cuts_hypercorn_s_own_wait_short(
    header: float, keep_alive: float, wait: str, terminate: bool, at_least: float, before: float
) -> None:
    took = await closed_after(header, keep_alive, wait, terminate)
    assert at_least <= took < before
