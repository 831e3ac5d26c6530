"""AWS Signature Version 4, checked the way AWS checks it, for the fake Bedrock.

The signature is recomputed with botocore's ``SigV4Auth`` from the request as it arrived: the
raw path and query, the headers named in ``SignedHeaders`` with the values received, the body's
bytes, the access key's secret from the fake's credentials and the ``X-Amz-Date`` given. What
fails gets AWS's error type and wording (all 403): no ``Authorization``
(MissingAuthenticationTokenException), an unparsable one (IncompleteSignatureException), an
unknown access key (UnrecognizedClientException), a scope for another service or day, a
signing time more than 5 minutes off, an unsigned ``host`` or ``x-amz-date``, or a signature
that does not match (InvalidSignatureException).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from botocore.auth import SIGV4_TIMESTAMP, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

ACCESS_KEY = "AKIAFAKEGATEWAY00001"  # the fake's default credentials
SECRET_KEY = "fake/Bedrock+secret/key0000000000000000"
CREDENTIALS = {ACCESS_KEY: SECRET_KEY}
SERVICE = "bedrock"
ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW = timedelta(minutes=5)
MISMATCH = (
    "The request signature we calculated does not match the signature you provided. Check "
    "your AWS Secret Access Key and signing method. Consult the service documentation for "
    "details."
)


@dataclass(frozen=True, slots=True)
class Rejection:
    error_type: str
    message: str
    status: int = 403


def _parse(authorization: str) -> dict[str, str] | None:
    """``AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...`` -> its fields."""
    algorithm, _, rest = authorization.partition(" ")
    if algorithm != ALGORITHM:
        return None
    fields: dict[str, str] = {}
    for item in rest.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq:
            return None
        fields[key] = value
    if not {"Credential", "SignedHeaders", "Signature"} <= fields.keys():
        return None
    return fields


def verify(
    method: str,
    raw_path: str,
    headers: Mapping[str, str],
    body: bytes,
    credentials: Mapping[str, str],
    now: datetime | None = None,
) -> Rejection | None:
    """None when the request is signed by one of ``credentials`` (access key -> secret);
    else why not. ``headers`` is case-insensitive (aiohttp's); ``raw_path`` the request
    line's path and query as received."""
    authorization = headers.get("Authorization")
    if not authorization:
        return Rejection("MissingAuthenticationTokenException", "Missing Authentication Token")
    fields = _parse(authorization)
    scope = fields["Credential"].split("/") if fields else []
    if fields is None or len(scope) != 5 or scope[4] != "aws4_request":
        return Rejection(
            "IncompleteSignatureException",
            "Authorization header requires 'Credential', 'SignedHeaders' and 'Signature'.",
        )
    access_key, day, region, service, _ = scope
    secret = credentials.get(access_key)
    if secret is None:
        return Rejection(
            "UnrecognizedClientException", "The security token included in the request is invalid."
        )
    if service != SERVICE:
        return Rejection(
            "InvalidSignatureException",
            f"Credential should be scoped to correct service: '{SERVICE}'.",
        )
    stamp = headers.get("X-Amz-Date", "")
    try:
        signed_at = datetime.strptime(stamp, SIGV4_TIMESTAMP).replace(tzinfo=UTC)
    except ValueError:
        return Rejection("IncompleteSignatureException", "X-Amz-Date is missing or malformed.")
    now = now or datetime.now(UTC)
    if abs(now - signed_at) > MAX_SKEW:
        return Rejection(
            "InvalidSignatureException",
            f"Signature expired: {stamp} is now earlier than "
            f"{(now - MAX_SKEW).strftime(SIGV4_TIMESTAMP)} "
            f"({now.strftime(SIGV4_TIMESTAMP)} - 5 min.)",
        )
    if day != stamp[:8]:
        return Rejection(
            "InvalidSignatureException", f"Date in Credential scope does not match YYYYMMDD "
            f"from ISO-8601 version of date from HTTP: '{day}' != '{stamp[:8]}'"
        )  # fmt: skip
    signed_names = fields["SignedHeaders"].split(";")
    if "host" not in signed_names or "x-amz-date" not in signed_names:
        return Rejection("InvalidSignatureException", MISMATCH)
    signed = {}
    for name in signed_names:
        value = headers.get(name)
        if value is None:
            return Rejection("InvalidSignatureException", MISMATCH)
        signed[name] = value
    request = AWSRequest(
        method=method, url=f"http://{signed['host']}{raw_path}", headers=signed, data=body
    )
    request.context["timestamp"] = stamp
    auth = SigV4Auth(
        Credentials(access_key, secret, headers.get("X-Amz-Security-Token")), service, region
    )
    if auth.signed_headers(auth.headers_to_sign(request)) != fields["SignedHeaders"]:
        return Rejection("InvalidSignatureException", MISMATCH)
    canonical = auth.canonical_request(request)
    expected = auth.signature(auth.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected, fields["Signature"]):
        return Rejection("InvalidSignatureException", MISMATCH)
    return None
