"""Who is calling: the one authentication gate of the client surface.

A request's key is read from where each provider's SDK sends it (``auth.extract_key``),
looked up by its hash in the key cache (no store round trip), checked (401: unknown,
disabled, expired) and held to its ``allowed_ips`` (403). While the gateway has not reached
its store, or has not heard from it for longer than ``limits.store_grace``, keys and balances
are not trusted and every request answers 503. The relay, the model lists and the billing
dashboard all pass through here.
"""

from __future__ import annotations

import math
import time
from datetime import datetime

from gateway.config import Settings
from gateway.edge.routes import RouteSpec
from gateway.errors import AuthenticationError, PermissionDeniedError, UpstreamUnavailableError
from gateway.policy.auth import address_allowed, check_key, extract_key, key_hash
from gateway.policy.billing import ClientAddress
from gateway.store import KeyRecord
from gateway.store.cache import Cache
from gateway.types import Scope

STORE_RETRY_AFTER = 2.0  # seconds a client is told to wait while the store is away
# the scope entry of a request the console makes for a signed-in user's own key (its try-it
# box, ``operator/console/trial.py``): the key's hash, in place of a secret the console does
# not have. Only this process puts it in a scope: a server builds a scope from standard
# entries alone, so no client can send it.
CONSOLE_KEY = "gateway.console_key"


class Gate:
    """Authenticates client requests against the key cache; ``ready`` once the store answered
    and the cache is filled (set by the app's lifespan)."""

    __slots__ = ("cache", "address", "store_grace", "ready")

    def __init__(self, settings: Settings, cache: Cache) -> None:
        self.cache = cache
        self.address = ClientAddress(settings.trusted_proxies)
        self.store_grace = settings.limits.store_grace or math.inf
        self.ready = False

    def authenticate(
        self, spec: RouteSpec, scope: Scope, headers: dict[bytes, bytes], now: datetime
    ) -> KeyRecord:
        """The caller's key record (401 when missing, unknown, disabled or expired; 403 from
        an address its ``allowed_ips`` do not hold; 503 while the store is not trusted)."""
        if not self.ready or time.monotonic() - self.cache.fresh_at > self.store_grace:
            raise UpstreamUnavailableError(
                "The gateway cannot reach its store; try again shortly.",
                retry_after=STORE_RETRY_AFTER,
            )
        chosen = scope.get(CONSOLE_KEY)
        if chosen is not None:  # the console's try-it call for a key of the signed-in user
            key = check_key(self.cache.key(chosen), now)
        else:
            secret = extract_key(headers, scope.get("query_string", b""), spec.key_in_query)
            if secret is None:
                raise AuthenticationError("Missing API key.")
            key = check_key(self.cache.key(key_hash(secret)), now)
        if key.allowed_ips is not None:
            self.check_address(key, scope, headers)
        return key

    def check_address(self, key: KeyRecord, scope: Scope, headers: dict[bytes, bytes]) -> None:
        """403 when the key has ``allowed_ips`` and the client's address (the socket peer, or
        the forwarded one from a trusted proxy) is outside them: for its requests, its console
        sign-in and every console request of its session alike."""
        if key.allowed_ips is None:
            return
        ip = self.address.of(scope.get("client"), headers.get(b"x-forwarded-for"))
        if not address_allowed(ip, key.allowed_ips):
            raise PermissionDeniedError("This API key may not be used from this address.")
