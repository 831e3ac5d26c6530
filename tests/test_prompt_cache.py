"""Cache breakpoints for requests converted to the messages protocol
(``protocols/anthropic/cache.py``; the golden cases are tests/fixtures/conversion/*__anthropic/
prompt_cache_*): where they go, at most four, never on a thinking block, never over a client's
own marks, never into a passthrough; ``prompt_cache`` in the channel's configuration."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.config import ConfigError, parse_settings
from gateway.protocols.anthropic.cache import EPHEMERAL, MAX_BREAKPOINTS, add_breakpoints
from gateway.protocols.anthropic.request import encode_messages_body
from gateway.protocols.base import UpstreamTarget
from tests.plugins.inprocess import Scripted, running

MESSAGE = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
    "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
    "usage": {"input_tokens": 5, "output_tokens": 1},
}  # fmt: skip


def marks(body: Any) -> int:
    return str(body).count("'cache_control'")


def target(prompt_cache: bool) -> UpstreamTarget:
    return UpstreamTarget("an", "http://an.test", "k", "claude", 1024, False,
                          prompt_cache=prompt_cache)  # fmt: skip


def test_at_most_four_marks_and_none_on_thinking() -> None:
    body: dict[str, Any] = {
        "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        "tools": [{"name": "t1"}, {"name": "t2"}],
        "messages": [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": [{"type": "text", "text": "x"},
                                              {"type": "thinking", "thinking": "..."}]},
            {"role": "user", "content": "two"},
            {"role": "assistant", "content": [{"type": "text", "text": "y"},
                                              {"type": "thinking", "thinking": "..."}]},
        ],
    }  # fmt: skip
    before = copy.deepcopy(body)
    shared = body["messages"][3]["content"]
    add_breakpoints(body)
    assert marks(body) == MAX_BREAKPOINTS
    assert (
        body["system"][-1]["cache_control"] == EPHEMERAL
        and "cache_control" not in (body["system"][0])
    )
    assert body["tools"][-1]["cache_control"] == EPHEMERAL
    last = body["messages"][3]["content"]
    assert "cache_control" in last[0] and "cache_control" not in last[1]  # not the thinking
    assert body["messages"][0]["content"][0]["cache_control"] == EPHEMERAL  # user turn -2
    assert shared == before["messages"][3]["content"]  # the blocks marked are copies


def test_the_encoder_marks_only_for_prompt_cache_and_never_over_client_marks() -> None:
    req: Any = {"model": "m", "messages": [{"role": "system", "content": "s"},
                                           {"role": "user", "content": "hi"}]}  # fmt: skip
    assert marks(encode_messages_body(req, target(False))) == 0
    assert marks(encode_messages_body(req, target(True))) == 2  # system, the last message
    own: Any = copy.deepcopy(req)
    own["messages"][1]["content"] = [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
    ]
    assert marks(encode_messages_body(own, target(True))) == 0  # left as it is


def settings(channel: dict[str, Any]) -> Any:
    return parse_settings(
        {"store": "sqlite:///x.db", "models": [{"name": "m", "price": {"input": 1}}],
         "channels": [{"name": "c", "base_url": "http://u", "models": ["m"], **channel}]}
    )  # fmt: skip


def test_prompt_cache_is_on_for_anthropic_channels_by_default() -> None:
    assert settings({"type": "anthropic"}).channels[0].prompt_cache is True
    assert settings({"type": "anthropic", "prompt_cache": "off"}).channels[0].prompt_cache is False
    assert settings({"type": "openai"}).channels[0].prompt_cache is False
    assert settings({"type": "bedrock", "region": "us-east-1"}).channels[0].prompt_cache is True
    with pytest.raises(ConfigError, match=r"^channels\[0\]\.prompt_cache: only anthropic"):
        settings({"type": "openai", "prompt_cache": "auto"})
    with pytest.raises(ConfigError, match=r"^channels\[0\]\.prompt_cache: must be auto or off"):
        settings({"type": "anthropic", "prompt_cache": True})


async def test_converted_requests_get_marks_and_passthrough_is_untouched(store_url: str) -> None:
    async with running(store_url) as app:
        app.upstream.answer("an", Scripted.json(MESSAGE), Scripted.json(MESSAGE))
        chat = {
            "model": "claude-small",
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
        }
        assert (await app.post("/v1/chat/completions", chat)).status == 200
        own = {"model": "claude-small", "max_tokens": 10, "system": "s",
               "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
        r = await app.post("/v1/messages", own, **{"anthropic-version": "2023-06-01"})
        assert r.status == 200
        converted, passed = app.upstream.sent
        assert marks(converted.body) == 2
        assert passed.body == {**own, "model": "claude-small"}  # as the client sent it
