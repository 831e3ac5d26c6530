"""The fake's directive is read from the last user turn even when system or developer messages
follow it: Claude Code ends its messages with a ``system`` one, and chat clients may put
instructions last."""

from __future__ import annotations

from typing import Any

import pytest

from bench.fake.incoming import from_anthropic, from_openai
from bench.fake.reply import find_directive

DIRECTIVE = '[[fake text="scripted"]]'


@pytest.mark.parametrize("trailing", ["system", "developer"])
def test_chat_instructions_after_the_users_turn(trailing: str) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": DIRECTIVE}]},
        {"role": trailing, "content": "a reminder"},
    ]
    seen = from_openai({"model": "m", "messages": messages})
    assert seen.last_user_text == DIRECTIVE
    found = find_directive(seen.last_user_text, None)
    assert found is not None and found.reply.text == "scripted"


def test_claude_codes_trailing_system_message() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>context</system-reminder>"},
                {"type": "text", "text": DIRECTIVE},
            ],
        },
        {"role": "system", "content": "Available agent types for the Agent tool: ..."},
    ]
    seen = from_anthropic({"model": "m", "max_tokens": 9, "messages": messages})
    assert seen.last_user_text is not None and seen.last_user_text.endswith(DIRECTIVE)


def test_a_reply_after_the_users_turn_still_ends_it() -> None:
    """Only instructions are passed over: a last assistant or tool turn carries no directive."""
    messages = [
        {"role": "user", "content": DIRECTIVE},
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": "note"},
    ]
    assert from_openai({"model": "m", "messages": messages}).last_user_text is None
