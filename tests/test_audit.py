"""The audit log (gateway/operator/audit.py), in process on both stores: every kind of change
through the admin API, a console user's own routes and the command line writes exactly one
entry (who, what, which fields, when, from which /24, how it ended); secrets reach no entry,
not even the store's raw bytes; a refused change is recorded with its status, a request
refused before it was authenticated is not; GET /admin/audit filters and pages, and only the
admin reads it; the CSV opens in a spreadsheet as text; an older SQLite file gets the table."""

from __future__ import annotations

import csv
import io
import sqlite3
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from starlette.routing import Route

from gateway.cli import main as cli_main
from gateway.operator.admin import admin_routes
from gateway.store import Store
from gateway.store.audit import AuditEntry, AuditQuery
from gateway.store.backends import open_store
from gateway.store.redis_audit import AUDIT_KEY
from gateway.store.sqlite import SQLiteStore
from tests.plugins.inprocess import ADMIN_TOKEN, InProcess, drive, running
from tests.plugins.stores import ALL_BACKENDS, backend_url, sqlite_url
from tests.test_users_api import PASSWORD, Client, admin, gateway, new_user, signed_in

UPSTREAM_SECRET = "sk-upstream-audit-7f3a9c2e1b"
NEW_PASSWORD = "a whole new passphrase"


async def entries(app: InProcess, query: str = "") -> list[dict[str, Any]]:
    reply = await admin(app, "GET", f"/admin/audit{query}")
    assert reply.status == 200, reply.body
    found: list[dict[str, Any]] = reply.json()["data"]
    return found


async def one_new(app: InProcess, before: int) -> dict[str, Any]:
    """The one entry written since there were ``before``."""
    now = await entries(app, "?limit=1000")
    assert len(now) == before + 1, [e["action"] for e in now[: len(now) - before]]
    return now[0]


# (method, path, body, status, action, object id (None: the reply's), fields recorded)
ADMIN_CHANGES: list[tuple[str, str, Any, int, str, str | None, dict[str, Any]]] = [
    ("POST", "/admin/accounts", {"id": "acme", "balance": 5}, 201, "account.create", "acme",
     {"id": "acme", "balance": 5}),
    ("POST", "/admin/accounts/acme/topup", {"amount": 2.5}, 200, "account.credit", "acme",
     {"amount": 2.5}),
    ("POST", "/admin/keys", {"account": "acme", "group": "default", "name": "ci"}, 201,
     "key.create", None, {"account": "acme", "group": "default", "name": "ci"}),
    ("PATCH", "/admin/keys/{key}", {"status": "disabled"}, 200, "key.update", "{key}",
     {"status": "disabled"}),
    ("DELETE", "/admin/keys/{key}", None, 200, "key.delete", "{key}", {}),
    ("POST", "/admin/channels", {"name": "oa-2", "type": "openai", "base_url": "http://x.test/v1",
     "api_key": UPSTREAM_SECRET, "groups": ["default"], "models": ["chat-small"]}, 201,
     "channel.create", "oa-2", {"name": "oa-2", "type": "openai", "base_url": "http://x.test/v1",
     "api_key": "[secret]", "groups": ["default"], "models": ["chat-small"]}),
    ("PATCH", "/admin/channels/oa-2", {"weight": 3, "api_keys": [UPSTREAM_SECRET + "b"]}, 200,
     "channel.update", "oa-2", {"weight": 3, "api_keys": "[secret]"}),
    ("DELETE", "/admin/channels/oa-2", None, 200, "channel.delete", "oa-2", {}),
    ("POST", "/admin/models", {"name": "m-2", "capabilities": ["chat"], "price": {"input": 1}},
     201, "model.create", "m-2", {"name": "m-2", "capabilities": ["chat"],
     "price": {"input": 1}}),
    ("PATCH", "/admin/models/m-2", {"default_max_tokens": 99}, 200, "model.update", "m-2",
     {"default_max_tokens": 99}),
    ("DELETE", "/admin/models/m-2", None, 200, "model.delete", "m-2", {}),
    ("POST", "/admin/groups", {"name": "gold", "ratio": 2}, 201, "group.create", "gold",
     {"name": "gold", "ratio": 2}),
    ("PATCH", "/admin/groups/gold", {"ratio": 3}, 200, "group.update", "gold", {"ratio": 3}),
    ("DELETE", "/admin/groups/gold", None, 200, "group.delete", "gold", {}),
    ("POST", "/admin/users", {"username": "zed", "password": PASSWORD, "account": "acme"}, 201,
     "user.create", None, {"username": "zed", "password": "[secret]", "account": "acme"}),
    ("PATCH", "/admin/users/{user}", {"password": NEW_PASSWORD, "status": "disabled"}, 200,
     "user.update", "{user}", {"password": "[secret]", "status": "disabled"}),
    ("DELETE", "/admin/users/{user}", None, 200, "user.delete", "{user}", {}),
    ("POST", "/admin/redemptions", {"amount": 1, "count": 2}, 201, "redemption.create", "",
     {"amount": 1, "count": 2}),
    ("POST", "/admin/sessions/rotate", None, 200, "sessions.rotate", "", {}),
]  # fmt: skip


def test_every_admin_route_that_changes_something_is_in_the_table() -> None:
    """A mutating admin route added later gets its row above (and its action in
    ``admin_routes``); the channel test changes nothing."""
    changing = {
        (method, "/admin" + route.path.replace(":path}", "}"))
        for route in admin_routes()
        if isinstance(route, Route) and "{path:path}" not in route.path
        for method in route.methods or ()
        if method not in ("GET", "HEAD")
    }
    names = {"{key}": "{id}", "{user}": "{id}", "acme": "{id}", "oa-2": "{name}",
             "m-2": "{name}", "gold": "{name}"}  # fmt: skip
    tabled = set()
    for method, path, *_ in ADMIN_CHANGES:
        for given, param in names.items():
            path = path.replace(given, param)
        tabled.add((method, path))
    assert changing - tabled == {("POST", "/admin/channels/{name}/test")}


async def test_every_admin_change_writes_one_entry(store_url: str) -> None:
    async with gateway(store_url) as app:
        made: dict[str, str] = {}
        for method, path, body, status, action, object_id, fields in ADMIN_CHANGES:
            before = len(await entries(app, "?limit=1000"))
            reply = await admin(app, method, path.format(**made), body)
            assert reply.status == status, (path, reply.body)
            if action == "key.create":
                made["key"] = reply.json()["id"]
            if action == "user.create":
                made["user"] = reply.json()["id"]
            entry = await one_new(app, before)
            want_id = made[action.partition(".")[0]] if object_id is None else object_id
            assert entry["action"] == action
            assert entry["object_type"] == action.partition(".")[0]
            assert entry["object_id"] == want_id.format(**made)
            assert entry["fields"] == fields
            assert (entry["actor"], entry["via"], entry["status"]) == ("admin", "api", status)
            assert entry["ip_range"] == "127.0.0.0/24"
            assert entry["time"].endswith("Z") and entry["request_id"]
        # reads write nothing
        before = len(await entries(app, "?limit=1000"))
        for path in ("/admin/keys", "/admin/accounts/acme", "/admin/channels", "/admin/usage"):
            assert (await admin(app, "GET", path)).status == 200
        assert len(await entries(app, "?limit=1000")) == before


async def test_a_console_users_changes_are_its_own(store_url: str) -> None:
    async with gateway(store_url) as app:
        user = await new_user(app, "dana")
        codes = (await admin(app, "POST", "/admin/redemptions", {"amount": 3})).json()["data"]
        client = await signed_in(app, "dana")
        made = await client.call("POST", "/console/keys", {"group": "default", "name": "mine"})
        assert made.status == 201
        key_id, secret = made.json()["id"], made.json()["key"]
        steps = [
            ("PATCH", f"/console/keys/{key_id}", {"status": "disabled"}, 200, "key.update",
             key_id, {"status": "disabled"}),
            ("DELETE", f"/console/keys/{key_id}", None, 200, "key.delete", key_id, {}),
            ("POST", "/console/redeem", {"code": codes[0]["code"]}, 200, "account.redeem",
             "alice", {"code": "[secret]"}),
            ("POST", "/console/redeem", {"code": codes[0]["code"]}, 400, "account.redeem",
             "alice", {"code": "[secret]"}),  # used already: refused, and recorded
            ("POST", "/console/password", {"current": PASSWORD, "new": NEW_PASSWORD}, 200,
             "user.password", user["id"], {"current": "[secret]", "new": "[secret]"}),
        ]  # fmt: skip
        for method, path, body, status, action, object_id, fields in steps:
            before = len(await entries(app, "?limit=1000"))
            reply = await client.call(method, path, body)
            assert reply.status == status, reply.body
            entry = await one_new(app, before)
            assert (entry["action"], entry["object_id"], entry["fields"]) == (
                action, object_id, fields,
            )  # fmt: skip
            assert (entry["actor"], entry["via"], entry["status"]) == (
                "user:dana", "console", status,
            )  # fmt: skip
        mine = await entries(app, "?actor=user:dana")
        assert [e["action"] for e in mine][-1] == "key.create"
        assert mine[-1]["object_id"] == key_id
        text = orjson.dumps(await entries(app, "?limit=1000")).decode()
        for hidden in (secret, codes[0]["code"], PASSWORD, NEW_PASSWORD):
            assert hidden not in text


async def test_the_admins_console_session_is_the_admin_via_the_console(store_url: str) -> None:
    async with gateway(store_url) as app:
        client = Client(app)
        assert (await client.sign_in(token=ADMIN_TOKEN)).status == 200
        reply = await client.call("POST", "/admin/accounts", {"id": "via-console"})
        assert reply.status == 201
        [entry] = await entries(app, "?action=account.create")
        assert (entry["actor"], entry["via"], entry["object_id"]) == (
            "admin", "console", "via-console",
        )  # fmt: skip


async def test_refused_changes_are_recorded_and_unauthenticated_ones_are_not(
    store_url: str,
) -> None:
    async with gateway(store_url) as app:
        refused = [
            ("POST", "/admin/accounts", {"id": "alice"}, 409, "alice"),
            ("POST", "/admin/keys", {"account": "nobody", "group": "default"}, 404, ""),
            ("PATCH", "/admin/keys/k-none", {"status": "disabled"}, 404, "k-none"),
            ("DELETE", "/admin/channels/oa", None, 409, "oa"),  # the file's
            ("POST", "/admin/users", {"username": "x", "password": "short"}, 400, "x"),
        ]
        for method, path, body, status, object_id in refused:
            before = len(await entries(app, "?limit=1000"))
            reply = await admin(app, method, path, body)
            assert reply.status == status, reply.body
            entry = await one_new(app, before)
            assert (entry["status"], entry["object_id"]) == (status, object_id)
        assert "short" not in orjson.dumps(await entries(app)).decode()
        before = len(await entries(app, "?limit=1000"))
        for headers in ({"authorization": "Bearer wrong"}, {}):
            sent = {"content-type": "application/json", **headers}
            reply = await drive(app.app, "POST", "/admin/accounts", b'{"id": "x"}', sent)
            assert reply.status == 401
        client = Client(app)
        assert (await client.sign_in(token=ADMIN_TOKEN)).status == 200
        no_csrf = await client.call("POST", "/admin/accounts", {"id": "y"}, csrf=False)
        assert no_csrf.status == 403
        errors = await entries(app, "?status=error&limit=1000")
        assert len(await entries(app, "?limit=1000")) == before
        assert {e["status"] for e in errors} == {400, 404, 409}


async def test_only_the_admin_reads_the_audit_log(store_url: str) -> None:
    async with gateway(store_url) as app:
        await new_user(app, "dana")
        user = await signed_in(app, "dana")
        key = Client(app)
        assert (await key.sign_in(token="sk-alice-0000000000000001")).status == 200
        for client in (user, key):
            for path in ("/admin/audit", "/admin/audit.csv"):
                assert (await client.call("GET", path)).status == 401
        for path in ("/admin/audit", "/admin/audit.csv"):
            reply = await drive(app.app, "GET", path, b"", {"authorization": "Bearer sk-x"})
            assert reply.status == 401


async def test_filters_and_pages(store_url: str) -> None:
    async with gateway(store_url) as app:
        for i in range(7):
            assert (await admin(app, "POST", "/admin/accounts", {"id": f"a{i}"})).status == 201
        await admin(app, "POST", "/admin/groups", {"name": "g1"})
        await admin(app, "POST", "/admin/accounts/a3/topup", {"amount": 1})
        seen: list[str] = []
        cursor = ""
        while True:
            reply = await admin(app, "GET", f"/admin/audit?action=account&limit=3{cursor}")
            page = reply.json()
            seen += [e["object_id"] for e in page["data"]]
            assert reply.headers.get("x-next-cursor") == page["next_cursor"]
            if page["next_cursor"] is None:
                break
            cursor = f"&cursor={page['next_cursor']}"
        assert seen == ["a3", "a6", "a5", "a4", "a3", "a2", "a1", "a0"]
        assert [e["object_id"] for e in await entries(app, "?object=account:a3")] == ["a3", "a3"]
        assert [e["action"] for e in await entries(app, "?object=group")] == ["group.create"]
        assert len(await entries(app, "?actor=admin&action=account.create")) == 7
        assert await entries(app, "?actor=user") == []
        assert await entries(app, "?since=2999-01-01") == []
        for query, word in (("?cursor=nope", "cursor"), ("?status=abc", "status"),
                            ("?since=yesterday", "since"), ("?limit=0", "limit")):  # fmt: skip
            reply = await admin(app, "GET", f"/admin/audit{query}")
            assert reply.status == 400 and word in reply.json()["error"]["message"]


async def test_the_csv_opens_as_text_in_a_spreadsheet(store_url: str) -> None:
    async with gateway(store_url) as app:
        formula = '=HYPERLINK("http://evil.test","x")'
        assert (await admin(app, "POST", "/admin/accounts", {"id": formula})).status == 400
        await admin(app, "POST", "/admin/keys", {"account": "alice", "group": "default",
                                                 "name": "@SUM(1)"})  # fmt: skip
        reply = await admin(app, "GET", "/admin/audit.csv")
        assert reply.status == 200
        assert reply.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(reply.body.decode())))
        assert [r["action"] for r in rows] == ["key.create", "account.create"]
        assert rows[1]["object_id"] == "'" + formula
        assert rows[1]["status"] == "400"
        assert orjson.loads(rows[0]["fields"])["name"] == "@SUM(1)"  # inside a JSON cell
        assert not any(v.startswith(("=", "+", "-", "@")) for r in rows for v in r.values())


async def test_secrets_never_reach_the_stored_entries(store_url: str, tmp_path: Path) -> None:
    async with gateway(store_url) as app:
        named = {"account": "alice", "group": "default", "name": UPSTREAM_SECRET}
        key = (await admin(app, "POST", "/admin/keys", named)).json()["key"]
        channel = {"name": "oa-9", "type": "openai", "base_url": "http://x.test/v1",
                   "api_key": UPSTREAM_SECRET, "groups": ["default"],
                   "models": ["chat-small"]}  # fmt: skip
        await admin(app, "POST", "/admin/channels", channel)
        erin = {"username": "erin", "password": PASSWORD, "account": "alice"}
        await admin(app, "POST", "/admin/users", erin)
        codes = (await admin(app, "POST", "/admin/redemptions", {"amount": 1})).json()["data"]
        client = await signed_in(app, "erin")
        assert (await client.call("POST", "/console/redeem", {"code": codes[0]["code"]})).ok
        store = app.services.store
        if isinstance(store, SQLiteStore):
            with sqlite3.connect(store.path) as conn:
                raw = b"\n".join(str(r).encode() for r in conn.execute("SELECT * FROM audit"))
            conn.close()
        else:
            client_ = redis.Redis.from_url(store_url)
            raw = b"\n".join(v[1][b"e"] for v in client_.xrange(AUDIT_KEY))
            client_.close()
        assert b"key.create" in raw and b"account.redeem" in raw  # the dump does hold them
        for secret in (key, UPSTREAM_SECRET, PASSWORD, codes[0]["code"], ADMIN_TOKEN):
            assert secret.encode() not in raw
        assert b"[redacted]" in raw  # the key's name looked like a credential


async def test_an_sqlite_file_without_the_table_gets_it(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    s = SQLiteStore(sqlite_url(path))
    await s.open()
    await s.create_account("alice", 5)
    await s.close()
    with sqlite3.connect(path) as conn:  # as a version before the audit log left it
        conn.execute("DROP TABLE audit")
    conn.close()
    async with running(sqlite_url(path)) as app:
        assert (await admin(app, "POST", "/admin/accounts/alice/topup", {"amount": 1})).ok
        [entry] = await entries(app)
        assert (entry["action"], entry["object_id"]) == ("account.credit", "alice")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM audit").fetchone() == (1,)
        assert conn.execute("SELECT balance FROM accounts WHERE id='alice'").fetchone() == (
            1_000_005,
        )
    conn.close()


def test_command_line_changes_are_recorded_as_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "gw.db"
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"store: {sqlite_url(db)}\nadmin_token: test-admin-token\ngroups: [default]\nmodels: []\n"
        "channels: []\naccounts: [{id: alice, balance: 1}]\n"
    )
    monkeypatch.setenv("USER", "ops")
    monkeypatch.setenv("LOGNAME", "ops")
    run = [
        ["accounts", "topup", "alice", "2"],
        ["keys", "create", "--account", "alice", "--name", "=1+1"],
        ["accounts", "topup", "nobody", "2"],  # refused: recorded with its status
        ["keys", "list"],  # a read: not recorded
    ]
    for argv in run:
        cli_main(["--config", str(config), *argv])
    secret = [w for w in capsys.readouterr().out.split() if w.startswith("sk-")][0]
    assert cli_main(["--config", str(config), "--json", "audit", "list"]) == 0
    data = orjson.loads(capsys.readouterr().out)["data"]
    assert [(e["action"], e["status"], e["actor"], e["via"]) for e in data] == [
        ("account.credit", 404, "cli:ops", "cli"),
        ("key.create", 200, "cli:ops", "cli"),
        ("account.credit", 200, "cli:ops", "cli"),
    ]
    assert data[1]["object_id"].startswith("k_") and data[1]["fields"]["name"] == "=1+1"
    assert data[2]["fields"] == {"id": "alice", "amount": 2.0}
    assert secret not in orjson.dumps(data).decode()
    assert cli_main(["--config", str(config), "audit", "list", "--csv", "--action", "key"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["action"] for r in rows] == ["key.create"]
    assert cli_main(["--config", str(config), "audit", "list", "--actor", "admin"]) == 0
    assert capsys.readouterr().out.strip() == "no audit entries"


async def test_a_write_the_store_refuses_is_logged_and_the_change_answered(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async with gateway(store_url) as app:
        store = app.services.store

        async def refuse(entry: AuditEntry) -> None:
            raise OSError("disk full")

        monkeypatch.setattr(store, "add_audit", refuse)
        reply = await admin(app, "POST", "/admin/accounts", {"id": "still-made"})
        assert reply.status == 201
        assert (await admin(app, "GET", "/admin/accounts/still-made")).status == 200
        assert "audit.write_failed action=account.create" in caplog.text


@pytest.fixture(params=ALL_BACKENDS)
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """On a Redis Cluster too: the log is one stream, in one slot."""
    s = open_store(backend_url(request, tmp_path))
    await s.open()
    try:
        yield s
    finally:
        await s.close()


def an_entry(n: int, actor: str = "admin") -> AuditEntry:
    from datetime import UTC, datetime, timedelta

    at = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=n)
    return AuditEntry(at, actor, "key.update", "key", f"k{n}", {"n": n}, "10.0.0.0/24", 200)


async def test_the_store_pages_newest_first_and_keeps_a_bounded_log(
    any_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gateway.store.sqlite_audit.AUDIT_KEEP", 50)
    monkeypatch.setattr("gateway.store.redis_audit.AUDIT_KEEP", 50)
    for n in range(400):
        await any_store.add_audit(an_entry(n, "user:dana" if n % 3 == 0 else "admin"))
    seen: list[str] = []
    query = AuditQuery()
    while True:
        page = await any_store.audit_page(query, 40)
        seen += [e.object_id for e in page.entries]
        if page.next is None:
            break
        query = AuditQuery(after=page.next)
    # the newest 50 at least, never every one (Redis trims whole nodes of its stream)
    assert seen[:50] == [f"k{n}" for n in range(399, 349, -1)]
    assert 50 <= len(seen) <= 200 and seen == sorted(seen, key=lambda i: -int(i[1:]))
    mine = await any_store.audit_page(AuditQuery(actor="user"), 100)
    assert mine.entries and {e.actor for e in mine.entries} == {"user:dana"}
    assert mine.entries[0] == an_entry(399, "user:dana")  # every field round-trips


async def test_a_sign_up_is_the_new_users_own(store_url: str) -> None:
    body = {"username": "newcomer", "password": PASSWORD}
    async with gateway(store_url, console={"registration": "open"}) as app:
        made = await Client(app).call("POST", "/console/users", body)
        assert made.status == 201
        assert (await Client(app).call("POST", "/console/users", body)).status == 409
        [entry] = await entries(app)  # the refused one named no user: not recorded
        assert (entry["actor"], entry["action"], entry["via"], entry["status"]) == (
            "user:newcomer", "user.register", "console", 201,
        )  # fmt: skip
        assert entry["object_id"] == made.json()["id"]
        assert entry["fields"] == {"username": "newcomer", "password": "[secret]"}
