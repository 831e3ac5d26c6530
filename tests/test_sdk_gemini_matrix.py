"""The official google-genai SDK (its async API) against every channel type over real sockets,
stream and not, on its default API version (v1) and on v1beta: text with a system
instruction, usage and its bill, function-call round trips, an inline image, and the SDK's
typed errors. The table and the upstream readers live in test_sdk_matrix.py."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import pytest
from google.genai import errors as gerrors
from google.genai import types as gtypes

from bench.fake import media
from bench.fake_upstream import FakeUpstream, Reply
from tests.plugins.servers import KEYS, ServedGateway
from tests.test_sdk_matrix import (
    GENAI_AIOHTTP_WARNING,
    PNG_B64,
    WEATHER_TOOL_SCHEMA,
    Target,
    chat_request,
    check_billed,
    check_tool_results,
    genai_client,
    stream_param,
    target_param,
    usage_record,
)

pytestmark = GENAI_AIOHTTP_WARNING
# an image whose base64 holds both characters the URL-safe alphabet changes (+ and /) and a pad
URLSAFE_PNG = media.PNG + b"\xf8\xf8\xfb\xf8"
version_param = pytest.mark.parametrize("api_version", [None, "v1beta"], ids=["v1", "v1beta"])
TOOL = gtypes.Tool(
    function_declarations=[
        gtypes.FunctionDeclaration(
            name="get_weather",
            description="Weather now",
            parameters_json_schema=WEATHER_TOOL_SCHEMA,
        )
    ]
)


@dataclass
class Answer:
    text: str = ""
    calls: list[gtypes.FunctionCall] = field(default_factory=list)
    finish: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_parts: list[gtypes.Part] = field(default_factory=list)  # to send back
    chunks: int = 0


async def ask(
    gw: ServedGateway,
    api_version: str | None,
    model: str,
    contents: list[Any],
    stream: bool,
    **config: Any,
) -> Answer:
    cfg = gtypes.GenerateContentConfig(**config)
    async with genai_client(gw, api_version) as client:
        if stream:
            responses = [
                r
                async for r in await client.models.generate_content_stream(
                    model=model, contents=contents, config=cfg
                )
            ]
        else:
            responses = [
                await client.models.generate_content(model=model, contents=contents, config=cfg)
            ]
    out = Answer(chunks=len(responses))
    texts: list[str] = []
    for r in responses:
        cand = (r.candidates or [None])[0]
        for part in cand.content.parts or () if cand and cand.content else ():
            out.model_parts.append(part)
            if part.text and not part.thought:
                texts.append(part.text)
            if part.function_call:
                out.calls.append(part.function_call)
        if cand is not None and cand.finish_reason:
            out.finish = cand.finish_reason.value
    out.text = "".join(texts)
    meta = responses[-1].usage_metadata
    assert meta is not None
    out.prompt_tokens = meta.prompt_token_count or 0
    out.completion_tokens = (meta.candidates_token_count or 0) + (meta.thoughts_token_count or 0)
    return out


@version_param
@target_param
@stream_param
async def test_text_with_system_instruction_usage_and_bill(
    gateway: ServedGateway,
    fake: FakeUpstream,
    target: Target,
    stream: bool,
    api_version: str | None,
) -> None:
    contents = ["[[fake text='hello from upstream' chunks=3]] hi"]
    answer = await ask(
        gateway, api_version, target.model, contents, stream, system_instruction="You are terse."
    )
    assert answer.text == "hello from upstream"
    assert answer.finish == "STOP"
    if stream:
        assert answer.chunks >= 3
    sent = chat_request(fake, target, stream)
    assert sent.system == "You are terse."
    assert sent.last_user_text.endswith("hi")
    await check_billed(gateway, target, "gemini", answer.prompt_tokens, answer.completion_tokens)


@version_param
@target_param
@stream_param
@pytest.mark.parametrize("n", [1, 2], ids=["one_call", "parallel"])
async def test_function_call_round_trip(
    gateway: ServedGateway,
    fake: FakeUpstream,
    target: Target,
    stream: bool,
    n: int,
    api_version: str | None,
) -> None:
    contents: list[Any] = [
        gtypes.Content(role="user", parts=[gtypes.Part(text=f"[[fake tools={n}]] weather?")])
    ]
    first = await ask(gateway, api_version, target.model, contents, stream, tools=[TOOL])
    assert [c.name for c in first.calls] == ["get_weather"] * n
    assert [c.args for c in first.calls] == [{"city": c} for c in ("Paris", "London")[:n]]
    ids = [c.id for c in first.calls]
    assert len(set(ids)) == n or ids == [None] * n  # ids, when given, tell the calls apart
    contents.append(gtypes.Content(role="model", parts=first.model_parts))
    results = [
        gtypes.Part(
            function_response=gtypes.FunctionResponse(
                id=c.id, name=c.name, response={"result": f"sunny in {(c.args or {})['city']}"}
            )
        )
        for c in first.calls
    ]
    contents.append(gtypes.Content(role="user", parts=results))
    fake.queue(Reply(text="Sunny everywhere."))
    second = await ask(gateway, api_version, target.model, contents, stream, tools=[TOOL])
    assert second.text == "Sunny everywhere."
    sent = chat_request(fake, target, stream)
    client_calls = [(c.id, c.name or "", dict(c.args or {})) for c in first.calls]
    check_tool_results(target, sent, client_calls)


@target_param
@stream_param
async def test_inline_image_reaches_the_upstream(
    gateway: ServedGateway, fake: FakeUpstream, target: Target, stream: bool
) -> None:
    parts = [
        gtypes.Part(text="[[fake image]] what is this?"),
        gtypes.Part.from_bytes(data=media.PNG, mime_type="image/png"),
    ]
    contents = [gtypes.Content(role="user", parts=parts)]
    answer = await ask(gateway, None, target.model, contents, stream)
    assert answer.text == "I received 1 image part: image/png."
    images = chat_request(fake, target, stream).images
    assert [(mime, base64.b64decode(data)) for mime, data in images] == [("image/png", media.PNG)]
    assert images[0][1] == PNG_B64


@target_param
@stream_param
async def test_urlsafe_image_bytes_reach_every_upstream_as_standard_base64(
    gateway: ServedGateway, fake: FakeUpstream, target: Target, stream: bool
) -> None:
    """google-genai writes inline bytes URL-safe (``-``, ``_``); Gemini takes that, but the
    other APIs take only the standard alphabet: every channel gets standard base64, padded."""
    image = URLSAFE_PNG
    assert set(base64.urlsafe_b64encode(image)) >= set(b"-_=")  # the SDK's form differs
    parts = [
        gtypes.Part(text="[[fake image]] what is this?"),
        gtypes.Part.from_bytes(data=image, mime_type="image/png"),
    ]
    contents = [gtypes.Content(role="user", parts=parts)]
    answer = await ask(gateway, None, target.model, contents, stream)
    assert answer.text == "I received 1 image part: image/png."
    images = chat_request(fake, target, stream).images
    assert images == [("image/png", base64.b64encode(image).decode())]
    assert base64.b64decode(images[0][1], validate=True) == image


async def _call(
    gw: ServedGateway, key: str, model: str, text: str, stream: bool, version: Any
) -> None:
    async with genai_client(gw, version, key=key) as client:
        if stream:
            async for _ in await client.models.generate_content_stream(model=model, contents=text):
                pass
        else:
            await client.models.generate_content(model=model, contents=text)


@version_param
@stream_param
@pytest.mark.parametrize(
    ("key", "model", "code", "status"),
    [
        ("sk-unknown-000000000000", "gemini-small", 401, "UNAUTHENTICATED"),
        (KEYS["alice"], "vip-model", 404, "NOT_FOUND"),
    ],
    ids=["bad_key", "model_outside_group"],
)
async def test_client_errors_are_typed(
    gateway: ServedGateway,
    key: str,
    model: str,
    code: int,
    status: str,
    stream: bool,
    api_version: str | None,
) -> None:
    with pytest.raises(gerrors.ClientError) as exc:
        await _call(gateway, key, model, "hi", stream, api_version)
    assert (exc.value.code, exc.value.status) == (code, status)


@version_param
@target_param
@stream_param
async def test_upstream_rate_limit_is_resource_exhausted(
    gateway: ServedGateway, target: Target, stream: bool, api_version: str | None
) -> None:
    with pytest.raises(gerrors.ClientError) as exc:
        await _call(
            gateway, KEYS["alice"], target.model, "[[fake status=429]]", stream, api_version
        )
    assert (exc.value.code, exc.value.status) == (429, "RESOURCE_EXHAUSTED")


@target_param
async def test_thinking_budget_and_thoughts_cross_over(
    gateway: ServedGateway, fake: FakeUpstream, target: Target
) -> None:
    thinking = gtypes.ThinkingConfig(thinking_budget=1024, include_thoughts=True)
    answer = await ask(
        gateway,
        None,
        target.model,
        ["[[fake text=ok reasoning='step one, step two']] think first"],
        False,
        max_output_tokens=4096,
        thinking_config=thinking,
    )
    assert answer.text == "ok"
    assert [p.text for p in answer.model_parts if p.thought] == ["step one, step two"]
    body = fake.requests[-1].json
    if target.type == "openai":
        assert body["reasoning_effort"] == "low"
    elif target.type == "anthropic":
        assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    else:  # passed through as google-genai spelled it
        assert body["generationConfig"]["thinkingConfig"]["thinking_budget"] == 1024


@target_param
async def test_error_mid_stream_raises_after_the_text_so_far(
    gateway: ServedGateway, target: Target
) -> None:
    texts: list[str] = []
    async with genai_client(gateway) as client:
        stream = await client.models.generate_content_stream(
            model=target.model, contents="[[fake text='one two three four' chunks=4 error_after=2]]"
        )
        with pytest.raises(gerrors.ServerError):
            async for response in stream:
                texts.append(response.text or "")
    assert "".join(texts) == "one two "
    assert (await usage_record(gateway))["status"] >= 500
