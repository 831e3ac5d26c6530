"""AWS Signature Version 4 for a channel's upstream requests (``bedrock`` channels).

One ``Signer`` per channel, built once: static credentials (access key, secret, optional
session token) or the environment's AWS chain (botocore's resolver: environment variables,
shared config and credentials files, SSO, container and instance roles). Per request,
``sign(method, url, headers, body)`` returns the headers to add: ``Authorization``,
``X-Amz-Date`` and, with a session token, ``X-Amz-Security-Token``. Bedrock signs the payload's
SHA-256 inside the signature, so it needs no ``x-amz-content-sha256`` header (that is S3's).

The crypto is botocore's ``SigV4Auth`` (canonical request, string to sign, signing key,
signature); this module only frames its steps. It does not call ``SigV4Auth.add_auth``, which
would read the clock itself and log the canonical request at DEBUG, session token included.

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
from collections.abc import Mapping
from datetime import UTC, datetime

from botocore.auth import SIGV4_TIMESTAMP, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, RefreshableCredentials
from botocore.session import Session

SERVICE = "bedrock"
ALGORITHM = "AWS4-HMAC-SHA256"
REPLACED = ("Authorization", "X-Amz-Date", "X-Amz-Security-Token")


class NoCredentialsError(ValueError):
    """The environment's AWS chain found no credentials (a configuration error)."""


class Signer:
    """Signs one channel's requests for ``service`` in ``region``."""

    __slots__ = ("region", "service", "_credentials")

    def __init__(self, credentials: Credentials, region: str, service: str = SERVICE) -> None:
        self.region = region
        self.service = service
        self._credentials = credentials

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
        auth = SigV4Auth(frozen, self.service, self.region)
        stamp = (now or datetime.now(UTC)).strftime(SIGV4_TIMESTAMP)
        request = AWSRequest(method=method, url=url, headers=dict(headers), data=body)
        request.context["timestamp"] = stamp
        added = {"X-Amz-Date": stamp}
        if frozen.token:
            added["X-Amz-Security-Token"] = frozen.token
        for name in REPLACED:  # a retry's call may carry the last attempt's
            del request.headers[name]
        for name, value in added.items():
            request.headers[name] = value
        canonical = auth.canonical_request(request)
        signature = auth.signature(auth.string_to_sign(request, canonical), request)
        # the canonical request's last lines are the signed header names and the payload's
        # hash (SigV4's fixed layout): read, not computed again
        signed = canonical.rsplit("\n", 2)[1]
        added["Authorization"] = (
            f"{ALGORITHM} Credential={auth.scope(request)}, "
            f"SignedHeaders={signed}, Signature={signature}"
        )
        return added
