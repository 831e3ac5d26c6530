"""Channels with several upstream keys (``api_keys``, ``policy/upstream_keys.py``): one key per
request, spread over the keys; a key refused (401, 403) or rate limited (429) cools down on its
own and the request goes on with another key; rate-limit headers steer new work to keys with
room; a session keeps its key; the keys are never shown. In process."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import pytest

from gateway.config import ConfigError, parse_settings
from gateway.policy.upstream_keys import is_low, key_digest
from tests.plugins.inprocess import ADMIN_TOKEN, InProcess, Scripted, running
from tests.test_affinity import CHAT, reply

KEYS = ["sk-upstream-key-aaaa-0001", "sk-upstream-key-bbbb-0002"]
CHANNEL = {"name": "oa", "type": "openai", "groups": ["default"], "models": ["chat-small"],
           "api_keys": KEYS}  # fmt: skip


def used(app: InProcess) -> list[str]:
    """The key of each upstream call, in order."""
    return [s.headers["Authorization"].removeprefix("Bearer ") for s in app.upstream.sent]


def refused(status: int, **headers: str) -> Scripted:
    return Scripted.json({"error": {"message": "no", "type": "x"}}, status, **headers)


async def test_requests_spread_over_the_keys(store_url: str) -> None:
    async with running(store_url, channels=[CHANNEL]) as app:
        app.upstream.answer("oa", *(reply() for _ in range(10)))
        for _ in range(10):
            assert (await app.post("/v1/chat/completions", CHAT)).status == 200
        assert Counter(used(app)) == Counter({KEYS[0]: 5, KEYS[1]: 5})


@pytest.mark.parametrize(
    ("failure", "cooled_for"),
    [(refused(401), 30.0), (refused(403), 30.0), (refused(429, **{"retry-after": "7"}), 7.0)],
)
async def test_a_refused_key_cools_alone_and_the_request_goes_on(
    store_url: str, failure: Scripted, cooled_for: float
) -> None:
    async with running(store_url, channels=[CHANNEL]) as app:
        app.upstream.answer("oa", failure, *(reply() for _ in range(6)))
        assert (await app.post("/v1/chat/completions", CHAT)).status == 200
        await asyncio.sleep(0)  # a 429's Retry-After is applied once the attempt read it
        bad, good = used(app)  # the other key of the same channel answered
        assert bad != good
        health = app.services.health
        name = f"oa#{key_digest(bad)}"
        assert name in health.cooling and "oa" not in health.cooling  # the key, not the channel
        left = health.cooling[name] - time.monotonic()
        assert cooled_for - 1 < left <= cooled_for
        app.upstream.sent.clear()
        for _ in range(5):
            assert (await app.post("/v1/chat/completions", CHAT)).status == 200
        assert set(used(app)) == {good}


async def test_every_key_refused_cools_the_channel(store_url: str) -> None:
    async with running(store_url, channels=[CHANNEL]) as app:
        app.upstream.answer("oa", refused(401), refused(401))
        r = await app.post("/v1/chat/completions", CHAT)
        assert r.status == 502
        assert "oa" in app.services.health.cooling
        assert (await app.post("/v1/chat/completions", CHAT)).status == 503


async def test_rate_limit_headers_steer_new_work_but_a_session_keeps_its_key(
    store_url: str,
) -> None:
    async with running(store_url, channels=[CHANNEL]) as app:
        low = {"x-ratelimit-remaining-requests": "1", "x-ratelimit-limit-requests": "500"}
        first = reply()
        first.headers.update(low)
        app.upstream.answer("oa", first, *(reply() for _ in range(12)))
        session = {"x-session-id": "keeps"}
        await app.post("/v1/chat/completions", CHAT, **session)
        (pinned,) = used(app)  # its reply said the key is nearly out of requests
        app.upstream.sent.clear()
        for _ in range(4):  # work without a session goes to the key with room
            await app.post("/v1/chat/completions", CHAT)
        assert pinned not in used(app)
        app.upstream.sent.clear()
        for _ in range(3):  # the session stays on its key: its prompt cache is there
            await app.post("/v1/chat/completions", CHAT, **session)
        assert set(used(app)) == {pinned}


def test_rate_limit_headers_say_when_a_key_is_low() -> None:
    assert is_low({}) is None
    assert is_low({"x-ratelimit-remaining-requests": "400", "x-ratelimit-limit-requests": "500"})\
        is False  # fmt: skip
    assert is_low({"x-ratelimit-remaining-tokens": "100", "x-ratelimit-limit-tokens": "90000"})
    assert is_low({"anthropic-ratelimit-input-tokens-remaining": "10"})  # no limit: absolute
    assert is_low({"anthropic-ratelimit-requests-remaining": "abc"}) is None


def settings(channel: dict[str, Any]) -> Any:
    return parse_settings(
        {
            "store": "sqlite:///x.db",
            "models": [{"name": "m", "price": {"input": 1}}],
            "channels": [
                {
                    "name": "c",
                    "type": "openai",
                    "base_url": "http://u/v1",
                    "models": ["m"],
                    **channel,
                }
            ],
        }  # fmt: skip
    )


@pytest.mark.parametrize(
    ("channel", "error"),
    [
        ({"api_key": "a", "api_keys": ["b", "c"]}, "api_keys: give api_key or api_keys"),
        ({"api_keys": []}, "api_keys: at least one key"),
        ({"api_keys": ["same-secret", "same-secret"]}, "api_keys: a key is listed twice$"),
        ({"api_keys": "k"}, "api_keys: must be a list"),
        # a key pasted with its line end: refused here, not by the HTTP client at each request
        ({"api_key": "same-secret\n"}, "api_key: holds a line break or another control char"),
        ({"api_keys": ["k1", "same-secret\r"]}, r"api_keys\[1\]: holds a line break"),
        ({"api_keys": ["k1", "same\x00secret"]}, r"api_keys\[1\]: holds a line break"),
    ],
)
def test_bad_api_keys_name_the_field_and_never_the_key(channel: Any, error: str) -> None:
    with pytest.raises(ConfigError, match=r"^channels\[0\]\." + error) as caught:
        settings(channel)
    assert "same-secret" not in str(caught.value)


def test_one_key_in_api_keys_is_a_channel_of_one_key() -> None:
    ch = settings({"api_keys": ["only"]}).channels[0]
    assert (ch.api_key, ch.api_keys) == ("only", ())
    assert "only" not in repr(ch)


async def test_the_admin_api_takes_keys_and_shows_only_hints(store_url: str) -> None:
    async with running(store_url, channels=[]) as app:
        body = {**CHANNEL, "base_url": "http://oa.test/v1"}
        made = await app.post("/admin/channels", body, key=ADMIN_TOKEN)
        assert made.status == 201, made.body
        listed = await app.get("/admin/channels", authorization=f"Bearer {ADMIN_TOKEN}")
        for text in (made.body, listed.body):
            assert b"aaaa-0001" not in text and b"bbbb-0002" not in text
        shown = made.json()
        assert shown["api_key_hints"] == ["sk-…0001", "sk-…0002"]
        assert "api_keys" not in shown and "api_key" not in shown
        app.upstream.answer("oa", reply(), reply())
        await app.post("/v1/chat/completions", CHAT)
        await app.post("/v1/chat/completions", CHAT)
        assert set(used(app)) == set(KEYS)


async def test_the_admin_api_refuses_a_key_pasted_with_its_line_end(store_url: str) -> None:
    async with running(store_url, channels=[]) as app:
        body = {**CHANNEL, "base_url": "http://oa.test/v1", "api_keys": [KEYS[0] + "\n"]}
        made = await app.post("/admin/channels", body, key=ADMIN_TOKEN)
        assert made.status == 400, made.body
        message = made.json()["error"]["message"]
        assert "api_keys[0]: holds a line break" in message and KEYS[0] not in message
        listed = await app.get("/admin/channels", authorization=f"Bearer {ADMIN_TOKEN}")
        assert listed.json()["data"] == []
