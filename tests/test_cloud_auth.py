"""The clouds' per-attempt authorisation, in process (``upstream/auth.py``, the pool the app
hands out): a Vertex access token got from the service account's token endpoint, kept, and
after a 401 invalidated and renewed for one more try; every Bedrock call signed with SigV4 over
what is sent; Bedrock's errors read by the type its ``x-amzn-errortype`` header names (a
throttle is the client's 429, a refused credential the channel's failure, never a 401); and the
credentials never in what the admin API shows."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest
from multidict import CIMultiDict

from bench.fake.aws_auth import ACCESS_KEY, CREDENTIALS, SECRET_KEY, verify
from bench.fake.google_auth import default_account
from gateway.upstream.google_token import GRANT_TYPE
from tests.plugins.inprocess import ADMIN_TOKEN, HOSTS, InProcess, Scripted, running

TOKEN_URI = HOSTS["token"] + "/token"
PRICE = {"input": 1.0, "output": 2.0}
CLAUDE = "anthropic.claude-3-5-sonnet-20240620-v1:0"
THROTTLED = "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"
QUOTA = "ServiceQuotaExceededException:http://internal.amazon.com/coral/com.amazon.bedrock/"
DENIED = "AccessDeniedException:http://internal.amazon.com/coral/com.amazon.coral.service/"


def cloud_config(**extra_channels: dict[str, Any]) -> dict[str, Any]:
    models = [
        {"name": m, "capabilities": ["chat"], "price": PRICE}
        for m in ("vx-gemini", "vx-claude", "bed-claude", "bed-nova")
    ]
    channels: list[dict[str, Any]] = [
        {
            "name": "vx",
            "type": "vertex",
            "project": "proj-1",
            "region": "us-east5",
            "credentials": json.dumps(default_account().info(TOKEN_URI)),
            "models": ["vx-gemini", "vx-claude"],
            "model_map": {"vx-gemini": "gemini-2.5-flash", "vx-claude": "claude-sonnet-4-5"},
        },
        {
            "name": "bed",
            "type": "bedrock",
            "region": "us-east-1",
            "aws_access_key_id": ACCESS_KEY,
            "aws_secret_access_key": SECRET_KEY,
            "models": ["bed-claude", "bed-nova"],
            "model_map": {"bed-claude": CLAUDE, "bed-nova": "us.amazon.nova-pro-v1:0"},
        },
        *extra_channels.values(),
    ]
    return {"models": models, "channels": channels}


@pytest.fixture
async def clouds(store_url: str) -> AsyncIterator[InProcess]:
    async with running(store_url, **cloud_config()) as app:
        yield app


def token_reply(token: str) -> Scripted:
    return Scripted.json({"access_token": token, "expires_in": 3599, "token_type": "Bearer"})


GEMINI_REPLY = {
    "candidates": [
        {"content": {"role": "model", "parts": [{"text": "hi"}]}, "finishReason": "STOP"}
    ],
    "usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": 3, "totalTokenCount": 14},
}
UNAUTHENTICATED = {
    "error": {
        "code": 401,
        "message": "Request had invalid authentication credentials.",
        "status": "UNAUTHENTICATED",
    }
}
CHAT = {"messages": [{"role": "user", "content": "hello"}]}
CONVERSE_REPLY = {
    "output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},
    "stopReason": "end_turn",
    "usage": {"inputTokens": 7, "outputTokens": 2, "totalTokens": 9},
}


def calls(app: InProcess) -> list[tuple[str, str | None]]:
    """Where each upstream call went (its host) and the bearer token it carried."""
    return [(urlsplit(s.url).netloc, s.headers.get("Authorization")) for s in app.upstream.sent]


async def test_a_vertex_token_is_got_once_and_sent_as_bearer(clouds: InProcess) -> None:
    clouds.upstream.answer("token", token_reply("tok-1"))
    clouds.upstream.answer("vx", Scripted.json(GEMINI_REPLY), Scripted.json(GEMINI_REPLY))
    for _ in range(2):
        reply = await clouds.post("/v1/chat/completions", {"model": "vx-gemini", **CHAT})
        assert reply.status == 200, reply.body
        assert reply.json()["choices"][0]["message"]["content"] == "hi"
    assert calls(clouds) == [
        ("token.test", None),
        ("vx.test", "Bearer tok-1"),
        ("vx.test", "Bearer tok-1"),  # kept: no second token request
    ]
    grant = parse_qs(clouds.upstream.sent[0].raw.decode())
    assert grant["grant_type"] == [GRANT_TYPE] and grant["assertion"][0].count(".") == 2
    sent = clouds.upstream.sent[1]
    assert sent.url == (
        "http://vx.test/v1/projects/proj-1/locations/us-east5/publishers/google/models/"
        "gemini-2.5-flash:generateContent"
    )
    assert "x-goog-api-key" not in {k.lower() for k in sent.headers}


async def test_a_refused_vertex_token_is_invalidated_and_renewed_once(clouds: InProcess) -> None:
    clouds.upstream.answer("token", token_reply("tok-1"), token_reply("tok-2"))
    clouds.upstream.answer(
        "vx", Scripted.json(UNAUTHENTICATED, status=401), Scripted.json(GEMINI_REPLY)
    )
    reply = await clouds.post("/v1/chat/completions", {"model": "vx-gemini", **CHAT})
    assert reply.status == 200, reply.body
    assert calls(clouds) == [
        ("token.test", None),
        ("vx.test", "Bearer tok-1"),
        ("token.test", None),  # the refused token forgotten, a new one got
        ("vx.test", "Bearer tok-2"),
    ]
    await clouds.settled()
    [record] = await clouds.services.store.usage("alice", limit=5)
    assert (record.status, record.prompt_tokens, record.completion_tokens) == (200, 11, 3)
    assert record.cost == 11 * 1 + 3 * 2  # micro-units: the price per million, per token


async def test_a_token_refused_twice_is_the_channels_failure(clouds: InProcess) -> None:
    """Renewed once only: a second 401 is the channel's (502), never the client's 401."""
    clouds.upstream.answer("token", token_reply("tok-1"), token_reply("tok-2"))
    refused = Scripted.json(UNAUTHENTICATED, status=401)
    clouds.upstream.answer("vx", refused, Scripted.json(UNAUTHENTICATED, status=401))
    reply = await clouds.post("/v1/messages", {"model": "vx-claude", "max_tokens": 5, **CHAT})
    assert reply.status == 502
    assert reply.json()["type"] == "error"
    assert [host for host, _ in calls(clouds)] == ["token.test", "vx.test", "token.test", "vx.test"]


async def test_a_token_endpoint_that_refuses_fails_the_channel(clouds: InProcess) -> None:
    clouds.upstream.answer(
        "token", Scripted.json({"error": "invalid_grant", "error_description": "bad"}, 400)
    )
    reply = await clouds.post("/v1/chat/completions", {"model": "vx-gemini", **CHAT})
    assert reply.status == 502
    assert "token endpoint refused" in reply.json()["error"]["message"]
    assert calls(clouds) == [("token.test", None)]  # nothing reached Vertex


async def test_every_bedrock_call_is_signed_over_what_is_sent(clouds: InProcess) -> None:
    clouds.upstream.answer("bed", Scripted.json(CONVERSE_REPLY))
    reply = await clouds.post("/v1/chat/completions", {"model": "bed-nova", **CHAT})
    assert reply.status == 200, reply.body
    sent = clouds.upstream.sent[0]
    assert sent.url == "http://bed.test/model/us.amazon.nova-pro-v1:0/converse"
    headers = CIMultiDict(sent.headers)
    headers["host"] = "bed.test"  # aiohttp adds it from the URL, as it was signed
    path = urlsplit(sent.url).path
    assert verify("POST", path, headers, sent.raw, CREDENTIALS) is None
    assert verify("POST", path, headers, sent.raw + b" ", CREDENTIALS) is not None
    assert headers["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/")


def bedrock_error(status: int, error_type: str, message: str) -> Scripted:
    return Scripted.json({"message": message}, status, **{"x-amzn-errortype": error_type})


@pytest.mark.parametrize(
    ("status", "error_type", "client_status"),
    [
        (429, THROTTLED, 429),
        (400, QUOTA, 429),  # Bedrock's quota is HTTP 400: its header says what it is
        (400, "ValidationException:http://internal.amazon.com/coral/x/", 400),
        (424, "ModelErrorException:http://internal.amazon.com/coral/x/", 502),
    ],
)
async def test_bedrock_errors_are_read_by_their_type(
    clouds: InProcess, status: int, error_type: str, client_status: int
) -> None:
    clouds.upstream.answer("bed", bedrock_error(status, error_type, "nope"))
    reply = await clouds.post("/v1/chat/completions", {"model": "bed-claude", **CHAT})
    assert reply.status == client_status
    if client_status == 429:
        assert reply.json()["error"]["type"] == "rate_limit_error"


async def test_bedrock_access_denied_is_the_channels_failure(store_url: str) -> None:
    """AccessDenied (403) cools the channel and the next is tried; alone, it is a 502, never
    the client's 401 or 403, and AWS's message (which may quote the request) is not shown."""
    backup = {
        "name": "bed2",
        "type": "bedrock",
        "region": "us-east-1",
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": SECRET_KEY,
        "models": ["bed-claude"],
        "model_map": {"bed-claude": CLAUDE},
        "priority": 1,
    }
    async with running(store_url, **cloud_config(backup=backup)) as app:
        app.upstream.answer("bed", bedrock_error(403, DENIED, "User: arn:aws:iam::1:user/x"))
        app.upstream.answer("bed2", bedrock_error(403, DENIED, "User: arn:aws:iam::1:user/x"))
        reply = await app.post("/v1/messages", {"model": "bed-claude", "max_tokens": 5, **CHAT})
        assert reply.status == 502
        message = reply.json()["error"]["message"]
        assert "AccessDeniedException" in message and "arn:aws" not in message
        assert [host for host, _ in calls(app)] == ["bed.test", "bed2.test"]
        assert {"bed", "bed2"} <= set(app.services.health.cooling)


async def test_bedrock_invoke_replies_reach_a_messages_client_as_they_came(
    clouds: InProcess,
) -> None:
    message = {
        "id": "msg_bdrk_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-3-5-sonnet-20240620",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 4},
    }
    clouds.upstream.answer("bed", Scripted.json(message))
    body = {"model": "bed-claude", "max_tokens": 5, **CHAT}
    reply = await clouds.post("/v1/messages", body, **{"anthropic-beta": "tools-2024"})
    assert reply.status == 200
    assert reply.json()["content"] == message["content"]
    assert reply.json()["model"] == "bed-claude"
    sent = clouds.upstream.sent[0]
    assert sent.url == f"http://bed.test/model/{CLAUDE}/invoke"
    assert sent.body["anthropic_version"] == "bedrock-2023-05-31"
    assert sent.body["anthropic_beta"] == ["tools-2024"] and "model" not in sent.body


async def test_cloud_credentials_are_never_shown_by_the_admin_api(clouds: InProcess) -> None:
    reply = await clouds.get("/admin/channels", authorization=f"Bearer {ADMIN_TOKEN}")
    assert reply.status == 200
    raw = reply.body.decode()
    assert SECRET_KEY not in raw and "PRIVATE KEY" not in raw and ACCESS_KEY not in raw
    shown = {c["name"]: c for c in orjson.loads(reply.body)["data"]}
    assert shown["bed"]["aws_secret_access_key_hint"].endswith(SECRET_KEY[-4:])
    assert shown["bed"]["region"] == "us-east-1"
    assert shown["bed"]["base_url"] == "http://bed.test"
    assert shown["vx"]["credentials_hint"].startswith("service account ")
    assert (shown["vx"]["project"], shown["vx"]["region"]) == ("proj-1", "us-east5")
