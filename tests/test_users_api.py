"""Users, their keys and top-up (CONTRACT §5b), every row of its tables, in process on both
stores: the admin's users and redemption codes; a user's sign-in, keys, redeem and password
change through /console with the CSRF header on every change; sign-up when registration is
open; a disabled user's sessions ending and keys answering 401; a key made by a user working
like any other; 20 redemptions of one code at once across two instances crediting it once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest

from gateway.store import MICRO
from tests.plugins.inprocess import (
    ADMIN_TOKEN,
    KEYS,
    InProcess,
    Reply,
    Scripted,
    drive,
    running,
)
from tests.test_pipeline import openai_reply

GROUPS = ["default", {"name": "vip", "ratio": 1.5}]
CHAT = {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}]}
PASSWORD = "correct horse battery"


class Client:
    """One browser: the console's cookie and CSRF token, kept between requests."""

    def __init__(self, app: InProcess) -> None:
        self.app = app
        self.cookie: str | None = None
        self.csrf = ""

    async def call(
        self, method: str, path: str, body: Any = None, csrf: bool = True, **headers: str
    ) -> Reply:
        sent = {"content-type": "application/json", **headers}
        if self.cookie:
            sent["cookie"] = f"gw_console={self.cookie}"
        if csrf and self.csrf and method != "GET":
            sent["x-console-csrf"] = self.csrf
        raw = b"" if body is None else orjson.dumps(body)
        reply = await drive(self.app.app, method, path, raw, sent)
        found = reply.headers.get("set-cookie", "")
        if found.startswith("gw_console="):
            value = found.split(";", 1)[0].split("=", 1)[1].strip('"')
            self.cookie = value or None
        return reply

    async def sign_in(self, **body: str) -> Reply:
        reply = await self.call("POST", "/console/session", body)
        if reply.status == 200:
            self.csrf = reply.json()["csrf"]
        return reply


async def admin(app: InProcess, method: str, path: str, body: Any = None) -> Reply:
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"}
    return await drive(app.app, method, path, b"" if body is None else orjson.dumps(body), headers)


async def chat(app: InProcess, key: str, tokens: tuple[int, int] = (7, 3)) -> Reply:
    app.upstream.answer("oa", Scripted.json(openai_reply("hello", *tokens)))
    reply = await app.post("/v1/chat/completions", CHAT, key=key)
    if reply.status != 200:
        app.upstream.scripts["http://oa.test"].clear()  # refused before the upstream
    return reply


async def new_user(
    app: InProcess, username: str, account: str = "alice", groups: list[str] | None = None
) -> dict[str, Any]:
    body = {"username": username, "password": PASSWORD, "account": account}
    body["groups"] = groups if groups is not None else ["default"]  # type: ignore[assignment]
    reply = await admin(app, "POST", "/admin/users", body)
    assert reply.status == 201, reply.body
    made: dict[str, Any] = reply.json()
    return made


async def signed_in(app: InProcess, username: str) -> Client:
    client = Client(app)
    reply = await client.sign_in(username=username, password=PASSWORD)
    assert reply.status == 200, reply.body
    assert reply.json() == {"role": "user", "csrf": client.csrf}
    assert client.cookie
    return client


@contextlib.asynccontextmanager
async def gateway(store_url: str, **overrides: Any) -> AsyncIterator[InProcess]:
    async with running(store_url, groups=GROUPS, **overrides) as app:
        yield app


async def test_the_admin_manages_users(store_url: str) -> None:
    async with gateway(store_url) as app:
        made = await new_user(app, "Dana", groups=["default", "vip"])
        assert set(made) == {"id", "username", "account", "groups", "status", "created_at"}
        assert (made["username"], made["account"], made["groups"], made["status"]) == (
            "Dana", "alice", ["default", "vip"], "enabled",
        )  # fmt: skip
        assert PASSWORD not in str(made)
        for body, status, words in (
            ({"username": "dana", "password": PASSWORD, "account": "alice"}, 409, "taken"),
            ({"username": "x", "password": PASSWORD, "account": "alice"}, 400, "username"),
            ({"username": "erin", "password": "short", "account": "alice"}, 400, "password"),
            ({"username": "erin", "password": PASSWORD, "account": "nobody"}, 404, "nobody"),
            ({"username": "erin", "password": PASSWORD, "account": "alice", "groups": ["gold"]},
             400, "groups[0]"),
            ({"username": "erin", "password": PASSWORD, "account": "alice", "role": "x"},
             400, "role"),
        ):  # fmt: skip
            reply = await admin(app, "POST", "/admin/users", body)
            assert reply.status == status, (body, reply.body)
            assert words in reply.json()["error"]["message"]
        listed = (await admin(app, "GET", "/admin/users")).json()["data"]
        assert listed == [made]
        reply = await admin(app, "PATCH", f"/admin/users/{made['id']}", {"groups": ["vip"]})
        assert (reply.status, reply.json()["groups"]) == (200, ["vip"])
        reply = await admin(app, "PATCH", f"/admin/users/{made['id']}", {"username": "z"})
        assert reply.status == 400
        reply = await admin(app, "PATCH", "/admin/users/u_nobody", {"status": "disabled"})
        assert reply.status == 404
        reply = await drive(app.app, "GET", "/admin/users", b"", {})
        assert reply.status == 401


async def test_a_user_signs_in_and_the_admin_and_key_sign_ins_still_work(store_url: str) -> None:
    async with gateway(store_url) as app:
        await new_user(app, "dana")
        client = await signed_in(app, "DANA")  # a username in any case
        me = (await client.call("GET", "/console/me")).json()
        assert (me["role"], me["user"]["username"], me["groups"]) == ("user", "dana", ["default"])
        assert me["balance"] == 10.0  # alice's
        for body in (
            {"username": "dana", "password": "wrong password"},
            {"username": "nobody", "password": PASSWORD},
            {"username": "dana", "password": 12345678},
        ):
            reply = await Client(app).sign_in(**body)  # type: ignore[arg-type]
            assert reply.status == 401, body
            assert reply.json()["error"]["code"] == "invalid_credentials"
        admin_client, key_client = Client(app), Client(app)
        assert (await admin_client.sign_in(token=ADMIN_TOKEN)).json()["role"] == "admin"
        assert (await key_client.sign_in(token=KEYS["alice"])).json()["role"] == "key"
        assert (await admin_client.call("GET", "/admin/users")).status == 200
        # a user is not the admin, nor a key: its session opens no admin route
        assert (await client.call("GET", "/admin/users")).status == 401
        assert (await key_client.call("GET", "/console/keys")).status == 401
        reply = await client.call("DELETE", "/console/session")
        assert reply.status == 200 and client.cookie is None


async def test_a_user_makes_keys_in_its_groups_only_and_they_work_everywhere(
    store_url: str,
) -> None:
    async with gateway(store_url) as app:
        dana = await new_user(app, "dana")
        client = await signed_in(app, "dana")
        reply = await client.call("POST", "/console/keys", {"group": "vip"})
        assert reply.status == 403 and reply.json()["error"]["code"] == "group_not_allowed"
        body = {"group": "default", "name": "laptop", "quota": 1, "allowed_ips": ["127.0.0.0/8"]}
        reply = await client.call("POST", "/console/keys", body)
        assert reply.status == 201, reply.body
        made = reply.json()
        assert made["key"].startswith("sk-") and made["owner"] == dana["id"]
        assert (made["account"], made["group"], made["quota"]) == ("alice", "default", 1.0)
        listed = (await client.call("GET", "/console/keys")).json()["data"]
        assert [k["id"] for k in listed] == [made["id"]] and "key" not in listed[0]
        # the key works like any other: chat, the model list, the messages protocol
        assert (await chat(app, made["key"])).status == 200
        models = await app.get("/v1/models", authorization=f"Bearer {made['key']}")
        assert models.status == 200 and "chat-small" in str(models.json())
        app.upstream.answer("oa", Scripted.json(openai_reply("hi")))
        reply = await app.post(
            "/v1/messages",
            {
                "model": "chat-small",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "x"}],
            },
            key=made["key"],
        )
        assert reply.status == 200 and reply.json()["type"] == "message"
        await app.settled()
        records = await app.services.store.usage("alice", 5)
        assert [r.key_id for r in records[:2]] == [made["id"], made["id"]]
        usage = (await client.call("GET", "/console/usage")).json()
        assert {r["key_id"] for r in usage["records"]} == {made["id"]}
        assert len(usage["records"]) == 2  # not k-alice's, though the account is shared
        keyed = (await client.call("GET", f"/console/usage?key={made['id']}")).json()
        assert len(keyed["records"]) == 2 and keyed["daily"][0]["requests"] == 2
        assert (await client.call("GET", "/console/usage?key=k-alice")).status == 404
        listed = (await client.call("GET", "/console/keys")).json()["data"]
        assert listed[0]["spent"] > 0
        # the admin sees whose it is
        admins = (await admin(app, "GET", "/admin/keys")).json()["data"]
        assert {k["id"]: k["owner"] for k in admins}[made["id"]] == dana["id"]


async def test_another_users_key_is_404_and_every_change_needs_the_csrf_header(
    store_url: str,
) -> None:
    async with gateway(store_url) as app:
        await new_user(app, "dana")
        await new_user(app, "erin")
        dana, erin = await signed_in(app, "dana"), await signed_in(app, "erin")
        made = (await dana.call("POST", "/console/keys", {"group": "default"})).json()
        path = f"/console/keys/{made['id']}"
        for method, body in (("PATCH", {"status": "disabled"}), ("DELETE", None)):
            for who, key_path in ((erin, path), (dana, "/console/keys/k-alice")):
                reply = await who.call(method, key_path, body)
                assert reply.status == 404, (method, key_path, reply.body)
        assert [k["id"] for k in (await erin.call("GET", "/console/keys")).json()["data"]] == []
        # without the header: 403, and nothing changes
        for method, route, body in (
            ("POST", "/console/keys", {"group": "default"}),
            ("PATCH", path, {"status": "disabled"}),
            ("DELETE", path, None),
            ("POST", "/console/redeem", {"code": "GW-0000"}),
            ("POST", "/console/password", {"current": PASSWORD, "new": "another password"}),
        ):
            reply = await dana.call(method, route, body, csrf=False)
            assert reply.status == 403 and reply.json()["error"]["code"] == "csrf", route
        keys = (await dana.call("GET", "/console/keys")).json()["data"]
        assert [(k["id"], k["status"]) for k in keys] == [(made["id"], "enabled")]
        assert (await signed_in(app, "dana")).cookie  # the password did not change
        # with it: the owner changes its key, then deletes it
        reply = await dana.call("PATCH", path, {"status": "disabled", "name": "old"})
        assert (reply.status, reply.json()["status"]) == (200, "disabled")
        assert (await chat(app, made["key"])).status == 401
        assert (await dana.call("PATCH", path, {"group": "vip"})).status == 400
        assert (await dana.call("DELETE", path)).status == 200
        assert await app.services.store.get_key(made["id"]) is None


async def test_codes_top_up_once_and_the_402_says_where(store_url: str) -> None:
    async with gateway(store_url) as app:
        assert (await admin(app, "POST", "/admin/accounts", {"id": "poor", "balance": 0})).ok
        await new_user(app, "dana", account="poor")
        client = await signed_in(app, "dana")
        key = (await client.call("POST", "/console/keys", {"group": "default"})).json()["key"]
        reply = await chat(app, key)
        assert reply.status == 402
        assert "top up in the console" in reply.json()["error"]["message"]
        soon = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
        reply = await admin(app, "POST", "/admin/redemptions", {"amount": 2.5, "count": 2})
        assert reply.status == 201
        codes = reply.json()["data"]
        assert [set(c) for c in codes] == [{"code", "amount"}] * 2
        assert [c["amount"] for c in codes] == [2.5, 2.5]
        expiring = await admin(app, "POST", "/admin/redemptions", {"amount": 1, "expires_at": soon})
        short = expiring.json()["data"][0]["code"]
        reply = await client.call("POST", "/console/redeem", {"code": codes[0]["code"].lower()})
        assert reply.json() == {"balance": 2.5}
        for code, words in (
            (codes[0]["code"], "used"),
            ("GW-AAAA-BBBB-CCCC-DDDD", "not a redemption code"),
        ):
            reply = await client.call("POST", "/console/redeem", {"code": code})
            assert reply.status == 400 and words in reply.json()["error"]["message"]
        await asyncio.sleep(2.1)
        reply = await client.call("POST", "/console/redeem", {"code": short})
        assert reply.status == 400 and "expired" in reply.json()["error"]["message"]
        assert (await app.services.store.get_account("poor")).balance == 2_500_000  # type: ignore[union-attr]
        assert (await chat(app, key)).status == 200
        listed = (await admin(app, "GET", "/admin/redemptions")).json()["data"]
        assert [c["status"] for c in listed] == ["used", "unused", "expired"]
        used = listed[0]
        assert (used["account"], used["amount"]) == ("poor", 2.5)
        assert used["user"] and used["used_at"] and used["hint"].startswith("GW-…")
        assert codes[0]["code"] not in str(listed) and codes[1]["code"] not in str(listed)
        unused = (await admin(app, "GET", "/admin/redemptions?status=unused")).json()["data"]
        assert [c["id"] for c in unused] == [listed[1]["id"]]
        for body in ({"amount": 0}, {"amount": 1, "count": 1001}, {"count": 2},
                     {"amount": 1, "expires_at": "2000-01-01T00:00:00Z"}):  # fmt: skip
            assert (await admin(app, "POST", "/admin/redemptions", body)).status == 400, body


async def test_a_user_changes_its_password(store_url: str) -> None:
    async with gateway(store_url) as app:
        await new_user(app, "dana")
        client = await signed_in(app, "dana")
        reply = await client.call(
            "POST", "/console/password", {"current": "not it at all", "new": "a new password"}
        )
        assert reply.status == 400 and reply.json()["error"]["code"] == "wrong_password"
        reply = await client.call("POST", "/console/password", {"current": PASSWORD, "new": "x"})
        assert reply.status == 400  # too short
        reply = await client.call(
            "POST", "/console/password", {"current": PASSWORD, "new": "a new password"}
        )
        assert reply.json() == {"changed": True}
        assert (await Client(app).sign_in(username="dana", password=PASSWORD)).status == 401
        assert (await Client(app).sign_in(username="dana", password="a new password")).ok


async def test_registration_is_refused_when_closed_and_makes_an_account_when_open(
    store_url: str,
) -> None:
    body = {"username": "newcomer", "password": PASSWORD}
    async with gateway(store_url) as app:  # closed by default
        assert (await Client(app).call("GET", "/console/registration")).json() == {
            "registration": "closed"
        }
        reply = await Client(app).call("POST", "/console/users", body)
        assert reply.status == 403 and reply.json()["error"]["code"] == "registration_closed"
        assert await app.services.store.find_user("newcomer") is None
    console = {"registration": "open", "default_groups": ["default", "vip"]}
    async with gateway(store_url, console=console) as app:
        assert (await Client(app).call("GET", "/console/registration")).json() == {
            "registration": "open"
        }
        reply = await Client(app).call("POST", "/console/users", body)
        assert reply.status == 201, reply.body
        made = reply.json()
        assert made["account"] == made["id"] and made["groups"] == ["default", "vip"]
        assert (await app.services.store.get_account(made["account"])).balance == 0  # type: ignore[union-attr]
        assert (await Client(app).call("POST", "/console/users", body)).status == 409
        reply = await Client(app).call("POST", "/console/users", {"username": "x"})
        assert reply.status == 400
        client = await signed_in(app, "newcomer")
        key = (await client.call("POST", "/console/keys", {"group": "vip"})).json()["key"]
        assert (await chat(app, key)).status == 402  # its own account, at 0


async def test_a_disabled_user_is_signed_out_and_its_keys_answer_401(store_url: str) -> None:
    async with gateway(store_url) as app:
        dana = await new_user(app, "dana")
        client = await signed_in(app, "dana")
        key = (await client.call("POST", "/console/keys", {"group": "default"})).json()["key"]
        assert (await chat(app, key)).status == 200
        path = f"/admin/users/{dana['id']}"
        assert (await admin(app, "PATCH", path, {"status": "disabled"})).status == 200
        assert (await client.call("GET", "/console/keys")).status == 401
        assert (await client.call("GET", "/console/me")).status == 401
        assert (await chat(app, key)).status == 401
        assert (await Client(app).sign_in(username="dana", password=PASSWORD)).status == 401
        assert (await admin(app, "PATCH", path, {"status": "enabled"})).status == 200
        assert (await chat(app, key)).status == 200  # its keys work again
        assert (await client.call("GET", "/console/keys")).status == 401  # that session ended
        fresh = await signed_in(app, "dana")  # a new one, even in the same second
        assert (await fresh.call("GET", "/console/keys")).status == 200
        # deleted: its keys with it
        reply = await admin(app, "DELETE", path)
        assert reply.status == 200 and len(reply.json()["keys"]) == 1
        assert (await chat(app, key)).status == 401
        assert (await fresh.call("GET", "/console/keys")).status == 401


async def test_the_model_square_shows_each_groups_price(store_url: str) -> None:
    async with gateway(store_url) as app:
        await new_user(app, "dana", groups=["default", "vip"])
        client = await signed_in(app, "dana")
        square = (await client.call("GET", "/console/square")).json()
        assert square["groups"] == ["default", "vip"]
        assert square["ratios"] == {"default": 1.0, "vip": 1.5}
        models = {m["name"]: m for m in square["models"]}
        assert models["chat-small"]["groups"] == ["default", "vip"]
        assert models["chat-small"]["prices"]["vip"]["input"] == 1.5
        assert models["chat-small"]["prices"]["default"]["output"] == 2.0
        # the cache prices as billed: unset, with no table row, the input's (x the ratio)
        vip = models["chat-small"]["prices"]["vip"]
        assert (vip["cache_read"], vip["cache_write"], vip["cache_write_1h"]) == (1.5, 1.5, 1.5)
        assert models["chat-small"]["price"]["cache_read"] is None  # as configured
        assert models["vip-model"]["groups"] == ["vip"]
        only = (await client.call("GET", "/console/square?group=default")).json()
        assert "vip-model" not in {m["name"] for m in only["models"]}
        assert (await client.call("GET", "/console/square?group=gold")).status == 404


async def test_twenty_redeem_one_code_at_once_on_two_instances(store_url: str) -> None:
    async with gateway(store_url) as a, gateway(store_url) as b:
        people = []
        for i in range(4):
            account = f"acct-{i}"
            assert (await admin(a, "POST", "/admin/accounts", {"id": account, "balance": 0})).ok
            people.append(await new_user(a, f"person-{i}", account=account))
        await b.services.cache.refresh()
        clients = [await signed_in(a if i % 2 else b, f"person-{i}") for i in range(4)]
        code = (await admin(a, "POST", "/admin/redemptions", {"amount": 3})).json()["data"][0]
        replies = await asyncio.gather(
            *(
                clients[i % 4].call("POST", "/console/redeem", {"code": code["code"]})
                for i in range(20)
            )
        )
        statuses = sorted(r.status for r in replies)
        assert statuses == [200] + [400] * 19, [r.body for r in replies]
        (won,) = [r for r in replies if r.status == 200]
        assert won.json() == {"balance": 3.0}
        balances = await a.services.store.load_balances()
        assert sum(balances[f"acct-{i}"] for i in range(4)) == 3 * MICRO
        (listed,) = (await admin(b, "GET", "/admin/redemptions")).json()["data"]
        assert listed["status"] == "used" and balances[listed["account"]] == 3 * MICRO


@pytest.mark.parametrize("path", ["/console/keys", "/console/redeem", "/console/password"])
async def test_the_users_routes_need_a_user(store_url: str, path: str) -> None:
    async with gateway(store_url) as app:
        assert (
            await Client(app).call("GET" if path.endswith("keys") else "POST", path)
        ).status == 401


async def test_the_console_modules_are_served_and_write_no_markup(store_url: str) -> None:
    async with gateway(store_url) as app:
        for name in ("app.js", "ui.js", "people.js", "square.js", "channels.js"):
            reply = await app.get(f"/console/assets/{name}")
            assert reply.status == 200 and "javascript" in reply.headers["content-type"]
            assert b".innerHTML" not in reply.body  # data goes in as text, never as markup
            assert b"localStorage" not in reply.body and b"sessionStorage" not in reply.body


async def test_disabling_a_user_on_one_instance_holds_on_another_within_a_second(
    store_url: str,
) -> None:
    async with gateway(store_url) as a, gateway(store_url) as b:
        dana = await new_user(a, "dana")
        await b.services.cache.refresh()
        on_b = await signed_in(b, "dana")
        key = (await on_b.call("POST", "/console/keys", {"group": "default"})).json()["key"]
        await a.services.cache.refresh()
        assert (await chat(a, key)).status == 200
        assert (await admin(a, "PATCH", f"/admin/users/{dana['id']}", {"status": "disabled"})).ok
        loop = asyncio.get_running_loop()
        start = loop.time()
        while (await on_b.call("GET", "/console/keys")).status != 401:
            assert loop.time() - start < 1.5, "B still serves the disabled user's session"
            await asyncio.sleep(0.02)
        assert (await chat(b, key)).status == 401  # and its key, on B too
        assert (await admin(a, "PATCH", f"/admin/users/{dana['id']}", {"status": "enabled"})).ok
        await b.services.cache.refresh()
        assert (await chat(b, key)).status == 200
        assert (await on_b.call("GET", "/console/keys")).status == 401  # ended for good


async def test_every_refused_user_sign_in_goes_through_the_limiters_hook(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``console.users.failed_sign_in`` sees each refusal (a wrong password, an unknown user, a
    wrong current password) and may answer instead; a sign-in that succeeds never reaches it."""
    from starlette.responses import Response

    from gateway.operator.console import users as console_users

    seen: list[str] = []

    async def limiter(request: Any, username: str) -> Response | None:
        seen.append(username)
        return Response(status_code=429, headers={"retry-after": "60"}) if len(seen) > 2 else None

    monkeypatch.setattr(console_users, "failed_sign_in", limiter)
    async with gateway(store_url) as app:
        await new_user(app, "dana")
        client = await signed_in(app, "dana")
        assert seen == []
        assert (await Client(app).sign_in(username="dana", password="wrong one!")).status == 401
        assert (await Client(app).sign_in(username="nobody", password=PASSWORD)).status == 401
        body = {"current": "not mine at all", "new": "another password"}
        reply = await client.call("POST", "/console/password", body)
        assert (reply.status, reply.headers["retry-after"]) == (429, "60")
        assert seen == ["dana", "nobody", "dana"]


async def test_a_store_that_fails_is_a_503_for_a_user(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from redis.exceptions import ConnectionError as RedisConnectionError

    async with gateway(store_url) as app:
        await new_user(app, "dana")
        client = await signed_in(app, "dana")

        async def away(*args: Any, **kwargs: Any) -> Any:
            raise RedisConnectionError("gone")

        monkeypatch.setattr(app.services.store, "list_keys", away)
        reply = await client.call("GET", "/console/keys")
        assert (reply.status, reply.json()["error"]["code"]) == (503, "store_unavailable")
