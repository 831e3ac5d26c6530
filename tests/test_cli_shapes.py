"""Requests shaped like the ones coding command-line tools send, against every channel type.

A messages-protocol CLI (Claude Code): ``POST /v1/messages?beta=true`` with system blocks
carrying cache_control, about twenty tools with draft-07 JSON schemas, thinking with a budget,
``anthropic-beta``, metadata.user_id and a streamed reply. A Gemini CLI:
``streamGenerateContent?alt=sse`` with ``x-goog-api-key``, systemInstruction,
functionDeclarations with parametersJsonSchema and a thinkingConfig. Each must succeed, its
stream must follow the client protocol's grammar, and the upstream must get a valid request in
its own format.
"""

from __future__ import annotations

import copy
from typing import Any

import aiohttp
import orjson
import pytest

from bench.fake_upstream import FakeUpstream
from tests.plugins.servers import KEYS, ServedGateway
from tests.test_sdk_matrix import Target, target_param

DRAFT7 = "http://json-schema.org/draft-07/schema#"
ANTHROPIC_BETA = "claude-code-20250219,interleaved-thinking-2025-05-14"


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
        "$schema": DRAFT7,
    }


STR = {"type": "string"}
CLAUDE_TOOLS: list[dict[str, Any]] = [
    {
        "name": "Bash",
        "description": "Executes a given bash command in a persistent shell session.",
        "input_schema": _schema(
            {
                "command": {"type": "string", "description": "The command to execute"},
                "timeout": {"type": "number", "description": "Optional timeout in ms"},
                "run_in_background": {"type": "boolean"},
            },
            ["command"],
        ),
    },
    {
        "name": "Read",
        "description": "Reads a file from the local filesystem.",
        "input_schema": _schema(
            {"file_path": STR, "offset": {"type": "number"}, "limit": {"type": "number"}},
            ["file_path"],
        ),
    },
    {
        "name": "Edit",
        "description": "Performs exact string replacements in files.",
        "input_schema": _schema(
            {
                "file_path": STR,
                "old_string": STR,
                "new_string": STR,
                "replace_all": {"type": "boolean", "default": False},
            },
            ["file_path", "old_string", "new_string"],
        ),
    },
    {
        "name": "TodoWrite",
        "description": "Create and manage a structured task list.",
        "input_schema": _schema(
            {
                "todos": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "content": {"type": "string", "minLength": 1},
                            "status": {
                                "type": "string",
                                "enum": ["pending", "in_progress", "completed"],
                            },
                            "activeForm": {"type": "string", "minLength": 1},
                        },
                        "required": ["content", "status", "activeForm"],
                        "additionalProperties": False,
                    },
                }
            },
            ["todos"],
        ),
    },
    *(
        {
            "name": name,
            "description": f"The {name} tool.",
            "input_schema": _schema({"path": STR, "pattern": STR}, ["pattern"]),
        }
        for name in (
            "Glob Grep LS MultiEdit Write NotebookEdit WebFetch WebSearch Task ExitPlanMode "
            "BashOutput KillShell SlashCommand ListMcpResources ReadMcpResource Skill"
        ).split()
    ),
]


def claude_code_body(model: str) -> dict[str, Any]:
    directive = (
        "[[fake reasoning='The user wants the file.' text='Reading it now.' "
        'tool=Read args={"file_path": "/repo/main.py"}]]'
    )
    return {
        "model": model,
        "max_tokens": 32000,
        "stream": True,
        "temperature": 1,
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "metadata": {"user_id": "user_0123abcd_account__session_5e1f"},
        "system": [
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                "cache_control": {"type": "ephemeral"},
            },
            {
                "type": "text",
                "text": "You are an interactive CLI tool that helps users with software tasks.",
                "cache_control": {"type": "ephemeral"},
            },
        ],
        "tools": CLAUDE_TOOLS,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>Context.</system-reminder>"},
                    {
                        "type": "text",
                        "text": f"{directive} show me main.py",
                        "cache_control": {"type": "ephemeral"},
                    },
                ],
            }
        ],
    }


def parse_sse(raw: bytes) -> list[tuple[str | None, Any]]:
    """(event name, decoded data) per event; a stream must end with a complete event."""
    text = raw.decode().replace("\r\n", "\n")
    assert text.endswith("\n\n"), text[-200:]
    events: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n")[:-1]:
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip())
        assert data, block
        events.append((name, orjson.loads("\n".join(data))))
    return events


def messages_stream_blocks(events: list[tuple[str | None, Any]]) -> list[dict[str, Any]]:
    """The content blocks of a well-formed messages stream: message_start first, blocks opened
    one at a time with contiguous indices, each closed, message_delta then message_stop."""
    names = [name for name, _ in events if name != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    assert all(data["type"] == name for name, data in events)
    start = events[0][1]["message"]
    assert start["role"] == "assistant" and start["usage"]["input_tokens"] > 0
    blocks: list[dict[str, Any]] = []
    open_index: int | None = None
    for name, data in events:
        if name == "content_block_start":
            assert open_index is None and data["index"] == len(blocks)
            open_index = data["index"]
            blocks.append({**data["content_block"], "partial_json": ""})
        elif name == "content_block_delta":
            assert data["index"] == open_index
            block, delta = blocks[data["index"]], data["delta"]
            field = {
                "text_delta": "text",
                "thinking_delta": "thinking",
                "signature_delta": "signature",
                "input_json_delta": "partial_json",
            }[delta["type"]]
            key = "partial_json" if field == "partial_json" else field
            block[key] = block.get(key, "") + delta[field]
        elif name == "content_block_stop":
            assert data["index"] == open_index
            open_index = None
    assert open_index is None
    final = [data for name, data in events if name == "message_delta"][0]
    assert final["delta"]["stop_reason"] == "tool_use"
    assert final["usage"]["output_tokens"] > 0
    for block in blocks:
        if block["type"] == "tool_use":
            block["input"] = orjson.loads(block.pop("partial_json") or "{}")
        else:
            block.pop("partial_json")
    return blocks


@target_param
async def test_claude_code_shaped_stream(
    gateway: ServedGateway, fake: FakeUpstream, target: Target
) -> None:
    body = claude_code_body(target.model)
    headers = {
        "x-api-key": KEYS["alice"],
        "anthropic-version": "2023-06-01",
        "anthropic-beta": ANTHROPIC_BETA,
        "x-app": "cli",
        "user-agent": "claude-cli/2.0.0 (external, cli)",
    }
    async with aiohttp.ClientSession() as s:
        url = gateway.url + "/v1/messages?beta=true"
        async with s.post(url, json=body, headers=headers) as r:
            raw = await r.read()
            assert r.status == 200, raw
            assert r.headers["Content-Type"].startswith("text/event-stream")
    blocks = messages_stream_blocks(parse_sse(raw))
    kinds = [b["type"] for b in blocks]
    assert kinds == ["thinking", "text", "tool_use"]
    assert blocks[0]["thinking"] == "The user wants the file."
    assert blocks[1]["text"] == "Reading it now."
    assert (blocks[2]["name"], blocks[2]["input"]) == ("Read", {"file_path": "/repo/main.py"})
    assert blocks[2]["id"]

    sent = fake.requests[-1]
    up = sent.json
    if target.type == "openai":
        assert sent.path == "/v1/chat/completions" and up["stream"] is True
        assert up["messages"][0]["role"] in ("system", "developer")
        assert "Claude Code" in orjson.dumps(up["messages"][0]).decode()
        assert [t["function"]["name"] for t in up["tools"]] == [t["name"] for t in CLAUDE_TOOLS]
        params = {t["function"]["name"]: t["function"]["parameters"] for t in up["tools"]}
        assert params["TodoWrite"]["properties"]["todos"]["items"]["required"] == [
            "content",
            "status",
            "activeForm",
        ]
        assert up["reasoning_effort"] == "high"
        assert 32000 in (up.get("max_tokens"), up.get("max_completion_tokens"))
        assert b"cache_control" not in sent.body
    elif target.type == "anthropic":  # passthrough: the same body, the client's headers
        assert sent.path == "/v1/messages"
        assert up == {**body, "model": target.upstream_model}
        assert sent.headers["anthropic-beta"] == ANTHROPIC_BETA
        assert sent.headers["anthropic-version"] == "2023-06-01"
        assert sent.headers["x-api-key"] == "upstream-key"
    else:
        assert sent.path == f"/v1beta/models/{target.upstream_model}:streamGenerateContent"
        assert sent.query.get("alt") == "sse"
        system = " ".join(p["text"] for p in up["systemInstruction"]["parts"])
        assert "Claude Code" in system
        decls = [d for tool in up["tools"] for d in tool["functionDeclarations"]]
        assert [d["name"] for d in decls] == [t["name"] for t in CLAUDE_TOOLS]
        for d in decls:  # Gemini's schema subset: no draft-07 keys unless sent as JSON schema
            if "parameters" in d:
                assert "$schema" not in d["parameters"]
                assert "additionalProperties" not in orjson.dumps(d["parameters"]).decode()
        config = up["generationConfig"]
        assert config["maxOutputTokens"] == 32000
        assert config["thinkingConfig"]["thinkingBudget"] > 0
        assert [c["role"] for c in up["contents"]] == ["user"]


# ---------------------------------------------------------------------- Gemini CLI
GEMINI_TOOLS = [
    {
        "name": name,
        "description": f"The {name} tool.",
        "parametersJsonSchema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "An absolute path."},
                "ignore": {"type": "array", "items": {"type": "string"}},
                "respect_git_ignore": {"type": "boolean"},
            },
            "required": ["path"],
        },
    }
    for name in (
        "list_directory read_file search_file_content glob replace write_file web_fetch "
        "read_many_files run_shell_command save_memory google_web_search write_todos"
    ).split()
]


def gemini_cli_body() -> dict[str, Any]:
    directive = (
        "[[fake reasoning='Listing first.' text='Here is the listing.' "
        'tool=list_directory args={"path": "/repo"}]]'
    )
    return {
        "contents": [
            {"role": "user", "parts": [{"text": "This is the Gemini CLI. Today is Monday."}]},
            {"role": "model", "parts": [{"text": "Got it. Thanks for the context!"}]},
            {"role": "user", "parts": [{"text": f"{directive} what is in /repo?"}]},
        ],
        "systemInstruction": {
            "role": "user",
            "parts": [{"text": "You are an interactive CLI agent for software tasks."}],
        },
        "tools": [{"functionDeclarations": GEMINI_TOOLS}],
        "generationConfig": {
            "temperature": 0,
            "topP": 1,
            "thinkingConfig": {"includeThoughts": True, "thinkingBudget": 8192},
        },
    }


@target_param
async def test_gemini_cli_shaped_stream(
    gateway: ServedGateway, fake: FakeUpstream, target: Target
) -> None:
    body = gemini_cli_body()
    headers = {
        "x-goog-api-key": KEYS["alice"],
        "x-goog-api-client": "gl-node/22.0.0",
        "user-agent": "GeminiCLI/0.9.0 (linux; x64)",
    }
    url = f"{gateway.url}/v1beta/models/{target.model}:streamGenerateContent?alt=sse"
    async with aiohttp.ClientSession() as s:
        async with s.post(url, json=copy.deepcopy(body), headers=headers) as r:
            raw = await r.read()
            assert r.status == 200, raw
            assert r.headers["Content-Type"].startswith("text/event-stream")
    events = parse_sse(raw)
    assert events and all(name is None for name, _ in events)
    thoughts, texts, calls = [], [], []
    for i, (_, data) in enumerate(events):
        assert "error" not in data, data
        (cand,) = data["candidates"]
        for part in cand.get("content", {}).get("parts", ()):
            if part.get("thought"):
                thoughts.append(part.get("text", ""))
            elif "functionCall" in part:
                calls.append((part["functionCall"]["name"], part["functionCall"]["args"]))
            elif "text" in part:
                texts.append(part["text"])
        if i < len(events) - 1:
            assert "finishReason" not in cand
    last = events[-1][1]
    assert last["candidates"][0]["finishReason"] == "STOP"
    meta = last["usageMetadata"]
    assert meta["promptTokenCount"] > 0 and meta["candidatesTokenCount"] > 0
    assert meta["totalTokenCount"] >= meta["promptTokenCount"] + meta["candidatesTokenCount"]
    assert "".join(thoughts) == "Listing first."
    assert "".join(texts) == "Here is the listing."
    assert calls == [("list_directory", {"path": "/repo"})]

    sent = fake.requests[-1]
    up = sent.json
    if target.type == "openai":
        assert sent.path == "/v1/chat/completions" and up["stream"] is True
        assert [m["role"] for m in up["messages"]] == ["system", "user", "assistant", "user"]
        fns = [t["function"] for t in up["tools"]]
        assert [f["name"] for f in fns] == [t["name"] for t in GEMINI_TOOLS]
        assert fns[0]["parameters"] == GEMINI_TOOLS[0]["parametersJsonSchema"]
        assert up["reasoning_effort"] == "medium"
        assert up["temperature"] == 0 and up["top_p"] == 1
    elif target.type == "anthropic":
        assert sent.path == "/v1/messages" and up["stream"] is True
        assert "interactive CLI agent" in orjson.dumps(up["system"]).decode()
        assert [m["role"] for m in up["messages"]] == ["user", "assistant", "user"]
        schemas = {t["name"]: t["input_schema"] for t in up["tools"]}
        assert list(schemas) == [t["name"] for t in GEMINI_TOOLS]
        assert schemas["read_file"] == GEMINI_TOOLS[1]["parametersJsonSchema"]
        assert up["thinking"]["type"] == "enabled"
        assert up["max_tokens"] > up["thinking"]["budget_tokens"] >= 1024
        assert sent.headers["anthropic-version"]
    else:  # passthrough: the same body on the channel's key
        assert sent.path == f"/v1beta/models/{target.upstream_model}:streamGenerateContent"
        assert sent.query.get("alt") == "sse"
        assert up == body
        assert sent.headers["x-goog-api-key"] == "upstream-key"


@pytest.mark.parametrize("path", ["/v1beta", "/v1"])
async def test_gemini_cli_key_in_query_on_both_versions(
    gateway: ServedGateway, fake: FakeUpstream, path: str
) -> None:
    """Older Gemini clients put the key in ``?key=``; google-genai's default version is v1."""
    url = (
        f"{gateway.url}{path}/models/gemini-small:streamGenerateContent?alt=sse&key={KEYS['alice']}"
    )
    async with aiohttp.ClientSession() as s:
        async with s.post(url, json=gemini_cli_body()) as r:
            raw = await r.read()
            assert r.status == 200, raw
    assert parse_sse(raw)[-1][1]["candidates"][0]["finishReason"] == "STOP"
    assert fake.requests[-1].headers["x-goog-api-key"] == "upstream-key"
    assert "key" not in fake.requests[-1].query
