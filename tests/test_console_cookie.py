"""The console's session cookie and the request's transport, on both stores: over plain http
it is ``gw_console`` (browsers refuse a ``__Host-`` cookie without ``Secure``); over TLS, as a
trusted proxy says with X-Forwarded-Proto, ``__Host-gw_console``, ``Secure``, ``Path=/`` and
no ``Domain``; the same header from a peer that is not a trusted proxy changes nothing. Each
session works on the next request, and sign-out clears the cookie that was set."""

from __future__ import annotations

from http.cookies import SimpleCookie
from typing import Any

import pytest

from tests.plugins.inprocess import ADMIN_TOKEN, KEYS, InProcess, Reply, drive, running

HTTPS = {"x-forwarded-proto": "https"}
JSON = {"content-type": "application/json"}


async def call(
    app: InProcess, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[Reply, SimpleCookie]:
    """The reply and every cookie it sets (each Set-Cookie line: the reply's headers keep one)."""
    seen: list[Any] = []
    reply = await drive(app.app, method, path, body, headers, seen)
    jar: SimpleCookie = SimpleCookie()
    for message in seen:
        for name, value in message.get("headers", ()):
            if name == b"set-cookie":
                jar.load(value.decode())
    return reply, jar


async def sign_in(
    app: InProcess, token: str, headers: dict[str, str]
) -> tuple[str, str, Reply, SimpleCookie]:
    body = b'{"token": "%s"}' % token.encode()
    reply, jar = await call(app, "POST", "/console/session", {**JSON, **headers}, body)
    assert reply.status == 200, reply.body
    assert len(jar) == 1, jar
    (name,) = jar
    return name, jar[name].value, reply, jar


# (trusted_proxies, the sign-in's headers, the cookie's name, Secure)
CASES = [
    pytest.param(None, {}, "gw_console", False, id="plain-http"),
    pytest.param(None, HTTPS, "__Host-gw_console", True, id="https-from-a-trusted-proxy"),
    pytest.param(
        None, {"x-forwarded-proto": "http, https"}, "gw_console", False, id="a-hop-that-was-http"
    ),  # fmt: skip
    pytest.param(["10.0.0.0/8"], HTTPS, "gw_console", False, id="https-from-an-untrusted-peer"),
    pytest.param([], HTTPS, "gw_console", False, id="no-trusted-proxies"),
]


@pytest.mark.parametrize(("proxies", "headers", "name", "secure"), CASES)
@pytest.mark.parametrize("token", [ADMIN_TOKEN, KEYS["alice"]], ids=["admin", "key"])
async def test_the_cookie_follows_the_transport_and_the_session_works(
    store_url: str,
    proxies: list[str] | None,
    headers: dict[str, str],
    name: str,
    secure: bool,
    token: str,
) -> None:
    overrides = {} if proxies is None else {"trusted_proxies": proxies}
    async with running(store_url, **overrides) as app:
        got, value, reply, jar = await sign_in(app, token, headers)
        assert got == name
        morsel = jar[name]
        assert bool(morsel["secure"]) is secure
        assert morsel["path"] == "/" and not morsel["domain"]
        assert morsel["httponly"] and morsel["samesite"].lower() == "strict"
        csrf = reply.json()["csrf"]

        # the next request, as the browser sends it back: signed in
        sent = {**headers, "cookie": f"{name}={value}"}
        me = await drive(app.app, "GET", "/console/me", b"", sent)
        assert me.status == 200 and me.json()["role"] == (
            "admin" if token == ADMIN_TOKEN else "key"
        )

        # sign-out clears that very cookie (over TLS a Secure clearing, or the browser ignores
        # it), and the session is over
        out, cleared = await call(
            app, "DELETE", "/console/session", {**sent, "x-console-csrf": csrf}
        )
        assert out.status == 200
        assert name in cleared and cleared[name].value == ""
        assert bool(cleared[name]["secure"]) is secure
        assert (await drive(app.app, "GET", "/console/me", b"", sent)).status == 401


async def test_over_tls_a_plain_named_cookie_is_not_read(store_url: str) -> None:
    """A plain-named cookie can be planted by anyone on the http side of the domain: over TLS
    only the ``__Host-`` one is read. Over plain http the ``__Host-`` one is read too."""
    async with running(store_url) as app:
        _, value, _, _ = await sign_in(app, ADMIN_TOKEN, HTTPS)
        planted = {**HTTPS, "cookie": f"gw_console={value}"}
        assert (await drive(app.app, "GET", "/console/me", b"", planted)).status == 401
        held = {"cookie": f"__Host-gw_console={value}"}
        assert (await drive(app.app, "GET", "/console/me", b"", held)).status == 200
