"""Azure OpenAI wire formats: OpenAI's, addressed by deployment, with Azure's content-filter
annotations and error bodies.

Paths (POST): ``/openai/deployments/{deployment}/chat/completions`` (``/completions``,
``/embeddings``, ``/images/generations``, ``/audio/transcriptions``, ``/audio/translations``,
``/audio/speech``) and
``/openai/responses``, each with ``?api-version=YYYY-MM-DD[-preview]`` (without it: 404
``Resource not found``, as Azure answers); and the v1 API, ``/openai/v1/{endpoint}``, which
takes no dated version and names the deployment in the body's ``model``.

Auth: the ``api-key`` header must hold one of the fake's Azure keys (``AZURE_KEY`` unless
given); the v1 API also takes it as ``Authorization: Bearer``. Else 401 ``Access denied due
to invalid subscription key or wrong API endpoint``.

Replies are OpenAI's plus ``prompt_filter_results`` and each choice's
``content_filter_results``; a stream begins with a chunk that holds only the prompt's filter
results (``choices: []``, empty ``id``, ``model`` and ``object``), as Azure's do. Errors are
``{"error": {"code", "message"}}`` with Azure's codes; ``error_type="content_filter"`` answers
Azure's content-filter refusal (400, ``innererror`` ``ResponsibleAIPolicyViolation``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

AZURE_KEY = "fake-azure-key-0000000000000001"
DEPLOYMENT = re.compile(r"^/openai/deployments/(?P<deployment>[^/]+)(?P<endpoint>/.+)$")
VERSION = re.compile(r"^\d{4}-\d{2}-\d{2}(-preview)?$")
V1_VERSIONS = frozenset({"", "preview", "latest", "v1"})
ENDPOINTS = {
    "/chat/completions": "chat",
    "/embeddings": "embeddings",
    "/images/generations": "images",
    "/audio/transcriptions": "transcriptions",
    "/audio/translations": "translations",
    "/audio/speech": "speech",
    "/completions": "completions",
}
V1_ENDPOINTS = {**ENDPOINTS, "/responses": "responses"}
DENIED = (
    "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide "
    "a valid key for an active subscription and use a correct regional API endpoint for your "
    "resource."
)
CODES = {404: "DeploymentNotFound", 500: "InternalServerError", 503: "ServiceUnavailable"}
MESSAGES = {
    400: "Invalid request.",
    404: "The API deployment for this resource does not exist. If you created the deployment "
    "within the last 5 minutes, please wait a moment and try again.",
    429: "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version "
    "2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please "
    "retry after 1 second.",
    500: "The server had an error while processing your request.",
    503: "The service is temporarily unable to process your request.",
}
FILTERED = (
    "The response was filtered due to the prompt triggering Azure OpenAI's content management "
    "policy. Please modify your prompt and retry. To learn more about our content filtering "
    "policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766"
)
SAFE = {
    "hate": {"filtered": False, "severity": "safe"},
    "self_harm": {"filtered": False, "severity": "safe"},
    "sexual": {"filtered": False, "severity": "safe"},
    "violence": {"filtered": False, "severity": "safe"},
}
PROMPT_SAFE = {**SAFE, "jailbreak": {"filtered": False, "detected": False}}


def route(method: str, path: str) -> tuple[str | None, str | None, bool]:
    """(kind, deployment, v1) of an Azure path; kind None when Azure has no such path."""
    if method != "POST":
        return None, None, False
    if path.startswith("/openai/v1/"):
        return V1_ENDPOINTS.get(path[len("/openai/v1") :]), None, True
    if path == "/openai/responses":
        return "responses", None, False
    found = DEPLOYMENT.match(path)
    if found is None:
        return None, None, False
    return ENDPOINTS.get(found["endpoint"]), found["deployment"], False


def error_payload(status: int, code: str | None, message: str | None) -> dict[str, Any]:
    """Azure's error body; ``code="content_filter"`` is its content-filter refusal."""
    if code == "content_filter":
        result = {**PROMPT_SAFE, "violence": {"filtered": True, "severity": "high"}}
        return {
            "error": {
                "message": message or FILTERED,
                "type": None,
                "param": "prompt",
                "code": "content_filter",
                "status": 400,
                "innererror": {
                    "code": "ResponsibleAIPolicyViolation",
                    "content_filter_result": result,
                },
            }
        }
    return {
        "error": {
            "code": code or CODES.get(status, str(status)),
            "message": message or MESSAGES.get(status, "The server had an error."),
        }
    }


def check(
    v1: bool, query: Mapping[str, str], headers: Mapping[str, str], keys: frozenset[str]
) -> tuple[int, dict[str, Any]] | None:
    """None when Azure would take the request's version and key; else its refusal."""
    version = query.get("api-version", "")
    if v1:
        if version not in V1_VERSIONS:
            return 400, error_payload(400, "BadRequest", "API version not supported")
    elif not version:
        return 404, error_payload(404, "404", "Resource not found")
    elif not VERSION.match(version):
        return 400, error_payload(400, "BadRequest", "API version not supported")
    key = headers.get("api-key", "")
    if not key and v1:
        authorization = headers.get("Authorization", "")
        key = authorization[7:].strip() if authorization[:7].lower() == "bearer " else ""
    if key not in keys:
        return 401, error_payload(401, "401", DENIED)
    return None


def _annotated(chunk: dict[str, Any]) -> dict[str, Any]:
    for choice in chunk.get("choices") or ():
        if isinstance(choice, dict):
            choice["content_filter_results"] = (
                SAFE if choice.get("delta") or "message" in choice else {}
            )
    return chunk


def chat_reply(raw: bytes) -> bytes:
    """An OpenAI chat completion as Azure writes it."""
    payload = _annotated(orjson.loads(raw))
    payload["prompt_filter_results"] = [{"prompt_index": 0, "content_filter_results": PROMPT_SAFE}]
    return orjson.dumps(payload)


def chat_events(events: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """An OpenAI chat stream as Azure writes it: the prompt's filter results first, each
    choice's after."""
    head = {
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": PROMPT_SAFE}],
    }
    out = [(events[0][0], b"data: " + orjson.dumps(head) + b"\n\n")] if events else []
    for kind, event in events:
        data = event[len(b"data: ") :].rstrip(b"\n")
        if data == b"[DONE]" or not data.startswith(b"{"):
            out.append((kind, event))
            continue
        out.append((kind, b"data: " + orjson.dumps(_annotated(orjson.loads(data))) + b"\n\n"))
    return out
