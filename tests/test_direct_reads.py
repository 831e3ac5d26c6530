"""A stream's reads handed to the relay inside the upstream socket's callback
(``gateway.upstream.direct_reads``), over real sockets, on both event loops the gateway runs
on (asyncio's and uvloop's) and over TLS: every piece arrives once, in order, as it comes; a
stop, an end, a failure, a timeout and a lost connection each hand the stream back to the
usual read with nothing lost; the connection goes back to the pool as aiohttp left it. And
served: a paced stream read this way is cut at what its account can pay, with everything
relayed before the cut, and billed exactly what the balance lost."""

from __future__ import annotations

import asyncio
import http.client
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest
import uvloop
from aiohttp import web

from bench.fake_upstream import FakeUpstream, Reply
from gateway.server import mends
from gateway.upstream.direct_reads import DIRECT_READS, DirectReads, direct_reads
from tests.plugins.servers import KEYS, make_config, serve_app
from tests.plugins.web_apps import served

END = None  # the server ends the body
DROP = "drop"  # the server drops the connection
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
EACH_LOOP = pytest.mark.parametrize("loop", list(LOOPS))
EACH_TRANSPORT = pytest.mark.parametrize("secure", [False, True], ids=["tcp", "tls"])


class Upstream:
    """A server whose one route streams what the test puts in its queue, piece by piece."""

    def __init__(self) -> None:
        self.pieces: asyncio.Queue[bytes | str | None] = asyncio.Queue()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        while True:
            piece = await self.pieces.get()
            if piece is END:
                await resp.write_eof()
                return resp
            if piece == DROP:
                assert request.transport is not None
                request.transport.abort()
                return resp
            assert isinstance(piece, bytes)
            await resp.write(piece)


@asynccontextmanager
async def serving(server_tls: ssl.SSLContext | None) -> AsyncIterator[tuple[Upstream, str]]:
    upstream = Upstream()
    app = web.Application()
    app.router.add_get("/stream", upstream.handle)
    async with served(app, server_tls) as url:
        try:
            yield upstream, url + "/stream"
        finally:
            upstream.pieces.put_nowait(DROP)  # a handler still waiting for its next piece ends


Scenario = Callable[[Upstream, str, aiohttp.ClientSession], Awaitable[None]]


def run(
    scenario: Scenario,
    loop: str,
    tls: tuple[ssl.SSLContext, ssl.SSLContext] | None,
    read_timeout: float | None = None,
    total: float | None = None,
) -> None:
    async def main() -> None:
        connector = aiohttp.TCPConnector(limit=1, ssl=tls[1] if tls else True)
        timeout = aiohttp.ClientTimeout(total=total, sock_read=read_timeout)
        async with serving(tls[0] if tls else None) as (upstream, url):
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                await asyncio.wait_for(scenario(upstream, url, session), 10)

    assert mends.fits(DIRECT_READS)
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(main())


class Taker:
    """An ``on_read`` that keeps what it is given and says when something came."""

    def __init__(self, stop_after: int = 0, fail: BaseException | None = None) -> None:
        self.reads: list[bytes] = []
        self.came = asyncio.Event()
        self.stop_after = stop_after
        self.fail = fail

    def __call__(self, raw: bytes) -> bool:
        self.reads.append(raw)
        self.came.set()
        if self.fail is not None:
            raise self.fail
        return not (self.stop_after and len(self.reads) >= self.stop_after)

    async def next(self) -> bytes:
        await self.came.wait()
        self.came.clear()
        return self.reads[-1]


async def opened(upstream: Upstream, url: str, session: aiohttp.ClientSession) -> Any:
    upstream.pieces.put_nowait(b"first")
    resp = await session.get(url)
    assert await resp.content.readany() == b"first"  # read the usual way: nothing left
    return resp


def reads_of(resp: Any) -> DirectReads:
    reads = direct_reads(resp)
    assert reads is not None
    return reads


async def relayed(
    upstream: Upstream, url: str, session: aiohttp.ClientSession, on_read: Any
) -> tuple[Any, DirectReads, asyncio.Future[None]]:
    """A stream opened, its first piece read the usual way, then its reads direct."""
    resp = await opened(upstream, url, session)
    reads = reads_of(resp)
    done = reads.relay(on_read)
    assert done is not None
    return resp, reads, done


@EACH_TRANSPORT
@EACH_LOOP
def test_each_read_reaches_on_read_as_it_comes_and_the_end_goes_the_usual_way(
    loop: str, secure: bool, tls: Any
) -> None:
    async def scenario(upstream: Upstream, url: str, session: aiohttp.ClientSession) -> None:
        resp = await opened(upstream, url, session)
        reads, taker = reads_of(resp), Taker()
        assert type(resp.content) is not aiohttp.StreamReader  # the stream's own subclass
        done = reads.relay(taker)
        assert done is not None
        for n in range(20):
            piece = f"data: {n}\n\n".encode()
            upstream.pieces.put_nowait(piece)
            assert await taker.next() == piece  # this one came before the next was sent
        upstream.pieces.put_nowait(END)
        await done
        assert await resp.content.readany() == b""  # the end, read the usual way
        reads.release()
        assert type(resp.content) is aiohttp.StreamReader  # as aiohttp made it
        resp.release()
        # the same connection (the pool holds one) serves the next request as usual
        upstream.pieces.put_nowait(b"again")
        upstream.pieces.put_nowait(END)
        async with session.get(url) as again:
            assert await again.read() == b"again"

    run(scenario, loop, tls if secure else None)


@EACH_LOOP
def test_on_read_stopping_hands_the_next_read_to_the_usual_way_and_may_start_again(
    loop: str,
) -> None:
    async def scenario(upstream: Upstream, url: str, session: aiohttp.ClientSession) -> None:
        taker = Taker(stop_after=2)
        resp, reads, done = await relayed(upstream, url, session, taker)
        upstream.pieces.put_nowait(b"a")
        assert await taker.next() == b"a"
        upstream.pieces.put_nowait(b"b")
        await done  # stopped by on_read at its second read
        upstream.pieces.put_nowait(b"c")
        assert await resp.content.readany() == b"c"
        again = Taker()
        done = reads.relay(again)
        assert done is not None
        upstream.pieces.put_nowait(b"d")
        assert await again.next() == b"d"
        upstream.pieces.put_nowait(END)
        await done
        reads.release()
        assert taker.reads == [b"a", b"b"] and again.reads == [b"d"]
        assert await resp.content.readany() == b""

    run(scenario, loop, None)


@EACH_LOOP
def test_what_on_read_raises_is_raised_to_the_stream(loop: str) -> None:
    async def scenario(upstream: Upstream, url: str, session: aiohttp.ClientSession) -> None:
        failing = Taker(fail=ValueError("bad event"))
        resp, reads, done = await relayed(upstream, url, session, failing)
        upstream.pieces.put_nowait(b"data: garbage\n\n")
        with pytest.raises(ValueError, match="bad event"):
            await done
        reads.release()
        resp.close()

    run(scenario, loop, None)


@EACH_TRANSPORT
@EACH_LOOP
def test_a_lost_connection_ends_the_direct_reads_and_the_usual_read_raises(
    loop: str, secure: bool, tls: Any
) -> None:
    async def scenario(upstream: Upstream, url: str, session: aiohttp.ClientSession) -> None:
        taker = Taker()
        resp, reads, done = await relayed(upstream, url, session, taker)
        upstream.pieces.put_nowait(b"one")
        assert await taker.next() == b"one"
        upstream.pieces.put_nowait(DROP)
        await done
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.content.readany()
        reads.release()
        resp.close()

    run(scenario, loop, tls if secure else None)


@EACH_LOOP
def test_a_read_timeout_ends_the_direct_reads_and_the_usual_read_raises_it(loop: str) -> None:
    async def scenario(upstream: Upstream, url: str, session: aiohttp.ClientSession) -> None:
        taker = Taker()
        resp, reads, done = await relayed(upstream, url, session, taker)
        upstream.pieces.put_nowait(b"one")
        assert await taker.next() == b"one"
        await done  # the upstream says nothing more: the 0.3 s read timeout fires
        with pytest.raises(aiohttp.ServerTimeoutError):
            await resp.content.readany()
        reads.release()
        resp.close()

    run(scenario, loop, None, read_timeout=0.3)


@EACH_LOOP
def test_the_read_timeout_counts_from_the_last_read_and_is_aiohttp_s_again_after(
    loop: str,
) -> None:
    """Pieces 0.1 s apart under a 0.3 s read timeout never time out, read directly; the
    timeout comes 0.3 s after the last one. Stopped by on_read, the usual read has aiohttp's
    timeout again; and a connection back in the pool is not hit by a timer left behind."""

    async def scenario(upstream: Upstream, url: str, session: aiohttp.ClientSession) -> None:
        taker = Taker()
        resp, reads, done = await relayed(upstream, url, session, taker)
        for n in range(6):  # 0.6 s in all: twice the timeout
            await asyncio.sleep(0.1)
            upstream.pieces.put_nowait(b"%d" % n)
            await taker.next()
        last = asyncio.get_running_loop().time()
        await done
        assert 0.25 <= asyncio.get_running_loop().time() - last < 1.0
        with pytest.raises(aiohttp.ServerTimeoutError):
            await resp.content.readany()
        reads.release()
        resp.close()
        upstream.pieces.put_nowait(DROP)  # its handler, still waiting, ends
        await asyncio.sleep(0.05)
        # stopped by on_read: aiohttp's timer runs again for the usual read
        taker = Taker(stop_after=1)
        resp, reads, done = await relayed(upstream, url, session, taker)
        upstream.pieces.put_nowait(b"x")
        await done
        with pytest.raises(aiohttp.ServerTimeoutError):
            await resp.content.readany()
        reads.release()
        resp.close()
        upstream.pieces.put_nowait(DROP)  # its handler, still waiting, ends
        await asyncio.sleep(0.05)
        # ended: the connection goes back to the pool and serves after the timeout's length
        taker = Taker()
        resp, reads, done = await relayed(upstream, url, session, taker)
        upstream.pieces.put_nowait(b"y")
        await taker.next()
        upstream.pieces.put_nowait(END)
        await done
        assert await resp.content.readany() == b""
        reads.release()
        await asyncio.sleep(0.5)
        upstream.pieces.put_nowait(b"after")
        upstream.pieces.put_nowait(END)
        async with session.get(url) as again:
            assert await again.read() == b"after"

    run(scenario, loop, None, read_timeout=0.3)


@EACH_LOOP
def test_the_total_timeout_stops_direct_reads_at_its_deadline(loop: str) -> None:
    """The body's total timeout (1 s from the request) ends a stream whose reads are direct
    at its deadline, though pieces keep coming: what came before it was relayed, the
    awaited end raises the timeout, and nothing after the deadline reaches on_read."""

    async def scenario(upstream: Upstream, url: str, session: aiohttp.ClientSession) -> None:
        clock = asyncio.get_running_loop().time
        began = clock()
        taker = Taker()
        resp, reads, done = await relayed(upstream, url, session, taker)

        async def feed() -> None:
            for n in range(40):  # 2 s of pieces, twice the total timeout
                upstream.pieces.put_nowait(b"%d" % n)
                await asyncio.sleep(0.05)

        feeding = asyncio.ensure_future(feed())
        with pytest.raises(asyncio.TimeoutError):
            await reads.wait(done)
        assert 0.9 <= clock() - began < 1.6
        came = len(taker.reads)
        assert 5 <= came < 40 and taker.reads == [b"%d" % n for n in range(came)]
        await asyncio.sleep(0.2)
        assert len(taker.reads) == came  # nothing more once the deadline passed
        feeding.cancel()
        reads.release()
        resp.close()

    run(scenario, loop, None, total=1.0)


@EACH_LOOP
def test_nothing_starts_while_a_read_would_not_wait(loop: str) -> None:
    async def scenario(upstream: Upstream, url: str, session: aiohttp.ClientSession) -> None:
        resp = await opened(upstream, url, session)
        reads = reads_of(resp)
        upstream.pieces.put_nowait(b"waiting")
        await asyncio.sleep(0.1)  # arrived, not read
        assert reads.relay(Taker()) is None
        assert await resp.content.readany() == b"waiting"
        upstream.pieces.put_nowait(END)
        await asyncio.sleep(0.1)
        assert reads.relay(Taker()) is None  # the end arrived
        reads.release()
        assert await resp.content.readany() == b""

    run(scenario, loop, None)


POOR = "sk-poor-0000000000000042"


def paced(words: str, chunks: int, delay_ms: int) -> dict[str, Any]:
    """A streamed chat request for the fake upstream's ``words``, in ``chunks`` pieces
    ``delay_ms`` apart."""
    content = f"[[fake text='{words}' chunks={chunks} delay_ms={delay_ms}]]"
    return {"model": "chat-small", "stream": True,
            "messages": [{"role": "user", "content": content}]}  # fmt: skip


def events_of(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")
    )


async def test_a_paced_stream_read_directly_is_cut_at_the_balance_and_billed_its_drop(
    fake: FakeUpstream, store_url: str
) -> None:
    """A hundred words, a chunk each, 5 ms apart, on a balance of 0.0001 (what 50 output
    tokens cost, at 2 micro-units each): the words before the cut reach the client, then the
    402 inside the stream; the record's cost is what the balance lost."""
    from gateway.config import parse_settings

    cfg = make_config(fake.url, store_url)
    cfg["accounts"].append({"id": "poor", "balance": 0.0001})
    cfg["keys"].append({"id": "k-poor", "key": POOR, "account": "poor", "group": "default"})
    body = paced(" ".join(f"w{i}" for i in range(100)), 100, 5)
    async with serve_app(parse_settings(cfg)) as gw:
        before = await gw.state.store.get_account("poor")
        async with aiohttp.ClientSession() as s:
            async with s.post(
                gw.v1 + "/chat/completions", json=body, headers={"Authorization": f"Bearer {POOR}"}
            ) as r:
                assert r.status == 200
                raw = await r.read()
        events = events_of(raw)
        assert "error" in events[-1] and b"[DONE]" not in raw
        said = text_of(events).split()
        assert 40 <= len(said) <= 52 and said == [f"w{i}" for i in range(len(said))]
        await gw.state.writer.flush()
        [record] = await gw.state.store.usage("poor", 10)
        after = await gw.state.store.get_account("poor")
        assert before is not None and after is not None
        assert record.status == 402
        # billed no output the client did not get (the read that passed the limit included),
        # and the balance lost exactly the record's cost
        assert record.completion_tokens <= len(said) <= record.completion_tokens + 2
        assert record.cost == before.balance - after.balance


async def test_a_channel_s_total_timeout_ends_a_paced_stream_read_directly(
    fake: FakeUpstream, store_url: str
) -> None:
    """A channel whose own total timeout (0.8 s) is shorter than its paced stream (40 words
    50 ms apart): the words before the deadline reach the client, then the timeout's error
    inside the stream (no traceback, no cut connection); the record says 504."""
    from gateway.config import parse_settings

    cfg = make_config(fake.url, store_url)
    cfg["channels"][0]["timeouts"] = {"total": 0.8}
    body = paced(" ".join(f"w{i}" for i in range(40)), 40, 50)
    async with serve_app(parse_settings(cfg)) as gw:
        async with aiohttp.ClientSession() as s:
            auth = {"Authorization": f"Bearer {KEYS['alice']}"}
            async with s.post(gw.v1 + "/chat/completions", json=body, headers=auth) as r:
                assert r.status == 200
                raw = await r.read()
        events = events_of(raw)
        said = text_of(events).split()
        assert events[-1]["error"]["type"] and b"[DONE]" not in raw
        assert 5 <= len(said) < 40 and said == [f"w{i}" for i in range(len(said))]
        await gw.state.writer.flush()
        [record] = await gw.state.store.usage("alice", 10)
        assert record.status == 504


def _stalling_read(port: int, body: bytes, stall: float, during: Callable[[], None]) -> bytes:
    """A stream read over a socket with a small receive buffer by a client that stalls after
    its first kilobyte, so the gateway's sends to it fill its transport and wait (``during``
    is called two thirds into the stall): the body, its chunked encoding undone (by
    http.client)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.sock = sock
    try:
        headers = {"Authorization": f"Bearer {KEYS['alice']}", "Content-Type": "application/json"}
        conn.request("POST", "/v1/chat/completions", body, headers)
        resp = conn.getresponse()
        assert resp.status == 200
        first = resp.read(1024)
        time.sleep(stall * 2 / 3)
        during()
        time.sleep(stall / 3)
        return first + resp.read()
    finally:
        conn.close()


def _said(raw: bytes) -> str:
    events = events_of(raw)
    assert not any("error" in e for e in events) and raw.rstrip().endswith(b"data: [DONE]")
    return text_of(events)


async def test_paced_streams_read_directly_arrive_whole_and_in_order_beside_a_stalled_client(
    fake: FakeUpstream, store_url: str
) -> None:
    """Six paced streams at once, their reads direct and their sends made together at the
    end of each turn of the loop: one of 25 MB (far more than the sockets hold), 60 pieces
    5 ms apart, to a client that stops reading for 1.5 s (and until the small ones ended):
    the gateway's sends to it wait, its stream goes on the usual way and stops reading the
    upstream, which is still writing a second into the stall (none of it drained into the
    gateway's memory); and five small ones. Each arrives whole, in order, and is billed."""
    from gateway.config import parse_settings

    big = "".join(f"w{i} " for i in range(3_200_000))
    fake.queue(Reply(text=big, chunks=60, delay_ms=5, completion_tokens=60))
    small = {n: " ".join(f"s{n}w{i}" for i in range(30)) for n in range(5)}

    def request(text: str | None) -> bytes:
        if text is None:  # the queued reply's
            return orjson.dumps({"model": "chat-small", "stream": True,
                                 "messages": [{"role": "user", "content": "big"}]})  # fmt: skip
        return orjson.dumps(paced(text, 30, 10))

    async with serve_app(parse_settings(make_config(fake.url, store_url))) as gw:
        port = int(gw.v1.rsplit(":", 1)[1].split("/")[0])
        held: list[int] = []
        smalls_done = threading.Event()

        def during() -> None:  # in the stall: once the small ones ended, however loaded
            smalls_done.wait(30)  # the machine (their end is not a matter of time here)
            held.append(fake.open_streams)

        stalled = asyncio.ensure_future(
            asyncio.to_thread(_stalling_read, port, request(None), 1.5, during)
        )
        while not fake.requests:  # the big one took the queued reply
            await asyncio.sleep(0.01)
        async with aiohttp.ClientSession() as s:

            async def said(text: str) -> str:
                headers = {"Authorization": f"Bearer {KEYS['alice']}"}
                async with s.post(gw.v1 + "/chat/completions", data=request(text),
                                  headers=headers) as r:  # fmt: skip
                    assert r.status == 200
                    return _said(await r.read())

            got = await asyncio.gather(*(said(text) for text in small.values()))
            smalls_done.set()
        assert got == list(small.values())
        assert _said(await stalled) == big
        assert held == [1]  # the big one's upstream, held back by the stalled client
        await gw.state.writer.flush()
        records = await gw.state.store.usage("alice", 10)
        assert len(records) == 6 and all(r.status == 200 for r in records)
