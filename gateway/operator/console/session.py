"""Console sign-in sessions: a signed cookie, the same on every instance, never the token.

A session is ``<payload>.<signature>``: the payload (base64url JSON) says who signed in, the
admin (``{"r": "admin"}``), a key (``{"r": "key", "h": <SHA-256 of its secret>}``) or a user
(``{"r": "user", "u": <its id>}``: ``console/users.py``), until
when (``e``, unix seconds) and a random ``n`` from which the session's CSRF token is derived;
the signature is an HMAC-SHA256 under the store's session secret (``Store.session_secret``:
random, made once, shared by every instance through the cache, never derived from the admin
token or anything else), so every instance on the store accepts it, and a rotation
(``POST /admin/sessions/rotate``) ends every session on every instance within a second. An
admin session's signature covers the configured admin token as well, so changing the token
ends every admin session too; under the random secret nothing a cookie holds lets anyone test
a guess of the token. Until the store first answered there is no secret: sign-in answers 503
and no cookie is accepted.

The cookie is ``HttpOnly`` (scripts never read it), ``SameSite=Strict`` (no other site's page
sends it) and, over TLS, ``__Host-``-prefixed and ``Secure`` (``console/http.py``). A request
that changes anything must also carry the session's CSRF token in ``x-console-csrf``: a form on
another site cannot set that header. A key session is checked against the key cache on every
request, so a key disabled, expired or deleted ends its sessions within a second. A cookie
stays valid by its signature alone, so signing out also revokes the session's nonce on the
server (``console.sign_out``, kept by the store and loaded into every cache) until the session
would have ended anyway. A key disabled or deleted revokes every session it signed in until
then the same way, under one entry (``key_sessions``, kept until the last of them would have
ended): those never come back, even when the key is enabled again (or made again with its
secret).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from dataclasses import dataclass
from typing import Protocol

import orjson

COOKIE = "gw_console"  # over plain http (``console/http.py``: ``over_tls``)
HOST_COOKIE = "__Host-" + COOKIE  # over TLS: Secure, Path=/, no Domain
CSRF_HEADER = "x-console-csrf"
LIFETIME = 12 * 3600  # seconds a sign-in lasts


ROLES = ("admin", "key", "user")


def key_sessions(key_hash: str) -> str:
    """The revocation entry of a key's sessions: kept until ``LIFETIME`` after the key was
    disabled, it ends every session of the key issued up to then (those whose end is not
    after the entry's)."""
    return "key:" + key_hash


@dataclass(frozen=True, slots=True)
class Session:
    role: str  # "admin" | "key" | "user"
    key_hash: str  # the key's (role "key"), else ""
    expires: int
    nonce: str
    user: str = ""  # the user's id (role "user"), else ""

    def csrf(self, signer: Signer) -> str:
        return signer.mac(b"csrf\0" + self.nonce.encode())[:32]


class Secrets(Protocol):
    """Where the session secret is read (the store's cache): None until the store answered."""

    @property
    def session_secret(self) -> bytes | None: ...


class NoSecretError(Exception):
    """No session secret yet: the store has not answered since the process started."""


class Signer:
    def __init__(self, secrets: Secrets, admin_token: str) -> None:
        self._secrets = secrets
        self._admin_token = admin_token.encode()

    def _secret(self) -> bytes:
        secret = self._secrets.session_secret
        if secret is None:
            raise NoSecretError("no session secret: the store has not answered yet")
        return secret

    def mac(self, data: bytes) -> str:
        """NoSecretError until the store first answered."""
        digest = hmac.new(self._secret(), data, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def _signature(self, body: bytes, role: str) -> str:
        if role == "admin":  # bound to the admin token in force: a new token ends it
            return self.mac(body + b"\0admin\0" + self._admin_token)
        return self.mac(body)

    def issue(
        self,
        role: str,
        key_hash: str = "",
        now: float | None = None,
        after: int = 0,
        user: str = "",
    ) -> tuple[str, Session]:
        """A new session and its cookie value (NoSecretError until the store answered).
        ``after``: the sessions ending at or before it are revoked (a key disabled in the same
        second as this sign-in): this one ends a second later, so it is not among them.
        ``user``: the user's id, for a user's session (role ``user``)."""
        expires = max(int((now or time.time()) + LIFETIME), after + 1)
        session = Session(role, key_hash, expires, os.urandom(12).hex(), user)
        payload = {"r": role, "h": key_hash, "e": session.expires, "n": session.nonce}
        if user:
            payload["u"] = user
        body = base64.urlsafe_b64encode(orjson.dumps(payload)).rstrip(b"=")
        return f"{body.decode()}.{self._signature(body, role)}", session

    def read(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session a cookie holds, or None when it is absent, forged, over, or there is
        no secret to check it with yet."""
        if not cookie or cookie.count(".") != 1:
            return None
        body, signature = cookie.split(".")
        try:
            payload = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            session = Session(
                payload["r"], payload["h"], int(payload["e"]), payload["n"], payload.get("u", "")
            )
            expected = self._signature(body.encode(), session.role)
        except (ValueError, KeyError, TypeError, AttributeError, NoSecretError):
            return None
        if not hmac.compare_digest(signature, expected):
            return None
        if session.expires <= (now or time.time()) or session.role not in ROLES:
            return None
        if (session.role == "user") != bool(session.user):
            return None
        return session
