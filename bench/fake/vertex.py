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

Embeddings: ``.../publishers/google/models/{m}:predict`` with ``{"instances": [{"content",
"task_type"?, "title"?}], "parameters"?: {"outputDimensionality"?, "autoTruncate"?}}``, answered
``{"predictions": [{"embeddings": {"values", "statistics": {"token_count", "truncated"}}}],
"metadata": {"billableCharacterCount"}}``, as Vertex's text-embedding and gemini-embedding
models answer; an instance without a string ``content`` is Vertex's 400.

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
from bench.fake.media import DEFAULT_DIMENSIONS, tokens, vector

PATH = re.compile(
    r"^/(?P<version>v1|v1beta1)/projects/(?P<project>[^/]+)/locations/(?P<region>[^/]+)"
    r"/publishers/(?P<publisher>google|anthropic)/models/(?P<model>[^/:]+):(?P<action>\w+)$"
)
PREFIXES = ("/v1/projects/", "/v1beta1/projects/")
GEMINI_KINDS = frozenset({"generateContent", "streamGenerateContent", "countTokens"})
PREDICT = "predict"  # a Google embedding model's method
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
        known = method == "POST" and (action in GEMINI_KINDS or action == PREDICT)
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


def _instances(body: dict[str, Any]) -> list[dict[str, Any]]:
    instances = body.get("instances")
    if not isinstance(instances, list) or not instances:
        raise RequestShapeError("Invalid JSON payload received. 'instances' must be a list.")
    for i, item in enumerate(instances):
        if not isinstance(item, dict) or not isinstance(item.get("content"), str):
            raise RequestShapeError(f"instances[{i}].content is required and must be a string.")
    return instances


def predict_text(body: dict[str, Any]) -> str:
    """The last instance's content: where a directive lives."""
    instances = body.get("instances")
    last = instances[-1] if isinstance(instances, list) and instances else None
    content = last.get("content") if isinstance(last, dict) else None
    return content if isinstance(content, str) else ""


def predict_reply(body: dict[str, Any]) -> bytes:
    """The embeddings of a ``:predict`` call, each with its token count."""
    instances = _instances(body)
    parameters = body.get("parameters")
    dims = parameters.get("outputDimensionality") if isinstance(parameters, dict) else None
    dims = dims if isinstance(dims, int) and dims > 0 else DEFAULT_DIMENSIONS
    predictions = [
        {
            "embeddings": {
                "values": vector(item["content"], dims),
                "statistics": {"token_count": tokens(item["content"]), "truncated": False},
            }
        }
        for item in instances
    ]
    chars = sum(len(item["content"]) for item in instances)
    return orjson.dumps({"predictions": predictions, "metadata": {"billableCharacterCount": chars}})
