"""Google Vertex AI addressing (``vertex`` channels): where a gemini or anthropic call goes,
and what of its body and headers Vertex wants otherwise. Pure: the token is the channel's
(``gateway.upstream.google_token``), added by the caller as ``Authorization: Bearer``.

A channel is a ``VertexSite``: project, region and the root URL, by default
``https://{region}-aiplatform.googleapis.com`` (``https://aiplatform.googleapis.com`` for the
``global`` region, ``https://aiplatform.{us,eu}.rep.googleapis.com`` for the multi-regions
``us`` and ``eu``, as Anthropic's and Google's SDKs address them). Models live under
``{root}/v1/projects/{project}/locations/{region}/publishers/{publisher}/models/{model}``;
the publisher is ``anthropic`` for upstream names starting ``claude``, else ``google``.

- Gemini (the gemini adapter's calls, ``gemini_call``): ``:generateContent``,
  ``:streamGenerateContent?alt=sse``, ``:countTokens``, the same body but for two things AI
  Studio lets pass and Vertex refuses: a content without ``role`` (given ``user``, as AI
  Studio reads it) and countTokens' ``generateContentRequest`` wrapper (Vertex takes
  ``contents``, ``systemInstruction``, ``tools`` and ``generationConfig`` at the top, no
  ``model``). ``x-goog-api-key`` is dropped.
- Claude (the anthropic adapter's calls, ``claude_call``): ``:rawPredict`` and, for a body
  with ``"stream": true``, ``:streamRawPredict``, with the Messages body without ``model``
  and with ``anthropic_version: vertex-2023-10-16`` (a body's own is kept); a count goes to
  ``.../publishers/anthropic/models/count-tokens:rawPredict`` with ``model`` kept, as
  Anthropic's Vertex SDK sends both. ``anthropic-beta`` stays a header (Vertex reads it there;
  Bedrock wants it in the body); ``x-api-key`` and ``anthropic-version`` are dropped.
  Replies and streams are the Messages API's, read by the anthropic adapter as they are.

A model name goes into the path as one segment (``claude-sonnet-4-5@20250929`` keeps its
``@``; ``;`` and ``/`` are quoted, as Anthropic's SDK quotes them).

Errors (``decode_error``) come in two shapes: Google's ``{"error": {code, message, status,
details}}`` (auth, quota, a Gemini model's errors; sometimes inside a one-element array) read
as the gemini adapter reads them, and Anthropic's ``{"type": "error", "error": {...}}`` (a
Claude model's own) read as the anthropic adapter does. A 401 is the token's
(``UNAUTHENTICATED``): ``token_refused`` tells the caller to ``invalidate`` it.

Not carried: nothing is dropped from a body but ``model`` (Claude) and countTokens' wrapper
and its ``model`` (Gemini); what Vertex does not take of the rest is its to refuse.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

import orjson

from gateway.errors import GatewayError, InternalError, InvalidRequestError
from gateway.protocols.anthropic.reply import decode_error_payload
from gateway.protocols.base import UpstreamCall
from gateway.protocols.gemini.reply import error_from_payload
from gateway.types import JSON

GLOBAL_REGION = "global"
MULTI_REGIONS = frozenset({"us", "eu"})
API_VERSION = "v1"
ANTHROPIC_VERSION = "vertex-2023-10-16"
SEGMENT_SAFE = "-._~!$&'()*+,=:@"  # a path segment's characters left unquoted (not ';')
GEMINI_ACTIONS = frozenset({"generateContent", "streamGenerateContent", "countTokens"})
COUNT_MODEL = "count-tokens"  # the model segment of Claude's count endpoint
COUNT_FIELDS = ("contents", "systemInstruction", "tools", "generationConfig")
DROPPED_HEADERS = frozenset({"authorization", "x-goog-api-key", "x-api-key", "anthropic-version"})


def default_base_url(region: str) -> str:
    if region == GLOBAL_REGION:
        return "https://aiplatform.googleapis.com"
    if region in MULTI_REGIONS:
        return f"https://aiplatform.{region}.rep.googleapis.com"
    return f"https://{region}-aiplatform.googleapis.com"


@dataclass(frozen=True, slots=True)
class VertexSite:
    """Where a ``vertex`` channel's models live."""

    project: str
    region: str
    base_url: str = ""  # "": the region's default

    @property
    def root(self) -> str:
        return (self.base_url or default_base_url(self.region)).rstrip("/")


def publisher(model: str) -> str:
    """The publisher of an upstream model name: ``anthropic`` for Claude, else ``google``."""
    return "anthropic" if model.startswith("claude") else "google"


def model_url(site: VertexSite, publisher: str, model: str, action: str) -> str:
    return (
        f"{site.root}/{API_VERSION}/projects/{quote(site.project, safe='')}"
        f"/locations/{quote(site.region, safe='')}/publishers/{publisher}"
        f"/models/{quote(model, safe=SEGMENT_SAFE)}:{action}"
    )


def gemini_url(site: VertexSite, model: str, action: str) -> str:
    """``action``: generateContent, streamGenerateContent (SSE framing) or countTokens."""
    url = model_url(site, "google", model, action)
    return url + "?alt=sse" if action == "streamGenerateContent" else url


def claude_url(site: VertexSite, model: str, *, stream: bool = False, count: bool = False) -> str:
    if count:
        return model_url(site, "anthropic", COUNT_MODEL, "rawPredict")
    return model_url(site, "anthropic", model, "streamRawPredict" if stream else "rawPredict")


def _with_roles(contents: JSON) -> JSON:
    """Contents with ``role`` on each (``user`` where missing); the list as it was if none
    lacked one."""
    if not isinstance(contents, list):
        return contents
    if all(isinstance(c, dict) and c.get("role") for c in contents):
        return contents
    return [
        {**c, "role": "user"} if isinstance(c, dict) and not c.get("role") else c for c in contents
    ]


def gemini_body(payload: dict[str, JSON], action: str) -> dict[str, JSON]:
    """A generate-content (or countTokens) body as AI Studio takes it -> as Vertex does."""
    if action == "countTokens":
        inner = payload.get("generateContentRequest")
        source = inner if isinstance(inner, dict) else payload
        out = {k: source[k] for k in COUNT_FIELDS if k in source}
    else:
        out = dict(payload)
    if "contents" in out:
        out["contents"] = _with_roles(out["contents"])
    return out


def claude_body(payload: dict[str, JSON], model: str, *, count: bool = False) -> dict[str, JSON]:
    """A Messages body -> Vertex's: no ``model`` (but for a count, which names it), with
    ``anthropic_version``."""
    out = {k: v for k, v in payload.items() if k != "model"}
    if count:
        out["model"] = model
    out.setdefault("anthropic_version", ANTHROPIC_VERSION)
    return out


def vertex_headers(headers: dict[str, str]) -> dict[str, str]:
    """A call's headers without the other providers' credentials and ``anthropic-version``
    (the body says it); the caller adds ``Authorization: Bearer <token>``."""
    return {k: v for k, v in headers.items() if k.lower() not in DROPPED_HEADERS}


def _load(call: UpstreamCall) -> dict[str, JSON]:
    try:
        payload = orjson.loads(call.body)
    except orjson.JSONDecodeError:
        payload = None
    if not isinstance(payload, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return payload


def gemini_call(call: UpstreamCall, site: VertexSite, model: str) -> UpstreamCall:
    """A call the gemini adapter encoded (its action read from its URL) -> Vertex's."""
    action = call.url.rpartition(":")[2].partition("?")[0]
    if action not in GEMINI_ACTIONS:
        raise InternalError(f"not a generate-content call: {action!r}")
    body = gemini_body(_load(call), action)
    return UpstreamCall(
        url=gemini_url(site, model, action),
        headers=vertex_headers(call.headers),
        body=orjson.dumps(body),
    )


def claude_call(call: UpstreamCall, site: VertexSite, model: str) -> UpstreamCall:
    """A call the anthropic adapter encoded (``/v1/messages`` or ``/count_tokens``) ->
    Vertex's; a body with ``"stream": true`` streams."""
    path = call.url.partition("?")[0]
    count = path.endswith("/messages/count_tokens")
    if not count and not path.endswith("/messages"):
        raise InternalError("not a Messages call")
    payload = _load(call)
    body = claude_body(payload, model, count=count)
    return UpstreamCall(
        url=claude_url(site, model, stream=payload.get("stream") is True, count=count),
        headers=vertex_headers(call.headers),
        body=orjson.dumps(body),
    )


def decode_error(status: int, raw: bytes) -> GatewayError:
    """An error reply of either shape (module docstring) -> the gateway error."""
    try:
        payload = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        payload = None
    if isinstance(payload, list) and len(payload) == 1:
        payload = payload[0]  # streamGenerateContent's JSON-array framing
    if isinstance(payload, dict) and payload.get("type") == "error":
        return decode_error_payload(status, payload)
    return error_from_payload(status, payload)


def token_refused(status: int) -> bool:
    """Whether an error status says the access token was refused (expired, revoked): the
    caller invalidates the token it sent, so that the next request gets a new one."""
    return status == 401
