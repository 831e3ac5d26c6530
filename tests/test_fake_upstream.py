"""The bundled fake upstream, through real HTTP: shapes, stream framing, auth, scripting."""

from __future__ import annotations

import asyncio
import base64
import io
import struct
import sys
import wave
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest
from google import genai
from google.genai import types as genai_types

from bench.fake_upstream import FakeUpstream, Reply

OA = {"Authorization": "Bearer sk-test"}
AN = {"x-api-key": "sk-test", "anthropic-version": "2023-06-01"}
GM = {"x-goog-api-key": "sk-test"}


@pytest.fixture
async def up(caplog: pytest.LogCaptureFixture) -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as fake:
        yield fake
    # a handler that raised is logged by aiohttp, not seen by the client: fail on it here
    records = caplog.get_records("setup") + caplog.get_records("call") + caplog.records
    failures = [r for r in records if r.name.startswith("aiohttp") and r.levelno >= 40]
    assert not failures, failures[0].getMessage()


async def call(
    fake: FakeUpstream,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    method: str = "POST",
) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as s:
        async with s.request(method, fake.url + path, json=body, headers=headers) as r:
            return r.status, dict(r.headers), await r.read()


def sse(raw: bytes) -> list[tuple[str | None, bytes]]:
    """(event name, data) per SSE event; CRLF or LF framing."""
    events = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not block.strip():
            continue
        name = None
        data = []
        for line in block.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                data.append(line[6:])
        events.append((name, b"\n".join(data)))
    return events


def oa_chat(content: Any, **extra: Any) -> dict[str, Any]:
    return {"model": "demo-chat", "messages": [{"role": "user", "content": content}], **extra}


def an_msg(content: Any, **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-demo",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


def gm_req(text: str, **extra: Any) -> dict[str, Any]:
    return {"contents": [{"role": "user", "parts": [{"text": text}]}], **extra}


# ---- OpenAI ---------------------------------------------------------------------------------


async def test_openai_reply_is_the_demo_sentence_under_the_requested_model(up) -> None:
    status, headers, raw = await call(up, "/v1/chat/completions", oa_chat("secret prompt"), OA)
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    body = orjson.loads(raw)
    assert body["object"] == "chat.completion" and body["model"] == "demo-chat"
    choice = body["choices"][0]
    assert choice["message"]["content"] == "Hello from the demo upstream. You sent 1 message."
    assert "secret" not in raw.decode()  # the prompt is never echoed by default
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["completion_tokens"] == 9 and usage["prompt_tokens"] >= 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_openai_stream_ends_in_done_and_usage_chunk_only_when_asked(up) -> None:
    body = oa_chat("hi", stream=True, stream_options={"include_usage": True})
    status, headers, raw = await call(up, "/v1/chat/completions", body, OA)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = sse(raw)
    assert events[-1][1] == b"[DONE]"
    chunks = [orjson.loads(data) for _, data in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    pieces = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert "".join(p or "" for p in pieces).startswith("Hello from the demo upstream.")
    assert sum(1 for p in pieces if p) == 9  # one chunk per word
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 9
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"

    _, _, raw = await call(up, "/v1/chat/completions", oa_chat("hi", stream=True), OA)
    chunks = [orjson.loads(d) for _, d in sse(raw)[:-1]]
    assert all("usage" not in c and c["choices"] for c in chunks)


async def test_openai_parallel_tool_calls_stream_with_index_and_split_arguments(up) -> None:
    body = oa_chat("[[fake tools=2]]", stream=True)
    body["tools"] = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    _, _, raw = await call(up, "/v1/chat/completions", body, OA)
    chunks = [orjson.loads(d) for _, d in sse(raw)[:-1]]
    calls: dict[int, dict[str, Any]] = {}
    deltas_per_call: dict[int, int] = {}
    for chunk in chunks:
        for tc in chunk["choices"][0]["delta"].get("tool_calls", []):
            i = tc["index"]
            deltas_per_call[i] = deltas_per_call.get(i, 0) + 1
            if i not in calls:
                assert tc["id"] and tc["function"]["name"] == "lookup"  # first declared tool
                calls[i] = {"id": tc["id"], "args": ""}
            else:
                assert "id" not in tc  # continuation deltas carry no id
            calls[i]["args"] += tc["function"].get("arguments", "")
    assert sorted(calls) == [0, 1] and calls[0]["id"] != calls[1]["id"]
    assert [orjson.loads(c["args"]) for c in calls.values()] == [
        {"city": "Paris"},
        {"city": "London"},
    ]
    assert all(n >= 3 for n in deltas_per_call.values())  # arguments over several deltas
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


# ---- Anthropic ------------------------------------------------------------------------------


async def test_anthropic_message_with_thinking_text_and_tool_use(up) -> None:
    directive = '[[fake reasoning=yes text=ok tool=get_weather args={"city": "Rome"}]]'
    status, _, raw = await call(up, "/v1/messages", an_msg(directive), AN)
    assert status == 200
    body = orjson.loads(raw)
    assert body["type"] == "message" and body["model"] == "claude-demo"
    kinds = [b["type"] for b in body["content"]]
    assert kinds == ["thinking", "text", "tool_use"]
    assert body["content"][0]["signature"]
    assert body["content"][2]["input"] == {"city": "Rome"}
    assert body["content"][2]["id"].startswith("toolu_")
    assert body["stop_reason"] == "tool_use"
    assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] > 0


async def test_anthropic_stream_event_order_and_block_indices(up) -> None:
    body = an_msg("[[fake reasoning tools=2 text=hello]]", stream=True)
    _, _, raw = await call(up, "/v1/messages", body, AN)
    events = [(name, orjson.loads(data)) for name, data in sse(raw)]
    assert all(name == payload["type"] for name, payload in events)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert "ping" in names
    open_block: int | None = None
    starts = []
    block_deltas: dict[int, list[str]] = {}
    for name, payload in events:
        if name == "content_block_start":
            assert open_block is None  # blocks do not overlap
            open_block = payload["index"]
            starts.append((payload["index"], payload["content_block"]["type"]))
        elif name == "content_block_delta":
            assert payload["index"] == open_block
            block_deltas.setdefault(open_block, []).append(payload["delta"]["type"])
        elif name == "content_block_stop":
            assert payload["index"] == open_block
            open_block = None
    assert starts == [(0, "thinking"), (1, "text"), (2, "tool_use"), (3, "tool_use")]
    assert block_deltas[0][-1] == "signature_delta"
    assert set(block_deltas[0][:-1]) == {"thinking_delta"}
    assert set(block_deltas[2]) == {"input_json_delta"}
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"]["output_tokens"] > 1 and delta["usage"]["input_tokens"] > 0


async def test_anthropic_output_limit_and_stop_sequence(up) -> None:
    body = an_msg("hi")
    body["max_tokens"] = 3
    _, _, raw = await call(up, "/v1/messages", body, AN)
    reply = orjson.loads(raw)
    assert reply["stop_reason"] == "max_tokens"
    assert reply["content"][0]["text"] == "Hello from the"
    body = an_msg("[[fake finish=stop_sequence]]", stop_sequences=["STOP!"])
    _, _, raw = await call(up, "/v1/messages", body, AN)
    reply = orjson.loads(raw)
    assert reply["stop_reason"] == "stop_sequence" and reply["stop_sequence"] == "STOP!"


# ---- Gemini ---------------------------------------------------------------------------------


async def test_gemini_generate_content_with_thought_and_function_calls(up) -> None:
    path = "/v1beta/models/gemini-demo:generateContent"
    status, _, raw = await call(up, path, gm_req("[[fake reasoning tools=2]]"), GM)
    assert status == 200
    body = orjson.loads(raw)
    assert body["modelVersion"] == "gemini-demo"
    cand = body["candidates"][0]
    parts = cand["content"]["parts"]
    assert cand["content"]["role"] == "model" and cand["finishReason"] == "STOP"
    assert parts[0]["thought"] is True and parts[0]["thoughtSignature"]
    assert [p["functionCall"]["args"] for p in parts[1:]] == [{"city": "Paris"}, {"city": "London"}]
    usage = body["usageMetadata"]
    assert usage["thoughtsTokenCount"] > 0
    total = usage["promptTokenCount"] + usage["candidatesTokenCount"] + usage["thoughtsTokenCount"]
    assert usage["totalTokenCount"] == total


async def test_gemini_stream_sse_and_json_array_carry_the_same_elements(up) -> None:
    path = "/v1beta/models/gemini-demo:streamGenerateContent"
    status, headers, raw_sse = await call(up, path + "?alt=sse", gm_req("hi"), GM)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    assert raw_sse.startswith(b"data: ")
    from_sse = [orjson.loads(data) for _, data in sse(raw_sse)]
    status, headers, raw_arr = await call(up, path, gm_req("hi"), GM)
    assert headers["Content-Type"].startswith("application/json")
    from_array = orjson.loads(raw_arr)
    assert isinstance(from_array, list) and len(from_array) == len(from_sse) == 9

    def text(elements: list[dict[str, Any]]) -> str:
        return "".join(e["candidates"][0]["content"]["parts"][0]["text"] for e in elements)

    assert text(from_sse) == text(from_array) == "Hello from the demo upstream. You sent 1 message."
    for elements in (from_sse, from_array):
        assert "finishReason" not in elements[0]["candidates"][0]
        assert elements[-1]["candidates"][0]["finishReason"] == "STOP"
        assert elements[-1]["usageMetadata"]["candidatesTokenCount"] == 9


# ---- auth and errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "headers", "status", "check"),
    [
        ("/v1/chat/completions", {}, 401, lambda b: b["error"]["type"] == "invalid_request_error"),
        (
            "/v1/chat/completions",
            {"Authorization": "Bearer wrong"},
            401,
            lambda b: b["error"]["code"] == "invalid_api_key",
        ),
        (
            "/v1/messages",
            {"anthropic-version": "2023-06-01"},
            401,
            lambda b: b["type"] == "error" and b["error"]["type"] == "authentication_error",
        ),
        (
            "/v1/messages",
            {"x-api-key": "right"},
            400,
            lambda b: b["error"]["type"] == "invalid_request_error",
        ),
        (
            "/v1beta/models/g:generateContent",
            {},
            403,
            lambda b: b["error"]["status"] == "PERMISSION_DENIED",
        ),
        (
            "/v1beta/models/g:generateContent?key=wrong",
            {},
            400,
            lambda b: b["error"]["details"][0]["reason"] == "API_KEY_INVALID",
        ),
    ],
)
async def test_auth_rejections_in_each_providers_shape(path, headers, status, check) -> None:
    async with FakeUpstream(require_key="right") as fake:
        body = gm_req("hi") if "v1beta" in path else an_msg("hi") | oa_chat("hi")
        got, _, raw = await call(fake, path, body, headers)
        assert got == status and check(orjson.loads(raw))
        assert "wrong" not in raw.decode()  # a rejected key is not echoed in full
        good = {
            "Authorization": "Bearer right",
            "x-goog-api-key": "right",
            **AN,
            "x-api-key": "right",
        }
        got, _, _ = await call(fake, path.split("?")[0], body, good)
        assert got == 200


async def test_gemini_accepts_the_key_as_a_query_parameter(up) -> None:
    path = "/v1beta/models/g:generateContent?key=anything"
    status, _, _ = await call(up, path, gm_req("hi"))
    assert status == 200


@pytest.mark.parametrize(
    ("path", "body", "headers"),
    [
        ("/v1/chat/completions", oa_chat("[[fake status=429]]"), OA),
        ("/v1/messages", an_msg("[[fake status=429]]"), AN),
        ("/v1beta/models/g:generateContent", gm_req("[[fake status=429]]"), GM),
    ],
)
async def test_rate_limit_in_each_providers_error_shape(up, path, body, headers) -> None:
    status, got_headers, raw = await call(up, path, body, headers)
    err = orjson.loads(raw)
    assert status == 429
    if path.startswith("/v1/chat"):
        assert set(err["error"]) == {"message", "type", "param", "code"}
        assert got_headers["Retry-After"] == "1"
    elif path.startswith("/v1/messages"):
        assert err["type"] == "error" and err["error"]["type"] == "rate_limit_error"
        assert got_headers["Retry-After"] == "1"
    else:
        assert err["error"]["code"] == 429 and err["error"]["status"] == "RESOURCE_EXHAUSTED"
        assert err["error"]["details"][0]["retryDelay"] == "1s"


async def test_malformed_directive_and_missing_fields_are_400(up) -> None:
    status, _, raw = await call(up, "/v1/chat/completions", oa_chat("[[fake bogus=1]]"), OA)
    assert status == 400 and "bogus" in orjson.loads(raw)["error"]["message"]
    body = an_msg("hi")
    del body["max_tokens"]
    status, _, raw = await call(up, "/v1/messages", body, AN)
    assert status == 400 and orjson.loads(raw)["error"]["type"] == "invalid_request_error"


# ---- directives and the queue -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "headers", "text_of"),
    [
        (
            "/v1/chat/completions",
            oa_chat("say this back [[fake echo]]"),
            OA,
            lambda b: b["choices"][0]["message"]["content"],
        ),
        (
            "/v1/chat/completions",
            oa_chat(
                [
                    {"type": "text", "text": "say this back"},
                    {"type": "text", "text": "[[fake echo]]"},
                ]
            ),
            OA,
            lambda b: b["choices"][0]["message"]["content"],
        ),
        (
            "/v1/messages",
            an_msg([{"type": "text", "text": "say this back [[fake echo]]"}]),
            AN,
            lambda b: b["content"][0]["text"],
        ),
        (
            "/v1beta/models/g:generateContent",
            gm_req("say this back [[fake echo]]"),
            GM,
            lambda b: b["candidates"][0]["content"]["parts"][0]["text"],
        ),
    ],
)
async def test_directive_read_from_each_request_shape(up, path, body, headers, text_of) -> None:
    _, _, raw = await call(up, path, body, headers)
    assert text_of(orjson.loads(raw)) == "say this back"


async def test_directive_in_an_earlier_turn_does_not_repeat_after_a_tool_result(up) -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "[[fake tool=get_weather]]"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
    }
    _, _, raw = await call(up, "/v1/chat/completions", body, OA)
    message = orjson.loads(raw)["choices"][0]["message"]
    assert "tool_calls" not in message
    assert message["content"] == "Hello from the demo upstream. You sent 3 messages."


async def test_image_directive_counts_image_parts(up) -> None:
    png = "data:image/png;base64," + base64.b64encode(b"x").decode()
    content = [
        {"type": "text", "text": "what is this [[fake image]]"},
        {"type": "image_url", "image_url": {"url": png}},
        {"type": "image_url", "image_url": {"url": "https://example.invalid/a.jpg"}},
    ]
    _, _, raw = await call(up, "/v1/chat/completions", oa_chat(content), OA)
    text = orjson.loads(raw)["choices"][0]["message"]["content"]
    assert text == "I received 2 image parts: image/png, url."
    body = {
        "contents": [
            {
                "parts": [
                    {"text": "[[fake image]]"},
                    {"inlineData": {"mimeType": "image/jpeg", "data": "eA=="}},
                ]
            }
        ]
    }
    _, _, raw = await call(up, "/v1beta/models/g:generateContent", body, GM)
    assert orjson.loads(raw)["candidates"][0]["content"]["parts"][0]["text"] == (
        "I received 1 image part: image/jpeg."
    )


async def test_queue_is_first_in_first_out_across_endpoints_then_directives(up) -> None:
    up.queue(Reply(text="first"), Reply(status=503, error_message="busy"))
    _, _, raw = await call(up, "/v1/messages", an_msg("[[fake text=ignored]]"), AN)
    assert orjson.loads(raw)["content"][0]["text"] == "first"  # the queue wins over a directive
    status, _, raw = await call(up, "/v1beta/models/g:generateContent", gm_req("hi"), GM)
    assert status == 503 and orjson.loads(raw)["error"] == {
        "code": 503,
        "message": "busy",
        "status": "UNAVAILABLE",
    }
    _, _, raw = await call(up, "/v1/chat/completions", oa_chat("[[fake text=third]]"), OA)
    assert orjson.loads(raw)["choices"][0]["message"]["content"] == "third"


async def test_requests_are_recorded(up) -> None:
    await call(up, "/v1beta/models/g:generateContent?alt=x", gm_req("hi"), {"X-Goog-Api-Key": "k"})
    rec = up.requests[-1]
    assert (rec.method, rec.path, rec.query["alt"]) == (
        "POST",
        "/v1beta/models/g:generateContent",
        "x",
    )
    assert rec.headers["x-goog-api-key"] == "k"  # case-insensitive
    assert rec.json == gm_req("hi") and orjson.loads(rec.body) == rec.json


async def test_usage_override_is_reported_in_each_shape(up) -> None:
    d = "[[fake prompt_tokens=100 completion_tokens=7 cached_tokens=40]]"
    _, _, raw = await call(up, "/v1/chat/completions", oa_chat(d), OA)
    usage = orjson.loads(raw)["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (100, 7)
    assert usage["prompt_tokens_details"]["cached_tokens"] == 40
    _, _, raw = await call(up, "/v1/messages", an_msg(d), AN)
    usage = orjson.loads(raw)["usage"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"], usage["output_tokens"]) == (
        60,
        40,
        7,
    )


# ---- failure modes --------------------------------------------------------------------------


async def test_hang_never_answers_and_the_client_leaving_is_counted(up) -> None:
    timeout = aiohttp.ClientTimeout(total=0.3)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        with pytest.raises(asyncio.TimeoutError):
            await s.post(up.url + "/v1/chat/completions", json=oa_chat("[[fake hang]]"), headers=OA)
    assert await up.wait_disconnect(timeout=5)
    assert up.disconnects == 1
    assert not await up.wait_disconnect(timeout=0.05)  # each disconnect is reported once


async def test_drop_after_cuts_the_stream_without_an_end(up) -> None:
    body = oa_chat("[[fake drop_after=3]]", stream=True)
    got = b""
    async with aiohttp.ClientSession() as s:
        async with s.post(up.url + "/v1/chat/completions", json=body, headers=OA) as r:
            with pytest.raises(aiohttp.ClientPayloadError):
                async for piece in r.content.iter_any():
                    got += piece
    chunks = [orjson.loads(d) for _, d in sse(got)]
    assert b"[DONE]" not in got
    assert sum(1 for c in chunks if c["choices"][0]["delta"].get("content")) == 3
    assert up.disconnects == 0  # the fake closed it: not a client disconnect


async def test_error_after_sends_each_providers_in_stream_error(up) -> None:
    _, _, raw = await call(
        up, "/v1/chat/completions", oa_chat("[[fake error_after=2]]", stream=True), OA
    )
    events = sse(raw)
    assert b"[DONE]" not in raw and "error" in orjson.loads(events[-1][1])
    assert sum(1 for _, d in events if b'"content":"' in d and b'"content":""' not in d) == 2

    _, _, raw = await call(up, "/v1/messages", an_msg("[[fake error_after=2]]", stream=True), AN)
    events = sse(raw)
    assert events[-1][0] == "error"
    assert orjson.loads(events[-1][1])["error"]["type"] == "overloaded_error"
    assert "message_stop" not in [name for name, _ in events]

    path = "/v1beta/models/g:streamGenerateContent"
    _, _, raw = await call(up, path, gm_req("[[fake error_after=2 error_type=INTERNAL]]"), GM)
    elements = orjson.loads(raw)  # still one well-formed JSON array
    assert len(elements) == 3 and elements[-1]["error"]["status"] == "INTERNAL"
    assert elements[-1]["error"]["code"] == 500


async def test_client_leaving_mid_stream_is_counted_and_stream_closed(up) -> None:
    body = oa_chat("[[fake chunks=50 delay_ms=20]]", stream=True)
    async with aiohttp.ClientSession() as s:
        r = await s.post(up.url + "/v1/chat/completions", json=body, headers=OA)
        await r.content.readany()
        assert up.open_streams == 1
        r.close()
        assert await up.wait_disconnect(timeout=5)
    assert up.open_streams == 0 and up.disconnects == 1


# ---- other endpoints ------------------------------------------------------------------------


async def test_models_lists_in_each_providers_shape(up) -> None:
    _, _, raw = await call(up, "/v1/models", None, OA, method="GET")
    assert orjson.loads(raw)["object"] == "list"
    _, _, raw = await call(up, "/v1/models", None, AN, method="GET")
    assert orjson.loads(raw)["data"][0]["type"] == "model"
    _, _, raw = await call(up, "/v1beta/models", None, GM, method="GET")
    assert orjson.loads(raw)["models"][0]["name"].startswith("models/")


async def test_embeddings_are_deterministic_in_float_and_base64(up) -> None:
    body = {"model": "e", "input": ["a", "b", "a"], "dimensions": 8}
    _, _, raw = await call(up, "/v1/embeddings", body, OA)
    data = orjson.loads(raw)["data"]
    assert [len(d["embedding"]) for d in data] == [8, 8, 8]
    assert data[0]["embedding"] == data[2]["embedding"] != data[1]["embedding"]
    _, _, raw = await call(up, "/v1/embeddings", {**body, "encoding_format": "base64"}, OA)
    packed = base64.b64decode(orjson.loads(raw)["data"][0]["embedding"])
    assert struct.unpack("<8f", packed) == pytest.approx(data[0]["embedding"], rel=1e-6)
    path = "/v1beta/models/e:batchEmbedContents"
    req = {"content": {"parts": [{"text": "a"}]}, "outputDimensionality": 8}
    _, _, raw = await call(up, path, {"requests": [req, req]}, GM)
    assert orjson.loads(raw)["embeddings"][0]["values"] == pytest.approx(data[0]["embedding"])


async def test_images_rerank_and_count_tokens(up) -> None:
    _, _, raw = await call(
        up, "/v1/images/generations", {"model": "i", "prompt": "cat", "n": 2}, OA
    )
    urls = [d["url"] for d in orjson.loads(raw)["data"]]
    assert len(urls) == 2
    async with aiohttp.ClientSession() as s, s.get(urls[0]) as r:
        assert r.content_type == "image/png" and (await r.read()).startswith(b"\x89PNG")
    body = {
        "model": "r",
        "query": "red fox",
        "documents": ["blue sky", "a red fox", "red"],
        "top_n": 2,
    }
    _, _, raw = await call(up, "/v1/rerank", body, OA)
    results = orjson.loads(raw)["results"]
    assert [r["index"] for r in results] == [1, 2]
    assert results[0]["relevance_score"] > results[1]["relevance_score"]
    _, _, raw = await call(
        up,
        "/v1/messages/count_tokens",
        {"model": "m", "messages": [{"role": "user", "content": "x" * 40}]},
        AN,
    )
    assert orjson.loads(raw) == {"input_tokens": 10}
    _, _, raw = await call(up, "/v1beta/models/g:countTokens", gm_req("x" * 40), GM)
    assert orjson.loads(raw)["totalTokens"] == 10


async def test_audio_transcription_and_streamed_speech(up) -> None:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(bytes(8000 * 2 * 3))  # three seconds
    form = aiohttp.FormData()
    form.add_field("model", "whisper")
    form.add_field("response_format", "verbose_json")
    form.add_field("file", buf.getvalue(), filename="a.wav", content_type="audio/wav")
    async with aiohttp.ClientSession() as s:
        async with s.post(up.url + "/v1/audio/transcriptions", data=form, headers=OA) as r:
            body = await r.json()
    assert body["duration"] == 3.0 and body["text"] == "This is the demo transcription."
    assert up.requests[-1].form["model"] == "whisper"

    speech = {"model": "tts", "input": "x" * 30, "voice": "alloy", "response_format": "wav"}
    async with aiohttp.ClientSession() as s:
        async with s.post(up.url + "/v1/audio/speech", json=speech, headers=OA) as r:
            assert r.content_type == "audio/wav" and r.headers.get("Transfer-Encoding") == "chunked"
            audio = await r.read()
    with wave.open(io.BytesIO(audio)) as w:
        assert w.getnframes() / w.getframerate() == 2.0  # 15 characters a second


# ---- the official SDKs parse what it sends ------------------------------------------------


async def test_openai_sdk_reads_the_stream(up) -> None:
    oa = openai.AsyncOpenAI(api_key="k", base_url=up.url + "/v1", max_retries=0)
    stream = await oa.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "[[fake tools=2 text=hi]]"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    await oa.close()
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hi"


async def test_anthropic_sdk_accumulates_the_stream(up) -> None:
    an = anthropic.AsyncAnthropic(api_key="k", base_url=up.url, max_retries=0)
    async with an.messages.stream(
        model="m",
        max_tokens=100,
        messages=[{"role": "user", "content": "[[fake reasoning tools=2]]"}],
    ) as s:
        final = await s.get_final_message()
    await an.close()
    assert [b.type for b in final.content] == ["thinking", "tool_use", "tool_use"]
    assert final.content[1].input == {"city": "Paris"} and final.stop_reason == "tool_use"
    assert final.usage.output_tokens > 0


@pytest.mark.filterwarnings("ignore:Inheritance class AiohttpClientSession:DeprecationWarning")
async def test_genai_sdk_reads_the_sse_stream(up) -> None:
    gm = genai.Client(api_key="k", http_options=genai_types.HttpOptions(base_url=up.url))
    pieces = []
    async for chunk in await gm.aio.models.generate_content_stream(
        model="gemini-demo", contents="hello [[fake chunks=3]]"
    ):
        pieces.append(chunk.text or "")
    await gm.aio.aclose()
    assert len(pieces) == 3
    assert "".join(pieces) == "Hello from the demo upstream. You sent 1 message."
    assert up.requests[-1].query["alt"] == "sse"


async def test_cli_prints_one_line_and_serves() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.fake_upstream",
        "--port",
        "0",
        "--chunks",
        "2",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        url = line.split()[-1]
        assert line.startswith("fake upstream listening on http://127.0.0.1:")
        async with aiohttp.ClientSession() as s:
            body = oa_chat("hi", stream=True)
            async with s.post(url + "/v1/chat/completions", json=body, headers=OA) as r:
                events = sse(await r.read())
        contents = [orjson.loads(d)["choices"][0]["delta"].get("content") for _, d in events[:-1]]
        assert sum(1 for c in contents if c) == 2  # --chunks applies
    finally:
        proc.terminate()
        await proc.wait()
    assert proc.returncode == 0
    assert (await proc.stdout.read()) == b""  # nothing per request
