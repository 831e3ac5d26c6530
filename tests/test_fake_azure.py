"""The fake upstream's Azure OpenAI paths, through real HTTP.

OpenAI's own ``AzureOpenAI`` client (and ``OpenAI`` on Azure's v1 API) succeeds against them,
so the fake checks what Azure checks (``api-key``, ``api-version``) and answers in Azure's
shapes (content-filter annotations, Azure's error bodies); the calls the gateway builds
(``gateway.protocols.azure`` over the openai adapter) match what the client sends and get
through, converted or passed through."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import aiohttp
import openai
import orjson
import pytest

from bench.fake import FakeUpstream, Reply
from bench.fake.azure import AZURE_KEY
from gateway.protocols.anthropic import AnthropicAdapter
from gateway.protocols.azure import AzureSite, azure_call, azure_url, decode_error
from gateway.protocols.base import ConvertedStream, Ctx, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.openai import OpenAIAdapter
from gateway.protocols.openai.passthrough import OpenAIPassthrough
from gateway.types import ChatRequest

VERSION = "2024-10-21"
DEPLOYMENT = "gpt4o-prod"
T = TypeVar("T")
OPENED: list[openai.OpenAI] = []


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as up:
        yield up


@pytest.fixture(autouse=True)
def close_clients() -> Iterator[None]:
    """The SDK clients a test made are closed after it (their pools hold sockets)."""
    yield
    while OPENED:
        OPENED.pop().close()


def azure_client(fake: FakeUpstream, key: str = AZURE_KEY) -> openai.AzureOpenAI:
    client = openai.AzureOpenAI(
        azure_endpoint=fake.url, api_key=key, api_version=VERSION, max_retries=0
    )
    OPENED.append(client)
    return client


async def off_loop(call: Callable[[], T]) -> T:
    """The SDK's sync client blocks: it runs in a thread while the fake answers here."""
    return await asyncio.to_thread(call)


def site(fake: FakeUpstream, version: str = VERSION) -> AzureSite:
    return AzureSite(fake.url, version)


async def send(call: UpstreamCall) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.post(call.url, data=call.body, headers=call.headers) as resp:
            return resp.status, await resp.read()


def target(stream: bool = False) -> UpstreamTarget:
    return UpstreamTarget("az", "https://unused.example/v1", AZURE_KEY, DEPLOYMENT, 64, stream)


def chat(text: str = "hello", stream: bool = False) -> ChatRequest:
    req: ChatRequest = {"model": "chat-small", "messages": [{"role": "user", "content": text}]}
    if stream:
        req["stream"] = True
    return req


# the client against the fake ---------------------------------------------------------------
async def test_azure_openai_chats_and_streams_with_azures_filter_results(
    fake: FakeUpstream,
) -> None:
    client = azure_client(fake)
    messages: Any = [{"role": "user", "content": '[[fake text="alpha beta gamma"]]'}]
    reply = await off_loop(
        lambda: client.chat.completions.create(model=DEPLOYMENT, messages=messages)
    )
    assert reply.choices[0].message.content == "alpha beta gamma"
    extra = reply.model_extra or {}
    assert extra["prompt_filter_results"][0]["content_filter_results"]["hate"]["filtered"] is False

    def stream() -> list[Any]:
        return list(
            client.chat.completions.create(
                model=DEPLOYMENT,
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
            )
        )

    chunks = await off_loop(stream)
    assert chunks[0].choices == [] and chunks[0].id == ""  # the prompt's filter results
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "alpha beta gamma" and chunks[-1].usage is not None
    sent = fake.requests[0]
    assert sent.path == f"/openai/deployments/{DEPLOYMENT}/chat/completions"
    assert dict(sent.query) == {"api-version": VERSION} and sent.headers["api-key"] == AZURE_KEY


async def test_azure_openai_embeds_and_answers_through_the_responses_api(
    fake: FakeUpstream,
) -> None:
    client = azure_client(fake)
    vectors = await off_loop(lambda: client.embeddings.create(model="emb-3", input="hello"))
    assert vectors.data and vectors.data[0].embedding
    reply = await off_loop(
        lambda: client.responses.create(model=DEPLOYMENT, input='[[fake text="one two"]]')
    )
    assert reply.output_text == "one two"
    assert [r.path for r in fake.requests] == [
        "/openai/deployments/emb-3/embeddings",
        "/openai/responses",
    ]


async def test_openai_on_azures_v1_api_takes_the_key_as_bearer(fake: FakeUpstream) -> None:
    client = openai.OpenAI(base_url=f"{fake.url}/openai/v1/", api_key=AZURE_KEY, max_retries=0)
    OPENED.append(client)
    messages: Any = [{"role": "user", "content": '[[fake text="v one"]]'}]
    reply = await off_loop(
        lambda: client.chat.completions.create(model=DEPLOYMENT, messages=messages)
    )
    assert reply.choices[0].message.content == "v one"
    assert fake.requests[-1].path == "/openai/v1/chat/completions"


async def test_a_wrong_key_or_a_missing_api_version_is_refused_as_azure_does(
    fake: FakeUpstream,
) -> None:
    client = azure_client(fake, key="not-the-key")
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError) as refused:
        await off_loop(lambda: client.chat.completions.create(model=DEPLOYMENT, messages=messages))
    assert "Access denied due to invalid subscription key" in refused.value.message
    call = azure_call(OpenAIAdapter().encode_request(chat(), target()), site(fake), DEPLOYMENT, "x")
    status, raw = await send(call)
    assert status == 401 and decode_error(status, raw).channel_fault
    bare = UpstreamCall(call.url.partition("?")[0], {"api-key": AZURE_KEY}, call.body)
    status, raw = await send(bare)
    assert (status, orjson.loads(raw)) == (
        404,
        {"error": {"code": "404", "message": "Resource not found"}},
    )
    assert decode_error(status, raw).channel_fault  # a channel configured without api_version


async def test_a_content_filter_refusal_reaches_the_client_as_azure_sends_it(
    fake: FakeUpstream,
) -> None:
    fake.queue(
        Reply(status=400, error_type="content_filter"),
        Reply(status=400, error_type="content_filter"),
    )
    client = azure_client(fake)
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as refused:
        await off_loop(lambda: client.chat.completions.create(model=DEPLOYMENT, messages=messages))
    assert refused.value.code == "content_filter"
    call = azure_call(
        OpenAIAdapter().encode_request(chat(), target()), site(fake), DEPLOYMENT, AZURE_KEY
    )
    status, raw = await send(call)
    err = decode_error(status, raw)
    assert (status, err.status, err.code) == (400, 400, "content_filter")
    assert err.message.endswith("(filtered: violence)") and not err.retryable


# what the gateway builds is what the client sends ---------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_call_is_what_azure_openai_sends(fake: FakeUpstream, stream: bool) -> None:
    client = azure_client(fake)
    messages: Any = [{"role": "user", "content": "hello"}]
    options: Any = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}

    def sdk() -> None:
        reply = client.chat.completions.create(
            model=DEPLOYMENT, messages=messages, max_tokens=20, **options
        )
        if stream:
            list(reply)  # type: ignore[arg-type]

    await off_loop(sdk)
    sent = fake.requests[-1]
    payload: dict[str, Any] = {"model": "chat-small", "messages": messages, "max_tokens": 20}
    if stream:
        payload |= {"stream": True, "stream_options": {"include_usage": True}}
    route = RouteMatch("openai", "chat", "chat-small", stream, include_usage=stream)
    encoded = OpenAIAdapter().passthrough_request(payload, route, target(stream))
    call = azure_call(encoded, site(fake), DEPLOYMENT, AZURE_KEY)
    assert call.url == f"{fake.url}{sent.path}?api-version={sent.query['api-version']}"
    assert orjson.loads(call.body) == sent.json
    assert call.headers["api-key"] == sent.headers["api-key"]
    assert "authorization" not in {k.lower() for k in call.headers}
    assert "authorization" not in sent.headers
    status, raw = await send(call)
    assert status == 200 and raw


async def test_the_other_endpoints_go_where_azure_openai_sends_them(fake: FakeUpstream) -> None:
    client = azure_client(fake)
    await off_loop(lambda: client.embeddings.create(model="emb-3", input="hello"))
    await off_loop(lambda: client.images.generate(model="dalle", prompt="a cat"))
    await off_loop(lambda: client.responses.create(model=DEPLOYMENT, input="hi"))
    got = [f"{fake.url}{r.path}?api-version={r.query['api-version']}" for r in fake.requests]
    assert got == [
        azure_url(site(fake), "emb-3", "/embeddings"),
        azure_url(site(fake), "dalle", "/images/generations"),
        azure_url(site(fake), DEPLOYMENT, "/responses"),
    ]


# the gateway's pieces end to end ---------------------------------------------------------------
async def test_an_azure_stream_converts_for_an_anthropic_client(fake: FakeUpstream) -> None:
    encoded = OpenAIAdapter().encode_request(
        chat('[[fake text="red green blue"]]', True), target(True)
    )
    status, raw = await send(azure_call(encoded, site(fake), DEPLOYMENT, AZURE_KEY))
    assert status == 200 and b'"prompt_filter_results"' in raw
    ctx = Ctx(request_id="r", model="claude-ish", created=1, prompt_tokens_estimate=3)
    route = RouteMatch(protocol="anthropic", capability="chat", model="claude-ish", stream=True)
    stream = ConvertedStream(
        OpenAIAdapter().stream_decoder(ctx), AnthropicAdapter().stream_encoder(ctx, route)
    )
    out = b"".join(stream.feed(raw[i : i + 40]) for i in range(0, len(raw), 40)) + stream.finish()
    deltas = [
        orjson.loads(line[6:])["delta"].get("text", "")
        for line in out.split(b"\n")
        if line.startswith(b"data: ") and b'"content_block_delta"' in line
    ]
    assert "".join(deltas) == "red green blue" and out.rstrip().endswith(b'{"type":"message_stop"}')
    assert stream.usage is not None and stream.usage["completion_tokens"] == 3


async def test_an_azure_stream_passes_through_with_the_clients_model(fake: FakeUpstream) -> None:
    payload: dict[str, Any] = {
        "model": "chat-small",
        "messages": [{"role": "user", "content": '[[fake text="one two"]]'}],
        "stream": True,
    }
    route = RouteMatch("openai", "chat", "chat-small", True)
    encoded = OpenAIAdapter().passthrough_request(payload, route, target(True))
    status, raw = await send(azure_call(encoded, site(fake), DEPLOYMENT, AZURE_KEY))
    assert status == 200
    stream = OpenAIPassthrough(Ctx("r", "chat-small", 1), target(True))
    out = stream.feed(raw) + stream.finish()
    assert DEPLOYMENT.encode() not in out and b'"model":"chat-small"' in out
    assert stream.usage is not None and stream.usage["completion_tokens"] == 2
