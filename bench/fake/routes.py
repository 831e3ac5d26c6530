"""Where a request goes: its path to (provider, endpoint kind), and what each kind reads.

Provider by path: ``/model/{id}/{action}`` is Bedrock, ``/v1/messages*`` is Anthropic,
``/v1beta/...`` and ``/v1/models/{m}:action`` are Gemini, every other ``/v1/...`` is OpenAI
(``GET /v1/models`` is Anthropic's list when the request carries ``anthropic-version``).
The clouds: ``/v1/projects/...`` and ``/v1beta1/projects/...`` are Vertex AI (Gemini or Claude
by publisher; ``cloud`` "vertex"), ``/openai/...`` is Azure OpenAI (``cloud`` "azure"), and
``/token`` is Google's OAuth2 token endpoint (``cloud`` "google").
Unknown paths keep the provider of their prefix so the 404 comes in that provider's shape.
"""

from __future__ import annotations

import email.parser
import email.policy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from bench.fake import azure, bedrock, completions, media, responses, vertex
from bench.fake.incoming import Incoming, from_anthropic, from_gemini, from_openai

GEMINI_ACTIONS = frozenset(
    {
        "generateContent",
        "streamGenerateContent",
        "countTokens",
        "embedContent",
        "batchEmbedContents",
    }
)
CHAT_KINDS = frozenset(
    {"chat", "messages", "generateContent", "streamGenerateContent", "responses", "completions"}
    | bedrock.KINDS
    | vertex.CLAUDE_KINDS
)
TOKEN_PATH = "/token"
OPENAI_POSTS = {
    "/v1/chat/completions": "chat",
    "/v1/embeddings": "embeddings",
    "/v1/images/generations": "images",
    "/v1/audio/transcriptions": "transcriptions",
    "/v1/audio/translations": "translations",
    "/v1/audio/speech": "speech",
    "/v1/rerank": "rerank",
    "/v1/responses": "responses",
    "/v1/completions": "completions",
}
UPLOADS = frozenset({"transcriptions", "translations"})  # multipart bodies


@dataclass(frozen=True, slots=True)
class Route:
    protocol: str  # openai | anthropic | gemini | bedrock (the wire shapes)
    kind: str | None  # None: unknown path
    model: str | None = None  # from a Gemini, Bedrock, Vertex or Azure deployment path
    cloud: str = ""  # "vertex" | "azure" | "google" (the token endpoint); "": the provider's own


def route(method: str, path: str, headers: Mapping[str, str]) -> Route:
    if path == TOKEN_PATH:
        return Route("google", "token" if method == "POST" else None, cloud="google")
    if path.startswith(vertex.PREFIXES):
        return Route(*vertex.route(method, path), cloud="vertex")
    if path.startswith("/openai/"):
        kind, deployment, _ = azure.route(method, path)
        return Route("openai", kind, deployment, cloud="azure")
    if path.startswith("/model/"):
        model, _, action = path[len("/model/") :].rpartition("/")
        known = method == "POST" and model and action in bedrock.KINDS
        return Route("bedrock", action if known else None, model or None)
    if method == "POST":
        kind = OPENAI_POSTS.get(path)
        if kind is not None:
            return Route("openai", kind)
        if path == "/v1/messages":
            return Route("anthropic", "messages")
        if path == "/v1/messages/count_tokens":
            return Route("anthropic", "count_tokens")
        for prefix in ("/v1beta/models/", "/v1/models/"):
            if path.startswith(prefix):
                model, _, action = path[len(prefix) :].rpartition(":")
                if model and action in GEMINI_ACTIONS:
                    return Route("gemini", action, model)
    elif method == "GET":
        if path == "/v1/models":
            return Route("anthropic" if "anthropic-version" in headers else "openai", "models")
        if path == "/v1beta/models":
            return Route("gemini", "models")
    if path.startswith("/v1beta/") or ":" in path:
        return Route("gemini", None)
    if path.startswith("/v1/messages"):
        return Route("anthropic", None)
    return Route("openai", None)


def bearer(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    return header[7:].strip() if header[:7].lower() == "bearer " else ""


def bad_json_message(protocol: str) -> str:
    if protocol == "anthropic":
        return "Request body must be a JSON object"
    if protocol == "gemini":
        return "Invalid JSON payload received."
    if protocol == "bedrock":
        return "Malformed input request, please reformat your input and try again."
    return "We could not parse the JSON body of your request."


def incoming_for(where: Route, body: dict[str, Any]) -> Incoming | None:
    kind = where.kind
    if kind == vertex.PREDICT:
        vertex.predict_reply(body)  # a malformed body is Vertex's 400 (RequestShapeError)
        return None
    if where.cloud == "vertex" and kind is not None:
        if where.protocol == "anthropic":
            return vertex.from_claude_body(body, kind)
        return vertex.from_gemini_body(body, kind)
    if kind == "chat":
        return from_openai(body)
    if kind == "responses":
        return responses.incoming(body)
    if kind == "completions":
        return completions.incoming(body)
    if kind == "messages":
        return from_anthropic(body)
    if kind == "count_tokens":
        return from_anthropic(body, counting=True)
    if kind in ("generateContent", "streamGenerateContent", "countTokens"):
        return from_gemini(body)
    if kind in ("converse", "converse-stream"):
        return bedrock.from_converse(body)
    if kind in ("invoke", "invoke-with-response-stream"):
        return bedrock.from_invoke(body)
    return None


def directive_text(where: Route, body: dict[str, Any], form: dict[str, str]) -> str:
    kind = where.kind
    value: Any = None
    if kind == "embeddings":
        texts = media.embedding_texts(body)
        value = texts[-1] if texts else None
    elif kind == "images":
        value = body.get("prompt")
    elif kind == "speech":
        value = body.get("input")
    elif kind == "rerank":
        value = body.get("query")
    elif kind in UPLOADS:
        value = form.get("prompt")
    elif kind == "embedContent":
        value = media.gemini_content_text(body.get("content"))
    elif kind == vertex.PREDICT:
        value = vertex.predict_text(body)
    elif kind == "batchEmbedContents":
        requests = body.get("requests")
        if isinstance(requests, list) and requests and isinstance(requests[-1], dict):
            value = media.gemini_content_text(requests[-1].get("content"))
    return value if isinstance(value, str) else ""


def multipart(content_type: str, raw: bytes) -> tuple[dict[str, str], dict[str, bytes]]:
    """Text fields and file contents of a multipart/form-data body."""
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + raw)
    form: dict[str, str] = {}
    files: dict[str, bytes] = {}
    if not message.is_multipart():
        return form, files
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            continue
        data = part.get_payload(decode=True)
        if not isinstance(data, bytes):
            data = b""
        if part.get_filename() is not None:
            files[name] = data
        else:
            form[name] = data.decode("utf-8", "replace")
    return form, files
