"""Google's OAuth2 token endpoint and access-token check, for the fake Vertex AI.

``POST /token`` takes the JWT bearer grant (``grant_type=urn:ietf:params:oauth:grant-type:
jwt-bearer``, ``assertion=<JWT>``) as Google's does: the assertion's RS256 signature must
verify against the public key of a service account the fake knows (its ``kid``, when given,
must name that key), ``aud`` must be Google's token endpoint (``https://oauth2.googleapis.com/
token``, which google-auth writes whatever the key file's ``token_uri``) or the fake's own
URL, ``iss`` the account's email,
``scope`` must hold the cloud-platform scope, and ``iat``/``exp`` must make a token of at most
an hour that is valid now. The reply is Google's, ``{"access_token", "expires_in",
"token_type": "Bearer"}``; a refusal is a 400 with ``{"error", "error_description"}`` in
Google's words. Verification is PyJWT's (the gateway signs with it; ``google-auth``'s own
service-account credentials are held to the same endpoint in the tests).

Vertex AI's paths accept ``Authorization: Bearer <token>`` only for a token this endpoint
minted that has not expired; else 401 ``UNAUTHENTICATED`` with the reason Google gives
(``CREDENTIALS_MISSING``, ``ACCESS_TOKEN_EXPIRED``, ``ACCESS_TOKEN_TYPE_UNSUPPORTED``).

Service accounts are made at run time (``make_account``: a 2048-bit RSA key generated for the
test, never a real one) and their key file's JSON written by ``FakeServiceAccount.info``.
"""

from __future__ import annotations

import functools
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
MAX_LIFETIME = 3600  # seconds an assertion may cover
SKEW = 300  # seconds of clock difference allowed
EMAIL = "gateway-test@fake-project.iam.gserviceaccount.com"
PROJECT = "fake-project"
BAD_SIGNATURE = "Invalid JWT Signature."
BAD_TIME = (
    "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable "
    "timeframe. Check your iat and exp values in the JWT claim."
)
BAD_SCOPE = "Invalid OAuth scope or ID token audience provided."
UNAUTHENTICATED = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
    "cookie or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project."
)
MISSING = (
    "Request is missing required authentication credential. Expected OAuth 2 access token, "
    "login cookie or other valid authentication credential. See "
    "https://developers.google.com/identity/sign-in/web/devconsole-project."
)


@dataclass(frozen=True, slots=True)
class FakeServiceAccount:
    """A service account made for a test: its email, key id and RSA key pair."""

    email: str
    key_id: str
    private_pem: str = field(repr=False)
    public_key: rsa.RSAPublicKey = field(repr=False)

    def info(self, token_uri: str, project: str = PROJECT) -> dict[str, str]:
        """The key file's JSON, as the Cloud console writes it."""
        return {
            "type": "service_account",
            "project_id": project,
            "private_key_id": self.key_id,
            "private_key": self.private_pem,
            "client_email": self.email,
            "client_id": "100000000000000000001",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth",
            "token_uri": token_uri,
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "universe_domain": "googleapis.com",
        }


def make_account(email: str = EMAIL) -> FakeServiceAccount:
    """A new service account with a freshly generated key (about 0.1 s)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return FakeServiceAccount(email, secrets.token_hex(20), pem, key.public_key())


@functools.cache
def default_account() -> FakeServiceAccount:
    """The process's test service account, made once (``FakeUpstream.service_account``)."""
    return make_account()


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    payload: dict[str, Any]


def _invalid(description: str, error: str = "invalid_grant") -> Refusal:
    return Refusal(400, {"error": error, "error_description": description})


class TokenIssuer:
    """The accounts the fake knows, the tokens it minted and when each expires."""

    def __init__(self, lifetime: int = 3599) -> None:
        self.lifetime = lifetime  # expires_in of the tokens minted
        self.accounts: dict[str, FakeServiceAccount] = {}
        self.tokens: dict[str, float] = {}  # token -> expiry (unix seconds)
        self.grants = 0  # tokens minted

    def add(self, account: FakeServiceAccount) -> None:
        self.accounts[account.email] = account

    def expire_all(self) -> None:
        """Every token minted so far expires now."""
        for token in self.tokens:
            self.tokens[token] = 0.0

    def grant(
        self, form: Mapping[str, str], audience: str, now: float | None = None
    ) -> tuple[int, dict[str, Any]]:
        """A token request's form -> (status, reply); ``audience`` is this endpoint's URL."""
        now = time.time() if now is None else now
        if form.get("grant_type") != GRANT_TYPE:
            given = form.get("grant_type", "")
            return 400, {
                "error": "unsupported_grant_type",
                "error_description": f"Invalid grant_type: {given}",
            }
        assertion = form.get("assertion")
        if not assertion:
            refusal = _invalid("Missing required parameter: assertion", "invalid_request")
            return refusal.status, refusal.payload
        refused = self._check(assertion, audience, now)
        if refused is not None:
            return refused.status, refused.payload
        token = "ya29.fake-" + secrets.token_urlsafe(32)
        self.tokens[token] = now + self.lifetime
        self.grants += 1
        return 200, {"access_token": token, "expires_in": self.lifetime, "token_type": "Bearer"}

    def _check(self, assertion: str, audience: str, now: float) -> Refusal | None:
        try:
            header = jwt.get_unverified_header(assertion)
            unverified = jwt.decode(assertion, options={"verify_signature": False})
        except jwt.PyJWTError:
            return _invalid("Invalid JWT: the assertion is not a JWT.")
        account = self.accounts.get(str(unverified.get("iss")))
        if account is None:
            return _invalid("Invalid grant: account not found")
        if header.get("alg") != "RS256":
            return _invalid(BAD_SIGNATURE)
        if "kid" in header and header["kid"] != account.key_id:
            return _invalid(BAD_SIGNATURE)
        try:
            claims = jwt.decode(
                assertion,
                account.public_key,
                algorithms=["RS256"],
                audience=[GOOGLE_TOKEN_URI, audience],
                # the times are checked below, against the ``now`` given
                options={
                    "require": ["iss", "aud", "iat", "exp"],
                    "verify_exp": False,
                    "verify_iat": False,
                    "verify_nbf": False,
                },
            )
        except jwt.InvalidAudienceError:
            return _invalid(
                f"Invalid JWT: Failed audience check. The right audience is {GOOGLE_TOKEN_URI}"
            )
        except (jwt.InvalidSignatureError, jwt.DecodeError):
            return _invalid(BAD_SIGNATURE)
        except jwt.PyJWTError:
            return _invalid(BAD_TIME)
        issued, expires = claims["iat"], claims["exp"]
        if not isinstance(issued, int) or not isinstance(expires, int):
            return _invalid(BAD_TIME)
        if expires - issued > MAX_LIFETIME or issued > now + SKEW or expires < now - SKEW:
            return _invalid(BAD_TIME)
        scopes = str(claims.get("scope") or "").split()
        if SCOPE not in scopes:
            return _invalid(BAD_SCOPE, "invalid_scope")
        return None

    def check_bearer(self, authorization: str, now: float | None = None) -> Refusal | None:
        """None when ``authorization`` is ``Bearer <a live token minted here>``; else the 401
        Vertex AI answers."""
        now = time.time() if now is None else now
        kind, _, token = authorization.partition(" ")
        if not authorization:
            return _unauthenticated(MISSING, "CREDENTIALS_MISSING")
        if kind.lower() != "bearer" or token.strip() not in self.tokens:
            return _unauthenticated(UNAUTHENTICATED, "ACCESS_TOKEN_TYPE_UNSUPPORTED")
        if self.tokens[token.strip()] <= now:
            return _unauthenticated(UNAUTHENTICATED, "ACCESS_TOKEN_EXPIRED")
        return None


def _unauthenticated(message: str, reason: str) -> Refusal:
    info = {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": reason,
        "domain": "googleapis.com",
        "metadata": {"service": "aiplatform.googleapis.com"},
    }
    error = {"code": 401, "message": message, "status": "UNAUTHENTICATED", "details": [info]}
    return Refusal(401, {"error": error})
