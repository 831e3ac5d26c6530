"""The fake upstream's Vertex AI paths and Google token endpoint, through real HTTP.

Google's and Anthropic's own clients succeed against them (google-auth's service-account
credentials get their token from the fake's endpoint, google-genai with ``vertexai=True`` and
``AnthropicVertex`` use it), so the fake checks what Vertex checks; the calls the gateway's
pieces build (``gateway.protocols.vertex`` over the gemini and anthropic adapters, the token
of ``gateway.upstream.google_token``) match what those clients send and get through too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import aiohttp
import anthropic
import google.oauth2.service_account
import orjson
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from bench.fake import FakeUpstream, Reply
from bench.fake.google_auth import make_account
from bench.fake.server import RecordedRequest
from gateway.errors import UpstreamError
from gateway.protocols.anthropic import AnthropicAdapter
from gateway.protocols.base import ConvertedStream, Ctx, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.gemini import GeminiAdapter
from gateway.protocols.openai import OpenAIAdapter
from gateway.protocols.vertex import (
    VertexSite,
    claude_call,
    decode_error,
    gemini_call,
    token_refused,
)
from gateway.types import ChatRequest
from gateway.upstream.google_token import SCOPE, AccessTokens, ServiceAccount, session_post

PROJECT, REGION = "fake-project", "us-east5"
CLAUDE = "claude-sonnet-4-5@20250929"
GEMINI = "gemini-2.5-flash"
T = TypeVar("T")


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as up:
        yield up


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
def tokens(fake: FakeUpstream, session: aiohttp.ClientSession) -> AccessTokens:
    return AccessTokens(ServiceAccount.from_info(fake.service_account()), session_post(session))


OPENED: list[anthropic.AnthropicVertex | genai.Client] = []


@pytest.fixture(autouse=True)
def close_clients() -> Iterator[None]:
    """The SDK clients a test made are closed after it (their pools hold sockets)."""
    yield
    while OPENED:
        OPENED.pop().close()


def site(fake: FakeUpstream) -> VertexSite:
    return VertexSite(PROJECT, REGION, fake.url)


async def off_loop(call: Callable[[], T]) -> T:
    """The SDKs' sync clients block: they run in a thread while the fake answers here."""
    return await asyncio.to_thread(call)


def claude_client(fake: FakeUpstream, token: str) -> anthropic.AnthropicVertex:
    client = anthropic.AnthropicVertex(
        region=REGION, project_id=PROJECT, access_token=token, base_url=f"{fake.url}/v1",
        max_retries=0,
    )  # fmt: skip
    OPENED.append(client)
    return client


def gemini_client(fake: FakeUpstream, credentials: Any) -> genai.Client:
    client = genai.Client(
        vertexai=True,
        project=PROJECT,
        location=REGION,
        credentials=credentials,
        http_options=types.HttpOptions(
            base_url=fake.url + "/",
            api_version="v1",
            retry_options=types.HttpRetryOptions(attempts=1),
        ),
    )
    OPENED.append(client)
    return client


def google_credentials(fake: FakeUpstream) -> Any:
    """google-auth's own service-account credentials: they get their token from the fake."""
    return google.oauth2.service_account.Credentials.from_service_account_info(
        fake.service_account(), scopes=[SCOPE]
    )


async def send(
    session: aiohttp.ClientSession, call: UpstreamCall, tokens: AccessTokens
) -> tuple[int, bytes]:
    """What the relay will do: the call as built, with the channel's token."""
    headers = {**call.headers, "Authorization": await tokens.authorization()}
    async with session.post(call.url, data=call.body, headers=headers) as resp:
        return resp.status, await resp.read()


def last(fake: FakeUpstream, path_part: str) -> RecordedRequest:
    return [r for r in fake.requests if path_part in r.path][-1]


# the clouds' own clients -------------------------------------------------------------------
async def test_anthropic_vertex_creates_and_streams_with_a_token_of_the_fake(
    fake: FakeUpstream, tokens: AccessTokens
) -> None:
    client = claude_client(fake, await tokens.token())
    messages: Any = [{"role": "user", "content": '[[fake text="alpha beta gamma"]]'}]
    reply = await off_loop(
        lambda: client.messages.create(model=CLAUDE, max_tokens=50, messages=messages)
    )
    assert reply.content[0].type == "text" and reply.content[0].text == "alpha beta gamma"

    def stream() -> str:
        with client.messages.stream(model=CLAUDE, max_tokens=50, messages=messages) as s:
            return "".join(s.text_stream)

    assert await off_loop(stream) == "alpha beta gamma"
    counted = await off_loop(lambda: client.messages.count_tokens(model=CLAUDE, messages=messages))
    assert counted.input_tokens > 0
    paths = [r.path.rpartition("/")[2] for r in fake.requests if "/publishers/" in r.path]
    assert paths == [
        f"{CLAUDE}:rawPredict",
        f"{CLAUDE}:streamRawPredict",
        "count-tokens:rawPredict",
    ]


async def test_google_genai_on_vertex_generates_streams_and_counts(fake: FakeUpstream) -> None:
    client = gemini_client(fake, google_credentials(fake))
    config = types.GenerateContentConfig(system_instruction="be brief", max_output_tokens=50)
    prompt = '[[fake text="one two three"]]'
    reply = await off_loop(
        lambda: client.models.generate_content(model=GEMINI, contents=prompt, config=config)
    )
    assert reply.text == "one two three" and reply.create_time is not None

    def stream() -> str:
        pieces = client.models.generate_content_stream(model=GEMINI, contents=prompt, config=config)
        return "".join(p.text or "" for p in pieces)

    assert await off_loop(stream) == "one two three"
    counted = await off_loop(lambda: client.models.count_tokens(model=GEMINI, contents=prompt))
    assert counted.total_tokens and counted.total_tokens > 0
    assert fake.google.grants == 1  # google-auth's assertion verified once, its token kept
    assert last(fake, ":streamGenerateContent").query == {"alt": "sse"}


async def test_the_fake_refuses_a_foreign_key_and_an_expired_token(
    fake: FakeUpstream, tokens: AccessTokens, session: aiohttp.ClientSession
) -> None:
    # an assertion signed by a key the account does not have: Google's invalid_grant
    forged = {**fake.service_account(), "private_key": make_account().private_pem}
    stranger = AccessTokens(ServiceAccount.from_info(forged), session_post(session))
    with pytest.raises(UpstreamError, match="invalid_grant: Invalid JWT Signature") as caught:
        await stranger.token()
    assert caught.value.channel_fault
    credentials = google.oauth2.service_account.Credentials.from_service_account_info(
        forged, scopes=[SCOPE]
    )
    client = gemini_client(fake, credentials)
    with pytest.raises(google.auth.exceptions.RefreshError, match="invalid_grant"):
        await off_loop(lambda: client.models.generate_content(model=GEMINI, contents="hi"))
    # a token that has expired: Vertex's 401, which the SDKs and the gateway read as such
    token = await tokens.token()
    fake.google.expire_all()
    stale = claude_client(fake, token)
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.AuthenticationError) as refused:
        await off_loop(lambda: stale.messages.create(model=CLAUDE, max_tokens=5, messages=messages))
    details = refused.value.body["error"]["details"]  # type: ignore[index]
    assert details[0]["reason"] == "ACCESS_TOKEN_EXPIRED"
    call = gemini_call(GeminiAdapter().encode_request(chat(), target()), site(fake), GEMINI)
    status, raw = await send(session, call, tokens)
    err = decode_error(status, raw)
    assert status == 401 and token_refused(status) and err.channel_fault and err.status == 502
    tokens.invalidate(token)  # what the relay does on a 401: the next request gets a new one
    status, _ = await send(session, call, tokens)
    assert status == 200


async def test_a_request_without_a_bearer_token_is_refused(fake: FakeUpstream) -> None:
    url = f"{fake.url}/v1/projects/p/locations/{REGION}/publishers/google/models/{GEMINI}"
    async with aiohttp.ClientSession() as s:
        async with s.post(url + ":generateContent", json={"contents": []}) as resp:
            body = await resp.json()
    assert resp.status == 401 and body["error"]["status"] == "UNAUTHENTICATED"
    assert body["error"]["details"][0]["reason"] == "CREDENTIALS_MISSING"


# what the gateway builds is what the clients send ---------------------------------------------
def chat(text: str = "hello", stream: bool = False) -> ChatRequest:
    req: ChatRequest = {"model": "m", "messages": [{"role": "user", "content": text}]}
    if stream:
        req["stream"] = True
    return req


def target(
    model: str = GEMINI, stream: bool = False, headers: dict[str, str] | None = None
) -> UpstreamTarget:
    return UpstreamTarget("vx", "https://unused.example", "", model, 64, stream, headers or {})


@pytest.mark.parametrize("stream", [False, True])
async def test_a_claude_call_is_what_anthropic_vertex_sends(
    fake: FakeUpstream, tokens: AccessTokens, session: aiohttp.ClientSession, stream: bool
) -> None:
    client = claude_client(fake, await tokens.token())
    messages: Any = [{"role": "user", "content": "hello"}]
    betas = ["interleaved-thinking-2025-05-14"]

    def sdk() -> None:
        if stream:
            with client.beta.messages.stream(
                model=CLAUDE, max_tokens=64, messages=messages, betas=betas
            ) as s:
                s.until_done()
        else:
            client.beta.messages.create(model=CLAUDE, max_tokens=64, messages=messages, betas=betas)

    await off_loop(sdk)
    sent = fake.requests[-1]
    payload: dict[str, Any] = {"model": "client-name", "max_tokens": 64, "messages": messages}
    if stream:
        payload["stream"] = True
    route = RouteMatch("anthropic", "chat", "client-name", stream)
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": betas[0]}
    encoded = AnthropicAdapter().passthrough_request(
        payload, route, target(CLAUDE, stream, headers)
    )
    call = claude_call(encoded, site(fake), CLAUDE)
    assert call.url == fake.url + sent.path
    ours = orjson.loads(call.body)
    # the version string differs: the contract's vertex-2023-10-16; this SDK release writes
    # its own API version there. Everything else is the same.
    assert ours.pop("anthropic_version") == "vertex-2023-10-16"
    assert isinstance(sent.json.pop("anthropic_version"), str)
    assert ours == sent.json
    lower = {k.lower(): v for k, v in call.headers.items()}
    assert lower["anthropic-beta"] == sent.headers["anthropic-beta"]
    assert lower["content-type"] == sent.headers["content-type"]
    assert "anthropic-version" not in sent.headers and "anthropic-version" not in lower
    status, raw = await send(session, call, tokens)
    assert status == 200 and (b"message_stop" in raw if stream else orjson.loads(raw)["content"])


async def test_a_claude_count_is_what_anthropic_vertex_sends(
    fake: FakeUpstream, tokens: AccessTokens, session: aiohttp.ClientSession
) -> None:
    client = claude_client(fake, await tokens.token())
    messages: Any = [{"role": "user", "content": "hello"}]
    await off_loop(lambda: client.messages.count_tokens(model=CLAUDE, messages=messages))
    sent = fake.requests[-1]
    encoded = AnthropicAdapter().count_request(chat(), target(CLAUDE))
    call = claude_call(encoded, site(fake), CLAUDE)
    ours = orjson.loads(call.body)
    assert call.url == fake.url + sent.path
    assert ours.pop("anthropic_version") and sent.json.pop("anthropic_version")
    assert ours == sent.json
    status, raw = await send(session, call, tokens)
    assert status == 200 and orjson.loads(raw)["input_tokens"] > 0


def genai_call(client: genai.Client, action: str, contents: Any, config: Any) -> object:
    models = client.models
    if action == "generateContent":
        return models.generate_content(model=GEMINI, contents=contents, config=config)
    if action == "streamGenerateContent":
        return list(models.generate_content_stream(model=GEMINI, contents=contents, config=config))
    return models.count_tokens(model=GEMINI, contents=contents, config=config)


@pytest.mark.parametrize("action", ["generateContent", "streamGenerateContent", "countTokens"])
async def test_a_gemini_call_is_what_google_genai_sends(
    fake: FakeUpstream, tokens: AccessTokens, session: aiohttp.ClientSession, action: str
) -> None:
    client = gemini_client(fake, google_credentials(fake))
    contents: Any = [{"role": "user", "parts": [{"text": "hello"}]}]
    await off_loop(lambda: genai_call(client, action, contents, {"system_instruction": "be brief"}))
    sent = fake.requests[-1]
    req: ChatRequest = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello"},
        ],
    }
    adapter = GeminiAdapter()
    stream = action == "streamGenerateContent"
    if action == "countTokens":
        encoded = adapter.count_request(req, target())
    else:
        encoded = adapter.encode_request(req, target(GEMINI, stream))
    call = gemini_call(encoded, site(fake), GEMINI)
    assert call.url.partition("?")[0] == fake.url + sent.path
    assert dict(sent.query) == ({"alt": "sse"} if stream else {})
    # genai writes an empty generationConfig, and role user in systemInstruction (which
    # Vertex ignores); the rest is the same
    theirs = {k: v for k, v in sent.json.items() if v != {}}
    theirs["systemInstruction"].pop("role")
    assert orjson.loads(call.body) == theirs
    assert "content-type" in {k.lower() for k in call.headers}
    assert sent.headers["authorization"].startswith("Bearer ya29.fake-")
    status, raw = await send(session, call, tokens)
    assert status == 200 and raw


async def test_vertex_refuses_what_ai_studio_takes_and_the_pieces_fix_it(
    fake: FakeUpstream, tokens: AccessTokens, session: aiohttp.ClientSession
) -> None:
    payload: dict[str, Any] = {"contents": [{"parts": [{"text": "hi"}]}]}
    route = RouteMatch("gemini", "chat", GEMINI, False)
    as_is = GeminiAdapter().passthrough_request(payload, route, target())
    raw_url = site(fake).root + "/v1/projects/p/locations/r/publishers/google/models/g:"
    status, raw = await send(
        session, UpstreamCall(raw_url + "generateContent", as_is.headers, as_is.body), tokens
    )
    assert status == 400 and b"valid role" in raw
    assert decode_error(status, raw).status == 400
    count = GeminiAdapter().count_request(chat(), target())
    status, raw = await send(
        session, UpstreamCall(raw_url + "countTokens", count.headers, count.body), tokens
    )
    assert status == 400 and b"generateContentRequest" in raw
    for call in (gemini_call(as_is, site(fake), GEMINI), gemini_call(count, site(fake), GEMINI)):
        assert (await send(session, call, tokens))[0] == 200


async def test_a_claude_body_with_model_or_without_version_is_refused(
    fake: FakeUpstream, tokens: AccessTokens, session: aiohttp.ClientSession
) -> None:
    encoded = AnthropicAdapter().encode_request(chat(), target(CLAUDE))
    good = claude_call(encoded, site(fake), CLAUDE)
    body = orjson.loads(good.body)
    for bad, word in (
        ({**body, "model": CLAUDE}, b"model: Extra inputs"),
        ({k: v for k, v in body.items() if k != "anthropic_version"}, b"anthropic_version"),
    ):
        call = UpstreamCall(good.url, good.headers, orjson.dumps(bad))
        status, raw = await send(session, call, tokens)
        assert status == 400 and word in raw and orjson.loads(raw)["type"] == "error"
        assert decode_error(status, raw).status == 400


# the gateway's pieces end to end ---------------------------------------------------------------
@pytest.mark.parametrize("model", [GEMINI, CLAUDE])
async def test_a_stream_converts_for_a_chat_client(
    fake: FakeUpstream, tokens: AccessTokens, session: aiohttp.ClientSession, model: str
) -> None:
    gemini = model == GEMINI
    adapter: GeminiAdapter | AnthropicAdapter = GeminiAdapter() if gemini else AnthropicAdapter()
    encoded = adapter.encode_request(
        chat('[[fake text="red green blue" prompt_tokens=11]]', True), target(model, True)
    )
    call = (gemini_call if gemini else claude_call)(encoded, site(fake), model)
    status, raw = await send(session, call, tokens)
    assert status == 200
    ctx = Ctx(request_id="r", model="m", created=1, include_usage=True)
    route = RouteMatch(protocol="openai", capability="chat", model="m", stream=True)
    stream = ConvertedStream(
        adapter.stream_decoder(ctx), OpenAIAdapter().stream_encoder(ctx, route)
    )
    out = b"".join(stream.feed(raw[i : i + 50]) for i in range(0, len(raw), 50)) + stream.finish()
    text = "".join(
        (c["delta"].get("content") or "")
        for line in out.split(b"\n") if line.startswith(b"data: {")
        for c in orjson.loads(line[6:]).get("choices", ())
    )  # fmt: skip
    assert text == "red green blue" and out.endswith(b"data: [DONE]\n\n")
    assert stream.usage is not None and stream.usage["prompt_tokens"] == 11


async def test_errors_scripted_on_vertex_come_in_each_publishers_shape(
    fake: FakeUpstream, tokens: AccessTokens, session: aiohttp.ClientSession
) -> None:
    fake.queue(Reply(status=429), Reply(status=529, error_type="overloaded_error"))
    gem = gemini_call(GeminiAdapter().encode_request(chat(), target()), site(fake), GEMINI)
    status, raw = await send(session, gem, tokens)
    assert status == 429 and orjson.loads(raw)["error"]["status"] == "RESOURCE_EXHAUSTED"
    assert decode_error(status, raw).status == 429
    cl = claude_call(AnthropicAdapter().encode_request(chat(), target(CLAUDE)), site(fake), CLAUDE)
    status, raw = await send(session, cl, tokens)
    assert status == 529 and orjson.loads(raw)["type"] == "error"
    assert decode_error(status, raw).status == 503
    client = gemini_client(fake, google_credentials(fake))
    fake.queue(Reply(status=400))
    with pytest.raises(genai_errors.ClientError) as caught:
        await off_loop(lambda: client.models.generate_content(model=GEMINI, contents="x"))
    assert caught.value.code == 400 and caught.value.status == "INVALID_ARGUMENT"
