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
from gateway.store import MICRO
from tests.plugins.servers import ADMIN_TOKEN, ServedGateway
from tests.plugins.stores import ALL_BACKENDS, backend_url
from tests.test_holds import BODY, COST, HOLD

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
