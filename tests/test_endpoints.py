"""Every endpoint beyond chat, end to end: the official SDKs (or plain HTTP) against the gateway
served on a socket, the bundled fake upstream behind it, on both stores. Each call must bring
back what the upstream produced, bill as the catalogue says and leave one usage record."""

from __future__ import annotations

import base64
import io
import struct
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from bench.fake import media
from bench.fake.routes import multipart as fake_multipart
from bench.fake_upstream import FakeUpstream
from tests.plugins.embedded import SERVER
from tests.plugins.servers import KEYS, ServedGateway, make_config
from tests.test_sdk_matrix import GENAI_AIOHTTP_WARNING, genai_client, usage_record

pytestmark = GENAI_AIOHTTP_WARNING

TOKEN_PRICE = {"input": 1.0, "output": 2.0}  # micro-units per token
MEDIA_MODELS = [
    {"name": "embed-small", "capabilities": ["embeddings"], "price": TOKEN_PRICE},
    {"name": "embed-gm", "capabilities": ["embeddings"], "price": TOKEN_PRICE},
    {"name": "image-small", "capabilities": ["images"], "price": {"image": 0.04}},
    {"name": "tts-small", "capabilities": ["audio"], "price": {"speech_char": 15.0}},
    {"name": "rerank-small", "capabilities": ["rerank"], "price": {"input": 1.0, "request": 0.001}},
    {"name": "whisper-small", "capabilities": ["audio"], "price": {"audio_second": 0.0001}},
]
MEDIA_CHANNELS = [
    {
        "name": "oa-media",
        "type": "openai",
        "base_url": "{up}/v1",
        "api_key": "upstream-key",
        "groups": ["default"],
        "models": ["embed-small", "image-small", "tts-small", "rerank-small", "whisper-small"],
        "model_map": {
            "embed-small": "demo-embed",
            "rerank-small": "demo-rerank",
            "whisper-small": "demo-whisper",
        },
    },
    {
        "name": "gm-embed",
        "type": "gemini",
        "base_url": "{up}",
        "api_key": "upstream-key",
        "groups": ["default"],
        "models": ["embed-gm"],
        "model_map": {"embed-gm": "gemini-demo-embedding"},
    },
]


def media_config(upstream: str, store_url: str) -> dict[str, Any]:
    cfg = make_config(upstream, store_url)
    cfg["models"] = [*cfg["models"], *MEDIA_MODELS]
    channels = [{**ch, "base_url": ch["base_url"].format(up=upstream)} for ch in MEDIA_CHANNELS]
    cfg["channels"] = [*cfg["channels"], *channels]
    return cfg


@pytest.fixture
async def gw(fake: FakeUpstream, store_url: str) -> AsyncIterator[ServedGateway]:
    from gateway.config import parse_settings
    from tests.plugins.servers import serve_app

    async with serve_app(parse_settings(media_config(fake.url, store_url))) as served:
        yield served


def oa(gw: ServedGateway) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.v1, api_key=KEYS["alice"], max_retries=0)


async def check_record(gw: ServedGateway, **expected: Any) -> dict[str, Any]:
    rec = await usage_record(gw)
    for field, value in expected.items():
        if isinstance(value, float):
            assert rec[field] == pytest.approx(value), field
        else:
            assert rec[field] == value, field
    return rec


def upstream_vector(text: str, dims: int = media.DEFAULT_DIMENSIONS) -> list[float]:
    """The vector the fake upstream gives ``text``, as float32 (what base64 carries)."""
    values = media.vector(text, dims)
    return list(struct.unpack(f"<{dims}f", struct.pack(f"<{dims}f", *values)))


# ---------------------------------------------------------------------------- embeddings
@pytest.mark.parametrize("encoding", ["float", "base64", None], ids=["float", "base64", "default"])
@pytest.mark.parametrize(
    ("model", "channel"), [("embed-small", "oa-media"), ("embed-gm", "gm-embed")]
)
async def test_openai_sdk_embeddings(
    gw: ServedGateway, fake: FakeUpstream, model: str, channel: str, encoding: str | None
) -> None:
    args: dict[str, Any] = {} if encoding is None else {"encoding_format": encoding}
    async with oa(gw) as client:
        res = await client.embeddings.create(model=model, input=["hello world", "bye"], **args)
    assert res.model == model
    assert [d.index for d in res.data] == [0, 1]
    if encoding == "base64":  # asked explicitly: the SDK hands the base64 text over as it is
        vectors = [
            list(struct.unpack(f"<{len(raw) // 4}f", raw))
            for raw in (base64.b64decode(str(d.embedding)) for d in res.data)
        ]
    else:
        vectors = [list(d.embedding) for d in res.data]
    assert vectors[0] == pytest.approx(upstream_vector("hello world"), abs=1e-6)
    assert vectors[1] == pytest.approx(upstream_vector("bye"), abs=1e-6)
    tokens = res.usage.prompt_tokens
    assert tokens > 0
    await check_record(
        gw,
        model=model,
        channel=channel,
        endpoint="embeddings",
        protocol="openai",
        status=200,
        prompt_tokens=tokens,
        cost=tokens / 1e6,
    )


@pytest.mark.parametrize(
    ("model", "channel"), [("embed-small", "oa-media"), ("embed-gm", "gm-embed")]
)
async def test_genai_embed_content(
    gw: ServedGateway, fake: FakeUpstream, model: str, channel: str
) -> None:
    async with genai_client(gw) as client:
        res = await client.models.embed_content(model=model, contents=["hello world", "bye"])
    assert res.embeddings is not None
    got = [list(e.values or []) for e in res.embeddings]
    assert got[0] == pytest.approx(media.vector("hello world", media.DEFAULT_DIMENSIONS), abs=1e-6)
    assert got[1] == pytest.approx(media.vector("bye", media.DEFAULT_DIMENSIONS), abs=1e-6)
    rec = await check_record(
        gw, model=model, channel=channel, endpoint="embeddings", protocol="gemini", status=200
    )
    assert rec["prompt_tokens"] > 0 and rec["cost"] == pytest.approx(rec["prompt_tokens"] / 1e6)


@pytest.mark.parametrize("model", ["embed-small", "embed-gm"])
@pytest.mark.parametrize("prefix", ["/v1beta/models/", "/v1/models/"])
async def test_embed_content_over_plain_http(gw: ServedGateway, model: str, prefix: str) -> None:
    body = {"content": {"parts": [{"text": "hello world"}]}}
    async with aiohttp.ClientSession() as s:
        url = f"{gw.url}{prefix}{model}:embedContent"
        async with s.post(url, json=body, headers={"x-goog-api-key": KEYS["alice"]}) as r:
            assert r.status == 200, await r.text()
            payload = await r.json()
    assert payload["embedding"]["values"] == pytest.approx(
        media.vector("hello world", media.DEFAULT_DIMENSIONS), abs=1e-6
    )
    await check_record(gw, model=model, endpoint="embeddings", protocol="gemini", status=200)


# ---------------------------------------------------------------------------- images
@pytest.mark.parametrize("response_format", ["b64_json", "url"])
async def test_openai_sdk_images(
    gw: ServedGateway, fake: FakeUpstream, response_format: str
) -> None:
    async with oa(gw) as client:
        res = await client.images.generate(
            model="image-small",
            prompt="a cat",
            n=2,
            response_format=response_format,  # type: ignore[arg-type]
        )
    assert res.data is not None and len(res.data) == 2
    if response_format == "b64_json":
        assert base64.b64decode(res.data[0].b64_json or "") == media.PNG
    else:
        assert (res.data[0].url or "").endswith("/files/image.png")
    assert fake.requests[-1].json["model"] == "image-small"
    await check_record(
        gw, model="image-small", channel="oa-media", endpoint="images", status=200, cost=0.08
    )


# ---------------------------------------------------------------------------- speech
async def test_openai_sdk_speech_is_streamed_back(gw: ServedGateway) -> None:
    text = "Hello there, this is a test of speech."
    async with oa(gw) as client:
        async with client.audio.speech.with_streaming_response.create(
            model="tts-small", voice="alloy", input=text, response_format="wav"
        ) as res:
            assert res.headers["content-type"] == "audio/wav"
            pieces = [piece async for piece in res.iter_bytes()]
    expected, _ = media.speech(text, "wav")
    assert b"".join(pieces) == expected
    await check_record(
        gw,
        model="tts-small",
        channel="oa-media",
        endpoint="audio_speech",
        status=200,
        cost=len(text) * 15.0 / 1e6,
    )


# ---------------------------------------------------------------------------- transcription
def wav(seconds: float, rate: int = 16_000) -> bytes:
    """A silent 16-bit mono WAV file of that length."""
    pcm = bytes(int(rate * seconds) * 2)
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", 36 + len(pcm))
        + b"WAVEfmt "
        + fmt
        + b"data"
        + (struct.pack("<I", len(pcm)) + pcm)
    )


def uploaded_file(fake: FakeUpstream) -> tuple[dict[str, str], bytes]:
    """The text fields and the file bytes of the last upload the upstream received."""
    sent = fake.requests[-1]
    form, files = fake_multipart(sent.headers["content-type"], sent.body)
    return form, files["file"]


@pytest.mark.parametrize("response_format", ["json", "verbose_json", "text", "srt"])
async def test_openai_sdk_transcription(
    gw: ServedGateway, fake: FakeUpstream, response_format: str
) -> None:
    audio = wav(3.0)
    async with oa(gw) as client:
        res = await client.audio.transcriptions.create(
            model="whisper-small",
            file=("speech.wav", audio, "audio/wav"),
            response_format=response_format,  # type: ignore[arg-type]
            language="en",
        )
    text = res if isinstance(res, str) else res.text
    assert "demo transcription" in text
    form, sent = uploaded_file(fake)
    assert form["model"] == "demo-whisper"  # renamed on the way out, nothing else changed
    assert (form["response_format"], form["language"]) == (response_format, "en")
    assert sent == audio
    seconds = 3 if response_format in ("json", "verbose_json") else 0  # text reports none
    await check_record(
        gw,
        model="whisper-small",
        channel="oa-media",
        endpoint="audio_transcription",
        status=200,
        cost=seconds * 0.0001,
    )


async def test_transcription_with_the_model_after_the_file(
    gw: ServedGateway, fake: FakeUpstream
) -> None:
    """Some clients send the file first: the fields after it are still found and renamed."""
    audio = wav(70.0)  # over the spool's memory: the part before the model goes to disk
    form = aiohttp.FormData()
    form.add_field("file", io.BytesIO(audio), filename="a.wav", content_type="audio/wav")
    form.add_field("model", "whisper-small")
    form.add_field("response_format", "verbose_json")
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {KEYS['alice']}"}
        async with s.post(gw.v1 + "/audio/transcriptions", data=form, headers=headers) as r:
            assert r.status == 200, await r.text()
            payload = await r.json()
    assert payload["duration"] == 70.0
    fields, sent = uploaded_file(fake)
    assert fields["model"] == "demo-whisper" and sent == audio
    await check_record(gw, endpoint="audio_transcription", status=200, cost=70 * 0.0001)


@pytest.mark.xfail(
    SERVER in ("uvicorn", "granian"),
    reason="the server closes with the upload unread: the SDK, still sending, mostly gets a "
    "reset, not the 413 (a race: hypercorn reads on, and wins it)",
    strict=False,
)
async def test_an_upload_over_the_limit_is_413_before_it_is_read(
    fake: FakeUpstream, store_url: str
) -> None:
    from gateway.config import parse_settings
    from tests.plugins.servers import serve_app

    cfg = media_config(fake.url, store_url)
    cfg["limits"] = {"max_upload_bytes": 100_000, "max_request_bytes": 1000}
    async with serve_app(parse_settings(cfg)) as gw:
        async with oa(gw) as client:
            # under the upload limit, far over the JSON body limit: served
            await client.audio.transcriptions.create(
                model="whisper-small", file=("a.wav", wav(1.0), "audio/wav")
            )
            with pytest.raises(openai.APIStatusError) as caught:
                await client.audio.transcriptions.create(
                    model="whisper-small", file=("a.wav", wav(10.0), "audio/wav")
                )
        assert caught.value.status_code == 413
        assert len([r for r in fake.requests if r.path.endswith("transcriptions")]) == 1

        async def drip() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            yield b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-small'
            yield b'\r\n--b\r\nContent-Disposition: form-data; name="file"; filename="a"\r\n\r\n'
            for _ in range(40):
                yield bytes(10_000)

        async with aiohttp.ClientSession() as s:
            headers = {
                "Authorization": f"Bearer {KEYS['alice']}",
                "Content-Type": "multipart/form-data; boundary=b",
            }
            async with s.post(gw.v1 + "/audio/transcriptions", data=drip(), headers=headers) as r:
                assert r.status == 413  # the upload was cut short once past the limit


# ---------------------------------------------------------------------------- rerank
async def test_rerank_best_first_with_the_clients_model(
    gw: ServedGateway, fake: FakeUpstream
) -> None:
    body = {
        "model": "rerank-small",
        "query": "red apple",
        "documents": ["a green pear", "a red apple", "red wine"],
        "top_n": 2,
    }
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {KEYS['alice']}"}
        async with s.post(gw.v1 + "/rerank", json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            payload = await r.json()
    assert fake.requests[-1].path == "/v1/rerank"
    assert fake.requests[-1].json["model"] == "demo-rerank"
    assert payload["model"] == "rerank-small"
    assert [x["index"] for x in payload["results"]] == [1, 2]
    scores = [x["relevance_score"] for x in payload["results"]]
    assert scores == sorted(scores, reverse=True)
    tokens = payload["usage"]["total_tokens"]
    await check_record(
        gw,
        model="rerank-small",
        endpoint="rerank",
        status=200,
        prompt_tokens=tokens,
        cost=tokens / 1e6 + 0.001,
    )


# ---------------------------------------------------------------------------- routing
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"model": "chat-small", "input": "x"}),  # no embeddings capability
        ("/v1/chat/completions", {"model": "embed-small", "messages": []}),  # no chat
        ("/v1/images/generations", {"model": "embed-small", "prompt": "x"}),
        ("/v1/rerank", {"model": "nope", "query": "q", "documents": ["d"]}),  # no such model
    ],
)
async def test_a_model_without_the_endpoints_capability_is_404(
    gw: ServedGateway, path: str, body: dict[str, Any]
) -> None:
    async with oa(gw) as client:
        with pytest.raises(openai.NotFoundError) as caught:
            await client.post(path.removeprefix("/v1"), body=body, cast_to=object)
    assert caught.value.status_code == 404
    rec = await usage_record(gw)
    assert (rec["status"], rec["channel"], rec["cost"]) == (404, None, 0)


async def test_generate_content_embeddings_of_a_model_served_only_by_openai_paths(
    gw: ServedGateway,
) -> None:
    """The gemini protocol has no images route: an image model is simply not found there."""
    async with aiohttp.ClientSession() as s:
        url = f"{gw.url}/v1beta/models/image-small:embedContent"
        body = {"content": {"parts": [{"text": "x"}]}}
        async with s.post(url, json=body, headers={"x-goog-api-key": KEYS["alice"]}) as r:
            assert r.status == 404
            payload = await r.json()
    assert payload["error"]["status"] == "NOT_FOUND"


# ---------------------------------------------------------------------------- the route table
@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/v1/messages", "POST"),
        ("GET", "/v1beta/models/x:generateContent", "POST"),
        ("DELETE", "/v1/models", "GET"),
    ],
)
async def test_a_known_path_with_another_method_is_405_with_allow(
    gw: ServedGateway, method: str, path: str, allow: str
) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.request(method, gw.url + path) as r:
            assert r.status == 405
            assert r.headers["allow"] == allow
            payload = await r.json()
    assert "error" in payload


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/nothing-here", "openai"),
        ("/v1beta/models/x:fooBar", "gemini"),
        ("/v1/models/x:fooBar", "gemini"),
        ("/v1/messages/unknown", "anthropic"),
    ],
)
async def test_an_unknown_url_is_404_not_a_missing_model(
    gw: ServedGateway, path: str, shape: str
) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + path, json={}) as r:
            assert r.status == 404
            payload = await r.json()
    if shape == "openai":
        assert payload["error"]["code"] == "unknown_url"
    elif shape == "gemini":
        assert payload["error"]["status"] == "NOT_FOUND" and payload["error"]["code"] == 404
    else:
        assert payload["type"] == "error" and payload["error"]["type"] == "not_found_error"
    assert "unknown request url" in str(payload).lower()
    assert "model_not_found" not in str(payload)


@pytest.mark.parametrize("method", ["GET", "HEAD"])
async def test_the_base_url_answers_200(gw: ServedGateway, method: str) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.request(method, gw.url + "/") as r:
            assert r.status == 200
