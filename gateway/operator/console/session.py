"""Console sign-in sessions: a signed cookie, the same on every instance, never the token.

A session is ``<payload>.<signature>``: the payload (base64url JSON) says who signed in, the
admin (``{"r": "admin"}``), a key (``{"r": "key", "h": <SHA-256 of its secret>}``) or a user
(``{"r": "user", "u": <its id>}``: ``console/users.py``), until
when (``e``, unix seconds) and a random ``n`` from which the session's CSRF token is derived;
the signature is an HMAC-SHA256 under a secret derived from the admin token, so every instance
with the same configuration accepts it, and changing the admin token ends every session. With
no admin token there is no admin sign-in, and key sessions are signed with a secret of this
process alone (they end with it, and hold on this instance only).

The cookie is ``HttpOnly`` (scripts never read it), ``SameSite=Strict`` (no other site's page
sends it) and ``Secure`` over HTTPS. A request that changes anything must also carry the
session's CSRF token in ``x-console-csrf``: a form on another site cannot set that header.
A key session is checked against the key cache on every request, so a key disabled, expired
or deleted ends its sessions within a second. A cookie stays valid by its signature alone, so
signing out also revokes the session's nonce on the server (``console.sign_out``, kept by
the store and loaded into every cache) until the session would have ended anyway.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from dataclasses import dataclass

import orjson

COOKIE = "gw_console"
CSRF_HEADER = "x-console-csrf"
LIFETIME = 12 * 3600  # seconds a sign-in lasts


ROLES = ("admin", "key", "user")


@dataclass(frozen=True, slots=True)
class Session:
    role: str  # "admin" | "key" | "user"
    key_hash: str  # the key's (role "key"), else ""
    expires: int
    nonce: str
    user: str = ""  # the user's id (role "user"), else ""

    def csrf(self, signer: Signer) -> str:
        return signer.mac(b"csrf\0" + self.nonce.encode())[:32]


class Signer:
    def __init__(self, admin_token: str) -> None:
        seed = b"gateway-console\0" + (admin_token.encode() if admin_token else os.urandom(32))
        self._secret = hashlib.sha256(seed).digest()

    def mac(self, data: bytes) -> str:
        digest = hmac.new(self._secret, data, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def issue(
        self, role: str, key_hash: str = "", now: float | None = None, user: str = ""
    ) -> tuple[str, Session]:
        """A new session and its cookie value."""
        session = Session(
            role, key_hash, int((now or time.time()) + LIFETIME), os.urandom(12).hex(), user
        )
        payload = {"r": role, "h": key_hash, "e": session.expires, "n": session.nonce}
        if user:
            payload["u"] = user
        body = base64.urlsafe_b64encode(orjson.dumps(payload)).rstrip(b"=")
        return f"{body.decode()}.{self.mac(body)}", session

    def read(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session a cookie holds, or None when it is absent, forged or over."""
        if not cookie or cookie.count(".") != 1:
            return None
        body, signature = cookie.split(".")
        if not hmac.compare_digest(signature, self.mac(body.encode())):
            return None
        try:
            payload = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
            session = Session(
                payload["r"], payload["h"], int(payload["e"]), payload["n"], payload.get("u", "")
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        if session.expires <= (now or time.time()) or session.role not in ROLES:
            return None
        if (session.role == "user") != bool(session.user):
            return None
        return session
