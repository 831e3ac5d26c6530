"""ASGI plumbing of the relay: reading the body, headers, JSON replies, errors, disconnects.

Plain functions over ``scope, receive, send``, kept apart from the relay's logic so both stay
readable; nothing here knows about keys, channels or money.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import deque

import orjson

from gateway.edge.interrupt import BODY_LATE, CLIENT_GONE, Interrupt
from gateway.errors import (
    GatewayError,
    InvalidRequestError,
    MethodNotAllowedError,
    PayloadTooLargeError,
    RequestTimeoutError,
)
from gateway.protocols.base import ClientSide
from gateway.types import JSON, Message, Receive, Scope, Send

JSON_HEADERS = [(b"content-type", b"application/json")]
# the scope key under which a request served outside the relay (admin, dashboard) carries its
# request id, for its log lines (set by ``app.GatewayApp``)
REQUEST_ID = "gateway.request_id"
CLIENT_HEADERS_FORWARDED = (b"anthropic-version", b"anthropic-beta")
# the headers that name a session (``policy/affinity.session_of`` reads them in its order)
SESSION_HEADERS = (b"x-session-id", b"x-claude-code-session-id", b"session_id")
RELAY_HEADERS = frozenset(
    {
        b"x-request-id",
        b"authorization",
        b"x-api-key",
        b"x-goog-api-key",
        b"content-length",
        b"x-forwarded-for",
        b"forwarded",
        *CLIENT_HEADERS_FORWARDED,
        *SESSION_HEADERS,
    }
)
# read as one list however many lines carry them: a proxy appends a line of its own after the
# client's (HAProxy's ``option forwardfor``), and the address the gateway may believe is in it
FORWARDING = frozenset({b"x-forwarded-for", b"forwarded"})
Headers = dict[bytes, bytes]
WATCH_TICK = 0.05  # seconds between looks at the requests in flight (see Watchlist)
# bytes a second a body that takes longer than the body timeout must have kept up on average
BODY_MIN_RATE = 16 * 1024


class ClientGone(Exception):
    """The client disconnected; the stream loop was cancelled on purpose."""


def request_headers(scope: Scope) -> Headers:
    """The headers the relay reads (``RELAY_HEADERS``), in one pass; the first of a repeated
    name, but X-Forwarded-For and Forwarded, whose lines are joined in order (commas between,
    as one line would list them). When there is no X-Forwarded-For, the ``for=`` nodes of
    Forwarded (RFC 7239) stand in its place, in its form (``forwarded_for``).

    One pass matters: a server may hand ``scope["headers"]`` as a sequence whose iteration
    runs in Python (hypercorn's h11 headers), several microseconds a loop. A request with one
    or none of these headers pays nothing more than a dict lookup for them."""
    found: Headers = {}
    for name, value in scope["headers"]:
        if name in RELAY_HEADERS:
            if name not in found:
                found[name] = value
            elif name in FORWARDING:
                found[name] += b", " + value
    if b"forwarded" in found and b"x-forwarded-for" not in found:
        found[b"x-forwarded-for"] = forwarded_for(found[b"forwarded"])
    return found


def forwarded_for(value: bytes) -> bytes:
    """The ``for=`` node of each element of a Forwarded value, as X-Forwarded-For lists
    addresses: quotes, IPv6 brackets and ports dropped; an element without one, or with an
    obfuscated one (``_hidden``, ``unknown``), as ``unknown`` (never believed a proxy)."""
    hops: list[bytes] = []
    for element in value.split(b","):
        node = b"unknown"
        for pair in element.split(b";"):
            name, sep, given = pair.partition(b"=")
            if sep and name.strip().lower() == b"for":
                node = _node(given.strip().strip(b'"'))
        hops.append(node)
    return b", ".join(hops)


def _node(node: bytes) -> bytes:
    if node.startswith(b"["):  # "[2001:db8::1]:4711"
        return node[1 : node.find(b"]")] if b"]" in node else b"unknown"
    if node.count(b":") == 1:  # "192.0.2.43:47011"
        node = node.partition(b":")[0]
    return node or b"unknown"


def forwarded_headers(headers: Headers) -> dict[str, str]:
    """The client's headers passed on to the upstream (Anthropic's version and betas)."""
    if headers.keys().isdisjoint(CLIENT_HEADERS_FORWARDED):
        return {}  # most requests: no comprehension to run
    return {
        k.decode(): headers[k].decode("latin-1") for k in CLIENT_HEADERS_FORWARDED if k in headers
    }


async def read_body(
    receive: Receive, limit: int, declared: bytes | None, reading: BodyRead | None = None
) -> bytes:
    """The whole request body; 413 past ``limit`` (checked against Content-Length first).
    ``reading`` (``BodyDeadlines.begin``) is told of what arrived; when it runs out of time it
    interrupts the request (``BODY_LATE``: 408)."""
    if declared is not None:
        try:
            if int(declared) > limit:
                raise PayloadTooLargeError(f"The request body is larger than {limit} bytes.")
        except ValueError:
            raise InvalidRequestError("bad Content-Length") from None
    chunks: list[bytes] = []
    size = 0
    try:
        message = await receive()
        if not message.get("more_body", False) and message["type"] == "http.request":
            body: bytes = message.get("body", b"")  # the whole body at once: most requests
            if len(body) > limit:
                raise PayloadTooLargeError(f"The request body is larger than {limit} bytes.")
            return body
        while True:
            if message["type"] == "http.disconnect":
                raise ClientGone()
            body = message.get("body", b"")
            if body:
                size += len(body)
                if size > limit:
                    raise PayloadTooLargeError(f"The request body is larger than {limit} bytes.")
                chunks.append(body)
                if reading is not None:
                    reading.received = size
            if not message.get("more_body", False):
                break
            message = await receive()
    finally:
        if reading is not None:
            reading.finish()
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def too_slow() -> RequestTimeoutError:
    return RequestTimeoutError("The request body did not arrive in time.")


class BodyRead:
    """One request's body being read, as ``BodyDeadlines`` watches it."""

    __slots__ = ("interrupt", "started", "received", "done")

    def __init__(self, interrupt: Interrupt, started: float) -> None:
        self.interrupt: Interrupt | None = interrupt
        self.started = started
        self.received = 0
        self.done = False

    def finish(self) -> None:
        """The body is read (or will never be): nothing to watch, nothing to interrupt."""
        self.done = True
        self.interrupt = None

    def expire(self) -> None:
        if self.interrupt is not None:
            self.interrupt.fire(BODY_LATE)


class BodyDeadlines:
    """Request bodies that arrive too slowly get 408 (slow-drip and lying-Content-Length
    clients hold a connection and a task otherwise). A body has ``timeout`` seconds, plus a
    second for every ``min_rate`` bytes it has sent, so a large upload at a real speed is never
    cut. One timer looks at the bodies being read every ``WATCH_TICK`` seconds while there are
    any (as ``Watchlist`` does), instead of a timer per request."""

    __slots__ = ("timeout", "min_rate", "_fresh", "_slow", "_timer", "_loop", "_seq")

    def __init__(self, timeout: float, min_rate: float = BODY_MIN_RATE) -> None:
        self.timeout = timeout
        self.min_rate = min_rate
        # every body's first deadline is its start + timeout: in the order they began
        self._fresh: deque[tuple[float, BodyRead]] = deque()
        # the bodies still arriving at their first deadline, by their later ones
        self._slow: list[tuple[float, int, BodyRead]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._seq = 0

    def begin(self, interrupt: Interrupt) -> BodyRead | None:
        """Watch a request's body, interrupting it when late (None: no timeout configured)."""
        if self.timeout <= 0:
            return None
        now = time.monotonic()
        reading = BodyRead(interrupt, now)
        self._fresh.append((now + self.timeout, reading))
        loop = asyncio.get_running_loop()
        if self._timer is None or self._loop is not loop:
            self._loop = loop
            self._timer = loop.call_later(WATCH_TICK, self._sweep)
        return reading

    def _check(self, reading: BodyRead, now: float) -> None:
        allowed = reading.started + self.timeout + reading.received / self.min_rate
        if allowed <= now:
            reading.expire()
        else:
            self._seq += 1
            heapq.heappush(self._slow, (allowed, self._seq, reading))

    def _sweep(self) -> None:
        self._timer = None
        now = time.monotonic()
        fresh, slow = self._fresh, self._slow
        while fresh and fresh[0][0] <= now:
            reading = fresh.popleft()[1]
            if not reading.done:
                self._check(reading, now)
        while slow and slow[0][0] <= now:
            reading = heapq.heappop(slow)[2]
            if not reading.done:
                self._check(reading, now)
        if (fresh or slow) and self._loop is not None:
            self._timer = self._loop.call_later(WATCH_TICK, self._sweep)


def parse_json(raw: bytes) -> JSON:
    if not raw:
        raise InvalidRequestError("The request body is empty; a JSON object was expected.")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"The request body is not valid JSON: {exc.msg}.") from None


class DisconnectWatch:
    """Interrupts a request (``CLIENT_GONE``) when its client disconnects (ASGI 2.1 only
    reports that on ``receive``), once started: by ``Watchlist``, after a delay, so that quick
    calls never pay for a watching task. The watching task runs ``receive()`` itself, and what
    it brings is looked at in a done callback: no coroutine of the watch's own stays alive
    beside it for as long as the request lasts."""

    __slots__ = ("_receive", "_interrupt", "_watcher")

    def __init__(self, receive: Receive, interrupt: Interrupt) -> None:
        self._receive: Receive | None = receive
        self._interrupt: Interrupt | None = interrupt
        self._watcher: asyncio.Future[Message] | None = None

    def start(self) -> None:
        """Start watching, unless stopped already."""
        if self._interrupt is not None and self._watcher is None:
            self._listen()

    def _listen(self) -> None:
        receive = self._receive
        assert receive is not None
        self._watcher = watcher = asyncio.ensure_future(receive())
        watcher.add_done_callback(self._heard)

    def _heard(self, watcher: asyncio.Future[Message]) -> None:
        if watcher is not self._watcher or watcher.cancelled():
            return  # stopped
        message = watcher.result()  # a receive that raised: the loop logs it, as it did
        if message["type"] != "http.disconnect":
            self._listen()  # anything else (the rest of a body no one read): listen on
        elif self._interrupt is not None:
            self._interrupt.fire(CLIENT_GONE)

    def stop(self) -> None:
        """Stop watching, or never start. The references are dropped too: a cancelled watcher
        keeps its CancelledError, whose traceback holds the watcher's frame and so this
        object; left pointing back at the request, that cycle outlives the request until a
        full collection, and full collections of a large heap stalled the event loop."""
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        self._interrupt = None
        self._receive = None


class Watchlist:
    """Starts the disconnect watch of each request that has lasted its delay. One timer looks
    at the requests in flight every ``WATCH_TICK`` seconds while there are any, instead of a
    timer per request, set and then cancelled (which costs far more). A watch starts
    between its delay and a tick later; the watches of one delay end in the order they began."""

    __slots__ = ("_queues", "_timer", "_loop")

    def __init__(self) -> None:
        self._queues: dict[float, deque[tuple[float, DisconnectWatch]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self, receive: Receive, delay: float, interrupt: Interrupt) -> DisconnectWatch:
        """A watch of a request, started after ``delay`` seconds (``<= 0``: at once)."""
        watch = DisconnectWatch(receive, interrupt)
        if delay <= 0:
            watch.start()
            return watch
        queue = self._queues.get(delay)
        if queue is None:
            queue = self._queues[delay] = deque()
        queue.append((time.monotonic() + delay, watch))
        loop = asyncio.get_running_loop()
        if self._timer is None or self._loop is not loop:
            self._loop = loop
            self._timer = loop.call_later(WATCH_TICK, self._sweep)
        return watch

    def _sweep(self) -> None:
        self._timer = None
        now = time.monotonic()
        waiting = False
        for queue in self._queues.values():
            while queue and queue[0][0] <= now:
                queue.popleft()[1].start()  # a stopped watch does not start
            waiting = waiting or bool(queue)
        if waiting and self._loop is not None:
            self._timer = self._loop.call_later(WATCH_TICK, self._sweep)


async def send_json(
    send: Send, status: int, payload: JSON, extra: list[tuple[bytes, bytes]] | None = None
) -> None:  # noqa: E501
    body = orjson.dumps(payload)
    headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(
    send: Send,
    client: ClientSide,
    err: GatewayError,
    request_id: str | None = None,
    close: bool = False,
) -> None:
    """The error in the client's protocol, with ``Retry-After``, ``Allow`` and
    ``x-request-id`` where they apply; ``close``: the request's body was not read, so the
    connection ends with the reply (``Connection: close``) rather than read what is left."""
    status, body = client.encode_error(err)
    extra = []
    if err.retry_after is not None:
        extra.append((b"retry-after", str(int(err.retry_after + 0.999)).encode()))
    elif isinstance(err, MethodNotAllowedError):
        extra.append((b"allow", ", ".join(err.allow).encode()))
    if request_id is not None:
        extra.append((b"x-request-id", request_id.encode()))
    if close:
        extra.append((b"connection", b"close"))
    await send_json(send, status, body, extra)
