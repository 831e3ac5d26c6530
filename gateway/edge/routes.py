"""The client surface: path -> (client protocol, endpoint kind). The only route table.

Generate-content paths carry the model in the path (``/v1beta/models/{model}:action``, and the
same under ``/v1/models/``, google-genai's default API version); ``:streamGenerateContent``
streams (SSE with ``?alt=sse``, else the JSON-array stream). ``Router.match`` answers a
request's method and path with its route, 405 (with the methods allowed) for a known path and
another method, or 404 for a path or generate-content action it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import MethodNotAllowedError, UnknownURLError


@dataclass(frozen=True, slots=True)
class RouteSpec:
    path: str
    method: str
    protocol: str  # the client's protocol: openai | anthropic | gemini
    kind: str  # the endpoint kind: chat | count_tokens | embeddings | models | ...
    stream: bool | None = None  # fixed by the path (generate-content), else the body says
    action: str = ""  # a generate-content path's action
    key_in_query: bool = False  # ``?key=`` is accepted too (Gemini's own clients send it)


GENERATE_PREFIXES = ("/v1beta/models/", "/v1/models/")
# generate-content actions: (action, kind, stream fixed by the path)
GENERATE_ACTIONS = (
    ("generateContent", "chat", False),
    ("streamGenerateContent", "chat", True),
    ("countTokens", "count_tokens", None),
    ("embedContent", "embeddings", None),
    ("batchEmbedContents", "embeddings", None),
)
MODEL = "{model}"

ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec("/v1/chat/completions", "POST", "openai", "chat"),
    RouteSpec("/v1/embeddings", "POST", "openai", "embeddings"),
    RouteSpec("/v1/images/generations", "POST", "openai", "images"),
    RouteSpec("/v1/audio/transcriptions", "POST", "openai", "audio_transcription"),
    RouteSpec("/v1/audio/translations", "POST", "openai", "audio_translation"),
    RouteSpec("/v1/audio/speech", "POST", "openai", "audio_speech"),
    RouteSpec("/v1/rerank", "POST", "openai", "rerank"),
    RouteSpec("/v2/rerank", "POST", "openai", "rerank_v2"),  # Cohere's v2 shape
    RouteSpec("/v1/completions", "POST", "openai", "completions"),  # legacy, with suffix
    RouteSpec("/v1/responses", "POST", "responses", "chat"),
    RouteSpec("/v1/responses/input_tokens", "POST", "responses", "count_tokens"),
    RouteSpec("/v1/messages", "POST", "anthropic", "chat"),
    RouteSpec("/v1/messages/count_tokens", "POST", "anthropic", "count_tokens"),
    RouteSpec("/v1/models", "GET", "openai", "models"),
    RouteSpec("/v1/models/{model}", "GET", "openai", "model"),
    RouteSpec("/v1/dashboard/billing/subscription", "GET", "openai", "billing_subscription"),
    RouteSpec("/v1/dashboard/billing/usage", "GET", "openai", "billing_usage"),
    RouteSpec("/v1beta/models", "GET", "gemini", "models", key_in_query=True),
    RouteSpec("/v1beta/models/{model}", "GET", "gemini", "model", key_in_query=True),
    *(
        RouteSpec(f"{prefix}{MODEL}:{action}", "POST", "gemini", kind, stream, action, True)
        for prefix in GENERATE_PREFIXES
        for action, kind, stream in GENERATE_ACTIONS
    ),
)


class Router:
    """Matches a request to its route: exact paths by a dict lookup; ``{model}`` paths by
    their prefix and action."""

    __slots__ = ("_exact", "_modelled")

    def __init__(self, routes: tuple[RouteSpec, ...] = ROUTES) -> None:
        self._exact: dict[str, dict[str, RouteSpec]] = {}
        # (prefix, ":action" or "") -> method -> spec
        self._modelled: dict[tuple[str, str], dict[str, RouteSpec]] = {}
        for spec in routes:
            if MODEL in spec.path:
                prefix, suffix = spec.path.split(MODEL)
                self._modelled.setdefault((prefix, suffix), {})[spec.method] = spec
            else:
                self._exact.setdefault(spec.path, {})[spec.method] = spec

    def match(self, method: str, path: str) -> tuple[RouteSpec, str | None] | None:
        """The route of a request and the ``{model}`` of its path; None for a path outside
        the client surface (admin, health, unknown: the caller decides). Raises
        MethodNotAllowedError for a known path and another method, UnknownURLError for an
        unknown generate-content action."""
        by_method = self._exact.get(path)
        model = None
        if by_method is None:
            found = self._with_model(method, path)
            if found is None:
                return None
            by_method, model = found
        spec = by_method.get(method)
        if spec is None and method == "HEAD":
            spec = by_method.get("GET")
        if spec is None:
            allowed = sorted(by_method)
            raise MethodNotAllowedError(
                f"Method {method} is not allowed on {path}; use {', '.join(allowed)}.",
                allow=tuple(allowed),
            )
        return spec, model

    def _with_model(self, method: str, path: str) -> tuple[dict[str, RouteSpec], str] | None:
        for prefix in GENERATE_PREFIXES:
            if not path.startswith(prefix):
                continue
            rest = path[len(prefix) :]
            name, colon, action = rest.rpartition(":")
            if not colon:
                name, action = rest, ""
            if not name or "/" in name:
                return None
            by_method = self._modelled.get((prefix, colon + action))
            if by_method is not None:
                return by_method, name
            # a model id with a colon (OpenAI's fine-tuned "ft:base:org::id"): read, it is
            # the model's own page; sent, an action this gateway does not know
            plain = self._modelled.get((prefix, ""))
            if plain is not None and method in ("GET", "HEAD") and "/" not in rest:
                return plain, rest
            if action:
                raise UnknownURLError(f"Unknown request URL: {path}")
            return None
        return None


def protocol_of_path(path: str) -> str:
    """The protocol whose error shape a path answers in (CONTRACT §4)."""
    if path.startswith("/v1beta/") or (path.startswith("/v1/models/") and ":" in path):
        return "gemini"
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
    return "openai"
