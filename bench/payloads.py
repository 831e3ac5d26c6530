"""The fixed bodies of the benchmark: client requests, upstream replies, and what a reply must hold.

The upstream replies are served verbatim by nginx, so every byte here is on the wire: the JSON
reply is exactly 827 bytes, the SSE reply is 20 content chunks, a usage chunk and ``[DONE]``,
the embeddings reply 2 vectors of 256 floats with usage.
"""

from __future__ import annotations

import random

import orjson

UPSTREAM_MODEL = "upstream-model"
# model names the relays are configured with, one per upstream kind
MODEL = {
    "json": "bench-json",
    "sse": "bench-sse",
    "paced": "bench-paced",
    "embeddings": "bench-embeddings",
}
BENCH_KEY = "sk-bench-0000000000000001"
UPSTREAM_KEY = "sk-upstream-bench"
JSON_REPLY_BYTES = 827
SSE_CHUNKS = 20
EMBED_INPUTS, EMBED_DIMS = 2, 256
# the last value of the last vector: a reply holding it went through whole
EMBED_MARK = -0.0271828183
# what each reply must contain to count as a success (checked on every reply by wrk's Lua)
EXPECT = {
    "json": ["BENCH-REPLY-OK"],
    "sse": ["tok19", "[DONE]"],
    "messages": ["message_stop"],
    "embeddings": [repr(EMBED_MARK)],
}

_MESSAGES = [
    {"role": "system", "content": "You are a terse benchmark assistant."},
    {"role": "user", "content": "Reply with a short paragraph about load testing, please."},
]


def chat_request(kind: str, stream: bool) -> bytes:
    """The OpenAI chat-completions body a client posts for one upstream kind."""
    body: dict[str, object] = {"model": MODEL[kind], "messages": _MESSAGES, "max_tokens": 128}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


def request(kind: str) -> bytes:
    """The body a client posts for one kind: a chat request (streaming for sse) or, for
    embeddings, an embeddings request."""
    if kind == "embeddings":
        return embeddings_request()
    return chat_request(kind, kind == "sse")


def embeddings_request() -> bytes:
    """The OpenAI embeddings body: two short texts, floats asked for (what the fixed reply is)."""
    return orjson.dumps(
        {
            "model": MODEL["embeddings"],
            "input": [
                "Load testing measures how a service behaves under pressure.",
                "A relay should add as little as it can to every request.",
            ],
            "encoding_format": "float",
        }
    )


def embeddings_reply() -> bytes:
    """An OpenAI embeddings reply: EMBED_INPUTS vectors of EMBED_DIMS floats (fixed seed, values
    of the size and precision text-embedding-3 sends), ``usage`` included; the last value of
    the last vector is EMBED_MARK."""
    rng = random.Random(1700000000)
    data = []
    for i in range(EMBED_INPUTS):
        values = [round(rng.gauss(0.0, 0.0625), 10) for _ in range(EMBED_DIMS)]
        if i == EMBED_INPUTS - 1:
            values[-1] = EMBED_MARK
        data.append({"object": "embedding", "index": i, "embedding": values})
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "model": UPSTREAM_MODEL,
            "usage": {"prompt_tokens": 23, "total_tokens": 23},
        }
    )


def messages_request(kind: str) -> bytes:
    """The Anthropic messages body (streaming) used for the converted-stream scenario."""
    return orjson.dumps(
        {
            "model": MODEL[kind],
            "max_tokens": 128,
            "system": _MESSAGES[0]["content"],
            "messages": [_MESSAGES[1]],
            "stream": True,
        }
    )


def json_reply() -> bytes:
    """An OpenAI chat.completion reply of exactly JSON_REPLY_BYTES bytes."""

    def build(pad: int) -> bytes:
        text = "Load testing measures how a service behaves under pressure. " + "x" * pad
        return orjson.dumps(
            {
                "id": "chatcmpl-bench0000000000000000000001",
                "object": "chat.completion",
                "created": 1700000000,
                "model": UPSTREAM_MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": text + " BENCH-REPLY-OK",
                            "refusal": None,
                        },
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": 31,
                    "completion_tokens": 120,
                    "total_tokens": 151,
                    "prompt_tokens_details": {"cached_tokens": 0},
                    "completion_tokens_details": {"reasoning_tokens": 0},
                },
                "service_tier": "default",
                "system_fingerprint": "fp_bench0001",
            }
        )

    pad = JSON_REPLY_BYTES - len(build(0))
    raw = build(pad)
    assert len(raw) == JSON_REPLY_BYTES, len(raw)
    return raw


def sse_events() -> list[bytes]:
    """The SSE reply as a list of events (each ``data: ...\\n\\n``), ending with ``[DONE]``."""
    head = {
        "id": "chatcmpl-bench0000000000000000000002",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": UPSTREAM_MODEL,
        "system_fingerprint": "fp_bench0001",
    }
    events = []
    for i in range(SSE_CHUNKS):
        delta: dict[str, object] = {"content": f"tok{i:02d} "}
        if i == 0:
            delta["role"] = "assistant"
        finish = "stop" if i == SSE_CHUNKS - 1 else None
        chunk = {
            **head,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        events.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    usage = {
        **head,
        "choices": [],
        "usage": {"prompt_tokens": 31, "completion_tokens": SSE_CHUNKS, "total_tokens": 51},
    }
    events.append(b"data: " + orjson.dumps(usage) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def sse_reply() -> bytes:
    return b"".join(sse_events())
