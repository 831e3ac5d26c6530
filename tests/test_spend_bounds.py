"""An upstream that reports more than it could have used (100x the asked tokens) cannot take
an account far below zero (``policy.spend``): a request that sets its maximum output is billed
at most that; a stream is metered as it runs and cut, with a 402 inside it in the client's
protocol, once it costs more than its account (or key quota) could pay, and billed that much
at most. In process: the upstream is scripted, prices are 1 micro-unit a prompt token and 2
an output token."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from gateway.store import MICRO
from tests.plugins.inprocess import ADMIN_TOKEN, InProcess, Scripted, inprocess_config, running
from tests.test_pipeline import CHAT, openai_reply, sse_data
from tests.test_upstream_faults import anthropic_start, openai_chunk

POOR = "sk-poor-0000000000000042"
BALANCE = 10_000  # micro-units: 0.01
ASKED = 100  # max_tokens
LIE = 100 * ASKED  # what the upstream reports having generated
PROMPT = 7


def lying_reply() -> Scripted:
    return Scripted.json(openai_reply("short", prompt=PROMPT, completion=LIE))


def lying_stream(usage_completion: int = LIE, texts: int = 1) -> Scripted:
    """A few words, then a usage chunk claiming ``usage_completion`` output tokens."""
    chunks = [openai_chunk("a few words") for _ in range(texts)]
    end = {**openai_chunk(""), "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    usage = {
        **openai_chunk(""),
        "choices": [],
        "usage": {"prompt_tokens": PROMPT, "completion_tokens": usage_completion,
                  "total_tokens": PROMPT + usage_completion},
    }  # fmt: skip
    return Scripted.sse([*chunks, end, usage])


@pytest.fixture
async def app(store_url: str) -> AsyncIterator[InProcess]:
    cfg = inprocess_config(store_url)
    accounts = [*cfg["accounts"], {"id": "poor", "balance": BALANCE / MICRO}]
    keys = [*cfg["keys"], {"id": "k-poor", "key": POOR, "account": "poor", "group": "default"}]
    async with running(store_url, accounts=accounts, keys=keys) as running_app:
        yield running_app


async def balance_of(app: InProcess, account: str = "poor") -> int:
    await app.settled()
    found = await app.services.store.get_account(account)
    assert found is not None
    return found.balance


async def only_record(app: InProcess, account: str = "poor") -> Any:
    await app.settled()
    [record] = await app.services.store.usage(account, 10)
    return record


async def test_a_whole_reply_is_billed_no_more_output_than_it_asked_for(app: InProcess) -> None:
    app.upstream.answer("oa", lying_reply())
    reply = await app.post("/v1/chat/completions", {**CHAT, "max_tokens": ASKED}, key=POOR)
    assert reply.status == 200
    record = await only_record(app)
    assert (record.prompt_tokens, record.completion_tokens) == (PROMPT, ASKED)
    assert await balance_of(app) == BALANCE - (PROMPT + 2 * ASKED)  # not -1.04 but 0.0098


async def test_every_choice_s_output_is_billed(app: InProcess) -> None:
    """n=3: the upstream counts every choice's output, up to three times the maximum."""
    app.upstream.answer("oa", Scripted.json(openai_reply("x", prompt=PROMPT, completion=250)))
    body = {**CHAT, "max_tokens": ASKED, "n": 3}
    assert (await app.post("/v1/chat/completions", body, key=POOR)).status == 200
    assert (await only_record(app)).completion_tokens == 250


async def test_a_stream_that_asked_a_maximum_is_billed_no_more(app: InProcess) -> None:
    app.upstream.answer("oa", lying_stream())
    body = {**CHAT, "max_tokens": ASKED, "stream": True}
    reply = await app.post("/v1/chat/completions", body, key=POOR)
    assert reply.body.endswith(b"data: [DONE]\n\n")  # its maximum fits the balance: not cut
    record = await only_record(app)
    assert (record.status, record.completion_tokens) == (200, ASKED)


@pytest.mark.parametrize("n", [1, 2])
async def test_streams_without_a_maximum_are_cut_at_what_the_account_can_pay(
    app: InProcess, n: int
) -> None:
    """No maximum to go by: the lying usage trips the meter; each client gets its words and
    a 402 in its stream; ``n`` such streams at once draw on one balance, so the account ends
    no lower than their prompts' cost below zero."""
    app.upstream.answer("oa", *[lying_stream() for _ in range(n)])
    body = {**CHAT, "stream": True}
    replies = await asyncio.gather(
        *(app.post("/v1/chat/completions", body, key=POOR) for _ in range(n))
    )
    for reply in replies:
        events = sse_data(reply.body)
        assert events[0]["choices"][0]["delta"]["content"] == "a few words"
        error = events[-1]["error"]
        assert error["type"] == "insufficient_balance" and "stopped" in error["message"]
    await app.settled()
    records = await app.services.store.usage("poor", 10)
    assert [r.status for r in records] == [402] * n
    assert await balance_of(app) >= -PROMPT * n  # not -1.04 (one), -2.09 (two)
    assert app.services.cache.held("poor") == 0  # every hold, grown or not, let go


async def test_a_long_honest_stream_on_a_rich_account_grows_its_hold_and_ends(
    store_url: str,
) -> None:
    """Past what its hold covered (the model's default output, 10 tokens here), a stream's
    hold grows while the account has money: it is not cut, and is billed all it used."""
    cfg = inprocess_config(store_url)
    models = [{**m, "default_max_tokens": 10} for m in cfg["models"]]
    async with running(store_url, models=models) as app:
        chunks = [openai_chunk(" token") for _ in range(60)]
        end = {**openai_chunk(""), "choices": [],
               "usage": {"prompt_tokens": PROMPT, "completion_tokens": 60}}  # fmt: skip
        app.upstream.answer("oa", Scripted.sse([*chunks, end]))
        reply = await app.post("/v1/chat/completions", {**CHAT, "stream": True})
        assert reply.body.endswith(b"data: [DONE]\n\n")
        record = await only_record(app, "alice")
        assert (record.status, record.completion_tokens) == (200, 60)
        assert app.services.cache.held("alice") == 0


async def test_an_honest_stream_is_cut_when_its_output_outgrows_the_balance(
    store_url: str,
) -> None:
    """A hundred tokens, one a chunk as OpenAI streams them, on a balance of 0.0001 (what 50
    output tokens cost): cut after about fifty, its upstream let go, billed at most 50."""
    cfg = inprocess_config(store_url)
    accounts = [*cfg["accounts"], {"id": "poor", "balance": 0.0001}]
    keys = [*cfg["keys"], {"id": "k-poor", "key": POOR, "account": "poor", "group": "default"}]
    async with running(store_url, accounts=accounts, keys=keys) as app:
        app.upstream.answer("oa", Scripted.sse([openai_chunk(" token") for _ in range(100)]))
        reply = await app.post("/v1/chat/completions", {**CHAT, "stream": True}, key=POOR)
        assert reply.status == 200
        events = sse_data(reply.body)
        assert "error" in events[-1] and "[DONE]" not in events
        relayed = sum(1 for e in events if isinstance(e, dict) and e.get("choices"))
        assert 45 <= relayed <= 51  # the fifty it can pay for, and the read that passed them
        assert app.upstream.replies[0].closed
        record = await only_record(app)
        assert (record.status, record.completion_tokens) == (402, 50)
        assert await balance_of(app) >= -PROMPT  # at most its prompt below zero


async def test_a_cut_reaches_a_messages_client_as_its_error_event(app: InProcess) -> None:
    events = anthropic_start(PROMPT)
    events.append({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                   "usage": {"output_tokens": LIE}})  # fmt: skip
    events.append({"type": "message_stop"})
    app.upstream.answer("an", Scripted.sse(events, False, True))
    body = {"model": "claude-small", "max_tokens": 10**6, "stream": True,
            "messages": CHAT["messages"]}  # fmt: skip
    reply = await app.post("/v1/messages", body, key=POOR, **{"anthropic-version": "2023-06-01"})
    assert b"event: error\n" in reply.body
    error = orjson.loads(reply.body.rsplit(b"data: ", 1)[1])
    assert error["error"]["type"] == "billing_error"
    assert await balance_of(app) >= -PROMPT


async def test_a_key_quota_bounds_a_lying_stream_however_rich_the_account(
    app: InProcess,
) -> None:
    made = await app.post(
        "/admin/keys", {"account": "alice", "group": "default", "quota": 0.01}, key=ADMIN_TOKEN
    )
    assert made.status in (200, 201), made.body
    secret, key_id = made.json()["key"], made.json()["id"]
    app.upstream.answer("oa", lying_stream())
    reply = await app.post("/v1/chat/completions", {**CHAT, "stream": True}, key=secret)
    assert b"insufficient_balance" in reply.body
    await app.settled()
    [record] = [r for r in await app.services.store.usage("alice", 10) if r.key_id == key_id]
    assert record.cost <= 10_000 + PROMPT  # the quota, and the prompt


async def test_a_stream_in_a_group_with_a_ratio_is_cut_at_what_the_balance_pays_at_it(
    store_url: str,
) -> None:
    """The same hundred tokens on the same 0.0001, with a key of a group whose ratio is 2
    (CONTRACT §5b): each output token costs twice as much, so it is cut after about 25,
    billed at most 25 at the ratio, and its account ends at most its prompt below zero."""
    cfg = inprocess_config(store_url)
    accounts = [*cfg["accounts"], {"id": "poor", "balance": 0.0001}]
    keys = [*cfg["keys"], {"id": "k-poor", "key": POOR, "account": "poor", "group": "vip"}]
    groups = ["default", {"name": "vip", "ratio": 2}]
    async with running(store_url, accounts=accounts, keys=keys, groups=groups) as app:
        app.upstream.answer("oa", Scripted.sse([openai_chunk(" token") for _ in range(100)]))
        reply = await app.post("/v1/chat/completions", {**CHAT, "stream": True}, key=POOR)
        assert reply.status == 200
        events = sse_data(reply.body)
        assert "error" in events[-1] and "[DONE]" not in events
        relayed = sum(1 for e in events if isinstance(e, dict) and e.get("choices"))
        assert 20 <= relayed <= 26  # the 25 it can pay for at twice the price
        record = await only_record(app)
        assert (record.status, record.completion_tokens) == (402, 25)
        assert record.cost == 2 * (record.prompt_tokens + 2 * 25)  # at the ratio
        assert await balance_of(app) >= -2 * PROMPT
        assert app.services.cache.held("poor") == 0
