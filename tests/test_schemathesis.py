"""A bounded schemathesis run against the live gateway (``gateway serve`` with the bundled fake
upstream, both processes of their own): for inputs generated from the OpenAPI document on
every operation, the gateway never answers 5xx, and no answer contradicts the document
(status codes, content types, bodies of the declared shapes). Derandomized, a few examples
per operation.

The document says ``model`` is any string and an admin body any object of the named fields,
so on its own the run would never reach an upstream nor change anything: every answer an
error. For the run (``run_document``; the gateway's document is not changed), each operation
gets an example request that succeeds against the test configuration (its models, accounts,
keys and a catalogue entry of the run's own), and the ``model`` of every generated request is
one of the configuration's models for that endpoint; so successes happen, and each is checked
against the document too. The last test checks that every operation succeeded at least once.
"""

from __future__ import annotations

import asyncio
import copy
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from hypothesis import HealthCheck, settings

from gateway.operator.openapi import document
from gateway.store import UserRecord
from gateway.store.backends import open_store
from tests.plugins.processes import GATEWAY, free_port
from tests.plugins.servers import ADMIN_TOKEN, KEYS
from tests.test_endpoints import media_config

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

KEY = KEYS["alice"]
START_DEADLINE = 30.0
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]

# ---- the run's document: examples that succeed, and the configuration's model names ----------

HI = [{"role": "user", "content": "hi"}]
CONTENTS = [{"role": "user", "parts": [{"text": "hi"}]}]
CHAT_MODELS = ["chat-small", "claude-small", "gemini-small"]
# the models a generated request names, by the path's endpoint (the test configuration's)
MODELS = {
    "/v1/chat/completions": CHAT_MODELS,
    "/v1/responses": CHAT_MODELS,
    "/v1/messages": CHAT_MODELS,
    "/v1/messages/count_tokens": CHAT_MODELS,
    "/v1/embeddings": ["embed-small", "embed-gm"],
    "/v1/images/generations": ["image-small"],
    "/v1/audio/speech": ["tts-small"],
    "/v1/audio/transcriptions": ["whisper-small"],
    "/v1/rerank": ["rerank-small"],
    "/v2/rerank": ["rerank-small"],
    "/v1/completions": ["chat-small"],  # legacy completions: openai-type channels only
    "/v1/responses/input_tokens": CHAT_MODELS,
    "{model}": CHAT_MODELS,  # the generate-content paths, the model lookups
    "{model}:embedContent": ["embed-gm", "embed-small"],
    "{model}:batchEmbedContents": ["embed-gm", "embed-small"],
}
ST_USER = "u_st_user"
# (method, path or the generate-content path's tail) -> (parameters, body) of a request that
# succeeds; admin entries of the run's own ("st-...") are made, used, changed and deleted in
# the document's order of operations (each path's methods as admin_paths lists them)
EXAMPLES: dict[tuple[str, str], tuple[dict[str, str], Any]] = {
    ("POST", "/admin/accounts"): ({}, {"id": "st-account", "balance": 5}),
    ("GET", "/admin/accounts/{id}"): ({"id": "alice"}, None),
    ("POST", "/admin/accounts/{id}/topup"): ({"id": "st-account"}, {"amount": 1}),
    ("POST", "/admin/keys"): ({}, {"account": "alice", "group": "default", "name": "st"}),
    ("GET", "/admin/keys/{id}"): ({"id": "k-vip"}, None),
    ("PATCH", "/admin/keys/{id}"): ({"id": "k-vip"}, {"name": "renamed by the run"}),
    ("DELETE", "/admin/keys/{id}"): ({"id": "k-broke"}, None),  # a key no request uses
    ("POST", "/admin/models"): (
        {},
        {"name": "st-model", "capabilities": ["chat"], "price": {"input": 1, "output": 2}},
    ),
    ("GET", "/admin/models/{name}"): ({"name": "st-model"}, None),
    ("PATCH", "/admin/models/{name}"): ({"name": "st-model"}, {"price": {"input": 3}}),
    ("DELETE", "/admin/models/{name}"): ({"name": "st-model"}, None),
    ("POST", "/admin/channels"): (
        {},
        {
            "name": "st-channel",
            "type": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "groups": ["default"],
            "models": ["chat-small"],
            "status": "disabled",  # never chosen: chat-small stays on its own channel
        },
    ),
    ("GET", "/admin/channels/{name}"): ({"name": "st-channel"}, None),
    ("PATCH", "/admin/channels/{name}"): ({"name": "st-channel"}, {"weight": 2}),
    ("DELETE", "/admin/channels/{name}"): ({"name": "st-channel"}, None),
    ("POST", "/admin/channels/{name}/test"): ({"name": "oa"}, None),
    ("POST", "/admin/groups"): ({}, {"name": "st-group"}),
    ("PATCH", "/admin/groups/{name}"): ({"name": "st-group"}, {"ratio": 2}),
    ("DELETE", "/admin/groups/{name}"): ({"name": "st-group"}, None),
    ("POST", "/admin/users"): (
        {},
        {"username": "st-user", "password": "st-password", "account": "alice", "groups": []},
    ),
    # a user the live fixture put in the store (a made user's id is random)
    ("PATCH", "/admin/users/{id}"): ({"id": ST_USER}, {"groups": ["default"]}),
    ("DELETE", "/admin/users/{id}"): ({"id": ST_USER}, None),
    ("POST", "/admin/redemptions"): ({}, {"amount": 1, "count": 2}),
    ("GET", "/admin/audit"): ({"action": "account", "limit": "5"}, None),
    ("GET", "/admin/audit.csv"): ({"actor": "admin"}, None),
    ("POST", "/v1/chat/completions"): ({}, {"model": "chat-small", "messages": HI}),
    ("POST", "/v1/responses"): ({}, {"model": "claude-small", "input": "hi"}),
    ("POST", "/v1/messages"): ({}, {"model": "gemini-small", "max_tokens": 16, "messages": HI}),
    ("POST", "/v1/messages/count_tokens"): ({}, {"model": "claude-small", "messages": HI}),
    ("POST", "/v1/embeddings"): ({}, {"model": "embed-small", "input": "hi"}),
    ("POST", "/v1/images/generations"): ({}, {"model": "image-small", "prompt": "a cat"}),
    ("POST", "/v1/audio/speech"): ({}, {"model": "tts-small", "input": "hi", "voice": "alloy"}),
    ("POST", "/v1/audio/transcriptions"): ({}, {"model": "whisper-small", "file": "RIFF...."}),
    ("POST", "/v1/rerank"): ({}, {"model": "rerank-small", "query": "q", "documents": ["a"]}),
    ("POST", "/v2/rerank"): ({}, {"model": "rerank-small", "query": "q", "documents": ["a"]}),
    ("POST", "/v1/completions"): ({}, {"model": "chat-small", "prompt": "hi", "max_tokens": 8}),
    ("POST", "/v1/responses/input_tokens"): ({}, {"model": "claude-small", "input": "hi"}),
    ("GET", "{model}"): ({"model": "chat-small"}, None),
    ("POST", "{model}:generateContent"): ({"model": "gemini-small"}, {"contents": CONTENTS}),
    ("POST", "{model}:streamGenerateContent"): (
        {"model": "chat-small", "alt": "sse"},
        {"contents": CONTENTS},
    ),
    ("POST", "{model}:countTokens"): ({"model": "gemini-small"}, {"contents": CONTENTS}),
    ("POST", "{model}:embedContent"): (
        {"model": "embed-gm"},
        {"content": {"parts": [{"text": "hi"}]}},
    ),
    ("POST", "{model}:batchEmbedContents"): (
        {"model": "embed-gm"},
        {"requests": [{"model": "models/embed-gm", "content": {"parts": [{"text": "hi"}]}}]},
    ),
}


def _key(path: str) -> str:
    """A path's entry in ``MODELS`` and ``EXAMPLES``: the generate-content paths by their tail."""
    return path[path.index("{model}") :] if "{model}" in path else path


# one event of a stream: schemathesis reads a 3.1 document's text/event-stream ``schema`` as
# each event's (Open API 3.2 has ``itemSchema`` for it); the document's ``string`` describes
# the whole body
SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
}


def run_document() -> dict[str, Any]:
    """The gateway's document with the run's examples and model names."""
    doc = copy.deepcopy(document())
    for path, item in doc["paths"].items():
        for method, op in item.items():
            for reply in op["responses"].values():
                if "text/event-stream" in reply.get("content", {}):
                    reply["content"]["text/event-stream"]["schema"] = SSE_EVENT
            key = _key(path)
            params, example = EXAMPLES.get((method.upper(), key), ({}, None))
            for param in op.get("parameters", ()):
                if param["name"] == "model" and key in MODELS:
                    param["schema"] = {"enum": MODELS[key]}
                if param["name"] in params:
                    param["example"] = params[param["name"]]
            for media in op.get("requestBody", {}).get("content", {}).values():
                properties = media["schema"].get("properties", {})
                if "model" in properties and key in MODELS:
                    properties["model"] = {"enum": MODELS[key]}
                if example is not None:
                    media["example"] = example
    return doc


schema = schemathesis.openapi.from_dict(run_document())
SEEN: dict[str, Counter[int]] = defaultdict(Counter)  # operation -> statuses it got


def wait_for(url: str) -> None:
    deadline = time.monotonic() + START_DEADLINE
    while True:
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, f"{url} never answered"
        time.sleep(0.05)


async def a_user(store_url: str) -> None:
    """``ST_USER``, of an account of its own, in the store before the gateway starts."""
    store = open_store(store_url)
    await store.open()
    try:
        await store.create_user(
            UserRecord(ST_USER, "st-known", "$argon2id$unused", ST_USER, ("default",)), 0
        )
    finally:
        await store.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The gateway (SQLite store) and the fake upstream, each a process of its own."""
    tmp = tmp_path_factory.mktemp("schemathesis")
    up_port, gw_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    cfg = media_config(upstream, f"sqlite:///{tmp / 'gw.db'}")
    cfg["journal"] = str(tmp / "journal")
    config = tmp / "gateway.yaml"
    config.write_text(yaml.safe_dump(cfg))
    asyncio.run(a_user(cfg["store"]))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = (tmp / "log").open("wb")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.fake_upstream", "--host", "127.0.0.1"]
            + ["--port", str(up_port), "--first-ms", "0", "--delay-ms", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=Path(__file__).resolve().parent.parent,
        ),
        subprocess.Popen(
            [GATEWAY, "serve", "--config", str(config), "--host", "127.0.0.1"]
            + ["--port", str(gw_port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        ),
    ]
    try:
        url = f"http://127.0.0.1:{gw_port}"
        wait_for(url + "/healthz")
        yield url
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        log.close()


@schema.parametrize()
@settings(
    max_examples=8,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_5xx_and_nothing_the_document_does_not_say(case: Any, live: str) -> None:
    if case.path.startswith("/admin"):
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    else:
        headers = {"Authorization": f"Bearer {KEY}", "x-api-key": KEY, "x-goog-api-key": KEY}
    response = case.call_and_validate(base_url=live, headers=headers, checks=CHECKS, timeout=30)
    SEEN[f"{case.method} {case.path}"][response.status_code] += 1


def test_every_operation_succeeded_at_least_once() -> None:
    """Each operation of the run had a success, checked against the document above."""
    if not SEEN:
        pytest.skip("the schemathesis run did not run here")
    operations = [
        f"{method.upper()} {path}"
        for path, item in schema.raw_schema["paths"].items()
        for method in item
    ]
    failed = {op: dict(SEEN[op]) for op in operations if not any(200 <= s < 300 for s in SEEN[op])}
    assert not failed, failed
