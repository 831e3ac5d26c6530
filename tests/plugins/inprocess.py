"""The pipeline in process: the app as ``create_app()`` builds it, driven through ASGI by hand
(no server, no socket), its upstream a scripted pool (``ScriptedUpstream``) that records each
call and answers what the test scripted, whole or as a stream of chunks.

``inproc`` is the app on the store of ``store_url`` (both backends), with its lifespan
running; ``inproc.post(path, json)`` returns the ``Reply`` a client would get. Use it for the
pipeline's logic (admission, failover, billing, conversion, errors); keep the served
gateway (``tests/plugins/servers.py``) for what needs a real server or client.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from gateway.app import GatewayApp, Services, create_app
from gateway.config import ChannelTimeouts, parse_settings
from gateway.errors import GatewayError
from gateway.protocols.base import UpstreamCall
from tests.plugins.servers import ADMIN_TOKEN, JOURNALS, KEYS, make_config

__all__ = ["ADMIN_TOKEN", "KEYS", "InProcess", "Reply", "Scripted", "ScriptedUpstream"]

# the base URLs the test config gives each channel: a call is answered by its host's script
HOSTS = {
    "oa": "http://oa.test",
    "ob": "http://ob.test",
    "an": "http://an.test",
    "ab": "http://ab.test",
    "gm": "http://gm.test",
    "gb": "http://gb.test",
    # the clouds' channels, and Google's token endpoint (a service account's token_uri)
    "az": "http://az.test",
    "bed": "http://bed.test",
    "bed2": "http://bed2.test",
    "vx": "http://vx.test",
    "token": "http://token.test",
}


@dataclass
class Scripted:
    """One scripted upstream answer: a whole body, or ``chunks`` streamed one per read; or
    ``fail`` raised when the call is sent (the upstream unreachable); ``cut`` raised by the
    read after the last chunk (the connection lost, or silent past its idle timeout, as the
    pool reports them: ``upstream.pool.read_error``); ``hold``: the status line is withheld
    until the test sets it."""

    status: int = 200
    body: bytes = b""
    chunks: list[bytes] | None = None
    headers: dict[str, str] = field(default_factory=lambda: {"content-type": "application/json"})
    fail: GatewayError | None = None
    cut: GatewayError | None = None
    hold: asyncio.Event | None = None

    @classmethod
    def json(cls, payload: Any, status: int = 200, **headers: str) -> Scripted:
        return cls(
            status, orjson.dumps(payload), headers={"content-type": "application/json", **headers}
        )

    @classmethod
    def sse(cls, events: Iterable[Any], done: bool = True, named: bool = False) -> Scripted:
        """A server-sent-event stream, one chunk per event (``[DONE]`` last when ``done``;
        ``named``: each with an ``event:`` line of its ``type``, as Anthropic sends them)."""
        chunks = [
            (f"event: {e['type']}\n".encode() if named else b"")
            + b"data: "
            + orjson.dumps(e)
            + b"\n\n"
            for e in events
        ]
        if done:
            chunks.append(b"data: [DONE]\n\n")
        return cls(chunks=chunks, headers={"content-type": "text/event-stream"})


class ScriptedReply:
    """An ``UpstreamReply`` over a script."""

    def __init__(self, scripted: Scripted) -> None:
        self.status = scripted.status
        self.headers: Mapping[str, str] = scripted.headers
        self._chunks = deque(scripted.chunks if scripted.chunks is not None else [scripted.body])
        self._cut = scripted.cut
        self.closed = False

    async def read(self) -> bytes:
        body = b"".join(self._chunks)
        self._chunks.clear()
        return body

    async def chunk(self) -> bytes:
        await asyncio.sleep(0)  # a read is an await, as on a socket
        if self._chunks:
            return self._chunks.popleft()
        if self._cut is not None:
            raise self._cut
        return b""

    def at_eof(self) -> bool:
        return not self._chunks and self._cut is None

    def direct(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True


@dataclass
class Sent:
    """One upstream call as the gateway sent it."""

    url: str
    headers: dict[str, str]
    body: Any  # the decoded JSON body (a form's bytes as they are)
    raw: bytes = b""  # the body as sent


class ScriptedUpstream:
    """An ``UpstreamPool`` that answers each call from its host's queue of scripts."""

    def __init__(self) -> None:
        self.scripts: dict[str, deque[Scripted]] = {}
        self.sent: list[Sent] = []
        self.replies: list[ScriptedReply] = []

    def answer(self, channel: str, *scripts: Scripted) -> None:
        self.scripts.setdefault(HOSTS[channel], deque()).extend(scripts)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def request(
        self,
        call: UpstreamCall,
        upload: AsyncIterable[bytes] | None = None,
        timeouts: ChannelTimeouts | None = None,
    ) -> ScriptedReply:
        try:
            body = orjson.loads(call.body)
        except orjson.JSONDecodeError:
            body = bytes(call.body)  # a form (a token request)
        self.sent.append(Sent(call.url, dict(call.headers), body, bytes(call.body)))
        host = next((h for h in self.scripts if call.url.startswith(h)), None)
        if host is None or not self.scripts[host]:
            raise AssertionError(f"no scripted answer for {call.url}")
        scripted = self.scripts[host].popleft()
        if scripted.hold is not None:
            await scripted.hold.wait()
        if scripted.fail is not None:
            raise scripted.fail
        reply = ScriptedReply(scripted)
        self.replies.append(reply)
        return reply


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


async def drive(
    app: GatewayApp,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    seen: list[Any] | None = None,
) -> Reply:
    """One request through the app's ASGI interface, as a server would hand it over;
    ``seen``: each message the app sends is appended there as it is sent."""
    path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.1"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
    }
    sent_body = False
    started: dict[str, Any] = {}
    parts: list[bytes] = []
    finished = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()  # the client stays until the response ended
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        if seen is not None:
            seen.append(message)
        if message["type"] == "http.response.start":
            started.update(message)
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                finished.set()

    await app(scope, receive, send)
    finished.set()
    found = {k.decode().lower(): v.decode() for k, v in started.get("headers", [])}
    return Reply(started.get("status", 0), found, b"".join(parts))


@dataclass
class InProcess:
    app: GatewayApp
    upstream: ScriptedUpstream

    @property
    def services(self) -> Services:
        return self.app.state.gateway  # type: ignore[no-any-return]

    async def post(
        self,
        path: str,
        payload: Any,
        key: str = KEYS["alice"],
        seen: list[Any] | None = None,
        **headers: str,
    ) -> Reply:
        """``seen``: the app's ASGI messages, appended as they are sent (``drive``)."""
        sent = {"content-type": "application/json", "authorization": f"Bearer {key}", **headers}
        return await drive(self.app, "POST", path, orjson.dumps(payload), sent, seen)

    async def get(self, path: str, **headers: str) -> Reply:
        return await drive(self.app, "GET", path, b"", headers)

    async def settled(self) -> None:
        """Every record handed to the writer is in the store."""
        await self.services.writer.flush()


def inprocess_config(store_url: str, **overrides: Any) -> dict[str, Any]:
    cfg = make_config("http://unused.test", store_url, **overrides)
    cfg["journal"] = tempfile.mkdtemp(dir=JOURNALS.name)
    for channel in cfg["channels"]:
        base = HOSTS.get(channel["name"], "http://oa.test")
        channel["base_url"] = base + "/v1" if channel["type"] == "openai" else base
    return cfg


@contextlib.asynccontextmanager
async def running(store_url: str, **overrides: Any) -> AsyncIterator[InProcess]:
    """The app with its lifespan running (store open, caches filled), until the block ends."""
    upstream = ScriptedUpstream()
    app = create_app(parse_settings(inprocess_config(store_url, **overrides)), upstream=upstream)
    async with app.inner.router.lifespan_context(app.inner):
        yield InProcess(app, upstream)


@pytest.fixture
async def inproc(store_url: str) -> AsyncIterator[InProcess]:
    async with running(store_url) as running_app:
        yield running_app
