"""The gateway's OpenAPI 3.1 document: the client surface (every route of ``routes.ROUTES``),
the admin API, the probes and ``/metrics``.

``GET /openapi.json`` serves the client part to anyone, and the admin part too to a request
with the admin token. The document is built here from the route table (so a route cannot be
missing from it) and kept in the repository as ``gateway/operator/openapi.json``
(``python -m gateway.operator.openapi > gateway/operator/openapi.json``); tests check the file
against this module and every route against the document. Request bodies list the fields the
contract names and allow more (clients send more); errors are each path's protocol shape.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson

from gateway import __version__
from gateway.config import CHANNEL_TYPES, CLOUD_FIELDS, TOOLS
from gateway.edge.routes import ROUTES, RouteSpec

JSONObject = dict[str, Any]

OBJECT: JSONObject = {"type": "object"}
STRING: JSONObject = {"type": "string"}
TEXT_OR_LIST: JSONObject = {"oneOf": [STRING, {"type": "array"}]}


def body(required: list[str], properties: JSONObject) -> JSONObject:
    """A JSON request body: these fields (the ones the contract names), any more allowed."""
    return {
        "type": "object",
        "required": required,
        "properties": properties,
        "additionalProperties": True,
    }


REQUESTS: dict[tuple[str, str], JSONObject] = {
    ("openai", "chat"): body(
        ["model", "messages"],
        {
            "model": STRING,
            "messages": {"type": "array", "items": OBJECT},
            "stream": {"type": "boolean"},
            "max_tokens": {"type": "integer"},
            "tools": {"type": "array", "items": OBJECT},
        },
    ),
    ("responses", "chat"): body(
        ["model"],
        {
            "model": STRING,
            "input": TEXT_OR_LIST,
            "instructions": STRING,
            "stream": {"type": "boolean"},
        },
    ),
    ("anthropic", "chat"): body(
        ["model", "messages", "max_tokens"],
        {
            "model": STRING,
            "messages": {"type": "array", "items": OBJECT},
            "max_tokens": {"type": "integer"},
            "system": TEXT_OR_LIST,
            "stream": {"type": "boolean"},
        },
    ),
    ("anthropic", "count_tokens"): body(
        ["model", "messages"], {"model": STRING, "messages": {"type": "array", "items": OBJECT}}
    ),
    ("openai", "embeddings"): body(
        ["model", "input"],
        {"model": STRING, "input": TEXT_OR_LIST, "encoding_format": {"enum": ["float", "base64"]}},
    ),
    ("openai", "images"): body(
        ["model", "prompt"], {"model": STRING, "prompt": STRING, "n": {"type": "integer"}}
    ),
    ("openai", "audio_speech"): body(
        ["model", "input"], {"model": STRING, "input": STRING, "voice": STRING}
    ),
    ("openai", "rerank"): body(
        ["model", "query", "documents"],
        {
            "model": STRING,
            "query": STRING,
            "documents": {"type": "array", "items": TEXT_OR_LIST},
            "top_n": {"type": "integer"},
        },
    ),
    ("openai", "rerank_v2"): body(
        ["model", "query", "documents"],
        {
            "model": STRING,
            "query": STRING,
            "documents": {"type": "array", "items": STRING},
            "top_n": {"type": "integer"},
            "max_tokens_per_doc": {"type": "integer"},
        },
    ),
    ("openai", "completions"): body(
        ["model", "prompt"],
        {
            "model": STRING,
            "prompt": TEXT_OR_LIST,
            "suffix": STRING,
            "max_tokens": {"type": "integer"},
            "stream": {"type": "boolean"},
        },
    ),
    ("responses", "count_tokens"): body(
        ["model"], {"model": STRING, "input": TEXT_OR_LIST, "instructions": STRING}
    ),
    ("gemini", "chat"): body(
        ["contents"], {"contents": {"type": "array", "items": OBJECT}, "generationConfig": OBJECT}
    ),
    ("gemini", "count_tokens"): body([], {"contents": {"type": "array", "items": OBJECT}}),
    ("gemini", "embeddings"): body(
        [], {"content": OBJECT, "requests": {"type": "array", "items": OBJECT}}
    ),
}
MULTIPART = {
    "multipart/form-data": {
        "schema": {
            "type": "object",
            "required": ["file", "model"],
            "properties": {"file": {"type": "string", "format": "binary"}, "model": STRING},
        }
    }
}
UPLOAD_KINDS = frozenset({"audio_transcription", "audio_translation"})  # multipart bodies
STREAMING_KINDS = frozenset({"chat", "completions", "audio_transcription"})  # may answer SSE
ERRORS = {
    "openai": "#/components/schemas/OpenAIError",
    "responses": "#/components/schemas/OpenAIError",
    "anthropic": "#/components/schemas/AnthropicError",
    "gemini": "#/components/schemas/GeminiError",
}
# each status the contract names (400, 401, 402, 403, 404, 405, 408, 413, 429; 502, 503,
# 504) is in a range, in the path's protocol's shape
RANGES = ("4XX", "5XX")
SECURITY: list[JSONObject] = [{"bearer": []}, {"x-api-key": []}, {"x-goog-api-key": []}]


def _errors(protocol: str, statuses: tuple[str, ...] = RANGES) -> JSONObject:
    return {status: {"$ref": f"#/components/responses/{protocol}Error"} for status in statuses}


def _success(spec: RouteSpec) -> JSONObject:
    if spec.kind == "audio_speech":
        return {
            "description": "the audio, streamed",
            "content": {"audio/*": {"schema": {"type": "string", "format": "binary"}}},
        }
    content: JSONObject = {"application/json": {"schema": OBJECT}}
    if spec.stream:  # streamGenerateContent without ?alt=sse: its chunks in one JSON array
        content["application/json"] = {"schema": {"type": "array", "items": OBJECT}}
    if spec.kind in STREAMING_KINDS:
        content["text/event-stream"] = {"schema": STRING}  # when the request streams
    return {"description": "the reply", "content": content}


def _operation(spec: RouteSpec) -> JSONObject:
    op: JSONObject = {
        "operationId": f"{spec.method.lower()}_{spec.protocol}_{spec.kind}"
        + (f"_{spec.action}" if spec.action else "")
        + ("_v1" if spec.path.startswith("/v1/models/{model}:") else ""),
        "tags": [spec.protocol],
        "security": SECURITY + ([{"key-query": []}] if spec.key_in_query else []),
        "responses": {
            "200": _success(spec),
            **_errors(spec.protocol),
        },
    }
    params = []
    if "{model}" in spec.path:
        params.append({"name": "model", "in": "path", "required": True, "schema": STRING})
    if spec.key_in_query:
        params.append(
            {"name": "alt", "in": "query", "required": False, "schema": {"enum": ["sse"]}}
        )
    if params:
        op["parameters"] = params
    if spec.method == "POST":
        if spec.kind in UPLOAD_KINDS:
            op["requestBody"] = {"required": True, "content": MULTIPART}
        else:
            schema = REQUESTS[(spec.protocol, spec.kind)]
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": schema}},
            }
    return op


def _admin(
    summary: str,
    *,
    request: JSONObject | None = None,
    created: bool = False,
    params: tuple[str, ...] = (),
    query: tuple[str, ...] = (),
) -> JSONObject:
    ok = "201" if created else "200"
    op: JSONObject = {
        "summary": summary,
        "tags": ["admin"],
        "security": [{"admin": []}],
        "responses": {
            ok: {"description": "done", "content": {"application/json": {"schema": OBJECT}}},
            **_errors("openai"),
        },
    }
    parameters = [{"name": p, "in": "path", "required": True, "schema": STRING} for p in params]
    parameters += [{"name": q, "in": "query", "required": False, "schema": STRING} for q in query]
    if parameters:
        op["parameters"] = parameters
    if request is not None:
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": request}}}
    return op


MONEY: JSONObject = {"type": "number"}
MODEL_FIELDS: JSONObject = {
    "name": STRING,
    "capabilities": {"type": "array", "items": STRING},
    "price": OBJECT,
    "default_max_tokens": {"type": "integer"},
    "aliases": {"type": "array", "items": STRING},
}
CHANNEL_FIELDS: JSONObject = {
    "name": STRING,
    "type": {"enum": list(CHANNEL_TYPES)},
    "base_url": STRING,
    "api_key": STRING,
    "api_keys": {"type": "array", "items": STRING},
    "groups": {"type": "array", "items": STRING},
    "models": {"type": "array", "items": STRING},
    "model_map": OBJECT,
    "priority": {"type": "integer"},
    "weight": {"type": "integer"},
    "status": {"enum": ["enabled", "disabled"]},
    "prompt_cache": {"enum": ["auto", "off"]},
    "responses": {"type": "boolean"},
    "max_tokens_field": {"enum": ["max_tokens", "max_completion_tokens"]},
    # the cloud types' own (docs/channels.md); the secrets are never shown again
    **{name: STRING for name in sorted(CLOUD_FIELDS)},
}
KEY_FIELDS: JSONObject = {
    "account": STRING,
    "group": STRING,
    "name": STRING,
    "expires_at": {"type": ["string", "null"]},
    "quota": {"type": ["number", "null"]},
    "models": {"type": ["array", "null"], "items": STRING},
    "allowed_ips": {"type": ["array", "null"], "items": STRING},
}


GROUP_FIELDS: JSONObject = {
    "name": STRING,
    "ratio": {"type": ["number", "null"]},
    "tool": {"enum": [*TOOLS, None]},
}
USER_FIELDS: JSONObject = {
    "username": STRING,
    "password": STRING,
    "account": STRING,
    "groups": {"type": "array", "items": STRING},
    "status": {"enum": ["enabled", "disabled"]},
}
CODE_FIELDS: JSONObject = {
    "amount": MONEY,
    "count": {"type": "integer", "minimum": 1, "maximum": 1000},
    "expires_at": {"type": ["string", "null"]},
}


def people_paths() -> JSONObject:
    """Users and redemption codes (CONTRACT §5b)."""
    user_change = {k: USER_FIELDS[k] for k in ("password", "groups", "status")}
    return {
        "/admin/users": {
            "get": _admin("list users (never their passwords)"),
            "post": _admin(
                "add a user of an account",
                request=body(["username", "password", "account"], USER_FIELDS),
                created=True,
            ),
        },
        "/admin/users/{id}": {
            "patch": _admin(
                "change a user's password, groups or status (disabled: its sessions end, its "
                "keys answer 401)",
                request=body([], user_change),
                params=("id",),
            ),
            "delete": _admin("delete a user and its keys", params=("id",)),
        },
        "/admin/redemptions": {
            "get": _admin("list redemption codes (hints, never the codes)", query=("status",)),
            "post": _admin(
                "make redemption codes, shown only in this reply",
                request=body(["amount"], CODE_FIELDS),
                created=True,
            ),
        },
    }


# GET /admin/usage's parameters (gateway/operator/usage_query.py): each a string, as written here
USAGE_PARAMS: dict[str, str] = {
    "account": "an account id",
    "key": "a key id",
    "model": "the model name the client asked for",
    "status": "an HTTP status (200, 429, ...), ok (below 400) or error (400 and up)",
    "since": "RFC 3339 time or day (midnight UTC), included",
    "until": "RFC 3339 time or day (midnight UTC), not included",
    "limit": "records per page: 1 to 1000 (larger is cut), default 100",
    "cursor": "the next_cursor (or x-next-cursor) of the page before",
}


def usage_operation() -> JSONObject:
    """Filtered and paged; the next page's cursor in ``x-next-cursor``, and in the body's
    ``next_cursor`` when a filter or a cursor is given."""
    op = _admin("usage records, newest first", query=tuple(USAGE_PARAMS))
    for param in op["parameters"]:
        param["description"] = USAGE_PARAMS[param["name"]]
    op["responses"]["200"]["headers"] = {
        "x-next-cursor": {
            "description": "the cursor of the next page; absent on the last page",
            "schema": STRING,
        }
    }
    return op


# GET /admin/audit's parameters (gateway/operator/audit_api.py)
AUDIT_PARAMS: dict[str, str] = {
    "actor": "admin, user:NAME, key:HINT, cli:NAME, or a kind alone (user: every user)",
    "action": "key.create, account.credit, ...; or a type of object alone (key: every action)",
    "object": "a type of object (channel) or type:id (channel:oa-1)",
    "status": "an HTTP status (200, 404, ...), ok (below 400) or error (400 and up)",
    "since": "RFC 3339 time or day (midnight UTC), included",
    "until": "RFC 3339 time or day (midnight UTC), not included",
    "limit": "entries per page: 1 to 1000 (larger is cut), default 100",
    "cursor": "the next_cursor (or x-next-cursor) of the page before",
}


def audit_paths() -> JSONObject:
    """The audit log: JSON pages, or every matching entry as CSV (up to 10,000; the
    x-next-cursor header names the rest)."""
    params = tuple(AUDIT_PARAMS)
    listing = _admin("the audit log: operators' changes, newest first", query=params)
    export = _admin("the audit log as CSV", query=tuple(p for p in params if p != "limit"))
    export["responses"]["200"]["content"] = {"text/csv": {"schema": STRING}}
    for op in (listing, export):
        for param in op["parameters"]:
            param["description"] = AUDIT_PARAMS[param["name"]]
        op["responses"]["200"]["headers"] = {
            "x-next-cursor": {
                "description": "the cursor of the next page; absent on the last page",
                "schema": STRING,
            }
        }
    return {"/admin/audit": {"get": listing}, "/admin/audit.csv": {"get": export}}


def admin_paths() -> JSONObject:
    return {
        "/admin/accounts": {
            "get": _admin("list accounts"),
            "post": _admin(
                "create an account",
                request=body(["id"], {"id": STRING, "balance": MONEY}),
                created=True,
            ),
        },
        "/admin/accounts/{id}": {"get": _admin("an account", params=("id",))},
        "/admin/accounts/{id}/topup": {
            "post": _admin("top up", request=body(["amount"], {"amount": MONEY}), params=("id",))
        },
        "/admin/keys": {
            "get": _admin("list keys (never their secrets)", query=("account",)),
            "post": _admin(
                "make a key (its secret shown once)",
                request=body(["account"], KEY_FIELDS),
                created=True,
            ),
        },
        "/admin/keys/{id}": {
            "get": _admin("a key", params=("id",)),
            "patch": _admin(
                "change a key",
                request=body([], {**KEY_FIELDS, "status": {"enum": ["enabled", "disabled"]}}),
                params=("id",),
            ),
            "delete": _admin("delete a key", params=("id",)),
        },
        "/admin/usage": {"get": usage_operation()},
        "/admin/usage/daily": {"get": _admin("daily totals", query=("since", "until", "account"))},
        "/admin/models": {
            "get": _admin("the catalogue's models"),
            "post": _admin("add a model", request=body(["name"], MODEL_FIELDS), created=True),
        },
        "/admin/models/{name}": {
            "get": _admin("a model", params=("name",)),
            "patch": _admin("change a model", request=body([], MODEL_FIELDS), params=("name",)),
            "delete": _admin("delete a model", params=("name",)),
        },
        "/admin/channels": {
            "get": _admin("the channels (never their keys)"),
            "post": _admin(
                "add a channel", request=body(["name", "type"], CHANNEL_FIELDS), created=True
            ),
        },
        "/admin/channels/{name}": {
            "get": _admin("a channel (never its key)", params=("name",)),
            "patch": _admin("change a channel", request=body([], CHANNEL_FIELDS), params=("name",)),
            "delete": _admin("delete a channel", params=("name",)),
        },
        "/admin/channels/{name}/test": {
            "post": _admin("one minimal request through the channel, not billed", params=("name",))
        },
        "/admin/groups": {
            "get": _admin("the groups, their price ratios and tool kinds"),
            "post": _admin("add a group", request=body(["name"], GROUP_FIELDS), created=True),
        },
        "/admin/groups/{name}": {
            "patch": _admin(
                "change a group's price ratio or tool",
                request=body([], GROUP_FIELDS),
                params=("name",),
            ),
            "delete": _admin("delete a group (409 while in use)", params=("name",)),
        },
        **people_paths(),
        **audit_paths(),
        "/admin/sessions/rotate": {
            "post": _admin("a new console session secret: every console session ends")
        },
    }


def probe_paths() -> JSONObject:
    ok = {"200": {"description": "yes", "content": {"application/json": {"schema": OBJECT}}}}
    return {
        "/healthz": {
            "get": {"summary": "liveness", "tags": ["probes"], "security": [], "responses": ok}
        },
        "/readyz": {
            "get": {
                "summary": "readiness: the store answers",
                "tags": ["probes"],
                "security": [],
                "responses": {
                    **ok,
                    "503": {
                        "description": "not ready",
                        "content": {"application/json": {"schema": OBJECT}},
                    },
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "tags": ["probes"],
                "security": [],
                "responses": {
                    "200": {
                        "description": "the exposition",
                        "content": {"text/plain": {"schema": STRING}},
                    },
                    "401": {
                        "description": "a metrics token is set and was not given",
                        "content": {"application/json": {"schema": OBJECT}},
                    },
                },
            }
        },
    }


COMPONENTS: JSONObject = {
    "responses": {
        f"{protocol}Error": {
            "description": "an error, in the path's protocol's shape",
            "content": {"application/json": {"schema": {"$ref": ref}}},
        }
        for protocol, ref in ERRORS.items()
    },
    "securitySchemes": {
        "bearer": {"type": "http", "scheme": "bearer", "description": "an sk- key"},
        "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
        "x-goog-api-key": {"type": "apiKey", "in": "header", "name": "x-goog-api-key"},
        "key-query": {"type": "apiKey", "in": "query", "name": "key"},
        "admin": {"type": "http", "scheme": "bearer", "description": "the admin token"},
    },
    "schemas": {
        "OpenAIError": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["message", "type"],
                    "properties": {
                        "message": STRING,
                        "type": STRING,
                        "code": {"type": ["string", "null"]},
                    },
                }
            },
        },
        "AnthropicError": {
            "type": "object",
            "required": ["type", "error"],
            "properties": {
                "type": {"const": "error"},
                "error": {
                    "type": "object",
                    "required": ["type", "message"],
                    "properties": {"type": STRING, "message": STRING},
                },
            },
        },
        "GeminiError": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["code", "message", "status"],
                    "properties": {
                        "code": {"type": "integer"},
                        "message": STRING,
                        "status": STRING,
                    },
                }
            },
        },
    },
}


def document(with_admin: bool = True) -> JSONObject:
    """The document: the client surface and probes, and the admin API when ``with_admin``."""
    paths: JSONObject = {}
    for spec in ROUTES:
        paths.setdefault(spec.path, {})[spec.method.lower()] = _operation(spec)
    paths.update(probe_paths())
    if with_admin:
        paths.update(admin_paths())
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Model Gateway",
            "version": __version__,
            "description": (
                "One endpoint for OpenAI, Anthropic and Gemini models, in each of their protocols."
            ),
        },
        "components": COMPONENTS,
        "paths": dict(sorted(paths.items())),
    }


def main() -> None:
    sys.stdout.write(orjson.dumps(document(), option=orjson.OPT_INDENT_2).decode() + "\n")


if __name__ == "__main__":
    main()
