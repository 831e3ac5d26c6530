"""The fake upstream's Bedrock paths, through real HTTP: AWS's own client (boto3's
``bedrock-runtime``) succeeds against them, so the fake checks SigV4 and frames its replies as
AWS does; and the gateway's pieces for bedrock channels (signer, Converse and invoke adapters,
event-stream parser) get through it the way the relay will drive them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import aiohttp
import boto3
import orjson
import pytest
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import ClientError, EventStreamError

from bench.fake import FakeUpstream, Reply
from bench.fake.aws_auth import ACCESS_KEY, SECRET_KEY
from gateway.protocols.anthropic.bedrock import InvokeAdapter
from gateway.protocols.base import ConvertedStream, Ctx, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.converse import ConverseAdapter
from gateway.protocols.openai import OpenAIAdapter
from gateway.types import ChatRequest
from gateway.upstream.eventstream import EventStreamParser
from gateway.upstream.sigv4 import Signer

CLAUDE = "anthropic.claude-3-5-sonnet-20240620-v1:0"
NOVA = "us.amazon.nova-pro-v1:0"
T = TypeVar("T")


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> AsyncIterator[FakeUpstream]:
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.setenv(name, str(tmp_path / "absent"))  # nothing of this machine's AWS
    async with FakeUpstream() as up:
        yield up


@pytest.fixture
def client(fake: FakeUpstream) -> Iterator[Callable[..., BaseClient]]:
    """boto3 bedrock-runtime clients of the fake (closed after the test: their pools hold
    sockets)."""
    made: list[BaseClient] = []

    def make(secret: str = SECRET_KEY) -> BaseClient:
        made.append(
            boto3.client(
                "bedrock-runtime",
                region_name="us-east-1",
                endpoint_url=fake.url,
                aws_access_key_id=ACCESS_KEY,
                aws_secret_access_key=secret,
                config=Config(retries={"max_attempts": 1, "mode": "standard"}),
            )
        )
        return made[-1]

    yield make
    for c in made:
        c.close()


async def off_loop(call: Callable[[], T]) -> T:
    """boto3 blocks: it runs in a thread while the fake answers on this loop."""
    return await asyncio.to_thread(call)


def converse_messages(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"text": text}]}]


# boto3 against the fake ----------------------------------------------------------------------
async def test_boto3_converse(fake: FakeUpstream, client: Callable[..., BaseClient]) -> None:
    bedrock = client()
    out = await off_loop(
        lambda: bedrock.converse(
            modelId=CLAUDE,
            system=[{"text": "Be brief."}],
            messages=converse_messages('Hi [[fake text="Hello from Bedrock" prompt_tokens=11]]'),
            inferenceConfig={"maxTokens": 100},
        )
    )
    assert out["output"]["message"]["content"] == [{"text": "Hello from Bedrock"}]
    assert out["stopReason"] == "end_turn"
    assert out["usage"] == {"inputTokens": 11, "outputTokens": 3, "totalTokens": 14}
    seen = fake.requests[-1]
    assert seen.path == f"/model/{CLAUDE}/converse"
    assert seen.headers["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")


async def test_boto3_converse_stream(fake: FakeUpstream, client: Callable[..., BaseClient]) -> None:
    bedrock = client()

    def run() -> list[dict[str, Any]]:
        out = bedrock.converse_stream(
            modelId=NOVA,
            messages=converse_messages("Weather? [[fake tool=get_weather]]"),
            toolConfig={"tools": [{"toolSpec": {"name": "get_weather",
                                                "inputSchema": {"json": {"type": "object"}}}}]},
        )  # fmt: skip
        return list(out["stream"])

    events = await off_loop(run)
    names = [next(iter(e)) for e in events]
    assert names[0] == "messageStart" and names[-2:] == ["messageStop", "metadata"]
    start = next(e["contentBlockStart"] for e in events if "contentBlockStart" in e)
    assert start["start"]["toolUse"]["name"] == "get_weather"
    arguments = "".join(
        e["contentBlockDelta"]["delta"]["toolUse"]["input"]
        for e in events
        if "toolUse" in e.get("contentBlockDelta", {}).get("delta", {})
    )
    assert json.loads(arguments) == {"city": "Paris"}
    assert events[-2]["messageStop"]["stopReason"] == "tool_use"
    assert events[-1]["metadata"]["usage"]["outputTokens"] > 0


async def test_boto3_invoke_model(fake: FakeUpstream, client: Callable[..., BaseClient]) -> None:
    bedrock = client()
    body = {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": '[[fake text="Claude here"]]'}],
    }

    def run() -> tuple[dict[str, Any], dict[str, Any]]:
        out = bedrock.invoke_model(modelId=CLAUDE, body=json.dumps(body))
        return json.loads(out["body"].read()), out["ResponseMetadata"]["HTTPHeaders"]

    reply, headers = await off_loop(run)
    assert reply["content"] == [{"type": "text", "text": "Claude here"}]
    assert reply["stop_reason"] == "end_turn"
    assert headers["x-amzn-bedrock-output-token-count"] == "2"


async def test_boto3_invoke_model_with_response_stream(
    fake: FakeUpstream, client: Callable[..., BaseClient]
) -> None:
    bedrock = client()
    body = {
        "anthropic_version": "bedrock-2023-05-31",
        "max_tokens": 50,
        "messages": [{"role": "user", "content": '[[fake text="one two three"]]'}],
    }

    def run() -> list[dict[str, Any]]:
        out = bedrock.invoke_model_with_response_stream(modelId=CLAUDE, body=json.dumps(body))
        return [json.loads(e["chunk"]["bytes"]) for e in out["body"]]

    events = await off_loop(run)
    assert [e["type"] for e in events][:2] == ["message_start", "content_block_start"]
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    assert text == "one two three"
    assert events[-1]["type"] == "message_stop"
    assert events[-1]["amazon-bedrock-invocationMetrics"]["outputTokenCount"] == 3


async def test_boto3_with_a_wrong_secret_gets_awss_403(
    fake: FakeUpstream, client: Callable[..., BaseClient]
) -> None:
    bedrock = client(secret="not-the-secret")
    with pytest.raises(ClientError) as info:
        await off_loop(lambda: bedrock.converse(modelId=NOVA, messages=converse_messages("x")))
    error = info.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert error["Error"]["Code"] == "InvalidSignatureException"
    assert "signature we calculated does not match" in error["Error"]["Message"]


async def test_boto3_sees_bedrocks_errors_as_typed_exceptions(
    fake: FakeUpstream, client: Callable[..., BaseClient]
) -> None:
    bedrock = client()
    with pytest.raises(bedrock.exceptions.ThrottlingException):
        await off_loop(
            lambda: bedrock.converse(
                modelId=NOVA, messages=converse_messages("[[fake status=429]]")
            )
        )
    alternating = [*converse_messages("a"), *converse_messages("b")]
    with pytest.raises(bedrock.exceptions.ValidationException, match="alternate"):
        await off_loop(lambda: bedrock.converse(modelId=NOVA, messages=alternating))
    fake.queue(Reply(error_after=1, error_type="ThrottlingException", error_message="slow"))

    def stream() -> None:
        out = bedrock.converse_stream(modelId=NOVA, messages=converse_messages("hi"))
        try:
            list(out["stream"])
        finally:
            out["stream"].close()  # its connection, left open by the error

    with pytest.raises(EventStreamError, match="slow") as info:
        await off_loop(stream)
    assert info.value.response["Error"]["Code"] == "throttlingException"


async def test_an_invoke_body_with_model_is_refused_as_bedrock_does(
    fake: FakeUpstream, client: Callable[..., BaseClient]
) -> None:
    bedrock = client()
    body = {"model": "claude", "anthropic_version": "bedrock-2023-05-31", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    with pytest.raises(bedrock.exceptions.ValidationException, match=r"extraneous key \[model\]"):
        await off_loop(lambda: bedrock.invoke_model(modelId=CLAUDE, body=json.dumps(body)))


# the gateway's pieces against the fake -------------------------------------------------------
def target(fake: FakeUpstream, model: str, stream: bool) -> UpstreamTarget:
    return UpstreamTarget("bedrock-1", fake.url, "", model, 1024, stream)


async def send(
    fake: FakeUpstream, call: UpstreamCall, signer: Signer
) -> tuple[int, dict[str, str], bytes]:
    """What the relay will do: sign the call's bytes, post it as it is (a str URL)."""
    headers = {**call.headers, **signer.sign("POST", call.url, call.headers, call.body)}
    async with aiohttp.ClientSession() as session:
        async with session.post(call.url, data=call.body, headers=headers) as resp:
            return resp.status, dict(resp.headers), await resp.read()


def chat(text: str, stream: bool) -> ChatRequest:
    req: ChatRequest = {"model": "m", "messages": [{"role": "user", "content": text}]}
    if stream:
        req["stream"] = True
    return req


SIGNER = Signer.static("us-east-1", ACCESS_KEY, SECRET_KEY)


@pytest.mark.parametrize("model", [NOVA, "arn:aws:bedrock:us-east-1:123456789012:"
                                   "inference-profile/us.meta.llama3-2-90b-v1:0"])  # fmt: skip
async def test_a_signed_converse_call_gets_through(fake: FakeUpstream, model: str) -> None:
    adapter = ConverseAdapter()
    call = adapter.encode_request(chat('[[fake text="Signed and sealed"]]', False),
                                  target(fake, model, False))  # fmt: skip
    status, _, raw = await send(fake, call, SIGNER)
    assert status == 200, raw
    resp = adapter.decode_response(orjson.loads(raw))
    assert resp["choices"][0]["message"]["content"] == "Signed and sealed"
    assert resp["usage"]["completion_tokens"] == 3


async def test_a_wrong_key_is_the_channels_fault(fake: FakeUpstream) -> None:
    adapter = ConverseAdapter()
    call = adapter.encode_request(chat("hi", False), target(fake, NOVA, False))
    wrong = Signer.static("us-east-1", ACCESS_KEY, "wrong-secret")
    status, headers, raw = await send(fake, call, wrong)
    err = adapter.decode_error(status, raw, headers.get("x-amzn-ErrorType"))
    assert (status, err.status, err.channel_fault) == (403, 502, True)


def stream_through(
    adapter: ConverseAdapter | InvokeAdapter, raw: bytes, pieces: int = 7
) -> tuple[bytes, Any]:
    ctx = Ctx(request_id="r", model="m", created=1, include_usage=True)
    route = RouteMatch(protocol="openai", capability="chat", model="m", stream=True)
    stream = ConvertedStream(
        adapter.stream_decoder(ctx), OpenAIAdapter().stream_encoder(ctx, route), EventStreamParser()
    )
    step = max(1, len(raw) // pieces)
    out = b"".join(stream.feed(raw[i : i + step]) for i in range(0, len(raw), step))
    return out + stream.finish(), stream.usage


def texts(sse: bytes) -> str:
    out = []
    for line in sse.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in orjson.loads(line[6:]).get("choices", ()):
                out.append(choice["delta"].get("content") or "")
    return "".join(out)


@pytest.mark.parametrize("adapter", [ConverseAdapter(), InvokeAdapter(EventStreamParser)])
async def test_a_signed_stream_converts_for_a_chat_client(
    fake: FakeUpstream, adapter: ConverseAdapter | InvokeAdapter
) -> None:
    call = adapter.encode_request(
        chat('[[fake text="alpha beta gamma" prompt_tokens=21]]', True),
        target(fake, CLAUDE, True),
    )
    status, headers, raw = await send(fake, call, SIGNER)
    assert status == 200 and headers["Content-Type"] == "application/vnd.amazon.eventstream"
    sse, usage = stream_through(adapter, raw)
    assert texts(sse) == "alpha beta gamma" and sse.endswith(b"data: [DONE]\n\n")
    assert usage == {"prompt_tokens": 21, "completion_tokens": 3, "total_tokens": 24}


async def test_an_unsigned_request_or_an_unknown_key_is_refused(fake: FakeUpstream) -> None:
    url = f"{fake.url}/model/{NOVA}/converse"
    body = orjson.dumps({"messages": converse_messages("hi")})
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=body) as resp:
            assert resp.status == 403
            assert resp.headers["x-amzn-ErrorType"] == "MissingAuthenticationTokenException"
            assert await resp.json() == {"message": "Missing Authentication Token"}
    fake.aws_credentials = {"AKIAOTHERKEY00000000": "other-secret"}
    call = ConverseAdapter().encode_request(chat("hi", False), target(fake, NOVA, False))
    status, headers, raw = await send(fake, call, SIGNER)
    assert status == 403 and headers["x-amzn-ErrorType"] == "UnrecognizedClientException"
    assert orjson.loads(raw)["message"] == "The security token included in the request is invalid."
