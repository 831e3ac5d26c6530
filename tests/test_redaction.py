"""Credentials never echoed (CONTRACT §4): an upstream whose error text quotes the channel's
key (or any credential) reaches the client in every protocol, whole replies and streams, the
log and the channel test without it; the rest of its message still comes through."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from gateway.errors import UpstreamError
from gateway.policy.redaction import REDACTED, channel_secrets, redact
from tests.plugins.inprocess import ADMIN_TOKEN, Scripted, inprocess_config, running
from tests.test_pipeline import CHAT, anthropic_events, sse_data

CHANNEL_KEY = "chan-secret-7c1e9a4b"  # the channel's own key: no credential shape of its own
# what providers have been seen to echo, and what the gateway must not pass on
ECHOED = {
    "the channel's key": CHANNEL_KEY,
    "a bearer token": "Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig-part",
    "an sk- key": "sk-proj-4f1c2d3e4f5a6b7c8d9e",
    "an AWS access key id": "AKIAIOSFODNN7EXAMPLE",
    "an AWS secret key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "an AWS session token": "IQoJb3JpZ2luX2VjE" + "Ab0+/" * 40,
    "a Google OAuth token": "ya29.a0AfH6SMBx-Q_long.token-value",
    "a Google API key": "AIzaSyA-1234567890abcdefghijklmnopqrs",
    "a private key": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0\n"
    "-----END PRIVATE KEY-----",
}
TOLD = "Invalid request; header was "  # what a client still reads of the upstream's message


@pytest.mark.parametrize("name", list(ECHOED))
def test_each_credential_shape_is_redacted_and_the_rest_kept(name: str) -> None:
    text = f"{TOLD}{ECHOED[name]}; see the docs"
    out = redact(text, (CHANNEL_KEY,))
    assert ECHOED[name] not in out and REDACTED in out
    assert out.startswith(TOLD.rstrip()) and out.endswith("; see the docs")


def test_ordinary_error_text_is_left_alone() -> None:
    text = "The model `gpt-4o-mini` does not exist (request req_8f2a); max_tokens: 4096 > 2048"
    assert redact(text, (CHANNEL_KEY,)) == text


def test_a_channel_s_secrets_are_every_credential_field_it_holds() -> None:
    class Cloud:  # the cloud channel types' fields, read by name
        api_key = ""
        aws_access_key_id = "AKIAIOSFODNN7EXAMPLE"
        aws_secret_access_key = "secret-0123456789"
        aws_session_token = None

    assert set(channel_secrets(Cloud())) == {"AKIAIOSFODNN7EXAMPLE", "secret-0123456789"}


def keyed_channels(store_url: str, responses: bool = False) -> list[dict[str, Any]]:
    """The test config's channels, each with ``CHANNEL_KEY``; the openai ones serving the
    Responses API themselves when ``responses``."""
    channels = inprocess_config(store_url)["channels"]
    for channel in channels:
        channel["api_key"] = CHANNEL_KEY
        if responses and channel["type"] == "openai":
            channel["responses"] = True
    return channels


def echoing(status: int = 400) -> Scripted:
    """An OpenAI-shaped error whose message quotes every credential of ``ECHOED``."""
    message = TOLD + " ".join(ECHOED.values())
    return Scripted.json({"error": {"message": message, "type": "invalid_request_error"}}, status)


def error_message(body: bytes) -> str:
    """The message of an error reply in any of the protocols' shapes."""
    payload = orjson.loads(body)
    err = payload.get("error", payload)
    return str(err["message"])


def no_credential(text: str) -> None:
    for name, secret in ECHOED.items():
        assert secret not in text, name
    assert "sk-alice" not in text  # nor the client's own key


GEMINI = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
CLIENTS = [
    ("/v1/chat/completions", CHAT),  # passthrough to the openai channel
    ("/v1/messages", {**CHAT, "max_tokens": 16}),  # converted
    ("/v1beta/models/chat-small:generateContent", GEMINI),
    ("/v1/responses", {"model": "chat-small", "input": "hi"}),
]


@pytest.mark.parametrize(("path", "payload"), CLIENTS)
async def test_an_upstream_error_reaches_every_protocol_without_credentials(
    store_url: str, path: str, payload: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with running(store_url, channels=keyed_channels(store_url)) as app:
        app.upstream.answer("oa", echoing())
        reply = await app.post(path, payload)
        assert reply.status == 400, reply.body
        message = error_message(reply.body)
        assert message.startswith(TOLD.rstrip()) and REDACTED in message
        no_credential(reply.body.decode())
    no_credential(caplog.text)


async def test_an_error_inside_a_stream_carries_no_credential(store_url: str) -> None:
    events = anthropic_events(["partial"])[:3]  # start, block, one delta: then the error
    text = f"overloaded; {CHANNEL_KEY} and x-api-key: {ECHOED['an sk- key']}"
    events.append({"type": "error", "error": {"type": "overloaded_error", "message": text}})
    async with running(store_url, channels=keyed_channels(store_url)) as app:
        app.upstream.answer("an", Scripted.sse(events, False, True))
        reply = await app.post("/v1/chat/completions", {**CHAT, "model": "claude-small",
                                                         "stream": True})  # fmt: skip
        assert reply.status == 200  # the stream had started
        no_credential(reply.body.decode())
        error = next(c for c in sse_data(reply.body) if isinstance(c, dict) and "error" in c)
        assert error["error"]["message"].startswith("overloaded; " + REDACTED)

        # the messages protocol's own stream, passed through, likewise
        app.upstream.answer("an", Scripted.sse(events, False, True))
        body = {**CHAT, "model": "claude-small", "stream": True, "max_tokens": 16}
        reply = await app.post("/v1/messages", body)
        assert reply.status == 200 and b"event: error" in reply.body
        no_credential(reply.body.decode())


async def test_a_responses_pass_through_stream_s_own_error_event_is_redacted(
    store_url: str,
) -> None:
    """An openai channel with ``responses: true``: the upstream's ``error`` event after output
    goes out as it came, its message without the key; a ``response.failed``'s error too."""
    started = [
        {"type": "response.created", "sequence_number": 0,
         "response": {"id": "r1", "object": "response", "model": "up", "status": "in_progress"}},
        {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
         "item": {"type": "message", "id": "m1", "role": "assistant", "content": []}},
        {"type": "response.output_text.delta", "sequence_number": 2, "item_id": "m1",
         "output_index": 0, "content_index": 0, "delta": "par"},
    ]  # fmt: skip
    error = {"type": "error", "sequence_number": 3, "code": "server_error", "param": None,
             "message": f"failed with key {CHANNEL_KEY}"}  # fmt: skip
    failed = {"type": "response.failed", "sequence_number": 3,
              "response": {"id": "r1", "object": "response", "model": "up", "status": "failed",
                           "error": {"code": "server_error",
                                     "message": f"key {CHANNEL_KEY} refused"}}}  # fmt: skip
    body = {"model": "chat-small", "input": "hi", "stream": True}
    async with running(store_url, channels=keyed_channels(store_url, responses=True)) as app:
        app.upstream.answer("oa", Scripted.sse([*started, error], done=False, named=True))
        reply = await app.post("/v1/responses", body)
        assert reply.status == 200
        no_credential(reply.body.decode())
        [sent] = [e for e in sse_data(reply.body) if e.get("type") == "error"]
        assert sent == {**error, "message": f"failed with key {REDACTED}"}

        app.upstream.answer("oa", Scripted.sse([*started, failed], done=False, named=True))
        reply = await app.post("/v1/responses", body)
        assert reply.status == 200
        no_credential(reply.body.decode())
        [end] = [e for e in sse_data(reply.body) if e.get("type") == "response.failed"]
        assert end["response"]["error"]["message"] == f"key {REDACTED} refused"


async def test_the_channel_test_reports_the_error_without_credentials(store_url: str) -> None:
    async with running(store_url, channels=keyed_channels(store_url)) as app:
        app.upstream.answer("oa", echoing(404))
        reply = await app.post("/admin/channels/oa/test", {}, key=ADMIN_TOKEN)
        assert reply.status == 200, reply.body
        result = reply.json()
        assert result["ok"] is False and result["status"] == 404
        assert result["error"].startswith(TOLD.rstrip()) and REDACTED in result["error"]
        no_credential(reply.body.decode())

        # an upstream that cannot be reached: the gateway's own words, nothing to redact
        app.upstream.answer("oa", Scripted(fail=UpstreamError("cannot reach the upstream")))
        reply = await app.post("/admin/channels/oa/test", {}, key=ADMIN_TOKEN)
        assert reply.json()["error"] == "cannot reach the upstream"
