"""The client surface: path -> (client protocol, endpoint). The whole table on one screen.

``app.py`` turns each row into a Starlette route whose endpoint is the relay. Generate-content
paths carry the model in the path; ``:streamGenerateContent`` streams (SSE with ``?alt=sse``,
else the JSON-array stream).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RouteSpec:
    path: str
    method: str
    protocol: str  # the client's protocol: openai | anthropic | gemini
    endpoint: str  # chat | count_tokens | models | model | embeddings | ...
    stream: bool | None = None  # fixed by the path (generate-content), else the body says


GENERATE = ("/v1beta/models/{model}", "/v1/models/{model}")

RELAY_ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec("/v1/chat/completions", "POST", "openai", "chat"),
    RouteSpec("/v1/messages", "POST", "anthropic", "chat"),
    RouteSpec("/v1/messages/count_tokens", "POST", "anthropic", "count_tokens"),
    RouteSpec("/v1/models", "GET", "openai", "models"),
    RouteSpec("/v1beta/models", "GET", "gemini", "models"),
    *(
        spec
        for prefix in GENERATE
        for spec in (
            RouteSpec(prefix + ":generateContent", "POST", "gemini", "chat", stream=False),
            RouteSpec(prefix + ":streamGenerateContent", "POST", "gemini", "chat", stream=True),
            RouteSpec(prefix + ":countTokens", "POST", "gemini", "count_tokens"),
        )
    ),
    RouteSpec("/v1beta/models/{model}", "GET", "gemini", "model"),
    RouteSpec("/v1/models/{model}", "GET", "openai", "model"),
)


def is_generate_content_path(path: str) -> bool:
    """Paths whose errors use the generate-content shape (CONTRACT §4)."""
    return path.startswith("/v1beta/") or (path.startswith("/v1/models/") and ":" in path)


def is_messages_path(path: str) -> bool:
    return path == "/v1/messages" or path.startswith("/v1/messages/")
