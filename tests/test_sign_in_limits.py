"""Failed sign-ins and admin-token attempts are limited per client address and per account
name (a key's hint), on every instance of a store together: past ``LIMIT`` failures in a
window, 429 with ``Retry-After`` and a message saying so, whatever the token (a right one
too: a limit that still tried it would tell a guesser when it was right). Other addresses and
successful sign-ins are unaffected, and a success costs no store call."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest

from gateway.config import parse_settings
from gateway.operator.lockout import LIMIT, WINDOW
from gateway.store import Store
from gateway.store.backends import open_store
from tests.plugins.servers import ADMIN_TOKEN, KEYS, ServedGateway, make_config, serve_app
from tests.plugins.stores import ALL_BACKENDS, backend_url

HOME = "198.51.100.20"  # the client's address, as the trusted proxy (127.0.0.1) forwards it
ELSEWHERE = "203.0.113.40"


async def sign_in(gw: ServedGateway, token: str, address: str = HOME) -> tuple[int, Any, Any]:
    headers = {"x-forwarded-for": address}
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/console/session", json={"token": token}, headers=headers) as r:
            return r.status, r.headers.get("retry-after"), await r.json()


async def admin(gw: ServedGateway, token: str, address: str = HOME) -> tuple[int, Any, Any]:
    headers = {"Authorization": f"Bearer {token}", "x-forwarded-for": address}
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/admin/accounts", headers=headers) as r:
            return r.status, r.headers.get("retry-after"), await r.json()


def locked_out(status: int, retry_after: Any, body: Any) -> bool:
    if status != 429:
        return False
    assert 0 < int(retry_after) <= WINDOW
    assert "Too many failed attempts" in body["error"]["message"]
    assert body["error"]["code"] == "too_many_attempts"
    return True


async def test_console_sign_in_stops_guessing_from_an_address(gateway: ServedGateway) -> None:
    seen = [await sign_in(gateway, f"guess-{i}") for i in range(LIMIT)]
    assert [status for status, _, _ in seen[:-1]] == [401] * (LIMIT - 1)
    assert locked_out(*seen[-1])  # the last failure the window allows says so
    assert locked_out(*await sign_in(gateway, ADMIN_TOKEN))  # right or wrong: not tried
    assert locked_out(*await sign_in(gateway, KEYS["alice"]))
    # another address signs in as ever
    assert (await sign_in(gateway, ADMIN_TOKEN, ELSEWHERE))[0] == 200
    assert (await sign_in(gateway, KEYS["alice"], ELSEWHERE))[0] == 200


async def test_guessing_one_key_from_many_addresses_stops_too(gateway: ServedGateway) -> None:
    """Wrong keys with alice's hint (``sk-…0001``: its first three and last four
    characters), each from an address of its own."""
    for i in range(LIMIT - 1):
        status, _, _ = await sign_in(gateway, f"sk-guess-{i:04d}-0001", f"192.0.2.{i}")
        assert status == 401
    assert locked_out(*await sign_in(gateway, "sk-guess-last-0001", "192.0.2.200"))
    assert locked_out(*await sign_in(gateway, KEYS["alice"], ELSEWHERE))
    assert (await sign_in(gateway, KEYS["vip"], ELSEWHERE))[0] == 200  # another key's hint


async def test_the_admin_token_stops_being_tried_past_the_limit(gateway: ServedGateway) -> None:
    calls = 0
    store = gateway.state.store
    real = store.count_failure

    async def counting(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        return await real(*args)

    store.count_failure = counting  # type: ignore[method-assign]
    for _ in range(3):
        assert (await admin(gateway, ADMIN_TOKEN))[0] == 200
    assert calls == 0  # a success never asks the store
    seen = [await admin(gateway, f"guess-{i}") for i in range(LIMIT)]
    assert [status for status, _, _ in seen[:-1]] == [401] * (LIMIT - 1)
    assert locked_out(*seen[-1])
    assert locked_out(*await admin(gateway, ADMIN_TOKEN))
    assert (await admin(gateway, ADMIN_TOKEN, ELSEWHERE))[0] == 200
    # nor is the OpenAPI document a way around it: the right token, locked out, gets the
    # public part
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "x-forwarded-for": HOME}
    async with aiohttp.ClientSession() as s:
        async with s.get(gateway.url + "/openapi.json", headers=headers) as r:
            assert "/admin/accounts" not in (await r.json())["paths"]


async def test_instances_on_one_store_count_together(fake: Any, store_url: str) -> None:
    settings = parse_settings(make_config(fake.url, store_url))
    async with serve_app(settings) as a, serve_app(settings) as b:
        half = LIMIT // 2
        for i in range(half):
            assert (await admin(a, f"guess-a{i}"))[0] == 401
        for i in range(LIMIT - half - 1):
            assert (await admin(b, f"guess-b{i}"))[0] == 401
        assert locked_out(*await admin(b, "guess-b-last"))  # the store's count: LIMIT
        # A has seen fewer of its own: its next failure reads the shared count
        assert locked_out(*await admin(a, "guess-a-next"))
        assert locked_out(*await admin(a, ADMIN_TOKEN))
        assert locked_out(*await sign_in(b, ADMIN_TOKEN))  # the console counts the same


@pytest.fixture(params=ALL_BACKENDS)
def any_store_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    return backend_url(request, tmp_path)


async def test_the_store_counts_in_windows(any_store_url: str) -> None:
    store: Store = open_store(any_store_url)
    await store.open()
    try:
        now = int(time.time())
        names = ["address:198.51.100.0/24", "key:sk-…0001"]
        assert await store.count_failure(names, 60, now) == [(1, now + 60)] * 2
        got = await store.count_failure(names[:1], 60, now)
        assert got[0][0] == 2 and now + 59 <= got[0][1] <= now + 60  # the same window
        assert (await store.count_failure(["address:other"], 60, now))[0][0] == 1
        # a window over: counting starts again
        await store.count_failure(["short"], 1, now)
        time.sleep(1.1)  # noqa: ASYNC251 - Redis expires by its own clock
        later = int(time.time()) + 1
        assert (await store.count_failure(["short"], 1, later))[0][0] == 1
    finally:
        await store.close()


# ---- a user's password (CONTRACT §5b): the same limit, per address and per username --------

PASSWORD = "correct horse battery"


async def make_user(gw: ServedGateway, username: str) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "x-forwarded-for": ELSEWHERE}
    body = {"username": username, "password": PASSWORD, "account": "alice"}
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/admin/users", json=body, headers=headers) as r:
            assert r.status == 201, await r.text()


async def user_sign_in(
    gw: ServedGateway, username: str, password: str, address: str = HOME
) -> tuple[int, Any, Any]:
    headers = {"x-forwarded-for": address}
    body = {"username": username, "password": password}
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/console/session", json=body, headers=headers) as r:
            return r.status, r.headers.get("retry-after"), await r.json()


async def test_a_users_sign_in_stops_guessing_from_an_address(gateway: ServedGateway) -> None:
    await make_user(gateway, "bob")
    await make_user(gateway, "carol")
    seen = [await user_sign_in(gateway, "bob", f"guess-{i}-xxxxxxxx") for i in range(LIMIT)]
    assert [status for status, _, _ in seen[:-1]] == [401] * (LIMIT - 1)
    assert locked_out(*seen[-1])  # like a key's, the last failure the window allows says so
    # right or wrong, nothing more is tried from there: not bob's password, not another
    # user's, not a key
    assert locked_out(*await user_sign_in(gateway, "bob", PASSWORD))
    assert locked_out(*await user_sign_in(gateway, "carol", PASSWORD))
    assert locked_out(*await sign_in(gateway, KEYS["alice"]))
    # bob's own name was guessed at as often: it is locked out from everywhere
    assert locked_out(*await user_sign_in(gateway, "bob", PASSWORD, ELSEWHERE))
    # another user, from another address, signs in as ever
    status, _, body = await user_sign_in(gateway, "carol", PASSWORD, ELSEWHERE)
    assert (status, body["role"]) == (200, "user")


async def test_guessing_one_users_password_from_many_addresses_stops_too(
    gateway: ServedGateway,
) -> None:
    """Wrong passwords for one username (written in any case: it is one user), each from an
    address of its own."""
    await make_user(gateway, "dave")
    for i in range(LIMIT - 1):
        name = "dave" if i % 2 else "DaVe"
        status, _, _ = await user_sign_in(gateway, name, f"guess-{i}-xxxxxxxx", f"192.0.2.{i}")
        assert status == 401
    assert locked_out(*await user_sign_in(gateway, "dave", "guess-last-xxxx", "192.0.2.200"))
    assert locked_out(*await user_sign_in(gateway, "dave", PASSWORD, ELSEWHERE))
    assert (await sign_in(gateway, KEYS["alice"], ELSEWHERE))[0] == 200  # another name


async def test_a_wrong_current_password_counts_as_a_failed_sign_in(
    gateway: ServedGateway,
) -> None:
    """A signed-in user's wrong ``current`` password is a guess at it too."""
    await make_user(gateway, "erin")
    headers = {"x-forwarded-for": HOME}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:
        body = {"username": "erin", "password": PASSWORD}
        async with s.post(gateway.url + "/console/session", json=body, headers=headers) as r:
            assert r.status == 200
            headers["x-console-csrf"] = (await r.json())["csrf"]
        statuses = []
        for i in range(LIMIT + 1):
            change = {"current": f"guess-{i}-xxxxxxxx", "new": "a new password here"}
            async with s.post(gateway.url + "/console/password", json=change, headers=headers) as r:
                statuses.append((r.status, r.headers.get("retry-after"), await r.json()))
        assert [status for status, _, _ in statuses[: LIMIT - 1]] == [400] * (LIMIT - 1)
        assert locked_out(*statuses[LIMIT - 1]) and locked_out(*statuses[LIMIT])
        # the right one is not tried either until the window is over
        change = {"current": PASSWORD, "new": "a new password here"}
        async with s.post(gateway.url + "/console/password", json=change, headers=headers) as r:
            assert r.status == 429
    assert locked_out(*await user_sign_in(gateway, "erin", PASSWORD, ELSEWHERE))
