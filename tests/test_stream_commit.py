"""An upstream that withholds its status line: a stream's client is not left with nothing.
After ``upstream.stream_commit_seconds`` the stream is committed (headers and its protocol's
keep-alive), and whatever the upstream does later arrives inside it: its stream, or its
failure in the client's protocol, with no other channel tried (in process)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.edge.interrupt import Interrupt
from gateway.relay.stream import KeepAlive, send_last
from tests.plugins.inprocess import InProcess, Scripted, running
from tests.test_pipeline import CHAT
from tests.test_upstream_faults import MESSAGES, openai_stream, with_second

FAST = {"stream_commit_seconds": 0.05, "stream_keepalive_seconds": 0.05}
STARTED_WITHIN = 10.0  # seconds: a guard for a busy machine, not a measure


async def started(seen: list[Any], task: asyncio.Task[Any]) -> dict[str, Any]:
    """The response's start, once the app has sent it (while the upstream still withholds
    its status); fails if the request ended, or nothing started in ``STARTED_WITHIN``."""
    async with asyncio.timeout(STARTED_WITHIN):
        while not any(m["type"] == "http.response.start" for m in seen):
            assert not task.done(), "the request ended before its response started"
            await asyncio.sleep(0.01)
        while not any(m["type"] == "http.response.body" for m in seen):
            await asyncio.sleep(0.01)  # and its first keep-alive
    return next(m for m in seen if m["type"] == "http.response.start")


@pytest.fixture
async def app(store_url: str) -> Any:
    async with running(store_url, upstream=FAST, channels=with_second(store_url)) as running_app:
        yield running_app


async def test_a_stream_is_committed_while_the_upstream_withholds_its_status(
    app: InProcess,
) -> None:
    hold = asyncio.Event()
    withheld = openai_stream("late but fine")
    withheld.hold = hold
    app.upstream.answer("oa", withheld)
    seen: list[Any] = []
    task = asyncio.create_task(
        app.post("/v1/chat/completions", {**CHAT, "stream": True}, seen=seen)
    )
    start = await started(seen, task)
    assert start["status"] == 200
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"text/event-stream"
    assert headers[b"x-request-id"]
    hold.set()  # the upstream answers at last
    reply = await task
    assert reply.status == 200
    assert reply.body.startswith(b": keep-alive\n\n")
    assert b"late but fine" in reply.body and reply.body.endswith(b"data: [DONE]\n\n")
    assert sum(m["type"] == "http.response.start" for m in seen) == 1
    await app.settled()
    [record] = await app.services.store.usage("alice", 10)
    assert (record.status, record.channel, record.completion_tokens) == (200, "oa", 3)


@pytest.mark.parametrize(
    ("path", "body", "channel", "keepalive", "error"),
    [
        ("/v1/chat/completions", {**CHAT, "stream": True}, "oa", b": keep-alive\n\n",
         b'data: {"error":'),
        ("/v1/messages", {**MESSAGES, "stream": True}, "an",
         b'event: ping\ndata: {"type": "ping"}\n\n', b"event: error\n"),
    ],
    ids=["openai", "anthropic"],
)  # fmt: skip
async def test_a_committed_stream_gets_its_upstream_s_later_failure_inside_it(
    app: InProcess,
    path: str,
    body: dict[str, Any],
    channel: str,
    keepalive: bytes,
    error: bytes,
) -> None:
    """Committed, the stream cannot go to the healthy channel behind: the upstream's 500,
    when it comes, is sent in the stream in the client's protocol, billed nothing."""
    hold = asyncio.Event()
    failing = Scripted.json({"error": {"message": "it broke", "type": "server_error"}}, 500)
    failing.hold = hold
    app.upstream.answer(channel, failing)
    seen: list[Any] = []
    headers = {"anthropic-version": "2023-06-01"}
    task = asyncio.create_task(app.post(path, body, seen=seen, **headers))
    await started(seen, task)
    hold.set()
    reply = await task
    assert reply.status == 200  # committed before the upstream said 500
    assert reply.body.startswith(keepalive)
    assert error in reply.body
    assert len(app.upstream.sent) == 1  # no other channel was tried
    await app.settled()
    [record] = await app.services.store.usage("alice", 10)
    assert (record.status, record.cost) == (502, 0)


async def test_a_quick_failure_still_fails_over_before_the_commit(store_url: str) -> None:
    """Before the commit nothing has reached the client: a channel that fails at once is
    left for the next, as without a commit."""
    slow = {"stream_commit_seconds": 30.0}
    async with running(store_url, upstream=slow, channels=with_second(store_url)) as app:
        app.upstream.answer("oa", Scripted.json({"error": {"message": "no"}}, 500))
        app.upstream.answer("ob", openai_stream("from the second"))
        reply = await app.post("/v1/chat/completions", {**CHAT, "stream": True})
        assert b"from the second" in reply.body
        assert not reply.body.startswith(b": keep-alive")


async def test_a_commit_under_way_still_starts_the_response_before_the_last_bytes() -> None:
    """The timer commits a stream (its task not run yet) as its attempt fails: the failure's
    last bytes wait for the commit's start; no keep-alive goes between them."""
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    keepalive = KeepAlive(15.0, 0.01)
    call = SimpleNamespace(responded=False, reply_id="rid-1")
    quiet = keepalive.open(send, b": keep-alive\n\n", Interrupt(None), call)
    assert quiet is not None
    quiet.exchange = SimpleNamespace(stream=lambda headers: SimpleNamespace(content_type="x/y"))
    quiet.opening = True
    quiet.began -= 1.0  # the client has waited past the commit
    keepalive._tick()
    assert quiet.started and call.responded  # the request knows at once
    await send_last(send, quiet, b"the error")
    keepalive.close(quiet)
    assert [(m["type"], m.get("more_body")) for m in sent] == [
        ("http.response.start", None),
        ("http.response.body", False),
    ]
    assert (b"x-request-id", b"rid-1") in sent[0]["headers"]
