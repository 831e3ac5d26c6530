"""Session affinity (``policy/affinity.py``, CONTRACT §3 "Sessions stay on one channel"): the
requests of one session reach one channel, on every instance; a channel that cools down or is
disabled moves the session, which stays where it went. In process, on both stores; the
two-instance test runs two apps on one Redis."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.policy.affinity import TTL_SECONDS, pin_id, session_of
from gateway.protocols.base import RouteMatch
from gateway.store.backends import open_store
from gateway.store.pins import pin_store
from tests.plugins.inprocess import ADMIN_TOKEN, HOSTS, InProcess, Scripted, running

CHAT = {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}]}
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def reply(text: str = "ok") -> Scripted:
    return Scripted.json(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": "up",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],  # fmt: skip
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
    )


def two_channels(**extra: Any) -> list[dict[str, Any]]:
    """chat-small on two openai channels of equal priority and weight: oa and ob."""
    base = {"type": "openai", "api_key": "k", "groups": ["default"], "models": ["chat-small"]}
    return [{**base, "name": "oa", **extra}, {**base, "name": "ob", **extra}]


@contextlib.asynccontextmanager
async def app_with(store_url: str, channels: list[dict[str, Any]]) -> AsyncIterator[InProcess]:
    async with running(store_url, channels=channels) as app:
        for name in ("oa", "ob"):
            app.upstream.answer(name, *(reply() for _ in range(60)))
        yield app


def hosts(app: InProcess) -> Counter[str]:
    """Calls per channel, by the host the call went to."""
    by_host = {url: name for name, url in HOSTS.items()}
    return Counter(by_host[s.url.split("/v1")[0]] for s in app.upstream.sent)


# ---- naming a session -------------------------------------------------------------------------


def test_a_session_is_named_in_the_contracts_order() -> None:
    body = RouteMatch("openai", "chat", session="pck")
    late = RouteMatch("anthropic", "chat", session="user-1", session_late=True)
    both = {b"x-session-id": b"a", b"x-claude-code-session-id": b"b", b"session_id": b"c"}
    assert session_of(both, body) == "a"
    assert session_of({b"x-claude-code-session-id": b"b", b"session_id": b"c"}, body) == "b"
    assert session_of({b"session_id": b"c"}, body) == "pck"  # the body's before Codex's
    assert session_of({b"session_id": b"c"}, late) == "c"  # metadata.user_id after it
    assert session_of({}, late) == "user-1"
    assert session_of({}, RouteMatch("gemini", "chat")) == ""
    assert pin_id("alice", "m", "s") != pin_id("bob", "m", "s")  # per account
    assert "s" not in pin_id("alice", "m", "s-secret-name")


# ---- one instance ---------------------------------------------------------------------------


async def test_a_sessions_requests_stay_on_one_channel(store_url: str) -> None:
    async with app_with(store_url, two_channels()) as app:
        for _ in range(20):
            r = await app.post("/v1/chat/completions", CHAT, **{"x-session-id": "s-1"})
            assert r.status == 200
        assert len(hosts(app)) == 1 and sum(hosts(app).values()) == 20
        app.upstream.sent.clear()
        for _ in range(30):  # without a session: both channels serve (the test can tell)
            await app.post("/v1/chat/completions", CHAT)
        assert set(hosts(app)) == {"oa", "ob"}


async def test_the_bodys_session_fields_pin_too(store_url: str) -> None:
    async with app_with(store_url, two_channels()) as app:
        for _ in range(12):
            r = await app.post("/v1/chat/completions", {**CHAT, "prompt_cache_key": "conv-7"})
            assert r.status == 200
        assert len(hosts(app)) == 1
        pins = app.services.health.affinity.pins  # type: ignore[union-attr]
        assert len(pins) == 1 and "conv-7" not in next(iter(pins))


async def test_a_cooling_channel_moves_the_session_and_it_stays(store_url: str) -> None:
    async with app_with(store_url, two_channels()) as app:
        session = {"x-claude-code-session-id": "cc-1"}
        await app.post("/v1/chat/completions", CHAT, **session)
        (first,) = hosts(app)
        other = "ob" if first == "oa" else "oa"
        health = app.services.health
        health.cooling[first] = 1e18  # as after failures (ChannelHealth._cool)
        app.upstream.sent.clear()
        for _ in range(5):
            await app.post("/v1/chat/completions", CHAT, **session)
        assert hosts(app) == Counter({other: 5})
        del health.cooling[first]  # healthy again: the session stays where it went
        app.upstream.sent.clear()
        for _ in range(8):
            await app.post("/v1/chat/completions", CHAT, **session)
        assert hosts(app) == Counter({other: 8})
        assert health.affinity is not None and health.affinity.moves == 1


async def test_a_disabled_channel_moves_the_session(store_url: str) -> None:
    async with running(store_url, channels=[]) as app:
        for name in ("oa", "ob"):
            body = {**two_channels()[0], "name": name, "base_url": HOSTS[name] + "/v1"}
            made = await app.post("/admin/channels", body, key=ADMIN_TOKEN)
            assert made.status == 201, made.body
            app.upstream.answer(name, *(reply() for _ in range(20)))
        session = {"x-session-id": "s-dis"}
        await app.post("/v1/chat/completions", CHAT, **session)
        (first,) = hosts(app)
        off = await drive_patch(app, f"/admin/channels/{first}", {"status": "disabled"})
        assert off == 200
        app.upstream.sent.clear()
        for _ in range(4):
            assert (await app.post("/v1/chat/completions", CHAT, **session)).status == 200
        assert set(hosts(app)) == {"ob" if first == "oa" else "oa"}


async def drive_patch(app: InProcess, path: str, body: Any) -> int:
    import orjson

    from tests.plugins.inprocess import drive

    headers = {"content-type": "application/json", **ADMIN}
    return (await drive(app.app, "PATCH", path, orjson.dumps(body), headers)).status


# ---- two instances ----------------------------------------------------------------------------


async def test_twenty_requests_over_two_instances_reach_one_channel(redis_url: str) -> None:
    async with app_with(redis_url, two_channels()) as a, app_with(redis_url, two_channels()) as b:
        for i in range(20):
            instance = (a, b)[i % 2]
            r = await instance.post("/v1/chat/completions", CHAT, **{"x-session-id": "shared"})
            assert r.status == 200
        served = hosts(a) + hosts(b)
        assert len(served) == 1 and sum(served.values()) == 20, served
        assert sum(hosts(a).values()) == sum(hosts(b).values()) == 10  # both instances served


# ---- the store's pins ------------------------------------------------------------------------


async def test_the_store_keeps_the_first_claim_and_moves_by_compare_and_set(
    store_url: str,
) -> None:
    store = open_store(store_url)
    await store.open()
    try:
        pins = pin_store(store)
        assert pins is not None
        ttl = int(TTL_SECONDS * 1000)
        assert await pins.sync([("p", "oa", None)], ttl, 1_000) == {"p": "oa"}
        # another instance's claim loses: it adopts the first
        assert await pins.sync([("p", "ob", None)], ttl, 1_001) == {"p": "oa"}
        # a move from what the store holds wins; a stale move (from ob) does not
        assert await pins.sync([("p", "oc", "oa")], ttl, 1_002) == {"p": "oc"}
        assert await pins.sync([("p", "od", "oa")], ttl, 1_003) == {"p": "oc"}
        assert await pins.sync([], ttl, 1_004) == {}
    finally:
        await store.close()


# ---- what the operator sees --------------------------------------------------------------------


async def test_pins_and_the_cache_hit_rate_are_in_the_metrics_and_the_overview(
    store_url: str,
) -> None:
    async with running(store_url, channels=two_channels()) as app:
        cached = reply()
        usage = {"prompt_tokens": 100, "completion_tokens": 1, "total_tokens": 101,
                 "prompt_tokens_details": {"cached_tokens": 75}}  # fmt: skip
        payload = orjson.loads(cached.body)
        cached.body = orjson.dumps({**payload, "usage": usage})
        for name in ("oa", "ob"):
            app.upstream.answer(name, *(cached for _ in range(4)))
        for session in ("a", "b", "c"):
            await app.post("/v1/chat/completions", CHAT, **{"x-session-id": session})
        served = hosts(app)
        scrape = (await app.get("/metrics")).body.decode()
        for channel, n in served.items():
            assert f'gateway_session_pins{{channel="{channel}",model="chat-small"}} {n}.0' in scrape
            assert (
                f'gateway_prompt_cache_hit_ratio{{channel="{channel}",model="chat-small"}} 0.75'
                in scrape
            )
        overview = await app.get("/admin/usage/daily", **ADMIN)
        rows = overview.json()["sessions"]
        assert {(r["channel"], r["pins"], r["cache_hit_rate"]) for r in rows} == {
            (channel, n, 0.75) for channel, n in served.items()
        }
