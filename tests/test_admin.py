"""The admin API (contract §5), driven through a Starlette app built from ``admin_routes()``
over a real store, cache and usage writer."""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
import redis.exceptions
from starlette.applications import Starlette
from starlette.routing import Mount

from gateway.config import Settings, parse_settings
from gateway.operator import accounts
from gateway.operator.admin import admin_routes
from gateway.store import MICRO, Store, UsageRecord, hash_key
from gateway.store.cache import Cache
from gateway.store.writer import UsageWriter
from tests.plugins.records import usage_record as make_record

TOKEN = "admin-secret-token"
UPSTREAM_KEY = "upstream-credential-never-shown"


def make_settings(admin_token: str = TOKEN) -> Settings:
    return parse_settings(
        {
            "store": "sqlite:///unused.db",
            "admin_token": admin_token,
            "groups": ["default", "vip"],
            "models": [
                {"name": "chat-small", "capabilities": ["chat"], "price": {"input": 0.5}},
            ],
            "channels": [
                {
                    "name": "oa-1",
                    "type": "openai",
                    "base_url": "http://127.0.0.1:9001/v1",
                    "api_key": UPSTREAM_KEY,
                    "groups": ["default"],
                    "models": ["chat-small"],
                }
            ],
        }
    )


@dataclass
class GatewayState:
    settings: Settings
    store: Store
    cache: Cache
    writer: UsageWriter


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    raw: bytes

    def json(self) -> Any:
        return orjson.loads(self.raw)


class Admin:
    """Calls the ASGI app by hand: one request body, then the reply collected."""

    def __init__(self, app: Starlette) -> None:
        self.app = app

    async def __call__(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        token: str | None = TOKEN,
        auth: str | None = None,
    ) -> Reply:
        path, _, query = path.partition("?")
        if raw is None:
            raw = b"" if body is None else orjson.dumps(body)
        headers = [(b"content-type", b"application/json")]
        if auth is None and token is not None:
            auth = f"Bearer {token}"
        if auth is not None:
            headers.append((b"authorization", auth.encode()))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return {"type": "http.disconnect"}

        status = 0
        resp_headers: dict[str, str] = {}
        chunks: list[bytes] = []

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                resp_headers.update({k.decode(): v.decode() for k, v in message["headers"]})
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)
        return Reply(status, resp_headers, b"".join(chunks))


@pytest.fixture
async def state(store: Store) -> GatewayState:
    cache = Cache(store)
    await cache.refresh()
    return GatewayState(make_settings(), store, cache, UsageWriter(store, cache))


def build_app(state: GatewayState) -> Starlette:
    app = Starlette(routes=[Mount("/admin", routes=admin_routes())])
    app.state.gateway = state
    return app


@pytest.fixture
def admin(state: GatewayState) -> Admin:
    return Admin(build_app(state))


def assert_error(reply: Reply, status: int, type_: str) -> dict[str, Any]:
    assert reply.status == status, reply.raw
    assert reply.headers["content-type"] == "application/json"
    err = reply.json()["error"]
    assert set(err) == {"message", "type", "code"}
    assert err["type"] == type_
    assert isinstance(err["message"], str) and err["message"]
    return err  # type: ignore[no-any-return]


def usage_record(n: int, account: str, *, cost: int = 0, minutes: int = 0) -> UsageRecord:
    return make_record(
        time=datetime(2030, 1, 1, tzinfo=UTC) + timedelta(minutes=minutes),
        request_id=f"req-{n}",
        account=account,
        key_id="k_test",
        prompt_tokens=10 + n,
        completion_tokens=20 + n,
        cost=cost,
        latency_ms=100 + n,
    )


# ---- authentication ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "auth",
    [None, "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer", f"{TOKEN}"],
)
async def test_bad_or_missing_token_is_401(admin: Admin, auth: str | None) -> None:
    for method, path in [
        ("GET", "/admin/keys"),
        ("POST", "/admin/accounts"),
        ("GET", "/admin/usage"),
        ("GET", "/admin/no-such-endpoint"),
    ]:
        reply = await admin(method, path, {"id": "x", "balance": 1}, token=None, auth=auth)
        assert_error(reply, 401, "authentication_error")
        assert reply.headers["www-authenticate"] == "Bearer"


async def test_bearer_scheme_is_case_insensitive(admin: Admin) -> None:
    reply = await admin("GET", "/admin/keys", auth=f"bearer {TOKEN}")
    assert reply.status == 200


async def test_empty_admin_token_turns_the_api_off(state: GatewayState) -> None:
    state.settings = make_settings(admin_token="")
    admin = Admin(build_app(state))
    for auth in [None, "Bearer ", "Bearer  ", f"Bearer {TOKEN}"]:
        reply = await admin("GET", "/admin/keys", token=None, auth=auth)
        assert_error(reply, 401, "authentication_error")


async def test_an_unrefused_change_needs_the_token(admin: Admin, store: Store) -> None:
    reply = await admin("POST", "/admin/accounts", {"id": "mallory", "balance": 100}, token="no")
    assert reply.status == 401
    assert await store.get_account("mallory") is None


@pytest.mark.parametrize(
    "failure",
    [
        redis.exceptions.ConnectionError("refused"),
        redis.exceptions.TimeoutError("timed out"),
        sqlite3.OperationalError("database is locked"),
        ConnectionResetError(),
        TimeoutError(),
    ],
    ids=repr,
)
async def test_a_store_failure_is_503(
    admin: Admin, monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    async def failing(*args: Any) -> Any:
        raise failure

    monkeypatch.setattr(accounts, "list_accounts", failing)
    err = assert_error(await admin("GET", "/admin/accounts"), 503, "overloaded_error")
    assert err["code"] == "store_unavailable"


async def test_a_bug_is_a_500_logged_with_its_traceback(
    admin: Admin, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a store outage: not a 503, not logged as one."""

    async def buggy(*args: Any) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(accounts, "list_accounts", buggy)
    with caplog.at_level("WARNING", logger="gateway.admin"):
        err = assert_error(await admin("GET", "/admin/accounts"), 500, "api_error")
    assert err["code"] == "internal_error"
    [record] = [r for r in caplog.records if r.name == "gateway.admin"]
    assert record.getMessage().startswith("admin.unexpected")
    assert record.exc_info is not None and record.exc_info[0] is KeyError


async def test_unknown_admin_path_is_404_in_shape(admin: Admin) -> None:
    assert_error(await admin("GET", "/admin/nothing/here"), 404, "not_found_error")
    assert_error(await admin("PUT", "/admin/keys/k_1"), 404, "not_found_error")


# ---- accounts ------------------------------------------------------------------------------


async def test_create_and_get_account(admin: Admin) -> None:
    reply = await admin("POST", "/admin/accounts", {"id": "alice", "balance": 10.5})
    assert reply.status == 201
    assert reply.json() == {"id": "alice", "balance": 10.5}
    reply = await admin("GET", "/admin/accounts/alice")
    assert reply.status == 200
    assert reply.json() == {"id": "alice", "balance": 10.5}


async def test_account_balance_defaults_to_zero(admin: Admin) -> None:
    reply = await admin("POST", "/admin/accounts", {"id": "bob"})
    assert reply.status == 201
    assert reply.json() == {"id": "bob", "balance": 0}


async def test_duplicate_account_is_409_and_keeps_the_balance(admin: Admin) -> None:
    await admin("POST", "/admin/accounts", {"id": "alice", "balance": 5})
    reply = await admin("POST", "/admin/accounts", {"id": "alice", "balance": 999})
    assert_error(reply, 409, "conflict_error")
    assert (await admin("GET", "/admin/accounts/alice")).json()["balance"] == 5


async def test_missing_account_is_404(admin: Admin) -> None:
    assert_error(await admin("GET", "/admin/accounts/nobody"), 404, "not_found_error")
    reply = await admin("POST", "/admin/accounts/nobody/topup", {"amount": 1})
    assert_error(reply, 404, "not_found_error")


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"",
        b"[1, 2]",
        b'"alice"',
        b'{"balance": 1}',
        b'{"id": "", "balance": 1}',
        b'{"id": 7, "balance": 1}',
        b'{"id": "has space", "balance": 1}',
        b'{"id": "alice", "balance": "10"}',
        b'{"id": "alice", "balance": true}',
        b'{"id": "alice", "balance": null}',
        b'{"id": "alice", "balance": 1e300}',
        b'{"id": "alice", "balanse": 1}',
    ],
)
async def test_bad_account_body_is_400(admin: Admin, store: Store, raw: bytes) -> None:
    reply = await admin("POST", "/admin/accounts", raw=raw)
    assert_error(reply, 400, "invalid_request_error")
    assert await store.get_account("alice") is None


async def test_topup_arithmetic_is_exact(admin: Admin, store: Store) -> None:
    await admin("POST", "/admin/accounts", {"id": "alice", "balance": 0})
    first = await admin("POST", "/admin/accounts/alice/topup", {"amount": 0.1})
    assert first.json() == {"id": "alice", "balance": 0.1}
    second = await admin("POST", "/admin/accounts/alice/topup", {"amount": 0.2})
    assert second.status == 200
    assert second.json() == {"id": "alice", "balance": 0.3}  # not 0.30000000000000004
    assert b'"balance":0.3}' in second.raw
    acct = await store.get_account("alice")
    assert acct is not None and acct.balance == 300_000
    negative = await admin("POST", "/admin/accounts/alice/topup", {"amount": -0.05})
    assert negative.json()["balance"] == 0.25


async def test_top_ups_never_take_a_balance_past_its_bound(admin: Admin, store: Store) -> None:
    """Each top-up is bounded, and so is the balance they add up to: before the bound, ten
    of the largest top-ups left a signed 64-bit integer (SQLite kept an inexact REAL, Redis
    refused the script with a 5xx)."""
    await admin("POST", "/admin/accounts", {"id": "alice", "balance": 10**12 - 1})
    reply = await admin("POST", "/admin/accounts/alice/topup", {"amount": 2})
    assert_error(reply, 400, "invalid_request_error")
    assert "amount" in reply.json()["error"]["message"]
    acct = await store.get_account("alice")
    assert acct is not None and acct.balance == (10**12 - 1) * 1_000_000  # unchanged
    assert (await admin("POST", "/admin/accounts/alice/topup", {"amount": 1})).status == 200
    low = await admin("POST", "/admin/accounts/alice/topup", {"amount": -(10**12)})
    assert low.json()["balance"] == 0
    deep = await admin("POST", "/admin/accounts/alice/topup", {"amount": -(10**12)})
    assert deep.status == 200 and deep.json()["balance"] == -(10**12)  # a correction, bounded
    past = await admin("POST", "/admin/accounts/alice/topup", {"amount": -1})
    assert_error(past, 400, "invalid_request_error")


@pytest.mark.parametrize("raw", [b"{}", b'{"amount": "5"}', b'{"amount": null}', b"nope"])
async def test_bad_topup_is_400(admin: Admin, raw: bytes) -> None:
    await admin("POST", "/admin/accounts", {"id": "alice", "balance": 1})
    assert_error(await admin("POST", "/admin/accounts/alice/topup", raw=raw), 400,
                 "invalid_request_error")  # fmt: skip
    assert (await admin("GET", "/admin/accounts/alice")).json()["balance"] == 1


async def test_balance_includes_requests_still_in_the_writer(
    admin: Admin, state: GatewayState
) -> None:
    await admin("POST", "/admin/accounts", {"id": "alice", "balance": 2})
    state.writer.submit(usage_record(1, "alice", cost=250_000))  # not yet written to the store
    assert (await admin("GET", "/admin/accounts/alice")).json()["balance"] == 1.75


async def test_topup_is_seen_by_this_instance_at_once(admin: Admin, state: GatewayState) -> None:
    await admin("POST", "/admin/accounts", {"id": "alice", "balance": 0})
    assert state.cache.balance("alice") == 0
    await admin("POST", "/admin/accounts/alice/topup", {"amount": 3})
    assert state.cache.balance("alice") == 3 * MICRO


# ---- keys ----------------------------------------------------------------------------------


async def create_key(admin: Admin, **body: Any) -> dict[str, Any]:
    body.setdefault("account", "alice")
    body.setdefault("group", "default")
    reply = await admin("POST", "/admin/keys", body)
    assert reply.status == 201, reply.raw
    return reply.json()  # type: ignore[no-any-return]


@pytest.fixture
async def alice(admin: Admin) -> None:
    assert (await admin("POST", "/admin/accounts", {"id": "alice", "balance": 10})).status == 201


@pytest.mark.usefixtures("alice")
async def test_create_key_shows_the_secret_once(
    admin: Admin, state: GatewayState, store: Store
) -> None:
    reply = await admin("POST", "/admin/keys", {"account": "alice", "name": "laptop"})
    assert reply.status == 201
    assert reply.headers["cache-control"] == "no-store"
    created = reply.json()
    secret = created["key"]
    assert re.fullmatch(r"sk-[A-Za-z0-9_-]{48}", secret)
    assert re.fullmatch(r"k_[0-9a-f]{12}", created["id"])
    assert created["account"] == "alice"
    assert created["group"] == "default"
    assert created["name"] == "laptop"
    assert created["status"] == "enabled"
    assert created["expires_at"] is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created["created_at"])
    assert created["hint"].startswith("sk-") and created["hint"].endswith(secret[-4:])
    assert secret not in created["hint"]

    # usable at once by this instance
    rec = state.cache.key(hash_key(secret))
    assert rec is not None and rec.id == created["id"]

    listed = await admin("GET", "/admin/keys")
    one = await admin("GET", f"/admin/keys/{created['id']}")
    for reply in (listed, one):
        assert reply.status == 200
        assert secret.encode() not in reply.raw
        assert secret[3:20].encode() not in reply.raw
    assert [k["id"] for k in listed.json()["data"]] == [created["id"]]
    shown = one.json()
    assert "key" not in shown
    assert shown == {k: v for k, v in created.items() if k != "key"}

    # nor does the store keep it
    stored = await store.load_keys()
    assert stored and all(secret not in repr(k) for k in stored)
    assert stored[0].key_hash == hash_key(secret)


@pytest.mark.usefixtures("alice")
async def test_two_keys_differ(admin: Admin) -> None:
    a = await create_key(admin)
    b = await create_key(admin)
    assert a["id"] != b["id"] and a["key"] != b["key"]


@pytest.mark.usefixtures("alice")
async def test_create_key_validation(admin: Admin, store: Store) -> None:
    reply = await admin("POST", "/admin/keys", {"account": "nobody", "group": "default"})
    assert_error(reply, 404, "not_found_error")
    for body in [
        {"account": "alice", "group": "gold"},
        {"account": "alice", "group": 3},
        {"group": "default"},
        {"account": "alice", "group": "default", "expires_at": "next tuesday"},
        {"account": "alice", "group": "default", "expires_at": 1893456000},
        {"account": "alice", "group": "default", "name": ["x"]},
        {"account": "alice", "group": "default", "secret": "sk-mine"},
    ]:
        assert_error(await admin("POST", "/admin/keys", body), 400, "invalid_request_error")
    assert_error(await admin("POST", "/admin/keys", raw=b"{"), 400, "invalid_request_error")
    assert await store.list_keys() == []


@pytest.mark.usefixtures("alice")
async def test_create_key_with_expiry_and_default_group(admin: Admin) -> None:
    reply = await admin(
        "POST", "/admin/keys", {"account": "alice", "expires_at": "2030-06-01T12:00:00+02:00"}
    )
    assert reply.status == 201
    assert reply.json()["expires_at"] == "2030-06-01T10:00:00Z"
    assert reply.json()["group"] == "default"


@pytest.mark.usefixtures("alice")
async def test_list_keys_by_account(admin: Admin) -> None:
    await admin("POST", "/admin/accounts", {"id": "bob", "balance": 1})
    a = await create_key(admin, account="alice")
    b = await create_key(admin, account="bob", group="vip")
    all_ids = {k["id"] for k in (await admin("GET", "/admin/keys")).json()["data"]}
    assert all_ids == {a["id"], b["id"]}
    bobs = (await admin("GET", "/admin/keys?account=bob")).json()["data"]
    assert [k["id"] for k in bobs] == [b["id"]]
    assert bobs[0]["group"] == "vip"
    assert (await admin("GET", "/admin/keys?account=carol")).json() == {"data": []}


@pytest.mark.usefixtures("alice")
async def test_patch_key(admin: Admin, state: GatewayState) -> None:
    created = await create_key(admin)
    path = f"/admin/keys/{created['id']}"
    secret_hash = hash_key(created["key"])

    reply = await admin("PATCH", path, {"status": "disabled"})
    assert reply.status == 200
    assert reply.json()["status"] == "disabled"
    assert "key" not in reply.json()
    cached = state.cache.key(secret_hash)
    assert cached is not None and cached.status == "disabled"

    reply = await admin("PATCH", path, {"expires_at": "2031-02-03T04:05:06Z", "group": "vip"})
    assert reply.json()["expires_at"] == "2031-02-03T04:05:06Z"
    assert reply.json()["group"] == "vip"
    assert (await admin("GET", path)).json()["expires_at"] == "2031-02-03T04:05:06Z"

    reply = await admin("PATCH", path, {"expires_at": None, "status": "enabled"})
    assert reply.json()["expires_at"] is None
    assert reply.json()["status"] == "enabled"
    shown = (await admin("GET", path)).json()
    assert shown["expires_at"] is None and shown["group"] == "vip"
    cached = state.cache.key(secret_hash)
    assert cached is not None and cached.expires_at is None and cached.group == "vip"


@pytest.mark.usefixtures("alice")
async def test_patch_key_validation(admin: Admin) -> None:
    created = await create_key(admin)
    path = f"/admin/keys/{created['id']}"
    for body in [
        {"status": "paused"},
        {"status": True},
        {"group": "gold"},
        {"expires_at": "soon"},
        {"account": "bob"},
        {"key": "sk-new"},
    ]:
        assert_error(await admin("PATCH", path, body), 400, "invalid_request_error")
    assert_error(await admin("PATCH", path, raw=b"[]"), 400, "invalid_request_error")
    assert (await admin("GET", path)).json() == {k: v for k, v in created.items() if k != "key"}
    reply = await admin("PATCH", "/admin/keys/k_missing", {"status": "disabled"})
    assert_error(reply, 404, "not_found_error")


@pytest.mark.usefixtures("alice")
async def test_delete_key(admin: Admin, state: GatewayState) -> None:
    created = await create_key(admin)
    path = f"/admin/keys/{created['id']}"
    assert state.cache.key(hash_key(created["key"])) is not None
    reply = await admin("DELETE", path)
    assert reply.status == 200
    assert reply.json() == {"id": created["id"], "deleted": True}
    assert state.cache.key(hash_key(created["key"])) is None
    assert_error(await admin("GET", path), 404, "not_found_error")
    assert_error(await admin("DELETE", path), 404, "not_found_error")
    assert (await admin("GET", "/admin/keys")).json() == {"data": []}


# ---- usage ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("alice")
async def test_usage_newest_first_with_limit(admin: Admin, store: Store) -> None:
    await admin("POST", "/admin/accounts", {"id": "bob", "balance": 1})
    await store.settle(
        [
            usage_record(1, "alice", cost=1_500_000, minutes=1),
            usage_record(2, "bob", cost=100_000, minutes=2),
            usage_record(3, "alice", cost=250_000, minutes=3),
        ]
    )
    data = (await admin("GET", "/admin/usage")).json()["data"]
    assert [r["request_id"] for r in data] == ["req-3", "req-2", "req-1"]
    newest = data[0]
    assert newest["time"] == "2030-01-01T00:03:00Z"
    assert newest["cost"] == 0.25
    assert newest["account"] == "alice"
    assert newest["channel"] == "oa-1"
    assert newest["prompt_tokens"] == 13 and newest["completion_tokens"] == 23
    assert newest["latency_ms"] == 103 and newest["status"] == 200
    assert newest["ip_range"] == "203.0.113.0/24"

    data = (await admin("GET", "/admin/usage?limit=2")).json()["data"]
    assert [r["request_id"] for r in data] == ["req-3", "req-2"]
    data = (await admin("GET", "/admin/usage?account=alice&limit=1")).json()["data"]
    assert [r["request_id"] for r in data] == ["req-3"]
    data = (await admin("GET", "/admin/usage?account=alice")).json()["data"]
    assert [r["request_id"] for r in data] == ["req-3", "req-1"]
    assert (await admin("GET", "/admin/accounts/alice")).json()["balance"] == 8.25


async def test_usage_limit_is_capped_at_1000(admin: Admin, store: Store) -> None:
    await admin("POST", "/admin/accounts", {"id": "alice", "balance": 1})
    await store.settle([usage_record(n, "alice", minutes=n) for n in range(1005)])
    assert len((await admin("GET", "/admin/usage")).json()["data"]) == 100
    assert len((await admin("GET", "/admin/usage?limit=5000")).json()["data"]) == 1000


@pytest.mark.parametrize("limit", ["0", "-3", "ten", "1.5"])
async def test_bad_usage_limit_is_400(admin: Admin, limit: str) -> None:
    reply = await admin("GET", f"/admin/usage?limit={limit}")
    assert_error(reply, 400, "invalid_request_error")


async def test_usage_includes_requests_still_in_the_writer(
    admin: Admin, state: GatewayState
) -> None:
    await admin("POST", "/admin/accounts", {"id": "alice", "balance": 1})
    state.writer.submit(usage_record(7, "alice", cost=10))
    data = (await admin("GET", "/admin/usage?account=alice")).json()["data"]
    assert [r["request_id"] for r in data] == ["req-7"]


async def test_usage_filters_and_pages_in_the_store(admin: Admin, store: Store) -> None:
    await admin("POST", "/admin/accounts", {"id": "alice", "balance": 1})
    await admin("POST", "/admin/accounts", {"id": "bob", "balance": 1})
    records = [usage_record(n, "alice" if n % 2 else "bob", minutes=n) for n in range(12)]
    for n, r in enumerate(records):
        r.key_id = f"k-{r.account}"
        r.model = "embed-small" if n % 3 == 0 else "chat-small"
        r.status = 429 if n % 4 == 0 else 200
    for r in records[6:10]:
        r.time = records[5].time  # five at one instant: pages must not skip or repeat them
    await store.settle(records)

    def ids(reply: Reply) -> list[str]:
        return [r["request_id"] for r in reply.json()["data"]]

    reply = await admin("GET", "/admin/usage?model=embed-small&limit=1000")
    assert ids(reply) == ["req-9", "req-6", "req-3", "req-0"]
    assert reply.json()["next_cursor"] is None and "x-next-cursor" not in reply.headers
    assert ids(await admin("GET", "/admin/usage?key=k-alice")) == [
        f"req-{n}" for n in (11, 9, 7, 5, 3, 1)
    ]
    assert ids(await admin("GET", "/admin/usage?account=bob&status=429")) == [
        "req-8",
        "req-4",
        "req-0",
    ]
    assert ids(await admin("GET", "/admin/usage?status=error&key=k-alice")) == []
    assert len(ids(await admin("GET", "/admin/usage?status=ok"))) == 9
    since, until = "2030-01-01T00:02:00Z", "2030-01-01T00:04:00%2B00:00"  # + as %2B
    assert ids(await admin("GET", f"/admin/usage?since={since}&until={until}")) == [
        "req-3",
        "req-2",
    ]
    assert len(ids(await admin("GET", "/admin/usage?since=2030-01-01&until=2030-01-02"))) == 12

    # pages of 3 across the five records of one instant: each record once, newest first (the
    # first page's body is the old shape: the cursor is in the header of every page)
    seen: list[str] = []
    cursor: str | None = ""
    while cursor is not None:
        reply = await admin("GET", f"/admin/usage?limit=3&cursor={cursor}")
        seen += ids(reply)
        assert reply.json().get("next_cursor", "-") in ("-", reply.headers.get("x-next-cursor"))
        cursor = reply.headers.get("x-next-cursor")
    everything = ids(await admin("GET", "/admin/usage?limit=1000"))
    assert seen == everything and len(set(seen)) == 12
    # the first page of the old shape: the body as it always was, the cursor in a header
    reply = await admin("GET", "/admin/usage?account=alice&limit=2")
    assert set(reply.json()) == {"data"}
    assert ids(reply) == ["req-11", "req-9"]
    cursor = reply.headers["x-next-cursor"]
    reply = await admin("GET", f"/admin/usage?account=alice&limit=2&cursor={cursor}")
    assert ids(reply) == ["req-7", "req-5"]
    assert reply.json()["next_cursor"] == reply.headers["x-next-cursor"]


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("status=teapot", "status"),
        ("status=99", "status"),
        ("status=600", "status"),
        ("since=yesterday", "since"),
        ("until=2030-13-01", "until"),
        ("since=2030-01-02&until=2030-01-01", "until"),
        ("cursor=not-a-cursor", "cursor"),
        ("cursor=WzEsMl0", "cursor"),  # [1,2] in base64url: a cursor of the other store kind
        ("cursor=WyJhIiwxXQ", "cursor"),  # ["a",1]
        ("limit=0&model=m", "limit"),
    ],
)
async def test_bad_usage_parameters_are_400_naming_the_parameter(
    admin: Admin, store: Store, query: str, param: str
) -> None:
    from gateway.store.sqlite import SQLiteStore

    if query == "cursor=WzEsMl0" and isinstance(store, SQLiteStore):
        query = "cursor=WzEsImEiXQ"  # [1,"a"]: a Redis cursor, refused by SQLite
    reply = await admin("GET", f"/admin/usage?{query}")
    err = assert_error(reply, 400, "invalid_request_error")
    assert err["message"].startswith(f"{param}:"), err


# ---- catalogue -----------------------------------------------------------------------------


async def test_models_and_channels_without_credentials(admin: Admin) -> None:
    models = await admin("GET", "/admin/models")
    assert models.status == 200
    (model,) = models.json()["data"]
    assert model["name"] == "chat-small"
    assert model["capabilities"] == ["chat"]
    assert model["price"]["input"] == 0.5

    channels = await admin("GET", "/admin/channels")
    assert channels.status == 200
    (channel,) = channels.json()["data"]
    assert channel["name"] == "oa-1" and channel["type"] == "openai"
    assert channel["models"] == ["chat-small"] and channel["groups"] == ["default"]
    assert "api_key" not in channel
    assert UPSTREAM_KEY.encode() not in channels.raw

    groups = (await admin("GET", "/admin/groups")).json()["data"]
    assert [g["name"] for g in groups] == ["default", "vip"]


# ---- end to end: a served gateway, its admin API and the command line on the same store ----


async def test_served_gateway_key_lifecycle(gateway: Any, tmp_path: Any) -> None:
    import asyncio

    import aiohttp
    import yaml

    from gateway.cli import main as cli_main
    from tests.plugins.servers import ADMIN_TOKEN

    admin_headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    chat = {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession(base_url=gateway.url) as http:

        async def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
            async with http.request(method, path, json=body, headers=admin_headers) as r:
                return r.status, await r.json(content_type=None)

        assert (await call("POST", "/admin/accounts", {"id": "carol", "balance": 5}))[0] == 201
        status, created = await call(
            "POST", "/admin/keys", {"account": "carol", "group": "default"}
        )
        assert status == 201
        client = {"authorization": f"Bearer {created['key']}"}

        async with http.post("/v1/chat/completions", json=chat, headers=client) as r:
            assert r.status == 200
            await r.read()
        status, usage = await call("GET", "/admin/usage?account=carol")
        assert status == 200
        (rec,) = usage["data"]
        assert rec["key_id"] == created["id"] and rec["model"] == "chat-small"
        assert rec["status"] == 200 and rec["endpoint"] == "chat"
        assert rec["cost"] > 0
        status, acct = await call("GET", "/admin/accounts/carol")
        assert acct["balance"] == pytest.approx(5 - rec["cost"], abs=1e-9)

        # disabled through the admin API: refused at once by this instance
        assert (await call("PATCH", f"/admin/keys/{created['id']}", {"status": "disabled"}))[0]
        async with http.post("/v1/chat/completions", json=chat, headers=client) as r:
            assert r.status == 401

        # enabled again through the command line, on the same store: the gateway follows
        config = tmp_path / "cli.yaml"
        config.write_text(yaml.safe_dump({
            "store": gateway.settings.store, "admin_token": "x" * 16, "groups": ["default", "vip"],
        }))  # fmt: skip
        rc = await asyncio.to_thread(cli_main, ["keys", "enable", created["id"], "--config",
                                                str(config)])  # fmt: skip
        assert rc == 0
        for _ in range(200):  # generous: the contract's one second, on a busy machine
            async with http.post("/v1/chat/completions", json=chat, headers=client) as r:
                await r.read()
                if r.status == 200:
                    break
            await asyncio.sleep(0.05)
        assert r.status == 200

        # admin bodies never 500, and the catalogue hides upstream credentials
        async with http.post("/admin/keys", data=b"{", headers=admin_headers) as r:
            assert r.status == 400
        async with http.get("/admin/channels", headers=admin_headers) as r:
            assert b"upstream-key" not in await r.read()
        async with http.get("/admin/keys") as r:
            assert r.status == 401
