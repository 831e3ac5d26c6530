"""The embeddings adapters: one parametrized runner over the fixture tree, then the official SDKs.

tests/fixtures/embeddings/<client>__<upstream>/<case>/case.json names the case's inputs (its
``request`` under requests/<client>/, its ``upstream_response`` or ``upstream_error``
(``{status, body}``) under replies/<upstream>/, stored once each: tests/fixtures/README.md);
its ``error`` is the error the case must raise (``stage``: match, decode, request or
response; ``status``, ``class``, a ``message`` excerpt, ``channel_fault``, ``retry_after``);
it gives the gemini path (``action``, ``path_model``), the prompt tokens a reply is billed
(``billed``), the usage a passthrough reply reports (``usage``) and the vectors a passthrough
base64 reply holds (``vectors``). Beside it are the golden files, upstream_request.json
(``{url, headers, body}``) and client_response.json, written by hand.

Each attempt is the kind's: ``EmbeddingsKind.exchange`` chooses the pass-through (the same
protocol on both sides) or a conversion, and its call, reply and error give the outputs.
Pure: no event loop, no sockets (the SDKs talk to the kind's exchange through a mock
transport).
"""

from __future__ import annotations

import base64
import random
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest
from google import genai
from google.genai import models as genai_models
from google.genai import types as genai_types
from openai import OpenAI, omit
from openai._models import construct_type
from openai.lib._parsing._embeddings import parse_embedding_response
from openai.types import CreateEmbeddingResponse

from gateway.errors import GatewayError, UpstreamError
from gateway.kinds import KINDS
from gateway.kinds.base import Exchange, Reply
from gateway.kinds.embeddings import EmbeddingsJob, estimate_tokens
from gateway.policy.billing import Metered
from gateway.protocols.base import Ctx, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.embeddings import EmbeddingsAdapter
from gateway.protocols.gemini.embeddings import GEMINI_EMBEDDINGS
from gateway.protocols.openai.embeddings import (
    OPENAI_EMBEDDINGS,
    decode_float32,
    encode_float32,
)
from tests.fixture_tree import EMBEDDINGS_TREE as ROOT
from tests.fixture_tree import (
    INPUT_DIRS,
    MANIFEST,
    FixtureCase,
    case_dirs,
    channel,
    load,
    shared_inputs,
    used_inputs,
)

ADAPTERS: dict[str, EmbeddingsAdapter] = {"openai": OPENAI_EMBEDDINGS, "gemini": GEMINI_EMBEDDINGS}
BASE_URLS = {"openai": "http://upstream.test/v1", "gemini": "http://upstream.test"}
KIND = KINDS["embeddings"]
FLOAT32_EPS = 2.0**-23  # float32's relative precision (24-bit significand), with room


def cases() -> list[Any]:
    return [pytest.param(case, id=f"{case.parent.name}/{case.name}") for case in case_dirs(ROOT)]


def float32(values: list[float]) -> list[float]:
    """Each value rounded to float32, independently of the adapters' code."""
    return [struct.unpack("<f", struct.pack("<f", v))[0] for v in values]


def unpack(text: str) -> list[float]:
    raw = base64.b64decode(text)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def assert_float32_close(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    assert got == float32(want)
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= abs(w) * FLOAT32_EPS


class Case:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.files = FixtureCase(path)
        client, upstream = self.files.client, self.files.upstream
        self.client = ADAPTERS[client]
        self.meta = self.files.manifest
        self.request = self.files.request
        self.error = self.meta.get("error")
        self.route = RouteMatch(
            protocol=client,
            capability="embeddings",
            model=self.meta.get("path_model"),
            action=self.meta.get("action", ""),
        )
        self.channel = self.files.channel(BASE_URLS[upstream])
        self.target = UpstreamTarget(
            channel="test",
            base_url=BASE_URLS[upstream],
            api_key="up-key",
            model="upstream-embed",
            default_max_tokens=0,
            stream=False,
        )

    def file(self, name: str) -> Any:
        """An input the manifest names (``upstream_response``, ``upstream_error``) or a golden
        file (``upstream_request``, ``client_response``); None when the case has none."""
        path = self.files.input(name) if name in INPUT_DIRS else self.path / f"{name}.json"
        return load(path) if path is not None and path.exists() else None

    def ctx(self, route: RouteMatch) -> Ctx:
        return Ctx(request_id="req-test", model=route.model or "", created=1700000000)

    def stage(self, name: str) -> bool:
        """Whether this case's error is expected at ``name``."""
        return self.error is not None and self.error.get("stage") == name

    def run_request(self) -> Exchange:
        """The request read as the kind reads it, then one attempt on the case's channel: the
        kind's ``exchange`` chooses the pass-through (same protocol) or a conversion. Each
        stage is checked for the case's error."""
        with self.expect("match"):
            route = self.client.match_embeddings(self.request, self.route)
        assert route.stream is False
        assert route.capability == "embeddings"
        with self.expect("decode"):
            req = self.client.decode_embeddings(self.request, route)
        body = orjson.loads(orjson.dumps(self.request))  # the relay hands over its own copy
        job = EmbeddingsJob(self.client, route, body, req, estimate_tokens(req))
        with self.expect("request"):
            return KIND.exchange(job, self.channel, self.target, self.ctx(route), last=True)

    @contextmanager
    def expect(self, stage: str) -> Iterator[None]:
        """Runs a stage; when the case expects its error there, checks it and ends the case."""
        if not self.stage(stage):
            yield
            return
        assert self.error is not None
        try:
            yield
        except GatewayError as err:
            check_error(err, self.error)
            raise Expected from None
        raise AssertionError(f"expected {self.error}, nothing raised at {stage}")


class Expected(Exception):
    """Raised once the expected error was checked, to end the case there."""


def check_error(err: GatewayError, expected: dict[str, Any]) -> None:
    assert type(err).__name__ == expected["class"]
    assert err.status == expected["status"]
    if "message" in expected:
        assert expected["message"] in err.message
    if "channel_fault" in expected:
        assert err.channel_fault is expected["channel_fault"]
    if "retry_after" in expected:
        assert err.retry_after == expected["retry_after"]


def respond(c: Case) -> Reply:
    """The client's reply to the case's upstream reply, and what it is billed."""
    exchange = c.run_request()
    raw = c.files.reply(".json").read_bytes()
    with c.expect("response"):
        reply = exchange.reply(raw, {})
    return reply


# --- the fixture tree ------------------------------------------------------------------


def test_fixture_tree_covers_every_pair() -> None:
    pairs = {p.parent.name for p in case_dirs(ROOT)}
    assert pairs == {"openai__openai", "openai__gemini", "gemini__openai", "gemini__gemini"}


# what a case.json may say; the golden files a case may hold
MANIFEST_KEYS = {
    "request", "upstream_response", "upstream_error", "error", "action", "path_model", "usage",
    "vectors", "billed", "channel",
}  # fmt: skip
GOLDEN = {"upstream_request.json", "client_response.json"}


def test_every_case_is_complete() -> None:
    """Each case names its request, at most one upstream reply or error, each in its
    protocol's directory, says nothing the runner does not read, holds only golden files
    beside its manifest, and either expects an error or has a reply to compare; no input is
    left that no case takes."""
    for path in case_dirs(ROOT):
        files = FixtureCase(path)
        assert set(files.manifest) <= MANIFEST_KEYS, path
        assert "request" in files.manifest, path
        assert not files.misplaced_inputs(), (path, files.misplaced_inputs())
        assert not {"upstream_response", "upstream_error"} <= set(files.manifest), path
        names = {p.name for p in path.iterdir()}
        assert MANIFEST in names and names - {MANIFEST} <= GOLDEN, path
        assert ("error" in files.manifest) != ("client_response.json" in names), path
        assert ("billed" in files.manifest) == ("client_response.json" in names), path
    assert shared_inputs(ROOT) - used_inputs(ROOT) == set()


@pytest.mark.parametrize("path", cases())
def test_request(path: Path) -> None:
    c = Case(path)
    try:
        call = c.run_request().call
    except Expected:
        return
    assert call is not None
    expected = c.file("upstream_request")
    if expected is None:
        pytest.skip("an upstream-error case: its request is not the point")
    assert call.url == expected["url"]
    assert call.headers == expected["headers"]
    assert orjson.loads(call.body) == expected["body"]


@pytest.mark.parametrize("path", cases())
def test_response(path: Path) -> None:
    """The client's reply, and the prompt tokens it is billed (``billed``), or the error."""
    c = Case(path)
    upstream_error = c.file("upstream_error")
    if upstream_error is not None:
        err = c.run_request().decode_error(
            upstream_error["status"], orjson.dumps(upstream_error["body"])
        )
        assert c.error is not None
        check_error(err, c.error)
        return
    if c.file("upstream_response") is None:
        assert c.error is not None and c.error["stage"] in ("match", "decode", "request")
        return
    try:
        reply = respond(c)
    except Expected:
        return
    assert c.error is None, f"expected {c.error}"
    assert orjson.loads(reply.body) == c.file("client_response")
    assert reply.used == Metered(prompt_tokens=c.meta["billed"])


def usage_cases() -> list[Any]:
    return [p for p in cases() if "usage" in FixtureCase(p.values[0]).manifest]


@pytest.mark.parametrize("path", usage_cases())
def test_passthrough_reads_the_upstreams_usage(path: Path) -> None:
    """The pass-through reads the usage an upstream's own reply reports (``usage``; None where
    it reports none, and the estimate is billed)."""
    c = Case(path)
    _, usage = c.client.embeddings_passthrough_response(c.file("upstream_response"), c.ctx(c.route))
    assert usage == c.meta["usage"]


def base64_cases() -> list[Any]:
    out = []
    for param in cases():
        reply = load(param.values[0] / "client_response.json") if _has(param) else None
        data = reply.get("data") if isinstance(reply, dict) else None
        if data and isinstance(data[0]["embedding"], str):
            out.append(param)
    return out


def _has(param: Any) -> bool:
    """Whether the case's client gets a reply (its golden client_response.json)."""
    return bool((param.values[0] / "client_response.json").exists())


@pytest.mark.parametrize("path", base64_cases())
def test_base64_holds_the_upstream_vectors(path: Path) -> None:
    """Decoded back, each base64 vector is the upstream's, to float32 precision."""
    c = Case(path)
    if "vectors" in c.meta:  # the upstream's reply holds base64 itself
        want = c.meta["vectors"]
    else:
        up = c.file("upstream_response")
        want = [e["values"] for e in up["embeddings"]] if "embeddings" in up else None
        want = want or [e["embedding"] for e in up["data"]]
    got = [unpack(item["embedding"]) for item in orjson.loads(respond(c).body)["data"]]
    for g, w in zip(got, want, strict=True):
        assert_float32_close(g, w)


# --- what the official SDKs make of the client side ------------------------------------


def converted(client: str) -> list[Any]:
    """The replies the gateway writes itself for a client of ``client``'s protocol: from a
    channel of another protocol (a pass-through reply is the upstream's own)."""
    return [
        p
        for p in cases()
        if p.values[0].parent.name.startswith(f"{client}__")
        and not p.values[0].parent.name.endswith(f"__{client}")
        and _has(p)
    ]


@pytest.mark.parametrize("path", converted("openai"))
def test_openai_sdk_reads_the_reply(path: Path) -> None:
    reply = Case(path).file("client_response")
    # what the SDK does with a reply: construct without validation, then its post-parser,
    # which decodes base64 vectors when the caller left encoding_format to it
    obj = construct_type(type_=CreateEmbeddingResponse, value=orjson.loads(orjson.dumps(reply)))
    parsed = parse_embedding_response(obj, encoding_format=omit)  # type: ignore[arg-type]
    assert parsed.model == "embed-small"
    assert parsed.usage.prompt_tokens == reply["usage"]["prompt_tokens"]
    for item, got in zip(reply["data"], parsed.data, strict=True):
        assert got.index == item["index"]
        if isinstance(item["embedding"], str):
            assert got.embedding == unpack(item["embedding"])
        else:
            assert got.embedding == item["embedding"]
    if not any(isinstance(item["embedding"], str) for item in reply["data"]):
        CreateEmbeddingResponse.model_validate(reply)  # the strict form, for float replies


@pytest.mark.parametrize("path", converted("gemini"))
def test_genai_sdk_reads_the_reply(path: Path) -> None:
    reply = Case(path).file("client_response")
    if "embedding" in reply:  # embedContent: google-genai never calls it; its vector type
        got = genai_types.ContentEmbedding._from_response(response=reply["embedding"], kwargs={})
        assert got.values == reply["embedding"]["values"]
        return
    parsed = genai_types.EmbedContentResponse._from_response(
        response=genai_models._EmbedContentResponse_from_mldev(reply), kwargs={}
    )
    assert [e.values for e in parsed.embeddings or []] == [e["values"] for e in reply["embeddings"]]
    if "usageMetadata" in reply:
        assert parsed.usage_metadata is not None
        assert (
            parsed.usage_metadata.prompt_token_count == reply["usageMetadata"]["promptTokenCount"]
        )


# --- the SDKs end to end, through a mock transport -------------------------------------

V1 = [0.1, -0.25, 0.333, 1.5e-05]
V2 = [-0.9, 0.0, 0.125, 0.7071067811865476]
JSON_CT = {"content-type": "application/json"}


def gateway(
    client: str,
    upstream: str,
    reply: Callable[[UpstreamCall], Any],
    seen: list[tuple[str, Any, UpstreamCall]],
) -> httpx2.MockTransport:
    """A transport that answers as the gateway would on a channel of type ``upstream`` (the
    kind's exchange: pass-through or conversion; no relay, no I/O)."""
    client_adapter = ADAPTERS[client]
    on = channel(upstream, BASE_URLS[upstream])
    target = UpstreamTarget("test", BASE_URLS[upstream], "up-key", "upstream-embed", 0, False)

    def handle(request: httpx2.Request) -> httpx2.Response:
        payload = orjson.loads(request.content)
        route = RouteMatch(protocol=client, capability="embeddings")
        if client == "gemini":
            route.model, route.action = request.url.path.rsplit("/", 1)[1].split(":")
        route = client_adapter.match_embeddings(payload, route)
        req = client_adapter.decode_embeddings(payload, route)
        job = EmbeddingsJob(client_adapter, route, payload, req, estimate_tokens(req))
        ctx = Ctx(request_id="req-test", model=route.model or "", created=1700000000)
        exchange = KIND.exchange(job, on, target, ctx, last=False)
        assert exchange.call is not None
        seen.append((request.url.path, payload, exchange.call))
        out = exchange.reply(orjson.dumps(reply(exchange.call)), {})
        return httpx2.Response(200, content=out.body, headers=JSON_CT)

    return httpx2.MockTransport(handle)


def gemini_upstream(call: UpstreamCall) -> Any:
    n = len(orjson.loads(call.body)["requests"])
    return {"embeddings": [{"values": [V1, V2][i % 2]} for i in range(n)]}


def pack(values: list[float]) -> str:
    """A vector as OpenAI's base64 encoding writes it: little-endian float32."""
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()


def openai_upstream(call: UpstreamCall) -> Any:
    """An OpenAI embeddings endpoint: base64 vectors when asked for them."""
    body = orjson.loads(call.body)
    vector: Callable[[list[float]], Any] = pack if body.get("encoding_format") == "base64" else list
    data = [
        {"object": "embedding", "index": i, "embedding": vector([V1, V2][i % 2])} for i in range(2)
    ]
    return {"object": "list", "data": data[: len(body["input"])], "model": body["model"],
            "usage": {"prompt_tokens": 6, "total_tokens": 6}}  # fmt: skip


@pytest.mark.parametrize("encoding_format", [None, "float", "base64"])
def test_openai_sdk_end_to_end(encoding_format: str | None) -> None:
    seen: list[tuple[str, Any, UpstreamCall]] = []
    transport = gateway("openai", "gemini", gemini_upstream, seen)
    extra: dict[str, Any] = {} if encoding_format is None else {"encoding_format": encoding_format}
    with (
        httpx2.Client(transport=transport) as http,
        OpenAI(api_key="sk-test", base_url="http://gw.test/v1", http_client=http) as sdk,
    ):
        got = sdk.embeddings.create(model="embed-small", input=["a", "b"], dimensions=4, **extra)
    path, sent, call = seen[0]
    assert path == "/v1/embeddings"
    assert sent["encoding_format"] == (encoding_format or "base64")  # the SDK's default
    assert orjson.loads(call.body)["requests"][0]["outputDimensionality"] == 4
    assert got.model == "embed-small"
    assert [e.index for e in got.data] == [0, 1]
    if encoding_format is None:  # the SDK decoded base64 float32 itself
        assert_float32_close(got.data[0].embedding, V1)
        assert_float32_close(got.data[1].embedding, V2)
    elif encoding_format == "float":
        assert [e.embedding for e in got.data] == [V1, V2]
    else:  # asked for base64 explicitly: the SDK hands the strings over as they came
        assert_float32_close(unpack(got.data[0].embedding), V1)  # type: ignore[arg-type]


def test_openai_sdk_token_arrays_reach_an_openai_channel() -> None:
    seen: list[tuple[str, Any, UpstreamCall]] = []
    transport = gateway("openai", "openai", openai_upstream, seen)
    with (
        httpx2.Client(transport=transport) as http,
        OpenAI(api_key="sk-test", base_url="http://gw.test/v1", http_client=http) as sdk,
    ):
        got = sdk.embeddings.create(model="embed-small", input=[[1, 2, 3], [4]])
    body = orjson.loads(seen[0][2].body)
    # passed through: the SDK's body (base64, its default) with the channel's model name
    assert body == {
        "model": "upstream-embed",
        "input": [[1, 2, 3], [4]],
        "encoding_format": "base64",
    }
    assert got.usage.prompt_tokens == 6
    assert_float32_close(got.data[1].embedding, V2)


@pytest.mark.parametrize("api_version", [None, "v1beta"], ids=["v1", "v1beta"])
def test_genai_sdk_end_to_end(api_version: str | None) -> None:
    seen: list[tuple[str, Any, UpstreamCall]] = []
    transport = gateway("gemini", "openai", openai_upstream, seen)
    with httpx2.Client(transport=transport) as http:
        sdk = genai.Client(
            api_key="sk-test",
            http_options=genai_types.HttpOptions(
                base_url="http://gw.test", api_version=api_version, httpx_client=http
            ),
        )
        got = sdk.models.embed_content(
            model="embed-small",
            contents=["first", "second"],
            config=genai_types.EmbedContentConfig(
                task_type="RETRIEVAL_DOCUMENT", title="Doc", output_dimensionality=4
            ),
        )
    path, sent, call = seen[0]
    assert path == f"/{api_version or 'v1'}/models/embed-small:batchEmbedContents"
    assert [r["model"] for r in sent["requests"]] == ["models/embed-small"] * 2
    assert orjson.loads(call.body) == {
        "model": "upstream-embed",
        "input": ["first", "second"],
        "encoding_format": "float",
        "dimensions": 4,
    }
    assert [e.values for e in got.embeddings or []] == [V1, V2]
    assert got.usage_metadata is not None and got.usage_metadata.prompt_token_count == 6


# --- the vector codec ------------------------------------------------------------------


def test_float32_codec_round_trip_as_the_openai_sdk_decodes() -> None:
    rng = random.Random(7)
    values = [rng.uniform(-1, 1) for _ in range(3072)]
    text = encode_float32(values)
    assert len(base64.b64decode(text)) == 4 * 3072
    assert decode_float32(text) == float32(values)
    reply = {
        "object": "list",
        "model": "m",
        "data": [{"object": "embedding", "index": 0, "embedding": text}],
        "usage": {"prompt_tokens": 1, "total_tokens": 1},
    }
    obj = construct_type(type_=CreateEmbeddingResponse, value=reply)
    parsed = parse_embedding_response(obj, encoding_format=omit)  # type: ignore[arg-type]
    assert_float32_close(parsed.data[0].embedding, values)


@pytest.mark.parametrize(
    ("text", "match"),
    [("AAAA", "float32"), ("AAAAAAA=", "float32"), ("%%%%", "base64"), ("QUJD\n", "base64")],
)
def test_decode_float32_refuses_what_is_not_float32(text: str, match: str) -> None:
    with pytest.raises(UpstreamError, match=match):
        decode_float32(text)
