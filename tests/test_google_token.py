"""OAuth2 access tokens for vertex channels (``gateway.upstream.google_token``): the key file
read, the JWT bearer assertion as Google verifies it (PyJWT and google-auth both check it),
one refresh however many requests wait, renewal before expiry on an injected clock, a failure
as the channel's 502, and no secret in any repr or error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import google.auth.crypt
import google.auth.jwt
import jwt
import orjson
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bench.fake.google_auth import (
    GOOGLE_TOKEN_URI,
    GRANT_TYPE,
    SCOPE,
    FakeServiceAccount,
    TokenIssuer,
    make_account,
)
from gateway.errors import UpstreamError
from gateway.upstream.google_token import (
    RETRY_WAIT,
    AccessTokens,
    CredentialsError,
    ServiceAccount,
    session_post,
)

TOKEN_URI = "https://oauth2.example.test/token"
T0 = 1_750_000_000.0


@pytest.fixture(scope="module")
def made() -> FakeServiceAccount:
    return make_account()


@pytest.fixture
def info(made: FakeServiceAccount) -> dict[str, str]:
    return made.info(TOKEN_URI)


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Endpoint:
    """The token endpoint as an injected ``post``: the fake's issuer checks each assertion;
    ``gate`` holds replies back; ``script`` replaces them."""

    def __init__(self, made: FakeServiceAccount, clock: Clock) -> None:
        self.issuer = TokenIssuer()
        self.issuer.add(made)
        self.clock = clock
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.gate: asyncio.Event | None = None
        self.script: list[tuple[int, bytes] | Exception] = []

    async def __call__(self, url: str, form: Mapping[str, str]) -> tuple[int, bytes]:
        self.calls.append((url, dict(form)))
        if self.gate is not None:
            await self.gate.wait()
        if self.script:
            step = self.script.pop(0)
            if isinstance(step, Exception):
                raise step
            return step
        status, payload = self.issuer.grant(form, TOKEN_URI, self.clock())
        return status, orjson.dumps(payload)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def endpoint(made: FakeServiceAccount, clock: Clock) -> Endpoint:
    return Endpoint(made, clock)


@pytest.fixture
def tokens(info: dict[str, str], endpoint: Endpoint, clock: Clock) -> AccessTokens:
    return AccessTokens(ServiceAccount.from_info(info), endpoint, clock=clock)


# the key file ------------------------------------------------------------------------------
def test_a_key_file_loads_from_its_json_or_its_path(info: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "sa.json"
    path.write_text(json.dumps(info))
    for source in (json.dumps(info), "  \n" + json.dumps(info), str(path)):
        account = ServiceAccount.load(source)
        assert account.client_email == info["client_email"]
        assert account.token_uri == TOKEN_URI
        assert account.project_id == "fake-project"
        assert account.key_id == info["private_key_id"]


def test_a_key_file_without_token_uri_uses_googles(info: dict[str, str]) -> None:
    del info["token_uri"]
    assert ServiceAccount.from_info(info).token_uri == "https://oauth2.googleapis.com/token"


def _ec_pem() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"type": "authorized_user"}, "type"),
        ({"client_email": ""}, "client_email"),
        ({"private_key": None}, "private_key"),
        ({"private_key": "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n"},
         "private_key"),
        ({"private_key": "EC"}, "not an RSA key"),
        ({"token_uri": "file:///etc/passwd"}, "token_uri"),
    ],
)  # fmt: skip
def test_an_unusable_key_file_is_named_without_its_key(
    info: dict[str, str], change: dict[str, Any], named: str
) -> None:
    if change.get("private_key") == "EC":
        change = {"private_key": _ec_pem()}
    pem = info["private_key"]
    with pytest.raises(CredentialsError, match=named) as caught:
        ServiceAccount.from_info({**info, **change})
    assert "PRIVATE KEY" not in str(caught.value) and pem[40:80] not in str(caught.value)


def test_unreadable_or_mistaken_sources_are_refused_without_echoing_a_key(
    info: dict[str, str], tmp_path: Path
) -> None:
    with pytest.raises(CredentialsError, match="absent.json"):
        ServiceAccount.load(str(tmp_path / "absent.json"))
    with pytest.raises(CredentialsError, match="not JSON"):
        ServiceAccount.load("{not json")
    with pytest.raises(CredentialsError) as caught:  # the PEM given where the file was meant
        ServiceAccount.load(info["private_key"])
    assert "PRIVATE" not in str(caught.value)


# the assertion -----------------------------------------------------------------------------
def test_the_assertion_verifies_as_google_auth_and_pyjwt_read_it(
    made: FakeServiceAccount, info: dict[str, str]
) -> None:
    assertion = ServiceAccount.from_info(info).assertion(T0)
    public_pem = made.public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = jwt.get_unverified_header(assertion)
    assert header == {"alg": "RS256", "typ": "JWT", "kid": made.key_id}
    claims = jwt.decode(
        assertion,
        made.public_key,
        algorithms=["RS256"],
        audience=GOOGLE_TOKEN_URI,
        options={"verify_exp": False, "verify_iat": False},
    )
    assert claims == {
        "iss": made.email,
        "scope": SCOPE,
        "aud": GOOGLE_TOKEN_URI,  # whatever token_uri says, as google-auth writes it
        "iat": int(T0),
        "exp": int(T0) + 3600,
    }
    # Google's own library reads it the same (its clock is now: verify the signature only)
    verified = google.auth.jwt.decode(assertion, certs=public_pem, verify=False)
    assert verified == claims
    assert google.auth.crypt.verify_signature(
        assertion.rpartition(".")[0].encode(),
        jwt.utils.base64url_decode(assertion.rpartition(".")[2]),
        [public_pem],
    )


def test_the_fake_endpoint_refuses_a_forged_or_stale_assertion(
    made: FakeServiceAccount, info: dict[str, str]
) -> None:
    issuer = TokenIssuer()
    issuer.add(made)
    account = ServiceAccount.from_info(info)
    good = account.assertion(T0)
    assert issuer.grant({"grant_type": GRANT_TYPE, "assertion": good}, TOKEN_URI, T0)[0] == 200
    other = ServiceAccount.from_info(make_account(made.email).info(TOKEN_URI))
    claims = jwt.decode(good, options={"verify_signature": False})
    elsewhere = jwt.encode(
        {**claims, "aud": "https://elsewhere.test/token"},
        made.private_pem,
        algorithm="RS256",
        headers={"kid": made.key_id},
    )
    cases = {
        "signed by another key": (other.assertion(T0), TOKEN_URI, T0),
        "for another endpoint": (elsewhere, TOKEN_URI, T0),
        "expired": (good, TOKEN_URI, T0 + 3600 + 301),
        "issued in the future": (good, TOKEN_URI, T0 - 301),
    }
    for why, (assertion, audience, now) in cases.items():
        status, reply = issuer.grant(
            {"grant_type": GRANT_TYPE, "assertion": assertion}, audience, now
        )
        assert (status, reply["error"]) == (400, "invalid_grant"), why
    narrow = ServiceAccount.from_info(info).assertion(T0, scope="https://www.googleapis.com/auth/x")
    status, reply = issuer.grant({"grant_type": GRANT_TYPE, "assertion": narrow}, TOKEN_URI, T0)
    assert (status, reply["error"]) == (400, "invalid_scope")


# one refresh, renewal, failure ---------------------------------------------------------------
async def test_a_hundred_waiters_share_one_token_request(
    tokens: AccessTokens, endpoint: Endpoint
) -> None:
    endpoint.gate = asyncio.Event()
    waiters = [asyncio.ensure_future(tokens.token()) for _ in range(100)]
    await asyncio.sleep(0.01)
    assert len(endpoint.calls) == 1 and not any(w.done() for w in waiters)
    endpoint.gate.set()
    got = await asyncio.gather(*waiters)
    assert len(set(got)) == 1 and got[0] in endpoint.issuer.tokens
    url, form = endpoint.calls[0]
    assert url == TOKEN_URI and form["grant_type"] == GRANT_TYPE
    assert set(form) == {"grant_type", "assertion"}
    assert await tokens.authorization() == "Bearer " + got[0]
    assert len(endpoint.calls) == 1


async def test_a_token_is_renewed_five_minutes_before_it_expires(
    tokens: AccessTokens, endpoint: Endpoint, clock: Clock
) -> None:
    first = await tokens.token()
    clock.now = T0 + 3599 - 301
    assert await tokens.token() == first and len(endpoint.calls) == 1
    clock.now = T0 + 3599 - 299
    second = await tokens.token()
    assert second != first and len(endpoint.calls) == 2
    claims = jwt.decode(endpoint.calls[1][1]["assertion"], options={"verify_signature": False})
    assert claims["iat"] == int(clock.now)  # the new assertion is issued on the clock given


async def test_a_short_lived_token_is_renewed_at_half_its_life(
    tokens: AccessTokens, endpoint: Endpoint, clock: Clock
) -> None:
    endpoint.issuer.lifetime = 120
    await tokens.token()
    clock.now = T0 + 59
    await tokens.token()
    assert len(endpoint.calls) == 1
    clock.now = T0 + 61
    await tokens.token()
    assert len(endpoint.calls) == 2


async def test_a_refused_refresh_is_the_channels_502_for_every_waiter_once(
    tokens: AccessTokens, endpoint: Endpoint
) -> None:
    body = {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
    endpoint.script = [(400, orjson.dumps(body))]
    endpoint.gate = asyncio.Event()
    waiters = [asyncio.ensure_future(tokens.token()) for _ in range(20)]
    await asyncio.sleep(0.01)
    endpoint.gate.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert len(endpoint.calls) == 1
    assert all(isinstance(r, UpstreamError) for r in results)
    errors = [r for r in results if isinstance(r, UpstreamError)]
    assert len({id(e) for e in errors}) == 20  # each its own: the relay may change one
    err = errors[0]
    assert err.status == 502 and err.channel_fault and err.retryable
    assert "invalid_grant" in err.message and "Invalid JWT Signature." in err.message
    endpoint.gate = None
    assert await tokens.token()  # the next request tries again
    assert len(endpoint.calls) == 2


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (200, b'{"token_type": "Bearer", "expires_in": 3599}'),
        (200, b'{"access_token": "t", "token_type": "mac", "expires_in": 3599}'),
        (200, b'{"access_token": "t", "expires_in": -5}'),
        (200, b"<html>proxy</html>"),
        (503, b"unavailable"),
    ],
)
async def test_a_reply_without_a_usable_token_is_a_channel_failure(
    tokens: AccessTokens, endpoint: Endpoint, status: int, body: bytes
) -> None:
    endpoint.script = [(status, body)]
    with pytest.raises(UpstreamError) as caught:
        await tokens.token()
    assert caught.value.channel_fault and caught.value.status == 502


async def test_while_the_old_token_works_a_failed_renewal_keeps_it_and_waits(
    tokens: AccessTokens, endpoint: Endpoint, clock: Clock
) -> None:
    first = await tokens.token()
    clock.now = T0 + 3400  # due for renewal, not expired
    endpoint.script = [UpstreamError("could not reach the token endpoint", channel_fault=True)]
    assert await tokens.token() == first
    assert await tokens.token() == first  # not tried again at once
    assert len(endpoint.calls) == 2
    clock.now += RETRY_WAIT + 1
    assert await tokens.token() != first
    assert len(endpoint.calls) == 3


async def test_an_invalidated_token_is_replaced_but_a_stale_invalidation_is_ignored(
    tokens: AccessTokens, endpoint: Endpoint
) -> None:
    first = await tokens.token()
    tokens.invalidate(first)
    second = await tokens.token()
    assert second != first and len(endpoint.calls) == 2
    tokens.invalidate(first)  # another request's 401 with the old token: already replaced
    assert await tokens.token() == second and len(endpoint.calls) == 2


async def test_a_cancelled_waiter_does_not_cancel_the_refresh_for_the_others(
    tokens: AccessTokens, endpoint: Endpoint
) -> None:
    endpoint.gate = asyncio.Event()
    first = asyncio.ensure_future(tokens.token())
    second = asyncio.ensure_future(tokens.token())
    await asyncio.sleep(0.01)
    first.cancel()
    await asyncio.sleep(0)
    endpoint.gate.set()
    assert await second
    assert first.cancelled() and len(endpoint.calls) == 1


# no secret shown ---------------------------------------------------------------------------
async def test_no_repr_str_or_error_shows_the_key_the_assertion_or_the_token(
    tokens: AccessTokens, endpoint: Endpoint, made: FakeServiceAccount
) -> None:
    token = await tokens.token()
    assertion = endpoint.calls[0][1]["assertion"]
    key_body = made.private_pem.splitlines()[1]
    shown = [repr(tokens), str(tokens), repr(tokens.account), str(tokens.account)]
    # a token endpoint that quotes the assertion back: its description is left out
    echo = {"error": "invalid_grant", "error_description": f"bad assertion {assertion}"}
    endpoint.script = [(400, orjson.dumps(echo))]
    tokens.invalidate()
    with pytest.raises(UpstreamError) as caught:
        await tokens.token()
    shown += [str(caught.value), repr(caught.value), caught.value.message]
    assert made.email in shown[0] and "invalid_grant" in caught.value.message
    for text in shown:
        assert token not in text and key_body not in text
        assert assertion.rpartition(".")[2] not in text and "PRIVATE" not in text


# over HTTP ---------------------------------------------------------------------------------
async def test_session_post_gets_a_token_over_http_and_maps_a_refused_connection(
    made: FakeServiceAccount, unused_tcp_port: int
) -> None:
    import aiohttp

    issuer = TokenIssuer()
    issuer.add(made)
    url = f"http://127.0.0.1:{unused_tcp_port}/token"

    async def token(request: web.Request) -> web.Response:
        form = await request.post()
        assert request.content_type == "application/x-www-form-urlencoded"
        status, payload = issuer.grant({k: str(v) for k, v in form.items()}, url)
        return web.json_response(payload, status=status)

    app = web.Application()
    app.router.add_post("/token", token)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    try:
        async with aiohttp.ClientSession() as session:
            tokens = AccessTokens(
                ServiceAccount.from_info(made.info(url)), session_post(lambda: session)
            )
            assert await tokens.token() in issuer.tokens
    finally:
        await runner.cleanup()
    async with aiohttp.ClientSession() as session:
        tokens = AccessTokens(ServiceAccount.from_info(made.info(url)), session_post(session))
        with pytest.raises(UpstreamError, match="could not reach") as caught:
            await tokens.token()
        assert caught.value.channel_fault
