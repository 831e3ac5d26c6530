"""What an open stream keeps of its request: a pass-through job lets its parsed body go once
its attempt answered, and still estimates its prompt (for a stream cut short before the
upstream counted it) from the bytes it sent, as it would have from the parsed body."""

from __future__ import annotations

import orjson

from gateway.kinds.chat import ChatJob
from gateway.protocols import CLIENTS
from gateway.protocols.base import UpstreamCall

PAYLOAD = {
    "model": "chat-small",
    "stream": True,
    "messages": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "What colour is the sky on a clear day, seen from Earth?"},
    ],
}


def job() -> ChatJob:
    client = CLIENTS["openai"]
    payload = orjson.loads(orjson.dumps(PAYLOAD))
    return ChatJob(client, client.match("chat", payload, None, b"", None), payload)


def test_a_released_pass_through_job_keeps_no_parsed_body_and_estimates_alike() -> None:
    expected = job().prompt_estimate()
    assert expected > 0
    released = job()
    renamed = {**PAYLOAD, "model": "upstream-name"}  # as a pass-through sends it
    released.sent = UpstreamCall("http://upstream/v1/chat/completions", {}, orjson.dumps(renamed))
    released.release()
    assert released.payload is None
    assert released.prompt_estimate() == expected


def test_a_job_with_nothing_sent_keeps_its_body_until_estimated() -> None:
    kept = job()
    kept.release()
    assert kept.payload is not None
    assert kept.prompt_estimate() > 0
