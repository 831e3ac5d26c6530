"""The console's server side (CONTRACT §5a): sign-in with the admin token or a key sets a
signed HttpOnly, SameSite=Strict cookie and never keeps the token; the admin API accepts the
admin's session in place of the bearer token, but a change only with the session's CSRF
header; a key's session sees only its own view and ends when the key is disabled; the page is
served with a strict Content-Security-Policy. (The page itself: tests/test_console_browser.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from gateway.config import parse_settings
from gateway.store import UsageRecord
from tests.plugins.records import usage_record
from tests.plugins.servers import ADMIN_TOKEN, KEYS, ServedGateway, make_config, serve_app
from tests.test_instances import propagated

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def session() -> aiohttp.ClientSession:
    # unsafe: the cookie jar keeps cookies of an IP address host (127.0.0.1)
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def sign_in(s: aiohttp.ClientSession, gw: ServedGateway, token: str) -> dict[str, Any]:
    async with s.post(gw.url + "/console/session", json={"token": token}) as r:
        assert r.status == 200, await r.text()
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert token not in cookie
        body: dict[str, Any] = await r.json()
        return body


async def test_the_page_is_served_with_a_strict_policy(gateway: ServedGateway) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.get(gateway.url + "/console") as r:
            assert r.status == 200
            assert "text/html" in r.headers["content-type"]
            csp = r.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert "unsafe-inline" not in csp
            assert '<script type="module" src="/console/assets/app.js">' in await r.text()
        async with s.get(gateway.url + "/console/assets/app.js") as r:
            assert r.status == 200
            assert ".innerHTML" not in await r.text()  # data goes in as text, never as markup
        async with s.get(gateway.url + "/console/assets/..%2Fsession.py") as r:
            assert r.status == 404


async def test_admin_session_drives_the_admin_api_with_csrf_on_changes(
    gateway: ServedGateway,
) -> None:
    async with session() as s:
        async with s.post(gateway.url + "/console/session", json={"token": "wrong"}) as r:
            assert r.status == 401
        async with s.get(gateway.url + "/admin/keys") as r:
            assert r.status == 401  # not signed in
        me = await sign_in(s, gateway, ADMIN_TOKEN)
        assert me["role"] == "admin"
        async with s.get(gateway.url + "/admin/keys") as r:
            assert r.status == 200
        body = {"id": "console-made", "balance": 3}
        async with s.post(gateway.url + "/admin/accounts", json=body) as r:
            assert r.status == 403  # no CSRF header: a cross-site form cannot do this
        assert await gateway.state.store.get_account("console-made") is None
        csrf = {"x-console-csrf": me["csrf"]}
        async with s.post(gateway.url + "/admin/accounts", json=body, headers=csrf) as r:
            assert r.status == 201
        async with s.get(gateway.url + "/console/me") as r:
            assert (await r.json())["csrf"] == me["csrf"]
        async with s.delete(gateway.url + "/console/session", headers=csrf) as r:
            assert r.status == 200
        async with s.get(gateway.url + "/admin/keys") as r:
            assert r.status == 401


async def test_a_forged_or_altered_cookie_is_refused(gateway: ServedGateway) -> None:
    async with session() as s:
        await sign_in(s, gateway, KEYS["alice"])
        cookie = next(c for c in s.cookie_jar if c.key == "gw_console").value
        body, sig = cookie.split(".")
    import base64

    import orjson

    payload = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    payload["r"] = "admin"
    forged = base64.urlsafe_b64encode(orjson.dumps(payload)).rstrip(b"=").decode() + "." + sig
    async with aiohttp.ClientSession(headers={"cookie": f"gw_console={forged}"}) as s:
        async with s.get(gateway.url + "/admin/keys") as r:
            assert r.status == 401
        async with s.get(gateway.url + "/console/me") as r:
            assert r.status == 401


async def test_a_key_sees_its_own_view_until_it_is_disabled(gateway: ServedGateway) -> None:
    async with aiohttp.ClientSession() as s:
        body = {"account": "alice", "group": "default", "models": ["chat-small"], "quota": 1}
        async with s.post(gateway.url + "/admin/keys", json=body, headers=ADMIN) as r:
            made = await r.json()
        chat = {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": f"Bearer {made['key']}"}
        async with s.post(gateway.v1 + "/chat/completions", json=chat, headers=headers) as r:
            assert r.status == 200
    async with session() as s:
        me = await sign_in(s, gateway, made["key"])
        assert me["role"] == "key"
        async with s.get(gateway.url + "/console/me") as r:
            view = await r.json()
        assert view["key"]["id"] == made["id"]
        assert "key" not in view["key"]  # never the secret
        assert view["balance"] > 0
        async with s.get(gateway.url + "/console/usage") as r:
            usage = await r.json()
        assert [u["key_id"] for u in usage["records"]] == [made["id"]]
        assert usage["daily"][0]["requests"] == 1
        async with s.get(gateway.url + "/console/square") as r:
            square = await r.json()
        assert [m["name"] for m in square["models"]] == ["chat-small"]  # its models only
        assert "POST /v1/chat/completions" in square["models"][0]["endpoints"]
        async with s.get(gateway.url + "/admin/keys") as r:
            assert r.status == 401  # a key is not the admin
        async with aiohttp.ClientSession() as a:
            patch = {"status": "disabled"}
            async with a.patch(
                f"{gateway.url}/admin/keys/{made['id']}", json=patch, headers=ADMIN
            ) as r:
                assert r.status == 200
        async with s.get(gateway.url + "/console/me") as r:
            assert r.status == 401


async def test_admin_daily_usage(gateway: ServedGateway) -> None:
    async with aiohttp.ClientSession() as s:
        chat = {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"Authorization": f"Bearer {KEYS['alice']}"}
        async with s.post(gateway.v1 + "/chat/completions", json=chat, headers=headers) as r:
            assert r.status == 200
        await gateway.state.writer.flush()
        async with s.get(gateway.url + "/admin/usage/daily", headers=ADMIN) as r:
            (row,) = (await r.json())["data"]
        assert (row["account"], row["key_id"], row["model"], row["requests"]) == (
            "alice",
            "k-alice",
            "chat-small",
            1,
        )
        async with s.get(gateway.url + "/admin/usage/daily?since=x", headers=ADMIN) as r:
            assert r.status == 400


async def test_channels_show_their_health_now(gateway: ServedGateway) -> None:
    import time

    gateway.state.health.cooling["an"] = time.monotonic() + 30
    async with aiohttp.ClientSession() as s:
        async with s.get(gateway.url + "/admin/channels", headers=ADMIN) as r:
            channels = {c["name"]: c for c in (await r.json())["data"]}
    assert channels["an"]["health"] == "cooling" and 0 < channels["an"]["cooling_for"] <= 30
    assert channels["oa"]["health"] == "healthy"
    assert "api_key" not in channels["oa"] and "upstream-key" not in str(channels)


async def test_a_group_and_channel_made_at_run_time_reach_the_square_and_the_metrics(
    gateway: ServedGateway,
) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(gateway.url + "/admin/groups", json={"name": "team"}, headers=ADMIN) as r:
            assert r.status == 201
        channel = {
            "name": "team-ch",
            "type": "openai",
            "base_url": gateway.settings.channels[0].base_url,
            "api_key": "upstream-key",
            "groups": ["team"],
            "models": ["chat-small"],
            "status": "disabled",
        }
        async with s.post(gateway.url + "/admin/channels", json=channel, headers=ADMIN) as r:
            assert r.status == 201, await r.text()
        async with s.get(gateway.url + "/metrics") as r:
            text = await r.text()
        assert 'gateway_channel_state{channel="team-ch",state="disabled"} 1.0' in text
        async with s.patch(
            gateway.url + "/admin/channels/team-ch", json={"status": "enabled"}, headers=ADMIN
        ) as r:
            assert r.status == 200
        body = {"account": "alice", "group": "team"}
        async with s.post(gateway.url + "/admin/keys", json=body, headers=ADMIN) as r:
            key = (await r.json())["key"]
    async with session() as s:
        await sign_in(s, gateway, key)
        async with s.get(gateway.url + "/console/square") as r:
            square = await r.json()
    assert square["group"] == "team"
    assert [m["name"] for m in square["models"]] == ["chat-small"]


def free_record(n: int, account: str, key_id: str, model: str, start: datetime) -> UsageRecord:
    """A settled chat record that cost nothing, ``n`` milliseconds after ``start``: bulk
    usage for the listing's filters and pages."""
    return usage_record(
        time=start + timedelta(milliseconds=n),
        request_id=f"bulk-{key_id}-{model}-{n}",
        account=account,
        key_id=key_id,
        model=model,
        channel="oa",
        latency_ms=5,
    )


async def test_a_key_on_a_busy_account_sees_its_own_records_a_page_at_a_time(
    gateway: ServedGateway,
) -> None:
    """The key's view reads through the store's key filter: 1,200 newer records of another
    key on the same account do not hide this key's, and its pages follow ``next_cursor``."""

    start = datetime.now(UTC) - timedelta(hours=1)

    def record(n: int, key_id: str) -> UsageRecord:
        return free_record(n, "alice", key_id, "chat-small", start)

    async with aiohttp.ClientSession() as s:
        body = {"account": "alice", "group": "default", "name": "quiet"}
        async with s.post(gateway.url + "/admin/keys", json=body, headers=ADMIN) as r:
            made = await r.json()
    mine = [record(n, made["id"]) for n in range(5)]
    await gateway.state.store.settle(mine + [record(n, "k-alice") for n in range(10, 1210)])
    async with session() as s:
        await sign_in(s, gateway, made["key"])
        seen: list[str] = []
        cursor = ""
        while True:
            async with s.get(f"{gateway.url}/console/usage?limit=2&cursor={cursor}") as r:
                assert r.status == 200, await r.text()
                page = await r.json()
            assert len(page["records"]) <= 2
            seen += [u["request_id"] for u in page["records"]]
            if page["next_cursor"] is None:
                break
            cursor = page["next_cursor"]
        assert seen == [f"bulk-{made['id']}-chat-small-{n}" for n in (4, 3, 2, 1, 0)]
        # the key's own records only, whatever the parameters say
        async with s.get(gateway.url + "/console/usage?key=k-alice&account=bob") as r:
            assert len((await r.json())["records"]) == 5
        async with s.get(gateway.url + "/console/usage?cursor=zz") as r:
            assert r.status == 400
            assert (await r.json())["error"]["message"].startswith("cursor:")


async def test_a_key_fenced_by_allowed_ips_signs_in_and_reads_only_from_inside(
    gateway: ServedGateway,
) -> None:
    """The key's ``allowed_ips`` hold for its console too: its sign-in, and every request of
    its session, from outside its range get 403 (the client's address as the trusted proxy,
    127.0.0.1, forwards it)."""
    inside, outside = {"x-forwarded-for": "198.51.100.5"}, {"x-forwarded-for": "203.0.113.9"}
    async with aiohttp.ClientSession() as s:
        body = {"account": "alice", "group": "default", "allowed_ips": ["198.51.100.0/24"]}
        async with s.post(gateway.url + "/admin/keys", json=body, headers=ADMIN) as r:
            key = (await r.json())["key"]
    async with session() as s:
        async with s.post(
            gateway.url + "/console/session", json={"token": key}, headers=outside
        ) as r:
            assert r.status == 403
            assert (await r.json())["error"]["code"] == "address_not_allowed"
        assert not any(c.key == "gw_console" for c in s.cookie_jar)
        async with s.post(
            gateway.url + "/console/session", json={"token": key}, headers=inside
        ) as r:
            assert r.status == 200
        for path in ("/console/me", "/console/usage", "/console/square"):
            async with s.get(gateway.url + path, headers=inside) as r:
                assert r.status == 200, path
            async with s.get(gateway.url + path, headers=outside) as r:
                assert r.status == 403, path
                body = await r.json()
                assert "balance" not in body and "records" not in body


async def test_a_disabled_key_s_sessions_end_for_good(fake: Any, store_url: str) -> None:
    """Disabling a key ends its console sessions, and enabling it again does not bring them
    back (on any instance); a new sign-in works. A seed key deleted and made again by the
    next start, with the same secret, brings back none either."""
    settings = parse_settings(make_config(fake.url, store_url))
    async with serve_app(settings) as a, serve_app(settings) as b:
        async with session() as s:
            await sign_in(s, a, KEYS["alice"])
            old = next(c for c in s.cookie_jar if c.key == "gw_console").value
        assert await me_status(b, old) == 200
        async with aiohttp.ClientSession() as s:
            for status in ("disabled", "enabled"):
                body = {"status": status}
                async with s.patch(a.url + "/admin/keys/k-alice", json=body, headers=ADMIN) as r:
                    assert r.status == 200
        assert await me_status(a, old) == 401  # here at once
        await propagated(lambda: me_status(b, old), 401)  # there within a second
        assert await key_works(b, KEYS["alice"])  # the key itself is enabled again
        async with session() as s:
            await sign_in(s, b, KEYS["alice"])  # a new session is a new session
            fresh = next(c for c in s.cookie_jar if c.key == "gw_console").value
        assert await me_status(a, fresh) == 200
        async with aiohttp.ClientSession() as s:
            async with s.delete(a.url + "/admin/keys/k-alice", headers=ADMIN) as r:
                assert r.status == 200
    async with serve_app(settings) as c:  # the seed key is made again, the same secret
        assert await key_works(c, KEYS["alice"])
        assert await me_status(c, fresh) == 401


async def test_an_expired_key_given_a_new_expiry_keeps_its_old_sessions_over(
    fake: Any, store_url: str
) -> None:
    """A key that lapsed and was extended is like one disabled and enabled again: the console
    session it had stays over; a new sign-in works."""
    settings = parse_settings(make_config(fake.url, store_url))
    async with serve_app(settings) as a:
        async with session() as s:
            await sign_in(s, a, KEYS["alice"])
            old = next(c for c in s.cookie_jar if c.key == "gw_console").value
        assert await me_status(a, old) == 200
        async with aiohttp.ClientSession() as s:
            for when in ("2001-01-01T00:00:00Z", "2099-01-01T00:00:00Z"):
                body = {"expires_at": when}
                async with s.patch(a.url + "/admin/keys/k-alice", json=body, headers=ADMIN) as r:
                    assert r.status == 200
                assert await me_status(a, old) == 401
        assert await key_works(a, KEYS["alice"])  # the key itself works again
        async with session() as s:
            await sign_in(s, a, KEYS["alice"])
            fresh = next(c for c in s.cookie_jar if c.key == "gw_console").value
        assert await me_status(a, fresh) == 200


async def me_status(gw: ServedGateway, cookie: str) -> int:
    async with aiohttp.ClientSession(headers={"cookie": f"gw_console={cookie}"}) as s:
        async with s.get(gw.url + "/console/me") as r:
            return r.status


async def key_works(gw: ServedGateway, key: str) -> bool:
    chat = {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {key}"}
        async with s.post(gw.v1 + "/chat/completions", json=chat, headers=headers) as r:
            return r.status == 200
