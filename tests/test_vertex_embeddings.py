"""Embeddings on a ``vertex`` channel: Google's embedding models through Vertex's ``:predict``.
google-genai with ``vertexai=True`` is the reference: its ``embed_content`` gets its answer
from the fake, and the call the gateway builds for the same texts is the one it sends (path,
body). (google-genai sends ``:predict`` for the text-embedding models and, lately, Gemini's
``:embedContent`` for ``gemini*`` ones; Vertex serves ``:predict`` for both, the one API every
Google embedding model on Vertex has.) Then through a served gateway on both stores: the OpenAI
embeddings API and both of Gemini's embed paths reach a vertex channel (with the fake checking
its OAuth2 token), get the fake's vectors, and are billed exactly the tokens Vertex counted
(``statistics. token_count``), times the price. A token array is the gateway's 400; Vertex's
errors come back in the client's shape."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import google.oauth2.service_account
import orjson
import pytest
from google import genai
from google.genai import types
from hypothesis import given
from hypothesis import strategies as st

from bench.fake import FakeUpstream
from bench.fake.media import tokens, vector
from gateway.errors import GatewayError
from gateway.protocols.base import UpstreamTarget
from gateway.protocols.vertex import VertexSite
from gateway.protocols.vertex_embeddings import VERTEX_EMBEDDINGS, predict_call
from gateway.upstream.google_token import SCOPE
from tests.mutation import BOUNDED, copy, json_values, paths, replaced
from tests.plugins.servers import KEYS, ServedGateway
from tests.test_clouds_served import VERTEX, cloud_config

Factory = Callable[..., AbstractAsyncContextManager[ServedGateway]]
EMBED = "gemini-embedding-001"
PREDICT = f"{VERTEX}/google/models/{EMBED}:predict"
TEXT_EMBED = "text-embedding-005"  # one google-genai sends to :predict
PRICE = 3.0  # micro-units per input token
TEXTS = ["the quick brown fox", "jumps over the lazy dog, twice"]


def embed_config(fake: FakeUpstream) -> dict[str, Any]:
    """The served clouds' config with an embedding model on its vertex channel."""
    cfg = cloud_config(fake)
    cfg["models"].append(
        {"name": "vx-embed", "capabilities": ["embeddings"], "price": {"input": PRICE}}
    )
    (vx,) = [c for c in cfg["channels"] if c["name"] == "vx"]
    vx["models"] = [*vx["models"], "vx-embed"]
    vx["model_map"] = {**vx["model_map"], "vx-embed": EMBED}
    return cfg


async def test_a_predict_call_is_what_google_genai_sends(fake: FakeUpstream) -> None:
    credentials = google.oauth2.service_account.Credentials.from_service_account_info(
        fake.service_account(), scopes=[SCOPE]
    )
    client = genai.Client(
        vertexai=True, project="proj-1", location="us-east5", credentials=credentials,
        http_options=types.HttpOptions(base_url=fake.url + "/", api_version="v1"),
    )  # fmt: skip
    config = {"task_type": "RETRIEVAL_DOCUMENT", "output_dimensionality": 8}
    try:
        got = await asyncio.to_thread(
            lambda: client.models.embed_content(model=TEXT_EMBED, contents=TEXTS, config=config)
        )
    finally:
        client.close()
    assert [e.values for e in got.embeddings or []] == [vector(t, 8) for t in TEXTS]
    assert [e.statistics.token_count for e in got.embeddings or [] if e.statistics] == [
        tokens(t) for t in TEXTS
    ]
    sent = fake.requests[-1]
    req = {"model": "vx-embed", "input": TEXTS, "dimensions": 8, "task_type": "RETRIEVAL_DOCUMENT"}
    target = UpstreamTarget("vx", fake.url, "", TEXT_EMBED, 0, False)
    call = VERTEX_EMBEDDINGS.embeddings_request(req, target)  # type: ignore[arg-type]
    call = predict_call(call, VertexSite("proj-1", "us-east5", fake.url), TEXT_EMBED)
    assert call.url == fake.url + sent.path
    assert sent.path == f"{VERTEX}/google/models/{TEXT_EMBED}:predict"
    assert orjson.loads(call.body) == sent.json


def openai_body(model: str) -> tuple[str, dict[str, Any]]:
    return "/v1/embeddings", {"model": model, "input": TEXTS, "dimensions": 8}


def batch_body(model: str) -> tuple[str, dict[str, Any]]:
    requests = [
        {"model": f"models/{model}", "content": {"parts": [{"text": t}]}, "taskType": "CLUSTERING",
         "outputDimensionality": 8}
        for t in TEXTS
    ]  # fmt: skip
    return f"/v1beta/models/{model}:batchEmbedContents", {"requests": requests}


def single_body(model: str) -> tuple[str, dict[str, Any]]:
    body = {"content": {"parts": [{"text": TEXTS[0]}]}, "outputDimensionality": 8}
    return f"/v1beta/models/{model}:embedContent", body


def vectors(reply: dict[str, Any]) -> list[list[float]]:
    if "data" in reply:
        return [item["embedding"] for item in reply["data"]]
    if "embedding" in reply:
        return [reply["embedding"]["values"]]
    return [item["values"] for item in reply["embeddings"]]


@pytest.mark.parametrize(
    ("request_of", "texts", "task_type"),
    [(openai_body, TEXTS, None), (batch_body, TEXTS, "CLUSTERING"), (single_body, TEXTS[:1], None)],
    ids=["openai", "gemini-batch", "gemini-single"],
)
async def test_every_embeddings_client_reaches_vertex_and_is_billed_its_token_count(
    fake: FakeUpstream,
    gateway_factory: Factory,
    request_of: Callable[[str], tuple[str, dict[str, Any]]],
    texts: list[str],
    task_type: str | None,
) -> None:
    path, body = request_of("vx-embed")
    headers = {"Authorization": f"Bearer {KEYS['alice']}"}
    async with gateway_factory(**embed_config(fake)) as gw, aiohttp.ClientSession() as s:
        async with s.post(gw.url + path, json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            reply = await r.json()
        assert vectors(reply) == [vector(t, 8) for t in texts]
        (sent,) = [q for q in fake.requests if q.path != "/token"]
        assert sent.path == PREDICT
        assert sent.headers["Authorization"].startswith("Bearer ya29.fake-")
        instances = [
            {"content": t} | ({"task_type": task_type} if task_type else {}) for t in texts
        ]
        assert sent.json == {"instances": instances, "parameters": {"outputDimensionality": 8}}
        await gw.state.writer.flush()
        [record] = await gw.state.store.usage("alice", limit=5)
    counted = sum(tokens(t) for t in texts)  # what Vertex's statistics said
    assert (record.model, record.channel, record.endpoint, record.status) == (
        "vx-embed", "vx", "embeddings", 200,
    )  # fmt: skip
    assert (record.prompt_tokens, record.completion_tokens) == (counted, 0)
    assert (record.cost, record.cost_pico) == (counted * PRICE, 0)


async def test_what_vertex_cannot_embed_and_its_errors_come_back_in_the_client_s_shape(
    fake: FakeUpstream, gateway_factory: Factory
) -> None:
    headers = {"Authorization": f"Bearer {KEYS['alice']}"}
    async with gateway_factory(**embed_config(fake)) as gw, aiohttp.ClientSession() as s:
        body = {"model": "vx-embed", "input": [[1, 2, 3]]}
        async with s.post(gw.url + "/v1/embeddings", json=body, headers=headers) as r:
            assert r.status == 400
            assert "token arrays" in (await r.json())["error"]["message"]
        body = {"model": "vx-embed", "input": "[[fake status=429]] hi"}
        async with s.post(gw.url + "/v1/embeddings", json=body, headers=headers) as r:
            assert r.status == 429
            assert (await r.json())["error"]["type"]
        path, body = single_body("vx-embed")
        body["content"]["parts"][0]["text"] = "[[fake status=400 error_message=bad]] hi"
        async with s.post(gw.url + path, json=body, headers=headers) as r:
            assert r.status == 400
            assert (await r.json())["error"]["status"] == "INVALID_ARGUMENT"


REPLY: Any = {
    "predictions": [
        {
            "embeddings": {
                "values": [0.5, -0.5],
                "statistics": {"token_count": 3, "truncated": False},
            }
        },
        {"embeddings": {"values": [0.25, 1.0], "statistics": {"token_count": 4.0}}},
    ],
    "metadata": {"billableCharacterCount": 20},
}
REQ: Any = {"model": "vx-embed", "input": ["abc", "defg"]}


def read_reply(payload: Any) -> None:
    """A reply reads as two vectors with a whole token count, or is the upstream's fault."""
    try:
        resp = VERTEX_EMBEDDINGS.decode_embeddings_response(payload, REQ)
    except GatewayError as err:
        assert err.status == 502
        return
    assert [e["index"] for e in resp["data"]] == [0, 1]
    assert type(resp.get("usage", {}).get("prompt_tokens", 0)) is int


def test_a_reply_is_read_with_its_token_counts() -> None:
    resp = VERTEX_EMBEDDINGS.decode_embeddings_response(REPLY, REQ)
    assert [e["embedding"] for e in resp["data"]] == [[0.5, -0.5], [0.25, 1.0]]
    assert resp["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    uncounted = copy(REPLY)  # one prediction without its count: the estimate is billed
    del uncounted["predictions"][1]["embeddings"]["statistics"]
    assert "usage" not in VERTEX_EMBEDDINGS.decode_embeddings_response(uncounted, REQ)


@st.composite
def reply_mutants(draw: st.DrawFn) -> Any:
    path = draw(st.sampled_from(list(paths(REPLY))))
    return replaced(REPLY, path, draw(json_values))


@BOUNDED
@given(reply_mutants())
def test_any_value_anywhere_in_a_reply_is_read_or_a_502(payload: Any) -> None:
    read_reply(payload)
