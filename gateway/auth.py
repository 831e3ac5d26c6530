"""Who is calling: the key from the request, checked against the cached key table (pure).

Keys are accepted as ``Authorization: Bearer sk-...``, ``x-api-key``, ``x-goog-api-key`` on
every path, and ``?key=`` on the generate-content paths, so each provider's SDK works with only
its base URL changed. The secret is hashed (SHA-256) and looked up; it is never kept or logged.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from urllib.parse import parse_qsl

from gateway.errors import AuthenticationError
from gateway.store import KeyRecord
from gateway.types import Scope

HEADER_NAMES = (b"authorization", b"x-api-key", b"x-goog-api-key")


def extract_key(scope: Scope, allow_query: bool = False) -> str | None:
    found: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in HEADER_NAMES:
            found[name] = value
    auth = found.get(b"authorization")
    if auth is not None:
        scheme, _, token = auth.partition(b" ")
        if scheme.lower() == b"bearer" and token.strip():
            return token.strip().decode("latin-1")
    for name in (b"x-api-key", b"x-goog-api-key"):
        v = found.get(name)
        if v:
            return v.strip().decode("latin-1")
    if allow_query and scope.get("query_string"):
        query: bytes = scope["query_string"]
        for name, value in parse_qsl(query.decode("latin-1")):
            if name == "key" and value:
                return value
    return None


def check_key(record: KeyRecord | None, now: datetime) -> KeyRecord:
    """The key's record if it may be used now; AuthenticationError (401) otherwise."""
    if record is None:
        raise AuthenticationError("Invalid API key.")
    if record.status != "enabled":
        raise AuthenticationError("This API key is disabled.")
    if record.expires_at is not None and record.expires_at <= now:
        raise AuthenticationError("This API key has expired.")
    return record


def key_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()
