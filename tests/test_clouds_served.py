"""The cloud channels end to end: every client protocol (chat completions, Responses, messages,
generate-content) against Azure OpenAI, AWS Bedrock (Claude through invoke, others through
Converse) and Google Vertex AI (Gemini, Claude), whole and streamed, with a tool and an image,
through a served gateway on both stores and the bundled fake, which checks each cloud's
credentials as the cloud does (an ``api-key`` and ``api-version``, SigV4, an OAuth2 token).

Each case asks the fake (a directive) to describe the image parts it received and call a tool
with exact usage, so the reply proves the image reached the upstream in the upstream's shape,
the tool call came back in the client's, and the usage record bills exactly the price times the
usage the fake reported."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import orjson
import pytest

from bench.fake import FakeUpstream
from bench.fake.aws_auth import ACCESS_KEY, SECRET_KEY
from bench.fake.azure import AZURE_KEY
from bench.fake.media import PNG
from tests.plugins.servers import KEYS, ServedGateway

Factory = Callable[..., AbstractAsyncContextManager[ServedGateway]]
PRICE = {"input": 1.0, "output": 2.0}  # micro-units per token
PROMPT, COMPLETION = 1234, 56
DIRECTIVE = f"[[fake image tool=get_weather prompt_tokens={PROMPT} completion_tokens={COMPLETION}]]"
SEEN = "I received 1 image part: image/png."
IMAGE = base64.b64encode(PNG).decode()
DATA_URL = f"data:image/png;base64,{IMAGE}"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CLAUDE = "anthropic.claude-3-5-sonnet-20240620-v1:0"
NOVA = "us.amazon.nova-pro-v1:0"
VERTEX = "/v1/projects/proj-1/locations/us-east5/publishers"
# model -> (channel, the upstream path of a whole reply, of a stream)
MODELS = {
    "az-gpt": ("az", *(["/openai/deployments/gpt-4o-deploy/chat/completions"] * 2)),
    "bed-claude": (
        "bed",
        f"/model/{CLAUDE}/invoke",
        f"/model/{CLAUDE}/invoke-with-response-stream",
    ),
    "bed-nova": ("bed", f"/model/{NOVA}/converse", f"/model/{NOVA}/converse-stream"),
    "vx-gemini": (
        "vx",
        f"{VERTEX}/google/models/gemini-2.5-flash:generateContent",
        f"{VERTEX}/google/models/gemini-2.5-flash:streamGenerateContent",
    ),
    "vx-claude": (
        "vx",
        f"{VERTEX}/anthropic/models/claude-sonnet-4-5@20250929:rawPredict",
        f"{VERTEX}/anthropic/models/claude-sonnet-4-5@20250929:streamRawPredict",
    ),
    "az-resp": ("az-resp", "/openai/responses", "/openai/responses"),  # responses: true
}
PROTOCOLS = ("openai", "responses", "anthropic", "gemini")
CASES = [
    (protocol, model, stream)
    for protocol in PROTOCOLS
    for model in MODELS
    if model != "az-resp" or protocol == "responses"
    for stream in (False, True)
]


def cloud_config(fake: FakeUpstream) -> dict[str, Any]:
    models = [
        {"name": m, "capabilities": ["chat", "vision", "tools"], "price": PRICE} for m in MODELS
    ]
    azure = {
        "type": "azure",
        "base_url": fake.url,
        "api_version": "2024-10-21",
        "api_key": AZURE_KEY,
    }
    return {
        "models": models,
        "channels": [
            {"name": "az", **azure, "models": ["az-gpt"], "model_map": {"az-gpt": "gpt-4o-deploy"}},
            {
                "name": "az-resp",
                **azure,
                "responses": True,
                "models": ["az-resp"],
                "model_map": {"az-resp": "gpt-4o-deploy"},
            },
            {
                "name": "bed",
                "type": "bedrock",
                "base_url": fake.url,
                "region": "us-east-1",
                "aws_access_key_id": ACCESS_KEY,
                "aws_secret_access_key": SECRET_KEY,
                "models": ["bed-claude", "bed-nova"],
                "model_map": {"bed-claude": CLAUDE, "bed-nova": NOVA},
            },
            {
                "name": "vx",
                "type": "vertex",
                "base_url": fake.url,
                "project": "proj-1",
                "region": "us-east5",
                "credentials": json.dumps(fake.service_account()),
                "models": ["vx-gemini", "vx-claude"],
                "model_map": {
                    "vx-gemini": "gemini-2.5-flash",
                    "vx-claude": "claude-sonnet-4-5@20250929",
                },
            },
        ],
    }


def client_request(protocol: str, model: str, stream: bool) -> tuple[str, dict[str, Any]]:
    """(path, body) of one request with the directive, an image and one tool."""
    if protocol == "openai":
        content = [
            {"type": "text", "text": DIRECTIVE},
            {"type": "image_url", "image_url": {"url": DATA_URL}},
        ]
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
        body = {"model": model, "messages": [{"role": "user", "content": content}]}
        return "/v1/chat/completions", {**body, "tools": [tool], "stream": stream}
    if protocol == "responses":
        content = [
            {"type": "input_text", "text": DIRECTIVE},
            {"type": "input_image", "image_url": DATA_URL},
        ]
        tool = {"type": "function", "name": "get_weather", "parameters": SCHEMA}
        body = {"model": model, "input": [{"role": "user", "content": content}], "tools": [tool]}
        return "/v1/responses", {**body, "stream": stream}
    if protocol == "anthropic":
        content = [
            {"type": "text", "text": DIRECTIVE},
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": IMAGE},
            },
        ]
        tool = {"name": "get_weather", "input_schema": SCHEMA}
        body = {
            "model": model,
            "max_tokens": 256,
            "messages": [{"role": "user", "content": content}],
        }
        return "/v1/messages", {**body, "tools": [tool], "stream": stream}
    parts = [{"text": DIRECTIVE}, {"inlineData": {"mimeType": "image/png", "data": IMAGE}}]
    tool = {"functionDeclarations": [{"name": "get_weather", "parameters": SCHEMA}]}
    action = "streamGenerateContent?alt=sse" if stream else "generateContent"
    body = {"contents": [{"role": "user", "parts": parts}], "tools": [tool]}
    return f"/v1beta/models/{model}:{action}", body


def sse_data(raw: bytes) -> list[Any]:
    events = []
    for block in raw.decode().split("\n\n"):
        data = "".join(line[5:].strip() for line in block.splitlines() if line.startswith("data:"))
        if data and data != "[DONE]":
            events.append(orjson.loads(data))
    return events


def outcome(protocol: str, stream: bool, raw: bytes) -> tuple[str, list[str]]:
    """(the reply's text, the tools it calls), read as the client reads them."""
    text: list[str] = []
    tools: list[str] = []
    if protocol == "openai":
        if not stream:
            message = orjson.loads(raw)["choices"][0]["message"]
            calls = message.get("tool_calls") or []
            return message["content"] or "", [c["function"]["name"] for c in calls]
        for chunk in sse_data(raw):
            for choice in chunk["choices"]:
                delta = choice["delta"]
                text.append(delta.get("content") or "")
                tools += [c["function"]["name"] for c in delta.get("tool_calls") or () if "id" in c]
        return "".join(text), tools
    if protocol == "responses":
        reply = (
            orjson.loads(raw)
            if not stream
            else next(e["response"] for e in sse_data(raw) if e["type"] == "response.completed")
        )
        for item in reply["output"]:
            if item["type"] == "message":
                text += [part["text"] for part in item["content"]]
            elif item["type"] == "function_call":
                tools.append(item["name"])
        return "".join(text), tools
    if protocol == "anthropic":
        if not stream:
            blocks = orjson.loads(raw)["content"]
        else:
            events = sse_data(raw)
            blocks = [e["content_block"] for e in events if e["type"] == "content_block_start"]
            text = [
                e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta"
            ]
        text += [b["text"] for b in blocks if b["type"] == "text"]
        return "".join(text), [b["name"] for b in blocks if b["type"] == "tool_use"]
    for reply in sse_data(raw) if stream else [orjson.loads(raw)]:
        for part in reply["candidates"][0]["content"]["parts"]:
            text.append(part.get("text", ""))
            if "functionCall" in part:
                tools.append(part["functionCall"]["name"])
    return "".join(text), tools


@pytest.mark.parametrize(("protocol", "model", "stream"), CASES)
async def test_every_client_protocol_reaches_every_cloud(
    fake: FakeUpstream, gateway_factory: Factory, protocol: str, model: str, stream: bool
) -> None:
    path, body = client_request(protocol, model, stream)
    headers = {"Authorization": f"Bearer {KEYS['alice']}", "anthropic-version": "2023-06-01"}
    async with gateway_factory(**cloud_config(fake)) as gw, aiohttp.ClientSession() as s:
        async with s.post(gw.url + path, json=body, headers=headers) as r:
            raw = await r.read()
            status, rid = r.status, r.headers["x-request-id"]
        assert status == 200, raw
        text, tools = outcome(protocol, stream, raw)
        assert SEEN in text  # the image reached the upstream, in its shape
        assert tools == ["get_weather"]

        channel, whole, streamed = MODELS[model]
        sent = [q for q in fake.requests if q.path != "/token"]
        assert len(sent) == 1 and sent[0].path == (streamed if stream else whole)
        assert IMAGE in sent[0].body.decode()

        await gw.state.writer.flush()
        [record] = await gw.state.store.usage("alice", limit=5)
    assert record.request_id.endswith(rid.rpartition("/")[2])
    assert (record.model, record.channel, record.protocol) == (model, channel, protocol)
    assert (record.endpoint, record.status) == ("chat", 200)
    assert (record.prompt_tokens, record.completion_tokens) == (PROMPT, COMPLETION)
    # the price x the usage the fake reported, to the pico-unit
    assert (record.cost, record.cost_pico) == (PROMPT * 1 + COMPLETION * 2, 0)


async def test_a_served_alias_bills_its_model_and_records_the_name_asked(
    fake: FakeUpstream, gateway_factory: Factory
) -> None:
    """Claude Code's default model name reaches the operator's Bedrock Claude; /v1/models
    lists the exact alias, so its model discovery finds it."""
    cfg = cloud_config(fake)
    cfg["models"][1]["aliases"] = ["claude-sonnet-4-5", "claude-*"]  # bed-claude
    headers = {"x-api-key": KEYS["alice"], "anthropic-version": "2023-06-01"}
    async with gateway_factory(**cfg) as gw, aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/v1/models", headers=headers) as r:
            ids = [m["id"] for m in (await r.json())["data"]]
        assert "claude-sonnet-4-5" in ids and "bed-claude" in ids and "claude-*" not in ids
        body = {"model": "claude-3-5-haiku-20241022", "max_tokens": 64,
                "messages": [{"role": "user", "content": "[[fake text=hello]]"}]}  # fmt: skip
        async with s.post(gw.url + "/v1/messages", json=body, headers=headers) as r:
            reply = await r.json()
        assert reply["model"] == "claude-3-5-haiku-20241022"
        assert reply["content"][0]["text"] == "hello"
        assert fake.requests[-1].path == f"/model/{CLAUDE}/invoke"
        await gw.state.writer.flush()
        [record] = await gw.state.store.usage("alice", limit=5)
    assert (record.model, record.channel, record.status) == (
        "claude-3-5-haiku-20241022",
        "bed",
        200,
    )
    assert record.cost == record.prompt_tokens * 1 + record.completion_tokens * 2 > 0
