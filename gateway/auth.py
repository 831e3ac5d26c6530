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


def extract_key(
    found: dict[bytes, bytes], query_string: bytes = b"", allow_query: bool = False
) -> str | None:
    """The secret from the request's headers (``gateway.asgi.request_headers``) or query."""
    auth = found.get(b"authorization")
    if auth is not None:
        scheme, _, token = auth.partition(b" ")
        if scheme.lower() == b"bearer" and token.strip():
            return token.strip().decode("latin-1")
    for header in (b"x-api-key", b"x-goog-api-key"):
        v = found.get(header)
        if v:
            return v.strip().decode("latin-1")
    if allow_query and query_string:
        for name, value in parse_qsl(query_string.decode("latin-1")):
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
