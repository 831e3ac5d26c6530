"""AWS Signature Version 4 for a channel's upstream requests (``bedrock`` channels).

One ``Signer`` per channel, built once: static credentials (access key, secret, optional
session token) or the environment's AWS chain (botocore's resolver: environment variables,
shared config and credentials files, SSO, container and instance roles). Per request,
``sign(method, url, headers, body)`` returns the headers to add: ``Authorization``,
``X-Amz-Date`` and, with a session token, ``X-Amz-Security-Token``. Bedrock signs the payload's
SHA-256 inside the signature, so it needs no ``x-amz-content-sha256`` header (that is S3's).

The steps are botocore's ``SigV4Auth``'s, written out for the one shape the gateway sends
(no streamed body, headers given whole): the canonical request (botocore's path normalization
and quoting, its list of headers never signed, its trimming of values), the string to sign,
the signing key and the signature (HMAC-SHA256 from ``hashlib``). What botocore builds per
request and does not change between a channel's requests is kept instead: the signing key
per day and secret, per URL its canonical path, query and host, and the signing time's text
per second of the clock. ``tests/test_sigv4.py``
holds every signature to ``SigV4Auth``'s own, and the fake Bedrock verifies them with it;
written out, one costs about a third of what ``SigV4Auth`` costs (bench/RESULTS.md). It does
not call ``SigV4Auth.add_auth``, which would read the clock itself and log the canonical
request at DEBUG, session token included.

The request must go out exactly as signed: every header given to ``sign`` is signed (give the
ones that are sent: ``content-type``, ``accept``; the ``host`` is taken from the URL), and the
URL's path byte for byte. aiohttp re-quotes a ``str`` URL (``%3A`` becomes ``:``), so a URL to
be signed is built already in that normal form (``gateway.protocols.bedrock.model_path``
does), or sent as ``yarl.URL(url, encoded=True)``.

Credentials from a chain can expire (instance and container roles, SSO): ``refresh_due``
tells when botocore would refresh them, which blocks on I/O; ``await refresh()`` does it in
a thread, so that ``sign`` itself never blocks.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Mapping
from datetime import datetime
from urllib.parse import quote, urlsplit

from botocore.auth import SIGNED_HEADERS_BLACKLIST, SIGV4_TIMESTAMP
from botocore.credentials import Credentials, RefreshableCredentials
from botocore.session import Session
from botocore.utils import normalize_url_path

SERVICE = "bedrock"
ALGORITHM = "AWS4-HMAC-SHA256"
REPLACED = frozenset({"authorization", "x-amz-date", "x-amz-security-token"})
NOT_SIGNED = frozenset(SIGNED_HEADERS_BLACKLIST) | REPLACED  # (the last ones: added anew)
DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_KNOWN_URLS = 256  # canonical paths kept per signer (a channel calls a few URLs)


def canonical_url(url: str) -> tuple[str, str, str]:
    """(canonical path, canonical query, host) of a URL, as botocore's ``SigV4Auth`` makes
    them: the path's dot segments and empty segments removed and quoted again (AWS's double
    encoding for every service but S3), the query's pairs sorted as they are, the host
    lowercase without userinfo or a default port."""
    parts = urlsplit(url)
    path = quote(normalize_url_path(parts.path), safe="/~")
    pairs = (
        sorted(pair.partition("=")[::2] for pair in parts.query.split("&")) if parts.query else []
    )
    query = "&".join(f"{key}={value}" for key, value in pairs)
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    if parts.port is not None and parts.port != DEFAULT_PORTS.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return path, query, host


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


class NoCredentialsError(ValueError):
    """The environment's AWS chain found no credentials (a configuration error)."""


class Signer:
    """Signs one channel's requests for ``service`` in ``region``."""

    __slots__ = ("region", "service", "_credentials", "_key", "_urls", "_stamp")

    def __init__(self, credentials: Credentials, region: str, service: str = SERVICE) -> None:
        self.region = region
        self.service = service
        self._credentials = credentials
        self._key: tuple[str, str, bytes] = ("", "", b"")  # (secret, day, signing key)
        self._urls: dict[str, tuple[str, str, str]] = {}  # url -> canonical_url(url)
        # the clock's last second and its stamp: formatting a time costs ~3 µs, a request's
        # signature ~20 µs in all, and every call in a second has the same stamp
        self._stamp: tuple[int, str] = (-1, "")

    @classmethod
    def static(
        cls,
        region: str,
        access_key: str,
        secret_key: str,
        session_token: str | None = None,
        service: str = SERVICE,
    ) -> Signer:
        return cls(Credentials(access_key, secret_key, session_token or None), region, service)

    @classmethod
    def from_environment(
        cls, region: str, profile: str | None = None, service: str = SERVICE
    ) -> Signer:
        """Credentials from botocore's resolver chain (may read files or the network: call it
        once, at start-up). Raises ``NoCredentialsError`` when the chain has none."""
        session = Session(profile=profile) if profile else Session()
        credentials = session.get_credentials()
        if credentials is None:
            raise NoCredentialsError("no AWS credentials found in the environment")
        return cls(credentials, region, service)

    @property
    def refresh_due(self) -> bool:
        """Whether the next ``sign`` would make botocore refresh the credentials (blocking)."""
        credentials = self._credentials
        return isinstance(credentials, RefreshableCredentials) and credentials.refresh_needed()

    async def refresh(self) -> None:
        """Refresh the credentials in a thread (when ``refresh_due``)."""
        await asyncio.to_thread(self._credentials.get_frozen_credentials)

    def sign(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        now: datetime | None = None,
    ) -> dict[str, str]:
        """The headers that authenticate this request (to add to ``headers``); ``now`` (UTC)
        is the signing time, the clock's when not given."""
        frozen = self._credentials.get_frozen_credentials()
        stamp = now.strftime(SIGV4_TIMESTAMP) if now is not None else self._now_stamp()
        added = {"X-Amz-Date": stamp}
        if frozen.token:
            added["X-Amz-Security-Token"] = frozen.token
        found = self._urls.get(url)
        if found is None:
            if len(self._urls) >= MAX_KNOWN_URLS:
                self._urls.clear()
            found = self._urls[url] = canonical_url(url)
        path, query, host = found
        signed: dict[str, list[str]] = {}
        for name, value in headers.items():  # a retry's call may carry the last attempt's
            low = name.lower()
            if low not in NOT_SIGNED:
                signed.setdefault(low, []).append(" ".join(value.split()))
        for name, value in added.items():
            signed[name.lower()] = [value]
        if "host" not in signed:
            signed["host"] = [host]
        names = sorted(signed)
        signed_names = ";".join(names)
        canonical = "\n".join(
            (
                method.upper(),
                path,
                query,
                "".join(f"{n}:{','.join(signed[n])}\n" for n in names),
                signed_names,
                hashlib.sha256(body).hexdigest(),
            )
        )
        day = stamp[:8]
        scope = f"{day}/{self.region}/{self.service}/aws4_request"
        to_sign = "\n".join(
            (ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode()).hexdigest())
        )
        signature = hmac.new(
            self._signing_key(frozen.secret_key or "", day), to_sign.encode(), hashlib.sha256
        ).hexdigest()
        added["Authorization"] = (
            f"{ALGORITHM} Credential={frozen.access_key}/{scope}, "
            f"SignedHeaders={signed_names}, Signature={signature}"
        )
        return added

    def _now_stamp(self) -> str:
        """The clock's time as SigV4 writes it (whole seconds, UTC), formatted once a second."""
        second = int(time.time())
        kept, stamp = self._stamp
        if second != kept:
            stamp = time.strftime(SIGV4_TIMESTAMP, time.gmtime(second))
            self._stamp = (second, stamp)
        return stamp

    def _signing_key(self, secret: str, day: str) -> bytes:
        """SigV4's key for a day (four HMACs), kept while the day and the secret last."""
        kept_secret, kept_day, key = self._key
        if kept_secret != secret or kept_day != day:
            key = _hmac(("AWS4" + secret).encode(), day)
            for part in (self.region, self.service, "aws4_request"):
                key = _hmac(key, part)
            self._key = (secret, day, key)
        return key
