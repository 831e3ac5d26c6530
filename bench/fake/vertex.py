"""Google Vertex AI wire formats: Gemini and Claude behind one project's paths.

Paths (POST; ``v1`` or ``v1beta1``, as google-genai sends by default):
``/{version}/projects/{project}/locations/{region}/publishers/google/models/{m}:generateContent``
(``:streamGenerateContent``, SSE with ``?alt=sse`` else a JSON array; ``:countTokens``) and
``.../publishers/anthropic/models/{m}:rawPredict`` (``:streamRawPredict``; the count at
``.../anthropic/models/count-tokens:rawPredict``). Every request needs ``Authorization:
Bearer`` with a live token of the fake's token endpoint (``google_auth``), else Google's 401.

Gemini bodies are the Gemini API's but as Vertex checks them: each content needs a ``role``
(``user`` or ``model``) and countTokens takes ``contents`` (with ``systemInstruction``,
``tools``, ``generationConfig``) at the top, not AI Studio's ``generateContentRequest``.
Replies are Gemini's with Vertex's ``createTime`` and ``usageMetadata.trafficType``.

Claude bodies are the Messages body with ``anthropic_version`` and without ``model`` (a count
names its ``model``); refusals are Anthropic's 400 ``invalid_request_error`` as Vertex relays
them (``model: Extra inputs are not permitted``, ``anthropic_version: Field required``). Replies
and streams are the Messages API's.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from bench.fake.incoming import Incoming, RequestShapeError, from_anthropic, from_gemini

PATH = re.compile(
    r"^/(?P<version>v1|v1beta1)/projects/(?P<project>[^/]+)/locations/(?P<region>[^/]+)"
    r"/publishers/(?P<publisher>google|anthropic)/models/(?P<model>[^/:]+):(?P<action>\w+)$"
)
PREFIXES = ("/v1/projects/", "/v1beta1/projects/")
GEMINI_KINDS = frozenset({"generateContent", "streamGenerateContent", "countTokens"})
CLAUDE_KINDS = frozenset({"rawPredict", "streamRawPredict"})
COUNT_MODEL = "count-tokens"
ROLES = frozenset({"user", "model"})
CREATE_TIME = "2025-01-01T00:00:00.000000Z"


def route(method: str, path: str) -> tuple[str, str | None, str | None]:
    """(protocol, kind, model) of a Vertex path; kind None when Vertex has no such method."""
    found = PATH.match(path)
    if found is None:
        return "gemini", None, None
    publisher, model, action = found["publisher"], found["model"], found["action"]
    if publisher == "google":
        known = method == "POST" and action in GEMINI_KINDS
        return "gemini", action if known else None, model
    if method != "POST" or action not in CLAUDE_KINDS:
        return "anthropic", None, model
    if model == COUNT_MODEL:
        return "anthropic", "count_tokens" if action == "rawPredict" else None, None
    return "anthropic", action, model


def from_gemini_body(body: dict[str, Any], kind: str) -> Incoming:
    """A Gemini request as Vertex reads it: roles required, no countTokens wrapper."""
    if kind == "countTokens" and "generateContentRequest" in body:
        raise RequestShapeError(
            'Invalid JSON payload received. Unknown name "generateContentRequest": '
            "Cannot find field."
        )
    contents = body.get("contents")
    for content in contents if isinstance(contents, list) else ():
        role = content.get("role") if isinstance(content, dict) else None
        if role not in ROLES:
            raise RequestShapeError("Please use a valid role: user, model.")
    return from_gemini(body)


def from_claude_body(body: dict[str, Any], kind: str) -> Incoming:
    """A Messages body as Vertex's rawPredict reads it."""
    if not isinstance(body.get("anthropic_version"), str) or not body["anthropic_version"]:
        raise RequestShapeError("anthropic_version: Field required")
    if kind == "count_tokens":
        return from_anthropic(body, counting=True)
    if "model" in body:
        raise RequestShapeError("model: Extra inputs are not permitted")
    return from_anthropic(body, model_required=False)


def _gemini_extras(payload: dict[str, Any]) -> dict[str, Any]:
    payload.setdefault("createTime", CREATE_TIME)
    usage = payload.get("usageMetadata")
    if isinstance(usage, dict):
        usage.setdefault("trafficType", "ON_DEMAND")
    return payload


def gemini_reply(raw: bytes) -> bytes:
    """A Gemini reply body as Vertex writes it."""
    return orjson.dumps(_gemini_extras(orjson.loads(raw)))


def gemini_events(events: list[tuple[int, bytes]], sse: bool) -> list[tuple[int, bytes]]:
    """A Gemini stream's SSE events as Vertex writes them (the JSON-array framing as it is)."""
    if not sse:
        return events
    out = []
    for kind, event in events:
        data = event[len(b"data: ") :].rstrip(b"\r\n")
        out.append((kind, b"data: " + gemini_reply(data) + b"\r\n\r\n"))
    return out
