"""Who is calling: the key from the request, checked against the cached key table (pure).

Keys are accepted as ``Authorization: Bearer sk-...``, ``x-api-key``, ``x-goog-api-key`` on
every path, and ``?key=`` on the generate-content paths, so each provider's SDK works with only
its base URL changed. The secret is hashed (SHA-256) and looked up; it is never kept or logged.
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
from datetime import datetime
from urllib.parse import parse_qsl

from gateway.errors import AuthenticationError
from gateway.store import KeyRecord


def extract_key(
    found: dict[bytes, bytes], query_string: bytes = b"", allow_query: bool = False
) -> str | None:
    """The secret from the request's headers (``gateway.edge.asgi.request_headers``) or query."""
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


@functools.lru_cache(maxsize=1024)
def _networks(cidrs: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)


def address_allowed(ip: str | None, cidrs: tuple[str, ...]) -> bool:
    """Whether a key limited to ``cidrs`` (its ``allowed_ips``) may be used from ``ip`` (an
    IPv4-mapped IPv6 address counts as its IPv4 one)."""
    if ip is None:
        return False
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return any(addr in net for net in _networks(cidrs))
