"""The bodies of the agent workloads (`make bench-agents`): what coding agents send, and what the
upstream answers, generated deterministically (fixed seeds, fixed ids and times).

Seven workloads, each a ``Workload``: a client path and body, the strings every reply must
hold, the upstream location (under the nginx upstream) and what it serves there, and the
multiple of Portkey's (and LiteLLM's) throughput the gateway is held to (issue 30):

- ``chat`` and ``chat-stream``: plain chat completions, non-stream and a 20-chunk stream, the
  bodies of ``bench.payloads`` (``make bench``'s (a) and (b)); ≥ 4× Portkey, ≥ 40× LiteLLM.

- ``responses``: a Responses API stream (Codex's protocol) to an openai channel that speaks it;
  the upstream answers the Responses event stream as ``bench.fake`` renders it.
- ``messages``: an Anthropic Messages stream (Claude Code's protocol) converted to an openai
  chat channel; the upstream answers the chat-completions SSE of ``bench.payloads``.
- ``tools``: a coding agent's turn: a chat-completions stream whose body is ~200 KB (a system
  prompt, files read, tool results) with 40 tool definitions.
- ``embeddings``: a batch of 16 inputs, answered with 16 vectors of 512 floats.
- ``long``: a paced long stream, 200 chunks, the first after 200 ms, then one every 25 ms.

The five agent workloads: ≥ 3× Portkey.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import orjson

from bench import payloads
from bench.fake import Defaults, Reply
from bench.fake import responses as fake_responses
from bench.fake.plan import make_plan

UPSTREAM_MODEL = payloads.UPSTREAM_MODEL
TOOLS, PROMPT_BYTES = 40, 200_000
EMBED_BATCH, EMBED_DIMS = 16, 512
EMBED_MARK = -0.0314159265  # the last value of the last vector: the reply went through whole
LONG_CHUNKS, LONG_FIRST_MS, LONG_DELAY_MS = 200, 200, 25
RESPONSES_CHUNKS = 20


@dataclass(frozen=True)
class Workload:
    key: str
    title: str
    path: str  # what a client of an OpenAI/Anthropic-compatible relay posts to
    model: str  # the model name the relays are configured with
    prefix: str  # the upstream's location: http://127.0.0.1:UP/<prefix>/v1/...
    upstream_path: str  # the path under <prefix>/v1 the relay calls
    body: bytes
    expect: list[str]
    headers: dict[str, str] = field(default_factory=dict)
    paced: bool = False  # measured as N concurrent streams (bench.streams), not with wrk
    times_portkey: float = 3.0  # the gateway's target: this multiple of Portkey's
    times_litellm: float = 0.0  # and of LiteLLM's (0: none)


_SYSTEM = "You are a coding agent. Use the tools to read, search and edit the repository."


def responses_request() -> bytes:
    """A Codex-style Responses request: instructions, an input of messages, tools, streaming,
    nothing stored."""
    return orjson.dumps(
        {
            "model": "bench-responses",
            "instructions": _SYSTEM,
            "input": [
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "Explain what bench/run.py does."}],
                }
            ],
            "tools": [{"type": "function", **t["function"]} for t in tool_definitions()[:4]],  # type: ignore[dict-item]
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "store": False,
            "stream": True,
        }
    )


def responses_stream() -> bytes:
    """The upstream's Responses event stream, rendered by the fake upstream's own module:
    created, in_progress, the message item with RESPONSES_CHUNKS text deltas, completed."""
    body = orjson.loads(responses_request())
    incoming = fake_responses.incoming(body)
    plan = make_plan(
        Reply(),
        incoming,
        Defaults(chunks=RESPONSES_CHUNKS),
        UPSTREAM_MODEL,
        "bench0000000000000000000003",
        1700000000,
    )
    return b"".join(raw for _, raw in fake_responses.stream(plan, body))


def tool_definitions() -> list[dict[str, object]]:
    """TOOLS function tools with JSON schemas of a few typed parameters each (fixed seed)."""
    rng = random.Random(40)
    verbs = ["read", "write", "search", "list", "run", "edit", "diff", "fetch", "grep", "test"]
    nouns = ["file", "directory", "symbol", "command", "patch", "tests", "docs", "issue"]
    tools: list[dict[str, object]] = []
    for i in range(TOOLS):
        name = f"{verbs[i % len(verbs)]}_{nouns[i % len(nouns)]}_{i:02d}"
        props: dict[str, object] = {}
        for j in range(rng.randint(2, 6)):
            kind = rng.choice(["string", "integer", "boolean", "array"])
            prop: dict[str, object] = {"type": kind, "description": _words(rng, 12)}
            if kind == "array":
                prop["items"] = {"type": "string"}
            props[f"param_{j}"] = prop
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": _words(rng, 40),
                    "parameters": {
                        "type": "object",
                        "properties": props,
                        "required": sorted(props)[:1],
                    },
                },
            }
        )
    return tools


_VOCAB = (
    "def class return import self value async await yield lambda if else for while try except "
    "with open path config request reply stream chunk token model channel relay upstream"
).split()


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_VOCAB) for _ in range(n))


def tools_request() -> bytes:
    """A coding agent's turn: system prompt, the task, then pairs of tool calls and their
    results (source files) until the body reaches PROMPT_BYTES, with TOOLS tools; streaming."""
    rng = random.Random(200)
    messages: list[dict[str, object]] = [
        {"role": "system", "content": _SYSTEM + " " + _words(rng, 600)},
        {"role": "user", "content": "Find why the stream stalls and fix it."},
    ]
    body: dict[str, object] = {
        "model": payloads.MODEL["sse"],
        "messages": messages,
        "tools": tool_definitions(),
        "tool_choice": "auto",
        "max_tokens": 4096,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    turn = 0
    while len(orjson.dumps(body)) < PROMPT_BYTES:
        call_id = f"call_{turn:04d}"
        arguments = orjson.dumps({"param_0": f"src/module_{turn}.py"}).decode()
        call = {"id": call_id, "type": "function", "function": {"name": "read_file_00"}}
        call["function"]["arguments"] = arguments  # type: ignore[index]
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        lines = [f"    {_words(rng, 9)}" for _ in range(120)]
        messages.append({"role": "tool", "tool_call_id": call_id, "content": "\n".join(lines)})
        turn += 1
    messages.append({"role": "user", "content": "Now write the fix."})
    return orjson.dumps(body)


def embeddings_request() -> bytes:
    """EMBED_BATCH texts (chunks of code to index) in one request, floats of EMBED_DIMS."""
    rng = random.Random(16)
    return orjson.dumps(
        {
            "model": "bench-embatch",
            "input": [_words(rng, 80) for _ in range(EMBED_BATCH)],
            "encoding_format": "float",
            "dimensions": EMBED_DIMS,
        }
    )


def embeddings_reply() -> bytes:
    """EMBED_BATCH vectors of EMBED_DIMS floats (fixed seed), the last value EMBED_MARK."""
    rng = random.Random(1700000016)
    data = []
    for i in range(EMBED_BATCH):
        values = [round(rng.gauss(0.0, 0.0442), 10) for _ in range(EMBED_DIMS)]
        if i == EMBED_BATCH - 1:
            values[-1] = EMBED_MARK
        data.append({"object": "embedding", "index": i, "embedding": values})
    usage = {"prompt_tokens": 16 * 80, "total_tokens": 16 * 80}
    return orjson.dumps({"object": "list", "data": data, "model": UPSTREAM_MODEL, "usage": usage})


def long_events() -> list[bytes]:
    """The paced stream's events: LONG_CHUNKS chat chunks, a usage chunk, ``[DONE]``."""
    head = {
        "id": "chatcmpl-bench0000000000000000000004",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": UPSTREAM_MODEL,
    }
    events = []
    for i in range(LONG_CHUNKS):
        delta: dict[str, object] = {"content": f"w{i:03d} "}
        if i == 0:
            delta["role"] = "assistant"
        finish = "stop" if i == LONG_CHUNKS - 1 else None
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        events.append(b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n")
    usage = {"prompt_tokens": 31, "completion_tokens": LONG_CHUNKS, "total_tokens": 231}
    events.append(b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events


def long_request() -> bytes:
    body = orjson.loads(payloads.chat_request("sse", True))
    body["model"] = "bench-long"
    return orjson.dumps(body)


def workloads() -> list[Workload]:
    chat, sse = "/v1/chat/completions", "/chat/completions"
    return [
        Workload("chat", "chat, non-stream", chat, payloads.MODEL["json"], "json", sse,
                 payloads.chat_request("json", False), payloads.EXPECT["json"],
                 times_portkey=4.0, times_litellm=40.0),
        Workload("chat-stream", "chat, stream of 20 chunks", chat, payloads.MODEL["sse"],
                 "sse", sse, payloads.chat_request("sse", True), payloads.EXPECT["sse"],
                 times_portkey=4.0, times_litellm=40.0),
        Workload("responses", "Responses stream", "/v1/responses", "bench-responses",
                 "responses", "/responses", responses_request(), ["response.completed"]),
        Workload("messages", "Messages stream → openai channel", "/v1/messages",
                 payloads.MODEL["sse"], "sse", sse, payloads.messages_request("sse"),
                 ["message_stop"], {"anthropic-version": "2023-06-01"}),
        Workload("tools", "200 KB prompt, 40 tools (stream)", chat, payloads.MODEL["sse"],
                 "sse", sse, tools_request(), ["tok19", "[DONE]"]),
        Workload("embeddings", f"embeddings, batch of {EMBED_BATCH}", "/v1/embeddings",
                 "bench-embatch", "embatch", "/embeddings", embeddings_request(),
                 [repr(EMBED_MARK)]),
        Workload("long", f"paced stream ({LONG_FIRST_MS} ms, {LONG_DELAY_MS} ms × {LONG_CHUNKS})",
                 chat, "bench-long", "long", sse, long_request(), ["[DONE]"], paced=True),
    ]  # fmt: skip
