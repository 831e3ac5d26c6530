"""The rest of the client surface, end to end on both stores: legacy completions (with a
fill-in-the-middle ``suffix``), audio translations, Cohere's v2 rerank and the Responses API's
input-token count, each billed and recorded like every endpoint; the other kinds at Azure's
deployments; token counting at Vertex (both publishers) and locally for Bedrock; the output
limit as ``max_completion_tokens`` for reasoning models; unknown paths still 404."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import openai
import pytest

from bench.fake import FakeUpstream
from bench.fake.aws_auth import ACCESS_KEY, SECRET_KEY
from bench.fake.azure import AZURE_KEY
from tests.plugins.servers import KEYS, ServedGateway
from tests.test_endpoints import wav

Factory = Callable[..., AbstractAsyncContextManager[ServedGateway]]
PRICE = {"input": 1.0, "output": 2.0, "request": 0.5, "audio_second": 100.0, "image": 3.0}
KINDS = ["chat", "embeddings", "images", "audio", "rerank"]
VERTEX = "/v1/projects/proj-1/locations/us-east5/publishers"


def surface_config(fake: FakeUpstream) -> dict[str, Any]:
    names = ["oa-m", "az-m", "o3-m", "vx-gemini", "vx-claude", "bed-nova", "claude-small"]
    models = [{"name": n, "capabilities": KINDS, "price": PRICE} for n in names]
    return {
        "models": models,
        "channels": [
            {"name": "oa", "type": "openai", "base_url": fake.url + "/v1", "api_key": "k",
             "models": ["oa-m", "o3-m"], "model_map": {"o3-m": "o3-mini"}},
            {"name": "an", "type": "anthropic", "base_url": fake.url, "api_key": "k",
             "models": ["claude-small"]},
            {"name": "az", "type": "azure", "base_url": fake.url, "api_version": "2024-10-21",
             "api_key": AZURE_KEY, "models": ["az-m"], "model_map": {"az-m": "dep-1"}},
            {"name": "vx", "type": "vertex", "base_url": fake.url, "project": "proj-1",
             "region": "us-east5", "credentials": json.dumps(fake.service_account()),
             "models": ["vx-gemini", "vx-claude"],
             "model_map": {"vx-gemini": "gemini-2.5-flash", "vx-claude": "claude-haiku-4-5"}},
            {"name": "bed", "type": "bedrock", "base_url": fake.url, "region": "us-east-1",
             "aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY,
             "models": ["bed-nova"], "model_map": {"bed-nova": "us.amazon.nova-pro-v1:0"}},
        ],
    }  # fmt: skip


def sdk(gw: ServedGateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.v1, api_key=KEYS["alice"], max_retries=0)


async def last_record(gw: ServedGateway) -> Any:
    await gw.state.writer.flush()
    return (await gw.state.store.usage("alice", limit=1))[0]


def cost(record: Any) -> float:
    return record.cost + record.cost_pico / 1_000_000


FIM = '[[fake text="return a + b" prompt_tokens=40 completion_tokens=5]]'


@pytest.mark.parametrize(("model", "channel", "path"), [
    ("oa-m", "oa", "/v1/completions"),
    ("az-m", "az", "/openai/deployments/dep-1/completions"),
])  # fmt: skip
@pytest.mark.parametrize("stream", [False, True])
async def test_legacy_completions_with_a_suffix(
    fake: FakeUpstream, gateway_factory: Factory, model: str, channel: str, path: str, stream: bool
) -> None:
    async with gateway_factory(**surface_config(fake)) as gw, sdk(gw) as client:
        args: dict[str, Any] = {"model": model, "prompt": f"def add(a, b):\n    {FIM}"}
        if stream:
            text = ""
            async for chunk in await client.completions.create(
                **args, suffix="\n", max_tokens=16, stream=True
            ):
                assert chunk.model == model
                text += "".join(c.text for c in chunk.choices)
            assert chunk.usage is None  # not asked for: the gateway's own request kept it
        else:
            done = await client.completions.create(**args, suffix="\n", max_tokens=16)
            assert done.model == model and done.object == "text_completion"
            text = done.choices[0].text
            assert done.usage is not None and done.usage.prompt_tokens == 40
        assert text == "return a + b"
        sent = fake.requests[-1]
        assert sent.path == path and sent.json["suffix"] == "\n"
        assert sent.json["model"] == ("dep-1" if channel == "az" else model)
        if stream:
            assert sent.json["stream_options"] == {"include_usage": True}
        record = await last_record(gw)
    assert (record.endpoint, record.model, record.channel, record.status) == (
        "completions",
        model,
        channel,
        200,
    )
    assert (record.prompt_tokens, record.completion_tokens) == (40, 5)
    assert cost(record) == 40 * 1 + 5 * 2 + 0.5 * 1_000_000  # tokens, and the request price


async def test_legacy_completions_reach_no_other_channel_type(
    fake: FakeUpstream, gateway_factory: Factory
) -> None:
    async with gateway_factory(**surface_config(fake)) as gw, sdk(gw) as client:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.completions.create(model="claude-small", prompt="x")
        assert "No channel serves" in str(caught.value)
        async with aiohttp.ClientSession() as s:
            headers = {"Authorization": f"Bearer {KEYS['alice']}"}
            async with s.post(gw.url + "/v1/fine_tuning/jobs", json={}, headers=headers) as r:
                assert r.status == 404
                assert (await r.json())["error"]["code"] == "unknown_url"


@pytest.mark.parametrize(("model", "path"), [
    ("oa-m", "/v1/audio/translations"),
    ("az-m", "/openai/deployments/dep-1/audio/translations"),
])  # fmt: skip
async def test_audio_translations(
    fake: FakeUpstream, gateway_factory: Factory, model: str, path: str
) -> None:
    form = aiohttp.FormData()  # (the openai SDK marks its translations call deprecated)
    form.add_field("model", model)
    form.add_field("response_format", "verbose_json")
    form.add_field("file", wav(2.5), filename="hola.wav", content_type="audio/wav")
    headers = {"Authorization": f"Bearer {KEYS['alice']}"}
    async with gateway_factory(**surface_config(fake)) as gw, aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/v1/audio/translations", data=form, headers=headers) as r:
            assert r.status == 200
            out = await r.json()
        assert out["text"] == "This is the demo transcription." and out["duration"] == 2.5
        assert fake.requests[-1].path == path and fake.requests[-1].form["model"] != ""
        record = await last_record(gw)
    assert (record.endpoint, record.model, record.status) == ("audio_translation", model, 200)
    seconds = out["usage"]["seconds"]  # what the upstream bills (whole seconds: 3)
    assert seconds == 3
    assert cost(record) == (seconds * 100.0 + 0.5) * 1_000_000  # seconds, and the call


async def test_cohere_v2_rerank(fake: FakeUpstream, gateway_factory: Factory) -> None:
    body = {"model": "oa-m", "query": "red apple", "documents": ["pear", "red apple", "plum"]}
    headers = {"Authorization": f"Bearer {KEYS['alice']}"}
    async with gateway_factory(**surface_config(fake)) as gw, aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/v2/rerank", json=body, headers=headers) as r:
            assert r.status == 200
            out = await r.json()
        scores = [x["relevance_score"] for x in out["results"]]
        assert scores == sorted(scores, reverse=True) and out["results"][0]["index"] == 1
        assert out["model"] == "oa-m"
        assert fake.requests[-1].path == "/v1/rerank"
        async with s.post(
            gw.url + "/v2/rerank", json={**body, "model": "az-m"}, headers=headers
        ) as r:
            assert r.status == 404  # Azure OpenAI has no rerank
        await gw.state.writer.flush()
        record = (await gw.state.store.usage("alice", limit=2))[1]  # the first: newest first
    assert (record.endpoint, record.status) == ("rerank", 200)
    assert cost(record) == record.prompt_tokens * 1 + 0.5 * 1_000_000 and record.prompt_tokens > 0


@pytest.mark.parametrize(("model", "upstream"), [
    ("oa-m", None),  # an openai channel: the local estimate
    ("bed-nova", None),  # Bedrock: the local estimate
    ("vx-gemini", f"{VERTEX}/google/models/gemini-2.5-flash:countTokens"),
    ("vx-claude", f"{VERTEX}/anthropic/models/count-tokens:rawPredict"),
])  # fmt: skip
async def test_responses_input_tokens(
    fake: FakeUpstream, gateway_factory: Factory, model: str, upstream: str | None
) -> None:
    async with gateway_factory(**surface_config(fake)) as gw, sdk(gw) as client:
        counted = await client.responses.input_tokens.count(
            model=model, input="How many tokens is this sentence, more or less?"
        )
        assert counted.object == "response.input_tokens" and counted.input_tokens > 0
        sent = [q.path for q in fake.requests if q.path != "/token"]
        assert sent == ([upstream] if upstream else [])
        record = await last_record(gw)
    assert (record.endpoint, record.protocol, record.model) == ("count_tokens", "responses", model)
    assert record.prompt_tokens == counted.input_tokens and record.cost == 0  # never charged


@pytest.mark.parametrize("model", ["vx-gemini", "vx-claude", "bed-nova"])
async def test_count_tokens_from_messages_and_gemini_clients(
    fake: FakeUpstream, gateway_factory: Factory, model: str
) -> None:
    message = "count these words please"
    headers = {"x-api-key": KEYS["alice"], "anthropic-version": "2023-06-01"}
    async with gateway_factory(**surface_config(fake)) as gw, aiohttp.ClientSession() as s:
        body = {"model": model, "messages": [{"role": "user", "content": message}]}
        async with s.post(gw.url + "/v1/messages/count_tokens", json=body, headers=headers) as r:
            assert r.status == 200
            by_messages = (await r.json())["input_tokens"]
        body = {"contents": [{"role": "user", "parts": [{"text": message}]}]}
        path = f"/v1beta/models/{model}:countTokens"
        async with s.post(gw.url + path, json=body, headers={"x-goog-api-key": KEYS["alice"]}) as r:
            assert r.status == 200
            by_gemini = (await r.json())["totalTokens"]
        upstream = [q.path for q in fake.requests if q.path != "/token"]
    assert by_messages > 0 and by_gemini > 0
    if model == "bed-nova":
        assert upstream == []  # counted locally
    else:
        assert len(upstream) == 2 and all(p.startswith(VERTEX) for p in upstream)


async def test_the_other_kinds_reach_azure_deployments(
    fake: FakeUpstream, gateway_factory: Factory
) -> None:
    async with gateway_factory(**surface_config(fake)) as gw, sdk(gw) as client:
        vectors = await client.embeddings.create(model="az-m", input=["hello", "world"])
        assert len(vectors.data) == 2 and vectors.model == "az-m"
        image = await client.images.generate(model="az-m", prompt="a boat", n=2)
        assert len(image.data or []) == 2
        async with client.audio.speech.with_streaming_response.create(
            model="az-m", voice="alloy", input="Hello there"
        ) as speech:
            audio = await speech.read()
        assert len(audio) > 100
        text = await client.audio.transcriptions.create(model="az-m", file=("a.wav", wav(1.0)))
        assert text.text == "This is the demo transcription."
        paths = [q.path for q in fake.requests]
        await gw.state.writer.flush()
        records = await gw.state.store.usage("alice", limit=10)
    assert paths == [
        "/openai/deployments/dep-1/embeddings",
        "/openai/deployments/dep-1/images/generations",
        "/openai/deployments/dep-1/audio/speech",
        "/openai/deployments/dep-1/audio/transcriptions",
    ]
    assert all(q.query["api-version"] == "2024-10-21" for q in fake.requests)
    assert all(q.headers["api-key"] == AZURE_KEY for q in fake.requests)
    assert [(r.endpoint, r.channel, r.status) for r in reversed(records)] == [
        ("embeddings", "az", 200),
        ("images", "az", 200),
        ("audio_speech", "az", 200),
        ("audio_transcription", "az", 200),
    ]
    assert records[2].cost == 2 * 3.0 * 1_000_000 + 0.5 * 1_000_000  # images: 2, and the call


async def test_reasoning_models_get_max_completion_tokens(
    fake: FakeUpstream, gateway_factory: Factory
) -> None:
    async with gateway_factory(**surface_config(fake)) as gw, sdk(gw) as client:
        for model in ("o3-m", "oa-m"):
            for stream in (False, True):
                await client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=50,
                    stream=stream,
                )  # fmt: skip
        async with aiohttp.ClientSession() as s:  # converted from the messages protocol
            body = {
                "model": "o3-m",
                "max_tokens": 40,
                "messages": [{"role": "user", "content": "hi"}],
            }
            headers = {"x-api-key": KEYS["alice"], "anthropic-version": "2023-06-01"}
            async with s.post(gw.url + "/v1/messages", json=body, headers=headers) as r:
                assert r.status == 200
    limits = [
        (q.json["model"], q.json.get("max_tokens"), q.json.get("max_completion_tokens"))
        for q in fake.requests
    ]
    assert limits == [
        ("o3-mini", None, 50),
        ("o3-mini", None, 50),
        ("oa-m", 50, None),
        ("oa-m", 50, None),
        ("o3-mini", None, 40),
    ]
