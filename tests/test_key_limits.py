"""A key's own limits (CONTRACT §4, §5): a spend ``quota`` (402 once spent, however rich the
account, exact with concurrent requests as balances are), a ``models`` allowlist within its
group (404 outside it, and only those models listed), ``allowed_ips`` (403 from elsewhere);
set at creation or by PATCH, ``null`` clears each, bad values get 400 naming the field."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench.fake_upstream import FakeUpstream
from gateway.config import parse_settings
from gateway.store import MICRO
from tests.plugins.servers import ADMIN_TOKEN, ServedGateway, make_config, serve_app
from tests.plugins.stores import ALL_BACKENDS, backend_url
from tests.test_holds import BODY, COST, HOLD
from tests.test_instances import propagated

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
CHAT = {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(params=ALL_BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """These run on a Redis Cluster too."""
    return backend_url(request, tmp_path)


async def make_key(s: aiohttp.ClientSession, gw: ServedGateway, **limits: Any) -> dict[str, Any]:
    body = {"account": "alice", "group": "default", **limits}
    async with s.post(gw.url + "/admin/keys", json=body, headers=ADMIN) as r:
        assert r.status == 201, await r.text()
        made: dict[str, Any] = await r.json()
        return made


async def chat(
    s: aiohttp.ClientSession, gw: ServedGateway, key: str, body: dict[str, Any] = CHAT
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    async with s.post(gw.v1 + "/chat/completions", json=body, headers=headers) as r:
        return r.status, await r.json()


async def test_limits_are_shown_changed_and_cleared(gateway: ServedGateway) -> None:
    async with aiohttp.ClientSession() as s:
        made = await make_key(
            s, gateway, quota=1.5, models=["chat-small"], allowed_ips=["10.1.2.3/8", "::1"]
        )
        assert made["quota"] == 1.5
        assert made["spent"] == 0
        assert made["models"] == ["chat-small"]
        assert made["allowed_ips"] == ["10.0.0.0/8", "::1/128"]
        url = f"{gateway.url}/admin/keys/{made['id']}"
        async with s.patch(url, json={"quota": None, "models": None}, headers=ADMIN) as r:
            changed = await r.json()
            assert r.status == 200
        assert changed["quota"] is None
        assert changed["models"] is None
        assert changed["allowed_ips"] == ["10.0.0.0/8", "::1/128"]
        async with s.get(url, headers=ADMIN) as r:
            assert (await r.json())["allowed_ips"] == ["10.0.0.0/8", "::1/128"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("quota", "lots"),
        ("quota", -1),
        ("models", "chat-small"),
        ("models", [1]),
        ("models", ["typo"]),
        ("allowed_ips", ["not-a-network"]),
        ("allowed_ips", "10.0.0.0/8"),
    ],
)
async def test_a_bad_limit_is_400_naming_the_field(
    gateway: ServedGateway, field: str, value: object
) -> None:
    async with aiohttp.ClientSession() as s:
        body = {"account": "alice", "group": "default", field: value}
        async with s.post(gateway.url + "/admin/keys", json=body, headers=ADMIN) as r:
            assert r.status == 400
            assert (await r.json())["error"]["message"].startswith(field)
        async with s.patch(
            gateway.url + "/admin/keys/k-alice", json={field: value}, headers=ADMIN
        ) as r:
            assert r.status == 400
            assert (await r.json())["error"]["message"].startswith(field)


async def error_of(r: aiohttp.ClientResponse, status: int) -> str:
    assert r.status == status, await r.text()
    message: str = (await r.json())["error"]["message"]
    return message


async def test_models_must_be_models_of_the_key_s_group_in_the_live_catalogue(
    gateway: ServedGateway,
) -> None:
    """A typo would make every request of the key 404: it is refused with 400 naming the
    entry, on creation and on PATCH, against the group's models as they are now."""
    keys = gateway.url + "/admin/keys"
    async with aiohttp.ClientSession() as s:
        for models, bad in [
            (["typo"], "models[0]"),
            (["chat-small", "chat-small", "typo"], "models[2]"),
            (["vip-model"], "models[0]"),  # a model of the vip group only
        ]:
            body = {"account": "alice", "group": "default", "models": models}
            async with s.post(keys, json=body, headers=ADMIN) as r:
                message = await error_of(r, 400)
                assert message.startswith(bad) and repr(models[-1]) in message
            async with s.patch(keys + "/k-alice", json={"models": models}, headers=ADMIN) as r:
                assert (await error_of(r, 400)).startswith(bad)
        async with s.get(keys + "/k-alice", headers=ADMIN) as r:
            assert (await r.json())["models"] is None  # nothing was changed

        # in its group: accepted; moving the key to a group without them: refused
        vip = {"account": "alice", "group": "vip", "models": ["vip-model", "chat-small"]}
        async with s.post(keys, json=vip, headers=ADMIN) as r:
            assert r.status == 201
            made = await r.json()
        async with s.patch(f"{keys}/{made['id']}", json={"group": "default"}, headers=ADMIN) as r:
            assert (await error_of(r, 400)).startswith("models[0]")
        change = {"group": "default", "models": ["chat-small"]}
        async with s.patch(f"{keys}/{made['id']}", json=change, headers=ADMIN) as r:
            assert r.status == 200 and (await r.json())["models"] == ["chat-small"]

        # a model and a channel made at run time are the group's at once
        model = {"name": "m-live", "capabilities": ["chat"], "price": {"input": 1, "output": 1}}
        async with s.post(gateway.url + "/admin/models", json=model, headers=ADMIN) as r:
            assert r.status == 201
        body = {"account": "alice", "group": "default", "models": ["m-live"]}
        async with s.post(keys, json=body, headers=ADMIN) as r:
            assert (await error_of(r, 400)).startswith("models[0]")  # no channel serves it
        channel = {
            "name": "c-live",
            "type": "openai",
            "base_url": gateway.settings.channels[0].base_url,
            "api_key": "k",
            "groups": ["default"],
            "models": ["m-live"],
            "status": "disabled",  # a disabled channel's models still count
        }
        async with s.post(gateway.url + "/admin/channels", json=channel, headers=ADMIN) as r:
            assert r.status == 201
        async with s.post(keys, json=body, headers=ADMIN) as r:
            assert r.status == 201


async def test_models_allowlist_404s_other_models_and_lists_only_its_own(
    gateway: ServedGateway,
) -> None:
    async with aiohttp.ClientSession() as s:
        key = (await make_key(s, gateway, models=["claude-small"]))["key"]
        status, body = await chat(s, gateway, key, {**CHAT, "model": "claude-small"})
        assert status == 200
        status, body = await chat(s, gateway, key)
        assert status == 404
        assert "chat-small" in body["error"]["message"]
        headers = {"Authorization": f"Bearer {key}"}
        async with s.get(gateway.v1 + "/models", headers=headers) as r:
            assert [m["id"] for m in (await r.json())["data"]] == ["claude-small"]
        # the messages protocol answers in its own shape
        msg = {"model": "chat-small", "max_tokens": 8, "messages": CHAT["messages"]}
        async with s.post(gateway.v1 + "/messages", json=msg, headers=headers) as r:
            assert r.status == 404
            assert (await r.json())["type"] == "error"


async def test_allowed_ips_403_from_elsewhere(gateway: ServedGateway) -> None:
    async with aiohttp.ClientSession() as s:
        elsewhere = (await make_key(s, gateway, allowed_ips=["203.0.113.0/24"]))["key"]
        here = (await make_key(s, gateway, allowed_ips=["127.0.0.0/8"]))["key"]
        status, body = await chat(s, gateway, elsewhere)
        assert status == 403
        assert body["error"]["type"] == "permission_error"
        assert (await chat(s, gateway, here))[0] == 200
        gemini = gateway.url + "/v1beta/models/gemini-small:generateContent"
        contents = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        async with s.post(gemini, json=contents, headers={"x-goog-api-key": elsewhere}) as r:
            assert r.status == 403
            assert (await r.json())["error"]["status"] == "PERMISSION_DENIED"


async def test_a_quota_holds_under_concurrent_requests_however_rich_the_account(
    gateway: ServedGateway, fake: FakeUpstream
) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        made = await make_key(s, gateway, quota=5 * HOLD / MICRO)
        key = made["key"]
        results = await asyncio.gather(*(chat(s, gateway, key, BODY) for _ in range(40)))
        statuses = sorted(status for status, _ in results)
        assert statuses == [200] * 5 + [402] * 35  # five holds fill the quota while they run
        refused = [body for status, body in results if status == 402]
        assert all("quota" in b["error"]["message"] for b in refused)
        assert len(fake.requests) == 5  # nothing refused went upstream

        await gateway.state.writer.flush()
        async with s.get(f"{gateway.url}/admin/keys/{made['id']}", headers=ADMIN) as r:
            shown = await r.json()
        assert shown["spent"] == 5 * COST / MICRO
        records = [
            r for r in await gateway.state.store.usage("alice", 1_000) if r.key_id == made["id"]
        ]
        assert sum(r.cost for r in records) == 5 * COST

        # what is left (5 x (HOLD - COST)) admits more, until the quota is spent
        served = 5
        while (await chat(s, gateway, key, BODY))[0] == 200:
            served += 1
            assert served < 100
        await gateway.state.writer.flush()
        async with s.get(f"{gateway.url}/admin/keys/{made['id']}", headers=ADMIN) as r:
            spent = (await r.json())["spent"]
        # a request may take the key past its quota by its own cost, never by more
        assert served * COST == round(spent * MICRO)
        assert 5 * HOLD <= served * COST < 5 * HOLD + COST
        # the account is rich; another key of it is served
        assert (await chat(s, gateway, (await make_key(s, gateway))["key"]))[0] == 200


async def test_a_store_file_from_before_the_limits_gets_their_columns(tmp_path: Any) -> None:
    import sqlite3

    from gateway.store.sqlite import SQLiteStore

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE keys (id TEXT PRIMARY KEY, key_hash TEXT NOT NULL UNIQUE, account TEXT"
        " NOT NULL, grp TEXT NOT NULL, name TEXT NOT NULL DEFAULT '', status TEXT NOT NULL"
        " DEFAULT 'enabled', expires_at INTEGER, created_at INTEGER, hint TEXT NOT NULL"
        " DEFAULT '')"
    )
    conn.execute("INSERT INTO keys (id, key_hash, account, grp) VALUES ('k1', 'h1', 'a', 'g')")
    conn.commit()
    conn.close()
    store = SQLiteStore(f"sqlite:///{path}")
    await store.open()
    try:
        (key,) = await store.load_keys()
        assert (key.id, key.quota, key.models, key.allowed_ips) == ("k1", None, None, None)
        changed = await store.update_key("k1", {"quota": 7, "models": ("m",)})
        assert (changed.quota, changed.models) == (7, ("m",))
        assert (await store.get_key("k1")) == changed
        assert await store.load_spent() == {}
    finally:
        await store.close()


# ---- limits set by PATCH, under concurrency, and across instances ---------------------------


async def test_limits_set_by_patch_hold_at_once_here_and_within_a_second_on_another_instance(
    fake: FakeUpstream, store_url: str
) -> None:
    settings = parse_settings(make_config(fake.url, store_url))
    async with serve_app(settings) as a, serve_app(settings) as b:
        async with aiohttp.ClientSession() as s:
            made = await make_key(s, a)
            url = f"{a.url}/admin/keys/{made['id']}"

            async def on(gw: ServedGateway, model: str = "chat-small") -> int:
                return (await chat(s, gw, made["key"], {**CHAT, "model": model}))[0]

            await propagated(lambda: on(b), 200)  # the new key, on B too
            for change, model, refused in [
                ({"quota": 0}, "chat-small", 402),
                ({"models": ["claude-small"]}, "chat-small", 404),
                ({"allowed_ips": ["203.0.113.0/24"]}, "chat-small", 403),
            ]:
                async with s.patch(url, json=change, headers=ADMIN) as r:
                    assert r.status == 200, await r.text()
                assert await on(a, model) == refused, change  # this instance: at once
                await propagated(lambda m=model: on(b, m), refused)
                cleared = dict.fromkeys(change)  # null clears it
                async with s.patch(url, json=cleared, headers=ADMIN) as r:
                    assert r.status == 200
                assert await on(a, model) == 200, cleared
                await propagated(lambda m=model: on(b, m), 200)
            # the allowlist let its own model through all along
            async with s.patch(url, json={"models": ["claude-small"]}, headers=ADMIN) as r:
                assert r.status == 200
            assert await on(a, "claude-small") == 200
            await propagated(lambda: on(b, "claude-small"), 200)


async def test_models_and_allowed_ips_under_concurrent_requests(
    gateway: ServedGateway, fake: FakeUpstream
) -> None:
    """40 requests at once, mixing allowed and refused models and client addresses (the
    loopback proxy is trusted, so X-Forwarded-For is the client's): exactly the allowed ones
    are served, nothing refused reaches the upstream, and the balance drops by the records'
    sum."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        made = await make_key(s, gateway, models=["claude-small"], allowed_ips=["203.0.113.0/24"])
        await gateway.state.writer.flush()
        before = await gateway.state.store.get_account("alice")
        upstream_before = len(fake.requests)
        # (model, address) -> the status each must get; both wrong: either refusal
        cases = [
            ("claude-small", "203.0.113.9", {200}),
            ("chat-small", "203.0.113.9", {404}),
            ("claude-small", "198.51.100.7", {403}),
            ("chat-small", "198.51.100.7", {403, 404}),
        ]

        async def one(i: int) -> tuple[int, set[int]]:
            model, address, want = cases[i % len(cases)]
            headers = {"Authorization": f"Bearer {made['key']}", "X-Forwarded-For": address}
            body = {**CHAT, "model": model}
            async with s.post(gateway.v1 + "/chat/completions", json=body, headers=headers) as r:
                await r.read()
                return r.status, want

        results = await asyncio.gather(*(one(i) for i in range(40)))
        assert all(status in want for status, want in results), results
        assert sum(1 for status, _ in results if status == 200) == 10
        sent = fake.requests[upstream_before:]
        assert len(sent) == 10  # nothing refused went upstream
        assert all("claude-small" in r.body.decode() for r in sent)

        await gateway.state.writer.flush()
        after = await gateway.state.store.get_account("alice")
        assert before is not None and after is not None
        records = [
            r for r in await gateway.state.store.usage("alice", 1_000) if r.key_id == made["id"]
        ]
        assert sorted(r.status for r in records if r.status == 200) == [200] * 10
        assert all(r.cost == 0 for r in records if r.status != 200)
        assert before.balance - after.balance == sum(r.cost for r in records) > 0


async def test_a_quota_across_two_instances(fake: FakeUpstream, redis_url: str) -> None:
    """Two instances on one Redis, the same key's requests arriving on both at once.

    Holds are shared through the store twice a second (``cache.py``), not per request: within
    one tick each instance admits what its own view of the quota allows, so a burst that
    reaches both at the same moment may overrun the quota by what the other instance admitted
    before their holds met, while each instance alone stays within the single-instance bound.
    Once the holds and the spend are shared (within the propagation bound) both refuse; every
    record is billed once and the balance drops by their sum."""
    settings = parse_settings(make_config(fake.url, redis_url))
    quota = 5 * HOLD
    async with serve_app(settings) as a, serve_app(settings) as b:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            made = await make_key(s, a, quota=quota / MICRO)
            key = made["key"]
            headers = {"Authorization": f"Bearer {key}"}

            async def known_on_b() -> int:  # costs nothing
                async with s.get(b.v1 + "/models", headers=headers) as r:
                    return r.status

            await propagated(known_on_b, 200)
            before = await a.state.store.get_account("alice")
            results = await asyncio.gather(
                *(chat(s, gw, key, BODY) for _ in range(20) for gw in (a, b))
            )
            statuses = [status for status, _ in results]
            assert set(statuses) <= {200, 402}
            served = {a.url: statuses[0::2].count(200), b.url: statuses[1::2].count(200)}
            # each instance alone: as on one instance, five holds fill the quota
            assert all(1 <= n <= 5 for n in served.values()), served

            async def refused(gw: ServedGateway) -> int:
                status = (await chat(s, gw, key, BODY))[0]
                served[gw.url] += status == 200
                return status

            # once the spend is shared, both refuse
            await propagated(lambda: refused(a), 402)
            await propagated(lambda: refused(b), 402)

            await a.state.writer.flush()
            await b.state.writer.flush()
            async with s.get(f"{a.url}/admin/keys/{made['id']}", headers=ADMIN) as r:
                spent = round((await r.json())["spent"] * MICRO)
        records = [r for r in await a.state.store.usage("alice", 1_000) if r.key_id == made["id"]]
        after = await a.state.store.get_account("alice")
    assert before is not None and after is not None
    assert len({r.request_id for r in records}) == len(records)  # each billed once
    assert spent == sum(r.cost for r in records) == sum(served.values()) * COST
    assert before.balance - after.balance == spent
    # each instance's requests stay within what one instance may spend: the quota, plus one
    # request's cost; together at most twice that
    assert all(n * COST < quota + COST for n in served.values()), served
    assert spent < 2 * (quota + COST)
