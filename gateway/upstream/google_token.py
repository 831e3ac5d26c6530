"""OAuth2 access tokens for a Google service account (``vertex`` channels).

A service account's key file (its JSON, or the path of the file) holds an RSA private key.
A token is got with the JWT bearer grant (RFC 7523), as Google's own libraries get it: an
assertion ``{iss: client_email, scope, aud, iat, exp: iat + 1 h}`` signed RS256 (``kid``: the
key's ``private_key_id``) is posted form-encoded to the key file's ``token_uri`` with
``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer``. ``aud`` is Google's token endpoint
(``https://oauth2.googleapis.com/token``) whatever ``token_uri`` says, as google-auth's
service-account credentials write it (the endpoint checks its own name there). The reply is
``{"access_token", "expires_in", "token_type": "Bearer"}``. Requests then carry
``Authorization: Bearer <access_token>``.

``AccessTokens`` keeps one channel's token and renews it 5 minutes before it expires (at half
its life for a token shorter than 10 minutes). However many requests wait for a token, one
refresh is in flight: they all await the same task (shielded, so a waiter that is cancelled
does not cancel it for the others). A refresh that fails is a channel failure
(``UpstreamError``, ``channel_fault``: 502 and the channel cooled down, never the client's
401); while the old token has not expired yet, requests keep using it and the refresh is tried
again after ``RETRY_WAIT``. After the upstream refused a token (401), ``invalidate(token)``
drops it so the next request gets a new one.

The signing is PyJWT's (``jwt.encode``, RS256 through ``cryptography``): typed, so that
``mypy --strict`` checks its use, and the same library verifies assertions in the fake token
endpoint (``bench.fake.google_auth``); the key is parsed once, at load. The post is injected
(``TokenPost``): ``session_post`` makes one of an aiohttp session; tests pass their own.

Nothing here logs. Neither the private key, an assertion nor a token is ever in a ``repr``,
``str`` or error message: the dataclass fields that hold them are ``repr=False``, and an error
from the token endpoint is reported by its status and OAuth ``error`` code (its description
only when it quotes nothing sent).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import jwt
import orjson
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from gateway.errors import GatewayError, UpstreamError

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
DEFAULT_TOKEN_URI = "https://oauth2.googleapis.com/token"
AUDIENCE = DEFAULT_TOKEN_URI  # the assertion's aud, as google-auth writes it
ASSERTION_LIFETIME = 3600  # seconds; Google takes no longer
RENEW_EARLY = 300.0  # seconds before expiry a token is renewed
RETRY_WAIT = 10.0  # seconds between refresh attempts while the old token still works
DEFAULT_LIFETIME = 3600  # a token reply without expires_in
TOKEN_TIMEOUT = 10.0  # seconds for one token request
MAX_DESCRIPTION = 200  # characters of the endpoint's error_description kept

TokenPost = Callable[[str, Mapping[str, str]], Awaitable[tuple[int, bytes]]]
"""Posts a form to a URL: ``(status, body)``; raises only ``GatewayError``."""


class CredentialsError(ValueError):
    """The credentials are not a usable service-account key (a configuration error). The
    message names what is wrong, never the key."""


@dataclass(frozen=True, slots=True)
class ServiceAccount:
    """A service account's identity and its parsed key (``load`` makes one)."""

    client_email: str
    token_uri: str
    project_id: str | None = None
    key_id: str | None = None
    key: RSAPrivateKey = field(repr=False, compare=False, kw_only=True)

    @classmethod
    def load(cls, source: str) -> ServiceAccount:
        """From a key file's JSON (``source`` starting with ``{``) or its path. Reads the file
        and parses the key: call it once, at start-up. ``CredentialsError`` when unusable."""
        if source.lstrip().startswith("{"):
            text = source
        else:
            try:
                text = Path(source).read_text()
            except OSError as exc:
                reason = exc.strerror or type(exc).__name__
                raise CredentialsError(f"cannot read {_shown(source)}: {reason}") from None
        try:
            info = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise CredentialsError("the service account key is not JSON") from None
        if not isinstance(info, dict):
            raise CredentialsError("the service account key is not a JSON object")
        return cls.from_info(info)

    @classmethod
    def from_info(cls, info: Mapping[str, object]) -> ServiceAccount:
        """From a key file's decoded JSON."""
        kind = info.get("type")
        if kind != "service_account":
            raise CredentialsError(f"type: {kind!r} is not 'service_account'")
        email = info.get("client_email")
        if not isinstance(email, str) or not email:
            raise CredentialsError("client_email: required")
        pem = info.get("private_key")
        if not isinstance(pem, str) or not pem:
            raise CredentialsError("private_key: required")
        try:
            key = load_pem_private_key(pem.encode(), password=None)
        except (ValueError, TypeError):
            raise CredentialsError("private_key: not an unencrypted PEM private key") from None
        if not isinstance(key, RSAPrivateKey):
            raise CredentialsError("private_key: not an RSA key")
        token_uri = info.get("token_uri") or DEFAULT_TOKEN_URI
        if not isinstance(token_uri, str) or not token_uri.startswith(("https://", "http://")):
            raise CredentialsError("token_uri: not an http(s) URL")
        project = info.get("project_id")
        key_id = info.get("private_key_id")
        return cls(
            client_email=email,
            token_uri=token_uri,
            project_id=project if isinstance(project, str) and project else None,
            key_id=key_id if isinstance(key_id, str) and key_id else None,
            key=key,
        )

    def assertion(self, now: float, scope: str = SCOPE) -> str:
        """The signed JWT that asks ``token_uri`` for a token of ``scope``, issued at ``now``
        (unix seconds)."""
        issued = int(now)
        claims = {
            "iss": self.client_email,
            "scope": scope,
            "aud": AUDIENCE,
            "iat": issued,
            "exp": issued + ASSERTION_LIFETIME,
        }
        headers = {"kid": self.key_id} if self.key_id else None
        return jwt.encode(claims, self.key, algorithm="RS256", headers=headers)


def _shown(path: str) -> str:
    """A path for an error message; not when it may be a key given in the wrong form."""
    if len(path) > MAX_DESCRIPTION or "\n" in path or "PRIVATE" in path:
        return "the service account file"
    return repr(path)


def _refused(status: int, raw: bytes, sent: str) -> UpstreamError:
    """The error for a token endpoint's refusal: its status and OAuth error code, and its
    description unless that quotes what was sent."""
    code = description = ""
    try:
        payload = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        payload = None
    if isinstance(payload, dict):
        if isinstance(payload.get("error"), str):
            code = payload["error"][:MAX_DESCRIPTION]
        text = payload.get("error_description")
        if isinstance(text, str) and sent not in text and sent.rpartition(".")[2] not in text:
            description = text[:MAX_DESCRIPTION]
    detail = ": ".join(p for p in (code, description) if p)
    return UpstreamError(
        f"the token endpoint refused the channel's service account (HTTP {status}"
        + (f", {detail})" if detail else ")"),
        channel_fault=True,
    )


def read_token_reply(status: int, raw: bytes, sent: str) -> tuple[str, float]:
    """A token endpoint's reply -> (access token, lifetime in seconds); ``sent``: the
    assertion (kept out of error messages). ``UpstreamError`` when there is no token."""
    if status != 200:
        raise _refused(status, raw, sent)
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        payload = None
    token = payload.get("access_token") if isinstance(payload, dict) else None
    if not isinstance(payload, dict) or not isinstance(token, str) or not token:
        raise UpstreamError("the token endpoint sent no access token", channel_fault=True)
    kind = payload.get("token_type", "Bearer")
    if not isinstance(kind, str) or kind.lower() != "bearer":
        raise UpstreamError(
            "the token endpoint sent a token that is not Bearer", channel_fault=True
        )
    lifetime = payload.get("expires_in", DEFAULT_LIFETIME)
    if isinstance(lifetime, str) and lifetime.isdigit():
        lifetime = int(lifetime)
    if isinstance(lifetime, bool) or not isinstance(lifetime, int | float) or lifetime <= 0:
        raise UpstreamError("the token endpoint sent no valid expires_in", channel_fault=True)
    return token, float(lifetime)


class AccessTokens:
    """One service account's access token, kept and renewed (module docstring).

    Per request: ``headers["Authorization"] = await tokens.authorization()``; after the
    upstream answered 401 to it, ``tokens.invalidate(that header's token)``. ``clock`` gives
    unix seconds (the assertion's ``iat`` and the token's expiry alike).
    """

    __slots__ = (
        "account", "scope", "_post", "_clock", "_early", "_token", "_expires", "_renew_at",
        "_retry_at", "_flight",
    )  # fmt: skip

    def __init__(
        self,
        account: ServiceAccount,
        post: TokenPost,
        *,
        scope: str = SCOPE,
        clock: Callable[[], float] = time.time,
        renew_early: float = RENEW_EARLY,
    ) -> None:
        self.account = account
        self.scope = scope
        self._post = post
        self._clock = clock
        self._early = renew_early
        self._token: str | None = None
        self._expires = 0.0
        self._renew_at = 0.0
        self._retry_at = 0.0
        self._flight: asyncio.Future[str] | None = None

    def __repr__(self) -> str:
        state = f"valid until {self._expires:.0f}" if self._token is not None else "no token"
        return f"<AccessTokens {self.account.client_email} ({state})>"

    __str__ = __repr__

    async def authorization(self) -> str:
        """The ``Authorization`` header's value: ``Bearer <token>``."""
        return "Bearer " + await self.token()

    async def token(self) -> str:
        """The current token, renewed first when due. ``UpstreamError`` (channel fault) when
        there is none and the token endpoint gives none."""
        token = self._token
        now = self._clock()
        if token is not None and (now < self._renew_at or now < min(self._retry_at, self._expires)):
            return token
        flight = self._flight
        if flight is None:
            flight = self._flight = asyncio.ensure_future(self._refresh())
            flight.add_done_callback(self._landed)
        try:
            return await asyncio.shield(flight)
        except UpstreamError as exc:
            token = self._token
            if token is not None and self._clock() < self._expires:
                return token  # the old one still works
            # each waiter raises its own: the relay may change what it raises
            raise UpstreamError(exc.message, channel_fault=True) from None

    def invalidate(self, token: str | None = None) -> None:
        """Forget the token (only if it is still ``token``, when given): the upstream refused
        it. The next request gets a new one."""
        if token is None or token == self._token:
            self._token = None
            self._expires = self._renew_at = self._retry_at = 0.0

    async def _refresh(self) -> str:
        now = self._clock()
        assertion = self.account.assertion(now, self.scope)
        try:
            status, raw = await self._post(
                self.account.token_uri, {"grant_type": GRANT_TYPE, "assertion": assertion}
            )
            token, lifetime = read_token_reply(status, raw, assertion)
        except GatewayError:
            self._retry_at = self._clock() + RETRY_WAIT
            raise
        self._token = token
        self._expires = now + lifetime
        self._renew_at = now + max(lifetime - self._early, lifetime / 2)
        self._retry_at = 0.0
        return token

    def _landed(self, flight: asyncio.Future[str]) -> None:
        self._flight = None
        if not flight.cancelled():
            flight.exception()  # retrieved: a failure nobody awaited is not reported as lost


def session_post(
    session: aiohttp.ClientSession | Callable[[], aiohttp.ClientSession],
    timeout: float = TOKEN_TIMEOUT,
) -> TokenPost:
    """A ``TokenPost`` over an aiohttp session (or a function returning it, for a session
    made later, at start-up): a connection failure or a timeout becomes an ``UpstreamError``
    of the channel."""
    limits = aiohttp.ClientTimeout(total=timeout)

    async def post(url: str, form: Mapping[str, str]) -> tuple[int, bytes]:
        client = session if isinstance(session, aiohttp.ClientSession) else session()
        try:
            async with client.post(
                url, data=dict(form), headers={"Accept": "application/json"}, timeout=limits
            ) as resp:
                return resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError(
                f"could not reach the token endpoint ({type(exc).__name__})", channel_fault=True
            ) from None

    return post
