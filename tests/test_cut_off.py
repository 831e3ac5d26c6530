"""A stream cut off mid-way costs what was generated (CONTRACT §6): the prompt (the upstream's
count, else the local estimate) and the completion so far (counted from what passed, else
estimated), in every client x channel pair; the record says 499."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from bench.fake_upstream import FakeUpstream
from gateway.store import UsageRecord
from gateway.store.backends import open_store
from tests.plugins.embedded import SERVER
from tests.plugins.servers import KEYS, ServedGateway
from tests.test_sdk_matrix import TARGETS, Target

WORDS = 40
# 40 words in 40 chunks, 100 ms apart: the client reads a few and hangs up
SLOW = f"[[fake text='{' '.join(f'word{i}' for i in range(WORDS))}' chunks={WORDS} delay_ms=100]]"
CLIENTS = ("openai", "anthropic", "gemini")


HEADERS = {"Authorization": f"Bearer {KEYS['alice']}", "anthropic-version": "2023-06-01"}


def request(client: str, target: Target, text: str = SLOW) -> tuple[str, dict[str, Any]]:
    message = {"role": "user", "content": text}
    if client == "openai":
        return "/v1/chat/completions", {
            "model": target.model,
            "stream": True,
            "messages": [message],
        }
    if client == "anthropic":
        body = {"model": target.model, "stream": True, "max_tokens": 500, "messages": [message]}
        return "/v1/messages", body
    path = f"/v1beta/models/{target.model}:streamGenerateContent?alt=sse"
    return path, {"contents": [{"role": "user", "parts": [{"text": text}]}]}


@pytest.mark.parametrize("target", TARGETS, ids=[t.type for t in TARGETS])
@pytest.mark.parametrize("client", CLIENTS)
async def test_a_stream_cut_off_bills_the_prompt_and_what_was_generated(
    gateway: ServedGateway, fake: FakeUpstream, client: str, target: Target
) -> None:
    path, body = request(client, target)
    headers = {"Authorization": f"Bearer {KEYS['alice']}", "anthropic-version": "2023-06-01"}
    received = b""
    async with aiohttp.ClientSession() as s:
        async with s.post(gateway.url + path, json=body, headers=headers) as r:
            assert r.status == 200
            async for piece in r.content.iter_any():
                received += piece
                if received.count(b"word") >= 10:
                    break  # hang up with most of the stream still to come
    assert await fake.wait_disconnect(timeout=5.0)
    state = gateway.state

    async def cut_record() -> Any:
        await state.writer.flush()
        records = await state.store.usage("alice", 1)
        return records[0] if records and records[0].status == 499 else None

    rec = None
    for _ in range(100):  # the gateway notices the client leaving within a watch tick
        rec = await cut_record()
        if rec is not None:
            break
        await asyncio_sleep(0.05)
    assert rec is not None, "no 499 record"
    assert rec.channel == target.channel
    assert rec.prompt_tokens > 0
    # ten words or so reached the client; the estimate may be off, but never nothing, and
    # never the forty words the upstream would have sent had it been left to finish
    assert 5 <= rec.completion_tokens < WORDS * 3
    assert rec.cost == rec.prompt_tokens * 1 + rec.completion_tokens * 2


async def asyncio_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


def assert_billed_for_part(rec: UsageRecord, target: Target, status: int) -> None:
    assert (rec.channel, rec.status) == (target.channel, status)
    assert rec.prompt_tokens > 0
    assert 5 <= rec.completion_tokens < WORDS * 3
    assert rec.cost == rec.prompt_tokens * 1 + rec.completion_tokens * 2


@pytest.mark.parametrize("target", TARGETS, ids=[t.type for t in TARGETS])
@pytest.mark.parametrize("client", CLIENTS)
async def test_a_stream_whose_upstream_dies_bills_what_was_generated(
    gateway: ServedGateway, client: str, target: Target
) -> None:
    """The upstream closes the connection after ten of forty words: the client gets the ten
    and an error in the stream; the record bills them, with the error's status."""
    dying = SLOW.replace("delay_ms=100", "delay_ms=1 drop_after=10")
    path, body = request(client, target, dying)
    async with aiohttp.ClientSession() as s:
        async with s.post(gateway.url + path, json=body, headers=HEADERS) as r:
            assert r.status == 200
            received = await r.read()
    assert 5 <= received.count(b"word") < WORDS
    await gateway.state.writer.flush()
    (rec,) = await gateway.state.store.usage("alice", 1)
    assert_billed_for_part(rec, target, 502)


@pytest.mark.parametrize("target", TARGETS, ids=[t.type for t in TARGETS])
@pytest.mark.skipif(
    SERVER == "granian",
    reason="granian embedded in the test's loop has no grace period (it waits for every "
    "request, or cancels its worker's task mid-frame); gateway serve's grace on granian: "
    "tests/test_server.py",
)
async def test_a_stream_running_when_the_shutdown_grace_ends_bills_what_was_generated(
    gateway_factory: Callable[..., contextlib.AbstractAsyncContextManager[ServedGateway]],
    store_url: str,
    target: Target,
) -> None:
    """SIGTERM: the server waits its grace period (1 s in the tests) for open streams, then
    cuts them; a cut stream is billed for what it generated, and recorded before the
    process ends."""
    path, body = request("openai", target)
    words = 0

    async def read() -> None:
        nonlocal words
        async with aiohttp.ClientSession() as s:
            async with s.post(gw.url + path, json=body, headers=HEADERS) as r:
                with contextlib.suppress(aiohttp.ClientError):
                    async for piece in r.content.iter_any():
                        words += piece.count(b"word")

    async with gateway_factory() as gw:
        reading = asyncio.create_task(read())
        while words < 5:
            await asyncio.sleep(0.02)
    # the gateway has stopped: its grace period ended with the stream still running
    await reading
    assert 5 <= words < WORDS
    store = open_store(store_url)
    await store.open()
    try:
        (rec,) = await store.usage("alice", 1)
    finally:
        await store.close()
    assert_billed_for_part(rec, target, 499)
