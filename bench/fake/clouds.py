"""The clouds' credentials, checked before a request is read further: Vertex AI's bearer
token (minted by the fake's token endpoint, ``google_auth``) and Azure OpenAI's ``api-key``
with its ``api-version`` (``azure``); and the token endpoint's form body."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from bench.fake import azure
from bench.fake.google_auth import TokenIssuer


def form(raw: bytes) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body's fields (the last of a repeated one)."""
    return dict(parse_qsl(raw.decode("utf-8", "replace"), keep_blank_values=True))


def refusal(
    cloud: str, request: web.Request, issuer: TokenIssuer, azure_keys: frozenset[str]
) -> tuple[int, dict[str, Any]] | None:
    """None when the cloud takes the request's credentials; else (status, its error body)."""
    if cloud == "vertex":
        refused = issuer.check_bearer(request.headers.get("Authorization", ""))
        return None if refused is None else (refused.status, refused.payload)
    v1 = request.path.startswith("/openai/v1/")
    return azure.check(v1, request.query, request.headers, azure_keys)
