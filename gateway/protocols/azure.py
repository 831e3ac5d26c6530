"""Azure OpenAI addressing (``azure`` channels): the openai adapter's calls sent where Azure
takes them, with its ``api-key`` header, and Azure's errors read. Pure.

A channel is an ``AzureSite``: the resource endpoint (``https://NAME.openai.azure.com``) and
the ``api_version`` (required). The upstream model name (after ``model_map``) is the
deployment. As ``openai.AzureOpenAI`` addresses them:

- the deployment endpoints (``/chat/completions``, ``/completions``, ``/embeddings``,
  ``/images/generations``, ``/images/edits``, ``/audio/transcriptions``,
  ``/audio/translations``, ``/audio/speech``) go to
  ``{base_url}/openai/deployments/{deployment}{endpoint}?api-version={api_version}``;
- the others (the Responses API, ``/responses``) to ``{base_url}/openai{endpoint}?api-version=
  ...``, the deployment named by the body's ``model`` (the openai adapter writes the upstream
  model name there);
- with ``api_version: v1`` (Azure's v1 API, which takes no dated version), every endpoint goes
  to ``{base_url}/openai/v1{endpoint}``, the deployment in the body's ``model``.

The body is sent as the openai adapter encoded it (its ``model`` is the deployment already);
``Authorization: Bearer`` gives way to ``api-key``.

Azure's replies are OpenAI's plus ``prompt_filter_results`` (and a first stream chunk that
holds only them, with empty ``id`` and ``model``) and ``content_filter_results`` on choices;
the openai adapter carries them to openai clients and ignores them otherwise. A reply cut by
the content filter ends with ``finish_reason: content_filter``.

Errors (``decode_error``) are OpenAI's, mapped as the openai adapter maps them (by status),
but for Azure's codes that say more than their status:

| ``error.code``                                             | gateway                          |
|------------------------------------------------------------|----------------------------------|
| ``content_filter``, ``content_policy_violation``, or       | 400 InvalidRequestError, code    |
| ``innererror.code: ResponsibleAIPolicyViolation``          | ``content_filter``, the filtered |
|                                                            | categories named in the message  |
| ``DeploymentNotFound`` (404)                               | 404, retryable: another channel  |
|                                                            | may have the deployment          |
| ``404`` (Resource not found: a wrong ``api_version`` or    | 502 UpstreamError, the channel's |
| endpoint)                                                  | fault                            |
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

import orjson

from gateway.errors import GatewayError, InvalidRequestError, NotFoundError, UpstreamError
from gateway.protocols.base import UpstreamCall
from gateway.protocols.openai.reply import decode_error as openai_decode_error
from gateway.types import JSON

V1 = "v1"  # api_version of Azure's v1 API
API_KEY_HEADER = "api-key"
DEPLOYMENT_ENDPOINTS = (
    "/chat/completions",  # before "/completions", which it ends with
    "/completions",
    "/embeddings",
    "/images/generations",
    "/images/edits",
    "/audio/transcriptions",
    "/audio/translations",
    "/audio/speech",
)
RESOURCE_ENDPOINTS = ("/responses",)
CONTENT_FILTER = "content_filter"
FILTER_CODES = frozenset({"content_filter", "content_policy_violation"})
FILTER_INNER_CODE = "ResponsibleAIPolicyViolation"


@dataclass(frozen=True, slots=True)
class AzureSite:
    """An Azure OpenAI resource as a channel addresses it."""

    base_url: str  # the resource endpoint, https://NAME.openai.azure.com
    api_version: str  # e.g. 2024-10-21, or "v1"

    @property
    def root(self) -> str:
        return self.base_url.rstrip("/") + "/openai"


def endpoint_of(url: str) -> str:
    """The openai endpoint a call's URL ends with (``/chat/completions``, ...);
    ``NotFoundError`` for one Azure OpenAI has not (``/rerank``)."""
    path = url.partition("?")[0]
    for endpoint in DEPLOYMENT_ENDPOINTS + RESOURCE_ENDPOINTS:
        if path.endswith(endpoint):
            return endpoint
    raise NotFoundError("azure channels have no such endpoint")


def azure_url(site: AzureSite, deployment: str, endpoint: str) -> str:
    if site.api_version == V1:
        return f"{site.root}/v1{endpoint}"
    query = "?api-version=" + quote(site.api_version, safe="")
    if endpoint in DEPLOYMENT_ENDPOINTS:
        return f"{site.root}/deployments/{quote(deployment, safe='')}{endpoint}{query}"
    return f"{site.root}{endpoint}{query}"


def azure_headers(headers: dict[str, str], api_key: str) -> dict[str, str]:
    """A call's headers with ``api-key`` in place of ``Authorization``."""
    out = {k: v for k, v in headers.items() if k.lower() not in ("authorization", API_KEY_HEADER)}
    out[API_KEY_HEADER] = api_key
    return out


def azure_call(call: UpstreamCall, site: AzureSite, deployment: str, api_key: str) -> UpstreamCall:
    """A call the openai adapter (or an openai-type kind) encoded -> Azure's; the body as it
    is (a multipart upload too)."""
    return UpstreamCall(
        url=azure_url(site, deployment, endpoint_of(call.url)),
        headers=azure_headers(call.headers, api_key),
        body=call.body,
    )


def filtered_categories(error: dict[str, JSON]) -> list[str]:
    """The content-filter categories an error's ``innererror.content_filter_result`` marks
    filtered (or, for jailbreak-style ones, detected)."""
    inner = error.get("innererror") or error.get("inner_error")
    result = inner.get("content_filter_result") if isinstance(inner, dict) else None
    if not isinstance(result, dict):
        return []
    return sorted(
        name
        for name, verdict in result.items()
        if isinstance(verdict, dict)
        and (verdict.get("filtered") is True or verdict.get("detected") is True)
    )


def _content_filter(error: dict[str, JSON]) -> GatewayError:
    message = error.get("message")
    text = message if isinstance(message, str) and message else "the content filter refused"
    categories = filtered_categories(error)
    if categories:
        text += f" (filtered: {', '.join(categories)})"
    err = InvalidRequestError(text)
    err.code = CONTENT_FILTER
    return err


def decode_error(status: int, raw: bytes) -> GatewayError:
    """An Azure error reply -> the gateway error (module docstring)."""
    try:
        payload = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return openai_decode_error(status, raw)
    code = error.get("code")
    inner = error.get("innererror") or error.get("inner_error")
    inner_code = inner.get("code") if isinstance(inner, dict) else None
    if code in FILTER_CODES or inner_code == FILTER_INNER_CODE:
        return _content_filter(error)
    if code == "DeploymentNotFound":
        message = error.get("message")
        text = message if isinstance(message, str) and message else "deployment not found"
        return NotFoundError(text, retryable=True)
    if status == 404 and code == "404":
        return UpstreamError(
            "the channel's Azure endpoint or api_version is wrong (404 Resource not found)",
            channel_fault=True,
        )
    return openai_decode_error(status, raw)
