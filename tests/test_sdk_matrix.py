"""The SDK matrix's table and what every client shares: each channel type as a target, a
reading of what the upstream received in its own wire format, and the usage record a call left.

The per-SDK files (``test_sdk_openai_matrix.py``, ``test_sdk_anthropic_matrix.py``,
``test_sdk_gemini_matrix.py``) run their client against every target here; the cross-protocol
endpoints (model lists, token counting) are tested at the end of this module.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import anthropic
import pytest
from google import genai
from google.genai import types as gtypes
from google.genai.client import AsyncClient

from bench.fake import media
from bench.fake_upstream import FakeUpstream
from gateway import __version__
from tests.plugins.servers import ADMIN_TOKEN, KEYS, ServedGateway

PNG_B64 = base64.b64encode(media.PNG).decode()
WEATHER_TOOL_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "the city"}},
    "required": ["city"],
}
# the ids the fake upstream gives its tool calls: a gateway that renamed them could not pair
# the client's results with the upstream's calls on the way back
# google-genai subclasses aiohttp's ClientSession for its default (aiohttp) transport, and
# aiohttp warns about that on the first request: the SDK's own code, nothing a caller can change
GENAI_AIOHTTP_WARNING = pytest.mark.filterwarnings(
    "ignore:Inheritance class AiohttpClientSession from ClientSession is discouraged"
    ":DeprecationWarning"
)
pytestmark = GENAI_AIOHTTP_WARNING
UPSTREAM_CALL_ID = {
    "openai": re.compile(r"call_fake\w+"),
    "anthropic": re.compile(r"toolu_fake\w+"),
}


@dataclass(frozen=True)
class Target:
    """One channel type of the test config (tests/plugins/servers.py: make_config)."""

    type: str  # openai | anthropic | gemini
    model: str  # the catalogue name clients send
    upstream_model: str  # after model_map
    channel: str

    def chat_path(self, stream: bool) -> str:
        if self.type == "openai":
            return "/v1/chat/completions"
        if self.type == "anthropic":
            return "/v1/messages"
        action = "streamGenerateContent" if stream else "generateContent"
        return f"/v1beta/models/{self.upstream_model}:{action}"


TARGETS = [
    Target("openai", "chat-small", "up-small", "oa"),
    Target("anthropic", "claude-small", "claude-small", "an"),
    Target("gemini", "gemini-small", "gemini-small", "gm"),
]
BY_TYPE = {t.type: t for t in TARGETS}
target_param = pytest.mark.parametrize("target", TARGETS, ids=[t.type for t in TARGETS])
stream_param = pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])


@dataclass
class Sent:
    """One upstream chat request read back in neutral terms."""

    system: str = ""
    last_user_text: str = ""
    images: list[tuple[str, str]] = field(default_factory=list)  # (media type, base64)
    calls: list[tuple[str | None, str, dict[str, Any]]] = field(default_factory=list)
    results: list[tuple[str | None, str | None, str]] = field(default_factory=list)
    tools: dict[str, set[str]] = field(default_factory=dict)  # name -> its parameters


def chat_request(fake: FakeUpstream, target: Target, stream: bool, nth: int = -1) -> Sent:
    """The ``nth`` chat request the upstream of ``target`` received, checked for its path and
    auth, read in its own wire format."""
    reqs = [r for r in fake.requests if r.path == target.chat_path(stream)]
    assert reqs, f"no request reached {target.chat_path(stream)}: {_paths(fake)}"
    req = reqs[nth]
    # the gateway's own name, neither the client's SDK nor aiohttp
    assert req.headers["User-Agent"] == f"model-gateway/{__version__}"
    if target.type == "openai":
        assert req.headers["Authorization"] == "Bearer upstream-key"
        assert req.json["model"] == target.upstream_model
        assert bool(req.json.get("stream")) is stream
        return _read_openai(req.json)
    if target.type == "anthropic":
        assert req.headers["x-api-key"] == "upstream-key"
        assert req.headers.get("anthropic-version")
        assert req.json["model"] == target.upstream_model
        assert isinstance(req.json["max_tokens"], int)
        assert bool(req.json.get("stream")) is stream
        return _read_anthropic(req.json)
    assert req.headers["x-goog-api-key"] == "upstream-key"
    if stream:
        assert req.query.get("alt") == "sse"
    return _read_gemini(req.json)


def _paths(fake: FakeUpstream) -> list[str]:
    return [r.path for r in fake.requests]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _read_openai(body: dict[str, Any]) -> Sent:
    out = Sent()
    for tool in body.get("tools") or ():
        fn = tool["function"]
        out.tools[fn["name"]] = set(fn["parameters"]["properties"])
    names: dict[str, str] = {}
    for msg in body["messages"]:
        role, content = msg["role"], msg.get("content")
        if role in ("system", "developer"):
            out.system += _text_of(content)
        elif role == "user":
            out.last_user_text = _text_of(content)
            for part in content if isinstance(content, list) else ():
                if part.get("type") == "image_url":
                    head, _, data = part["image_url"]["url"].partition(",")
                    out.images.append((head[5:].split(";")[0], data))
        elif role == "assistant":
            for call in msg.get("tool_calls") or ():
                fn = call["function"]
                names[call["id"]] = fn["name"]
                out.calls.append((call["id"], fn["name"], _loads(fn["arguments"])))
        elif role == "tool":
            call_id = msg["tool_call_id"]
            out.results.append((call_id, names.get(call_id), _text_of(content)))
    return out


def _read_anthropic(body: dict[str, Any]) -> Sent:
    out = Sent(system=_text_of(body.get("system")))
    for tool in body.get("tools") or ():
        out.tools[tool["name"]] = set(tool["input_schema"]["properties"])
    names: dict[str, str] = {}
    for msg in body["messages"]:
        content = msg["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        texts: list[str] = []
        for block in blocks:
            kind = block["type"]
            if kind == "text":
                texts.append(block["text"])
            elif kind == "image":
                src = block["source"]
                assert src["type"] == "base64"
                out.images.append((src["media_type"], src["data"]))
            elif kind == "tool_use":
                names[block["id"]] = block["name"]
                out.calls.append((block["id"], block["name"], block["input"]))
            elif kind == "tool_result":
                call_id = block["tool_use_id"]
                out.results.append((call_id, names.get(call_id), _text_of(block.get("content"))))
        if msg["role"] == "user" and texts:
            out.last_user_text = "".join(texts)
    return out


def _read_gemini(body: dict[str, Any]) -> Sent:
    system = body.get("systemInstruction") or {}
    out = Sent(system="".join(p.get("text", "") for p in system.get("parts", ())))
    for tool in body.get("tools") or ():
        for decl in tool.get("functionDeclarations") or ():
            # passthrough forwards google-genai's proto spellings, which Gemini accepts
            schema = _either(decl, "parametersJsonSchema", "parameters_json_schema")
            schema = schema or decl["parameters"]
            out.tools[decl["name"]] = set(schema["properties"])
    for content in body["contents"]:
        texts: list[str] = []
        for part in content.get("parts", ()):
            if "text" in part and not part.get("thought"):
                texts.append(part["text"])
            if "inlineData" in part:
                blob = part["inlineData"]
                out.images.append((_either(blob, "mimeType", "mime_type"), blob["data"]))
            if "functionCall" in part:
                fc = part["functionCall"]
                out.calls.append((fc.get("id"), fc["name"], fc.get("args", {})))
            if "functionResponse" in part:
                fr = part["functionResponse"]
                out.results.append((fr.get("id"), fr["name"], str(fr.get("response"))))
        if content.get("role", "user") == "user" and texts:
            out.last_user_text = "".join(texts)
    return out


def _either(obj: dict[str, Any], json_name: str, proto_name: str) -> Any:
    return obj.get(json_name, obj.get(proto_name))


def _loads(text: str) -> dict[str, Any]:
    import orjson

    value = orjson.loads(text)
    assert isinstance(value, dict)
    return value


def check_tool_results(
    target: Target, sent: Sent, client_calls: list[tuple[str | None, str, dict[str, Any]]]
) -> None:
    """The upstream got one result per call, each paired with its call by the upstream's own
    means (the id it issued, or Gemini's name), carrying the client's result text."""
    assert sent.tools == {"get_weather": {"city"}}  # the declaration arrived with its schema
    assert len(sent.results) == len(client_calls)
    assert [name for _, name, _ in sent.calls] == [name for _, name, _ in client_calls]
    for (_, name, args), (_, rname, text) in zip(client_calls, sent.results, strict=True):
        assert rname == name
        assert f"sunny in {args['city']}" in text
    if target.type in UPSTREAM_CALL_ID:
        issued = [cid for cid, _, _ in sent.calls]
        assert all(UPSTREAM_CALL_ID[target.type].fullmatch(str(cid)) for cid in issued), issued
        assert [rid for rid, _, _ in sent.results] == issued
        # the call each result answers is the one whose arguments it mentions
        for (_, _, args), (_, _, text) in zip(sent.calls, sent.results, strict=True):
            assert f"sunny in {args['city']}" in text


def fake_signature(reasoning: str) -> str:
    """The signature the fake upstream gives a reply whose thinking is ``reasoning``."""
    digest = hashlib.sha256(reasoning.encode()).digest()[:24]
    return base64.b64encode(b"fake-signature:" + digest).decode()


def signature_sent_back(fake: FakeUpstream, target: Target, stream: bool) -> str | None:
    """The signature the upstream got back with the tool call in its last chat request: on
    the thinking block (anthropic), on the first functionCall part (gemini, which rejects an
    unsigned first call in a thinking turn)."""
    body = [r for r in fake.requests if r.path == target.chat_path(stream)][-1].json
    if target.type == "anthropic":
        blocks = [b for m in body["messages"] if m["role"] == "assistant" for b in m["content"]]
        signed = [b.get("signature") for b in blocks if b["type"] == "thinking"]
        return signed[0] if signed else None
    parts = [p for c in body["contents"] if c["role"] == "model" for p in c["parts"]]
    calls = [p for p in parts if "functionCall" in p]
    return calls[0].get("thoughtSignature")


async def usage_record(gw: ServedGateway) -> dict[str, Any]:
    """The newest usage record of alice's account, once the writer has stored it."""
    await gw.state.writer.flush()
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with s.get(gw.url + "/admin/usage?account=alice&limit=1", headers=headers) as r:
            assert r.status == 200, await r.text()
            record: dict[str, Any] = (await r.json())["data"][0]
    return record


async def check_billed(
    gw: ServedGateway, target: Target, protocol: str, prompt: int, completion: int
) -> None:
    """The usage record holds the tokens the client was told, priced by the test catalogue."""
    rec = await usage_record(gw)
    assert (rec["model"], rec["channel"], rec["protocol"]) == (
        target.model,
        target.channel,
        protocol,
    )
    assert rec["status"] == 200 and rec["endpoint"] == "chat"
    assert (rec["prompt_tokens"], rec["completion_tokens"]) == (prompt, completion)
    assert prompt > 0 and completion > 0
    assert rec["cost"] == pytest.approx((prompt * 1 + completion * 2) / 1e6)


# ---------------------------------------------------------------------- model lists, counting
def anthropic_client(gw: ServedGateway, key: str = KEYS["alice"]) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gw.url, api_key=key, max_retries=0)


def genai_client(
    gw: ServedGateway, api_version: str | None = None, key: str = KEYS["alice"]
) -> AsyncClient:
    """google-genai's async API, to use as ``async with`` so its aiohttp session closes."""
    options = gtypes.HttpOptions(base_url=gw.url, api_version=api_version)
    return genai.Client(api_key=key, http_options=options).aio


GENAI_VERSIONS = pytest.mark.parametrize("api_version", [None, "v1beta"], ids=["default", "v1beta"])
DEFAULT_MODELS = {"chat-small", "claude-small", "gemini-small"}


async def test_anthropic_models_list_is_the_groups_models(gateway: ServedGateway) -> None:
    async with anthropic_client(gateway) as c:
        page = await c.models.list()
        ids = {m.id async for m in page}
    assert ids == DEFAULT_MODELS
    async with anthropic_client(gateway, KEYS["vip"]) as c:
        vip = {m.id async for m in await c.models.list()}
    assert "vip-model" in vip


@GENAI_VERSIONS
async def test_genai_models_list_is_the_groups_models(
    gateway: ServedGateway, api_version: str | None
) -> None:
    async with genai_client(gateway, api_version) as client:
        names = {m.name async for m in await client.models.list()}
    assert names == {f"models/{n}" for n in DEFAULT_MODELS}


@GENAI_VERSIONS
async def test_genai_models_get_names_the_model(
    gateway: ServedGateway, api_version: str | None
) -> None:
    async with genai_client(gateway, api_version) as client:
        model = await client.models.get(model="claude-small")
    assert model.name == "models/claude-small"


@target_param
async def test_anthropic_count_tokens_on_every_channel(
    gateway: ServedGateway, fake: FakeUpstream, target: Target
) -> None:
    async with anthropic_client(gateway) as c:
        counted = await c.messages.count_tokens(
            model=target.model,
            system="You count.",
            messages=[{"role": "user", "content": "how many tokens is this sentence?"}],
        )
    assert counted.input_tokens > 0
    await _check_count_reached(gateway, fake, target, "anthropic", counted.input_tokens)


@GENAI_VERSIONS
@target_param
async def test_genai_count_tokens_on_every_channel(
    gateway: ServedGateway, fake: FakeUpstream, target: Target, api_version: str | None
) -> None:
    async with genai_client(gateway, api_version) as client:
        counted = await client.models.count_tokens(
            model=target.model, contents="how many tokens is this sentence?"
        )
    assert counted.total_tokens is not None and counted.total_tokens > 0
    await _check_count_reached(gateway, fake, target, "gemini", counted.total_tokens)


async def _check_count_reached(
    gw: ServedGateway, fake: FakeUpstream, target: Target, protocol: str, tokens: int
) -> None:
    """Channels that can count were asked in their own format and their count was passed on;
    an openai channel has no counting endpoint, so the gateway estimates. Never billed."""
    upstream_counts = {"anthropic": "/v1/messages/count_tokens", "gemini": "countTokens"}
    asked = [r for r in fake.requests if r.path.endswith(upstream_counts.get(target.type, "-"))]
    if target.type == "anthropic":
        assert len(asked) == 1 and asked[0].json["model"] == target.upstream_model
        assert "max_tokens" not in asked[0].json
    elif target.type == "gemini":
        assert len(asked) == 1 and asked[0].path.startswith(f"/v1beta/models/{target.model}:")
        assert asked[0].headers["x-goog-api-key"] == "upstream-key"
    else:
        assert fake.requests == []
    rec = await usage_record(gw)
    assert (rec["endpoint"], rec["protocol"], rec["model"]) == (
        "count_tokens",
        protocol,
        target.model,
    )
    assert rec["cost"] == 0 and rec["status"] == 200
    assert rec["prompt_tokens"] == tokens
