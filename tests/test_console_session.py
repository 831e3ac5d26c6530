"""Console sessions on the server side: sign-out ends a session for good, on this instance at
once and on every other within a second (the revoked sessions are in the store, and every
cache loads them), on both stores; sign-in takes only JSON and refuses another site's page
(login CSRF)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.config import parse_settings
from gateway.operator.console.session import LIFETIME
from gateway.store import Store
from gateway.store.cache import Cache
from tests.plugins.servers import ADMIN_TOKEN, KEYS, ServedGateway, make_config, serve_app
from tests.plugins.stores import ALL_BACKENDS, backend_url
from tests.test_console_api import session, sign_in
from tests.test_instances import propagated, status_of

COOKIE = "gw_console"


def cookie_of(s: aiohttp.ClientSession) -> str:
    return next(c for c in s.cookie_jar if c.key == COOKIE).value


async def status(gw: ServedGateway, path: str, cookie: str) -> int:
    """The status of a GET with only this session cookie (no jar: a sign-out's cleared cookie
    does not stop it being sent again, as an attacker who copied it would)."""
    async with aiohttp.ClientSession(headers={"cookie": f"{COOKIE}={cookie}"}) as s:
        async with s.get(gw.url + path) as r:
            await r.read()
            return r.status


async def sign_out(s: aiohttp.ClientSession, gw: ServedGateway, csrf: str) -> None:
    async with s.delete(gw.url + "/console/session", headers={"x-console-csrf": csrf}) as r:
        assert r.status == 200, await r.text()
        assert 'gw_console=""' in r.headers["set-cookie"]  # the browser forgets it too


async def test_a_signed_out_session_is_refused_everywhere_on_this_instance(
    gateway: ServedGateway,
) -> None:
    async with session() as s:
        me = await sign_in(s, gateway, ADMIN_TOKEN)
        old = cookie_of(s)
        assert await status(gateway, "/admin/keys", old) == 200
        assert await status(gateway, "/console/me", old) == 200
        await sign_out(s, gateway, me["csrf"])
    for path in ("/admin/keys", "/console/me", "/console/square"):
        assert await status(gateway, path, old) == 401, path
    # a change with the old cookie and its CSRF token: refused too
    headers = {"cookie": f"{COOKIE}={old}", "x-console-csrf": me["csrf"]}
    async with aiohttp.ClientSession(headers=headers) as s:
        body = {"id": "after-sign-out", "balance": 1}
        async with s.post(gateway.url + "/admin/accounts", json=body) as r:
            assert r.status == 401
    assert await gateway.state.store.get_account("after-sign-out") is None

    # a key's session likewise; signing in again gives a new session that works
    async with session() as s:
        me = await sign_in(s, gateway, KEYS["alice"])
        old = cookie_of(s)
        assert await status(gateway, "/console/me", old) == 200
        await sign_out(s, gateway, me["csrf"])
        assert await status(gateway, "/console/me", old) == 401
        await sign_in(s, gateway, KEYS["alice"])
        assert await status(gateway, "/console/me", cookie_of(s)) == 200


async def test_a_sign_out_on_one_instance_holds_on_another_within_a_second(
    fake: Any, store_url: str
) -> None:
    settings = parse_settings(make_config(fake.url, store_url))
    async with serve_app(settings) as a, serve_app(settings) as b:
        async with session() as s:
            me = await sign_in(s, a, ADMIN_TOKEN)
            old = cookie_of(s)
            assert await status(b, "/admin/keys", old) == 200  # one session, every instance
            await sign_out(s, a, me["csrf"])
            assert await status(a, "/admin/keys", old) == 401  # here at once
            await propagated(lambda: status(b, "/admin/keys", old), 401)
            assert await status(b, "/console/me", old) == 401
        # an instance started later knows it from the start
        async with serve_app(settings) as c:
            assert await status(c, "/admin/keys", old) == 401


async def test_checking_a_session_never_asks_the_store(gateway: ServedGateway) -> None:
    """The revoked sessions come with the cache's reloads: requests signed in read none."""
    calls = 0
    store = gateway.state.store
    real = store.load_revoked

    async def counting(now: int) -> dict[str, int]:
        nonlocal calls
        calls += 1
        return await real(now)

    store.load_revoked = counting  # type: ignore[method-assign]
    try:
        async with session() as s:
            await sign_in(s, gateway, ADMIN_TOKEN)
            before = calls
            for _ in range(20):
                async with s.get(gateway.url + "/console/me") as r:
                    assert r.status == 200
            assert calls - before <= 1  # at most a tick's reload came between, never 20
    finally:
        store.load_revoked = real  # type: ignore[method-assign]


# ---- the store and the cache ---------------------------------------------------------------


@pytest.fixture(params=ALL_BACKENDS)
def any_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """On a Redis Cluster too: the revoked sessions are one key, in one slot."""
    return backend_url(request, tmp_path)


async def test_an_entry_revoked_again_in_its_second_reaches_past_the_last(
    any_store_url: str,
) -> None:
    """A key disabled, enabled, signed in with and disabled again, all in one second: the
    session signed in between ends a second after the first revocation (``Signer.issue``'s
    ``after``), so the second revocation must reach it (it ends a second later still); a
    later revocation ends when it says."""
    from gateway.store.backends import open_store

    store: Store = open_store(any_store_url)
    await store.open()
    try:
        now = int(time.time())
        await store.revoke_session("key:h", now + LIFETIME, now)
        between = now + LIFETIME + 1  # what a sign-in after it ends at, at the latest
        await store.revoke_session("key:h", now + LIFETIME, now)
        assert (await store.load_revoked(now))["key:h"] >= between
        await store.revoke_session("key:h", now + LIFETIME + 100, now)
        assert (await store.load_revoked(now))["key:h"] == now + LIFETIME + 100
    finally:
        await store.close()


async def test_revoked_sessions_in_the_store_expire_by_themselves(any_store_url: str) -> None:
    from gateway.store.backends import open_store

    store: Store = open_store(any_store_url)
    await store.open()
    try:
        now = int(time.time())
        version = await store.version()
        await store.revoke_session("n-old", now + 10, now)
        assert await store.version() != version  # every cache reloads
        await store.revoke_session("n-new", now + LIFETIME, now)
        assert await store.load_revoked(now) == {"n-old": now + 10, "n-new": now + LIFETIME}
        assert await store.load_revoked(now + 10) == {"n-new": now + LIFETIME}
        # a later sign-out forgets what is over
        await store.revoke_session("n-later", now + 30, now + 20)
        assert set(await store.load_revoked(0)) == {"n-new", "n-later"}

        cache = Cache(store, interval=3600)
        await cache.start()
        try:
            assert cache.revoked("n-new") and not cache.revoked("n-old")
            cache.revoke("n-here", now + 60)  # this instance's own, at once
            assert cache.revoked("n-here")
            await cache.refresh()  # a reload keeps what this process revoked
            assert cache.revoked("n-here") and cache.revoked("n-new")
        finally:
            await cache.stop()
    finally:
        await store.close()

    if any_store_url.startswith("redis://"):
        import redis.asyncio as aioredis

        from gateway.store.redis import REVOKED_KEY

        client = aioredis.Redis.from_url(any_store_url)
        try:
            ttl = await client.ttl(REVOKED_KEY)
            assert 0 < ttl <= LIFETIME  # the key goes with the last of its sessions
        finally:
            await client.aclose()


# ---- sign-in: JSON only, and not from another site's page ----------------------------------


def console_error(body: Any) -> dict[str, Any]:
    err: dict[str, Any] = body["error"]
    assert set(err) == {"message", "type", "code"} and err["type"] == "console_error"
    return err


async def post_sign_in(gw: ServedGateway, data: bytes, headers: dict[str, str]) -> Any:
    async with session() as s:
        async with s.post(gw.url + "/console/session", data=data, headers=headers) as r:
            body = await r.json(content_type=None)
            signed_in = any(c.key == COOKIE for c in s.cookie_jar)
            return r.status, body, signed_in


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None],
)
async def test_sign_in_takes_only_json(gateway: ServedGateway, content_type: str | None) -> None:
    """What a cross-site form may send without a preflight is refused, whatever it holds."""
    raw = f'{{"token": "{ADMIN_TOKEN}"}}'.encode()
    headers = {} if content_type is None else {"content-type": content_type}
    got, body, signed_in = await post_sign_in(gateway, raw, headers)
    assert got == 415 and not signed_in
    assert "application/json" in console_error(body)["message"]
    json_type = {"content-type": "application/json; charset=utf-8"}
    got, body, signed_in = await post_sign_in(gateway, raw, json_type)
    assert got == 200 and signed_in


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({"origin": "https://evil.example"}, False),
        ({"origin": "null"}, False),
        ({"origin": "http://127.0.0.1:1"}, False),  # another port of this host
        ({"sec-fetch-site": "cross-site"}, False),
        ({"sec-fetch-site": "same-origin"}, True),
        ({"sec-fetch-site": "none"}, True),  # typed into the address bar
        ({}, True),  # not a browser: no Origin
        ({"origin": "SAME"}, True),
        ({"origin": "SAME", "sec-fetch-site": "same-origin"}, True),
    ],
)
async def test_sign_in_from_another_site_is_403(
    gateway: ServedGateway, headers: dict[str, str], allowed: bool
) -> None:
    headers = {k: gateway.url if v == "SAME" else v for k, v in headers.items()}
    raw = f'{{"token": "{KEYS["alice"]}"}}'.encode()
    got, body, signed_in = await post_sign_in(
        gateway, raw, {**headers, "content-type": "application/json"}
    )
    if allowed:
        assert (got, signed_in) == (200, True), body
    else:
        assert (got, signed_in) == (403, False)
        assert console_error(body)["code"] == "cross_site"


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        ("http://gw.example:8080", "gw.example:8080", True),
        ("https://gw.example", "gw.example", True),
        ("https://gw.example", "gw.example:443", True),
        ("https://gw.example:8443", "gw.example", True),  # a proxy's $host has no port
        ("https://GW.example", "gw.example", True),
        ("http://[::1]:8080", "[::1]:8080", True),
        ("http://gw.example", "gw.example:8080", False),
        ("https://gw.example.evil", "gw.example", False),
        ("null", "gw.example", False),
        ("file://", "gw.example", False),
        ("http://gw.example:x", "gw.example", False),
        ("https://gw.example", "", False),
    ],
)
def test_same_origin(origin: str, host: str, same: bool) -> None:
    from gateway.operator.console import same_origin

    assert same_origin(origin, host) is same


# ---- the signing secret: the store's, random, rotatable ------------------------------------


def signature(secret: bytes, body: str) -> str:
    digest = hmac.new(secret, body.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


async def test_a_cookie_says_nothing_of_the_admin_token(gateway: ServedGateway) -> None:
    """A key holder's own cookie was signed under SHA-256 of the admin token, so anyone with
    a key could test guesses of the token offline and forge an admin session. The secret is
    the store's own, random."""
    async with session() as s:
        await sign_in(s, gateway, KEYS["alice"])
        body, sig = cookie_of(s).split(".")
    derived = hashlib.sha256(b"gateway-console\0" + ADMIN_TOKEN.encode()).digest()
    assert sig != signature(derived, body)  # an offline guess of the token tests nothing
    secret = await gateway.state.store.session_secret()
    assert len(secret) >= 32 and ADMIN_TOKEN.encode() not in secret
    assert sig == signature(secret, body)


async def test_a_rotation_ends_every_session_everywhere_and_the_service_goes_on(
    fake: Any, store_url: str
) -> None:
    settings = parse_settings(make_config(fake.url, store_url))
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with serve_app(settings) as a, serve_app(settings) as b:
        async with session() as s:
            await sign_in(s, a, ADMIN_TOKEN)
            old_admin = cookie_of(s)
        async with session() as s:
            await sign_in(s, b, KEYS["alice"])
            old_key = cookie_of(s)
        for gw in (a, b):  # one secret, every instance
            assert await status(gw, "/admin/keys", old_admin) == 200
            assert await status(gw, "/console/me", old_key) == 200
        async with aiohttp.ClientSession() as s:
            async with s.post(a.url + "/admin/sessions/rotate", headers=admin) as r:
                assert r.status == 200 and await r.json() == {"rotated": True}
            async with s.post(a.url + "/admin/sessions/rotate") as r:
                assert r.status == 401  # the admin's alone
            assert await status(a, "/admin/keys", old_admin) == 401  # here at once
            await propagated(lambda: status(b, "/admin/keys", old_admin), 401)
            assert await status(b, "/console/me", old_key) == 401
            # the service never stopped: the key itself, the admin token, a new sign-in
            assert await status_of(s, b.url, KEYS["alice"]) == 200
            async with s.get(b.url + "/admin/keys", headers=admin) as r:
                assert r.status == 200
        async with session() as s:
            await sign_in(s, a, KEYS["alice"])
            assert await status(b, "/console/me", cookie_of(s)) == 200


async def test_changing_the_admin_token_ends_admin_sessions_alone(
    fake: Any, store_url: str
) -> None:
    cfg = make_config(fake.url, store_url)
    async with serve_app(parse_settings(cfg)) as a:
        async with session() as s:
            await sign_in(s, a, ADMIN_TOKEN)
            admin_cookie = cookie_of(s)
        async with session() as s:
            await sign_in(s, a, KEYS["alice"])
            key_cookie = cookie_of(s)
    async with serve_app(parse_settings({**cfg, "admin_token": "a-new-admin-token"})) as b:
        assert await status(b, "/admin/keys", admin_cookie) == 401
        assert await status(b, "/console/me", key_cookie) == 200


async def test_the_secret_is_made_once_and_kept_until_rotated(any_store_url: str) -> None:
    from gateway.store.backends import open_store

    first: Store = open_store(any_store_url)
    second: Store = open_store(any_store_url)  # another instance on the same store
    await first.open()
    await second.open()
    try:
        made = await first.session_secret()
        assert await second.session_secret() == made == await first.session_secret()
        version = await first.version()
        await second.rotate_session_secret()
        assert await first.version() != version  # every cache loads the new one
        rotated = await first.session_secret()
        assert rotated != made and len(rotated) == len(made)
        cache = Cache(first, interval=3600)
        await cache.start()
        try:
            assert cache.session_secret == rotated
        finally:
            await cache.stop()
    finally:
        await first.close()
        await second.close()
