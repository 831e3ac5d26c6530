"""A stream cut off mid-way costs what was generated (CONTRACT §6): the prompt (the upstream's
count, else the local estimate) and the completion so far (counted from what passed, else
estimated), in every client x channel pair; the record says 499."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from bench.fake_upstream import FakeUpstream
from tests.plugins.servers import KEYS, ServedGateway
from tests.test_sdk_matrix import TARGETS, Target

WORDS = 40
# 40 words in 40 chunks, 100 ms apart: the client reads a few and hangs up
SLOW = f"[[fake text='{' '.join(f'word{i}' for i in range(WORDS))}' chunks={WORDS} delay_ms=100]]"
CLIENTS = ("openai", "anthropic", "gemini")


def request(client: str, target: Target) -> tuple[str, dict[str, Any]]:
    message = {"role": "user", "content": SLOW}
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
    return path, {"contents": [{"role": "user", "parts": [{"text": SLOW}]}]}


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
    import asyncio

    await asyncio.sleep(seconds)
