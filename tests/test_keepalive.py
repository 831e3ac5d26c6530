"""Quiet streams get their protocol's keep-alive, and each SDK reads through them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from bench.fake_upstream import FakeUpstream
from tests.plugins.servers import KEYS, ServedGateway, make_config, serve_app
from tests.test_sdk_matrix import GENAI_AIOHTTP_WARNING, genai_client

pytestmark = GENAI_AIOHTTP_WARNING
# the upstream thinks 0.8 s before its first chunk and between chunks; keep-alives every 0.2 s
QUIET = "[[fake text='one two three' chunks=3 first_ms=800 delay_ms=800]]"


@pytest.fixture
async def gw(fake: FakeUpstream, store_url: str) -> AsyncIterator[ServedGateway]:
    from gateway.config import parse_settings

    cfg = make_config(fake.url, store_url, upstream={"stream_keepalive_seconds": 0.2})
    async with serve_app(parse_settings(cfg)) as served:
        yield served


REQUESTS: list[tuple[str, str, dict[str, Any], bytes]] = [
    (
        "/v1/chat/completions",
        "claude-small",
        {"stream": True, "messages": [{"role": "user", "content": QUIET}]},
        b": keep-alive\n\n",
    ),
    (
        "/v1/messages",
        "gemini-small",
        {"stream": True, "max_tokens": 50, "messages": [{"role": "user", "content": QUIET}]},
        b'event: ping\ndata: {"type": "ping"}\n\n',
    ),
    (
        "/v1beta/models/chat-small:streamGenerateContent?alt=sse",
        "",
        {"contents": [{"role": "user", "parts": [{"text": QUIET}]}]},
        b"\n",  # a blank line: no event
    ),
]


@pytest.mark.parametrize(
    ("path", "model", "body", "keepalive"), REQUESTS, ids=["openai", "anthropic", "gemini"]
)
async def test_a_quiet_stream_gets_keepalives_in_its_protocols_form(
    gw: ServedGateway, path: str, model: str, body: dict[str, Any], keepalive: bytes
) -> None:
    if model:
        body = {**body, "model": model}
    headers = {"Authorization": f"Bearer {KEYS['alice']}", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + path, json=body, headers=headers) as r:
            assert r.status == 200
            raw = await r.read()
    if keepalive == b"\n":
        lines = raw.splitlines()
        blank = sum(1 for line in lines if not line.strip())
        events = sum(1 for line in lines if line.startswith(b"data:"))
        assert blank - events >= 4  # ~2.4 s of quiet at one every 0.2 s
    else:
        assert raw.count(keepalive) >= 4
    for word in (b"one", b"two", b"three"):
        assert word in raw


async def test_the_sdks_read_through_the_keepalives(gw: ServedGateway) -> None:
    async with openai.AsyncOpenAI(base_url=gw.v1, api_key=KEYS["alice"], max_retries=0) as oa:
        text = ""
        async for chunk in await oa.chat.completions.create(
            model="gemini-small", messages=[{"role": "user", "content": QUIET}], stream=True
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
    assert text.split() == ["one", "two", "three"]

    async with anthropic.AsyncAnthropic(base_url=gw.url, api_key=KEYS["alice"]) as an:
        async with an.messages.stream(
            model="chat-small", max_tokens=50, messages=[{"role": "user", "content": QUIET}]
        ) as stream:
            text = "".join([t async for t in stream.text_stream])
    assert text.split() == ["one", "two", "three"]

    async with genai_client(gw) as gen:
        parts = [
            c.text or ""
            async for c in await gen.models.generate_content_stream(
                model="claude-small", contents=QUIET
            )
        ]
    assert "".join(parts).split() == ["one", "two", "three"]


# the upstream withholds its status line 1.5 s; the stream is committed after 0.2 s
WITHHELD = "[[fake text='one two three' chunks=3 first_ms=1500]]"


@pytest.fixture
async def committing(fake: FakeUpstream, store_url: str) -> AsyncIterator[ServedGateway]:
    from gateway.config import parse_settings

    upstream = {"stream_keepalive_seconds": 0.2, "stream_commit_seconds": 0.2}
    async with serve_app(parse_settings(make_config(fake.url, store_url, upstream=upstream))) as gw:
        yield gw


@pytest.mark.parametrize(
    ("path", "model", "keepalive"),
    [("/v1/chat/completions", "claude-small", b": keep-alive\n\n"),
     ("/v1/messages", "gemini-small", b'event: ping\ndata: {"type": "ping"}\n\n')],
    ids=["openai", "anthropic"],
)  # fmt: skip
async def test_a_stream_whose_upstream_withholds_its_status_is_committed(
    committing: ServedGateway, path: str, model: str, keepalive: bytes
) -> None:
    """Over a real server: the client's response starts with a keep-alive while the upstream
    has not answered, and the upstream's stream follows in it."""
    body = {"model": model, "stream": True, "max_tokens": 50,
            "messages": [{"role": "user", "content": WITHHELD}]}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEYS['alice']}", "anthropic-version": "2023-06-01"}
    async with aiohttp.ClientSession() as s:
        async with s.post(committing.url + path, json=body, headers=headers) as r:
            assert r.status == 200
            raw = await r.read()
    assert raw.startswith(keepalive)
    for word in (b"one", b"two", b"three"):
        assert word in raw
    async with anthropic.AsyncAnthropic(base_url=committing.url, api_key=KEYS["alice"]) as an:
        async with an.messages.stream(
            model="chat-small", max_tokens=50, messages=[{"role": "user", "content": WITHHELD}]
        ) as stream:
            text = "".join([t async for t in stream.text_stream])
    assert text.split() == ["one", "two", "three"]
