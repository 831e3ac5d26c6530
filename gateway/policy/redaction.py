"""Credentials never echoed: what an upstream's error text may not carry out of the gateway.

Providers echo credentials in some error texts (a 400 naming the header it could not parse, a
401 quoting the key it refused). An upstream's message may reach the client, and the channel
test's reply, but never a credential (CONTRACT §4): ``redact`` replaces the channel's own
secrets (``channel_secrets``) and anything shaped like a credential (bearer tokens, ``sk-``
keys, Google API keys and OAuth access tokens, AWS access key ids, secret keys and session
tokens, private key blocks, ``api_key=...`` pairs) by ``[redacted]``.

It is applied where an upstream's text becomes a gateway error on its way out: the relay's
attempt (an error status, a reply that fails, a stream's error before or after its first
output) and the channel test, which know the channel. The protocols stay pure and never
see the channel's secrets. Only failures pay for it: one regular expression over a short
message.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gateway.errors import GatewayError

REDACTED = "[redacted]"
# a channel's own secret shorter than this is not searched for (a test's "k" would blank
# every k of every message); anything credential-shaped still is
MIN_SECRET = 8
# the channel fields that hold a credential, by name: the cloud channel types' included, so a
# type that adds one is covered by naming it here
SECRET_FIELDS = (
    "api_key",
    "api_keys",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
)

_B64 = r"A-Za-z0-9+/="
PATTERN = re.compile(
    "|".join(
        (
            # a PEM private key, whole or cut short
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)",
            r"(?P<bearer>(?i:\bbearer\s+))[A-Za-z0-9._~+/=*-]{6,}",  # Authorization: Bearer <token>
            r"\bsk-[A-Za-z0-9_*-]{6,}",  # OpenAI, Anthropic and gateway keys
            r"\bAIza[0-9A-Za-z_-]{20,}",  # Google API keys
            r"\bya29\.[0-9A-Za-z._-]+",  # Google OAuth2 access tokens
            r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ABIA|ACCA)[A-Z0-9]{16}\b",  # AWS ids
            rf"(?<![{_B64}])[{_B64}]{{40}}(?![{_B64}])",  # AWS secret access keys (40 chars)
            rf"[{_B64}]{{100,}}",  # AWS session tokens, and any long opaque blob
            # name=value and "name": "value" pairs of a credential's name
            r"(?P<name>(?i:\b(?:api[-_]?key|access[-_]?token|secret(?:[-_]?access)?[-_]?key|"
            r"session[-_]?token|password)[\"']?\s*[:=]\s*[\"']?))[^\s\"',;&]{4,}",
        )
    )
)


def channel_secrets(channel: object) -> tuple[str, ...]:
    """The credentials a channel (or an upstream target) holds, longest first (a key that
    contains another is replaced whole)."""
    found: list[str] = []
    # a cloud channel keeps its own credentials apart (``config.clouds.CloudAccess``)
    for holder in (channel, getattr(channel, "cloud", None)):
        for name in SECRET_FIELDS:
            value = getattr(holder, name, None)
            values = value if isinstance(value, list | tuple) else (value,)
            found += [v for v in values if isinstance(v, str) and len(v) >= MIN_SECRET]
    return tuple(sorted(set(found), key=len, reverse=True))


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with each of ``secrets`` and everything credential-shaped replaced."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return PATTERN.sub(_keep_name, text)


def _keep_name(match: re.Match[str]) -> str:
    """A bearer token or a ``name=value`` pair keeps its name, for the reader's sake."""
    return (match.group("bearer") or match.group("name") or "") + REDACTED


def redact_error(err: GatewayError, secrets: Iterable[str] = ()) -> GatewayError:
    """``err`` with its message redacted (in place: the same error object goes on), so that
    wherever it is rendered (the client's reply in any protocol, a stream's error event) it
    carries no credential."""
    message = redact(err.message, secrets)
    if message != err.message:
        err.message = message
        err.args = (message,)
    return err
