"""Custom (freeform) tools through the Responses API, as Codex CLI sends its ``apply_patch``:
the official openai SDK against every channel type over real sockets, plain and streamed. A
channel without custom tools gets a function taking one string (``input``, its grammar told in
the description); its call comes back as a ``custom_tool_call`` with that text, and the
``custom_tool_call_output`` of the next turn reaches the upstream as the function's result. An
openai channel that serves the Responses API gets the tool unchanged and answers with its own
``custom_tool_call``. What a custom tool cannot be is still a clear 400."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from bench.fake_upstream import FakeUpstream
from tests.plugins.servers import ServedGateway
from tests.test_responses_sdk import client, passthrough_channels, respond
from tests.test_sdk_matrix import Target, chat_request, stream_param, target_param, usage_record

PATCH = '*** Begin Patch\n*** Add File: hello.txt\n+hello "world"\n*** End Patch\n'
GRAMMAR = 'start: "*** Begin Patch" LF hunk+ "*** End Patch" LF?\n%import common.LF\n'
APPLY_PATCH: dict[str, Any] = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files with a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR},
}
ASK = "[[fake tool=apply_patch args=" + orjson.dumps({"input": PATCH}).decode() + "]] add hello"


@target_param
@stream_param
async def test_a_custom_tool_call_round_trip(
    gateway: ServedGateway, fake: FakeUpstream, target: Target, stream: bool
) -> None:
    history: list[Any] = [{"role": "user", "content": ASK}]
    first = await respond(gateway, stream, model=target.model, input=history, tools=[APPLY_PATCH])
    (call,) = [item for item in first.output if item.type == "custom_tool_call"]
    assert (call.name, call.input) == ("apply_patch", PATCH)
    # the upstream was offered a function of one string, the grammar in its description
    sent = chat_request(fake, target, stream)
    assert sent.tools == {"apply_patch": {"input"}}
    raw = [r for r in fake.requests if r.path == target.chat_path(stream)][-1].body
    assert orjson.dumps(GRAMMAR)[1:-1] in raw
    history += [item.model_dump(exclude_none=True) for item in first.output]
    done = "Success. Updated the following files:\nA hello.txt"
    history.append({"type": "custom_tool_call_output", "call_id": call.call_id, "output": done})
    second = await respond(gateway, stream, model=target.model, input=history, tools=[APPLY_PATCH])
    assert second.output_text
    sent = chat_request(fake, target, stream)
    ((_, name, args),) = sent.calls
    assert (name, args) == ("apply_patch", {"input": PATCH})
    ((_, result_name, text),) = sent.results
    assert result_name == "apply_patch" and "A hello.txt" in text
    rec = await usage_record(gateway)
    assert (rec["protocol"], rec["channel"], rec["status"]) == ("responses", target.channel, 200)
    assert rec["cost"] > 0


@stream_param
async def test_a_channel_that_serves_responses_gets_custom_tools_unchanged(
    gateway_factory: Any, fake: FakeUpstream, store_url: str, stream: bool
) -> None:
    async with gateway_factory(channels=passthrough_channels(fake, store_url)) as gw:
        resp = await respond(gw, stream, model="chat-small", input=ASK, tools=[APPLY_PATCH])
        (call,) = [item for item in resp.output if item.type == "custom_tool_call"]
        assert (call.name, call.input) == ("apply_patch", PATCH)
        (sent,) = [r for r in fake.requests if r.path == "/v1/responses"]
        assert sent.json["tools"] == [APPLY_PATCH]


@pytest.mark.parametrize(
    ("tool", "says"),
    [
        ({"type": "custom"}, "'tools[0].name'"),
        ({**APPLY_PATCH, "format": {"type": "grammar", "syntax": "ebnf"}}, "'tools[0].format'"),
        ({**APPLY_PATCH, "format": {"type": "json"}}, "'tools[0].format.type'"),
    ],
)
async def test_a_malformed_custom_tool_is_a_400_naming_the_field(
    gateway: ServedGateway, tool: dict[str, Any], says: str
) -> None:
    async with client(gateway) as c:
        with pytest.raises(openai.BadRequestError) as caught:
            await c.responses.create(model="chat-small", input="hi", tools=[tool])
    assert says in str(caught.value)
