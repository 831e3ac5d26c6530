"""Chat completions end to end: the official openai SDK -> gateway -> fake openai upstream,
over real sockets, on both stores (CONTRACT §3, §4, §6)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest

from gateway.relay.call import MAX_RECORDED_MODEL
from tests.plugins.servers import ADMIN_TOKEN, KEYS, ServedGateway

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def client(gw: ServedGateway, key: str = KEYS["alice"]) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gw.v1, api_key=key, max_retries=0)


async def admin_get(gw: ServedGateway, path: str) -> Any:
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.url + path, headers=ADMIN) as r:
            assert r.status == 200, await r.text()
            return await r.json()


async def balance(gw: ServedGateway, account: str = "alice") -> float:
    return float((await admin_get(gw, f"/admin/accounts/{account}"))["balance"])


def cost(usage: Any) -> float:
    """The test catalogue's price: 1 micro-unit per input token, 2 per output token."""
    return (usage.prompt_tokens * 1 + usage.completion_tokens * 2) / 1e6


async def test_create_returns_reply_under_the_client_model_name(gateway, fake) -> None:
    async with client(gateway) as c:
        r = await c.chat.completions.create(
            model="chat-small", messages=[{"role": "user", "content": "[[fake text=pong]]"}]
        )
    assert r.choices[0].message.content == "pong"
    assert r.model == "chat-small"
    assert r.usage is not None and r.usage.completion_tokens > 0
    sent = fake.requests[-1]
    assert sent.path == "/v1/chat/completions"
    assert sent.json["model"] == "up-small"  # model_map applied on the way out
    assert sent.headers["Authorization"] == "Bearer upstream-key"  # the channel's key, not ours


async def test_unknown_fields_pass_through_untouched(gateway, fake) -> None:
    async with client(gateway) as c:
        await c.chat.completions.create(
            model="chat-small",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"vendor_knob": {"depth": 3}, "logit_bias": {"50256": -100}},
        )
    assert fake.requests[-1].json["vendor_knob"] == {"depth": 3}
    assert fake.requests[-1].json["logit_bias"] == {"50256": -100}


async def test_stream_arrives_in_pieces_without_usage_unless_asked(gateway, fake) -> None:
    async with client(gateway) as c:
        stream = await c.chat.completions.create(
            model="chat-small",
            messages=[{"role": "user", "content": "[[fake text='one two three four' chunks=4]]"}],
            stream=True,
        )
        chunks = [ch async for ch in stream]
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "one two three four"
    assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) >= 4
    assert all(ch.usage is None for ch in chunks)
    assert all(ch.model == "chat-small" for ch in chunks)
    # the gateway asked the upstream for usage anyway, to bill the stream
    assert fake.requests[-1].json["stream_options"] == {"include_usage": True}


async def test_stream_usage_chunk_when_asked(gateway) -> None:
    async with client(gateway) as c:
        stream = await c.chat.completions.create(
            model="chat-small",
            messages=[{"role": "user", "content": "hello"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [ch async for ch in stream]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and last.usage.total_tokens > 0


async def test_models_list_follows_the_group(gateway) -> None:
    async with client(gateway) as c:
        ids = [m.id async for m in c.models.list()]
    assert set(ids) == {"chat-small", "claude-small", "gemini-small"}
    async with client(gateway, KEYS["vip"]) as c:
        vip_ids = [m.id async for m in c.models.list()]
    assert "vip-model" in vip_ids


@pytest.mark.parametrize("key", ["sk-unknown-000000000000", KEYS["disabled"], KEYS["expired"]])
async def test_bad_disabled_or_expired_key_is_authentication_error(gateway, key) -> None:
    async with client(gateway, key) as c:
        with pytest.raises(openai.AuthenticationError):
            await c.chat.completions.create(
                model="chat-small", messages=[{"role": "user", "content": "hi"}]
            )


async def test_missing_key_is_401_in_openai_shape(gateway) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(gateway.v1 + "/chat/completions", json={"model": "x"}) as r:
            assert r.status == 401
            body = await r.json()
    assert set(body["error"]) >= {"message", "type", "code"}


async def test_model_outside_the_group_is_not_found(gateway) -> None:
    async with client(gateway) as c:
        with pytest.raises(openai.NotFoundError):
            await c.chat.completions.create(
                model="vip-model", messages=[{"role": "user", "content": "hi"}]
            )


async def test_empty_balance_is_402(gateway) -> None:
    async with client(gateway, KEYS["broke"]) as c:
        with pytest.raises(openai.APIStatusError) as exc:
            await c.chat.completions.create(
                model="chat-small", messages=[{"role": "user", "content": "hi"}]
            )
    assert exc.value.status_code == 402


@pytest.mark.parametrize(
    ("directive", "error", "status"),
    [
        ("[[fake status=429]]", openai.RateLimitError, 429),
        ("[[fake status=500]]", openai.InternalServerError, 502),
        ("[[fake status=503]]", openai.InternalServerError, 503),
        ("[[fake status=400]]", openai.BadRequestError, 400),
    ],
)
async def test_upstream_errors_map_to_contract_statuses(gateway, directive, error, status) -> None:
    async with client(gateway) as c:
        with pytest.raises(error) as exc:
            await c.chat.completions.create(
                model="chat-small", messages=[{"role": "user", "content": directive}]
            )
    assert exc.value.status_code == status


async def test_channel_credentials_rejected_is_502_not_401(gateway, fake) -> None:
    fake.require_key = "something-else"
    async with client(gateway) as c:
        with pytest.raises(openai.APIStatusError) as exc:
            await c.chat.completions.create(
                model="chat-small", messages=[{"role": "user", "content": "hi"}]
            )
    assert exc.value.status_code == 502


async def test_bad_json_and_oversized_body(gateway_factory) -> None:
    async with gateway_factory(limits={"max_request_bytes": 1000}) as gw:
        headers = {"Authorization": f"Bearer {KEYS['alice']}", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as s:
            async with s.post(gw.v1 + "/chat/completions", data=b"{nope", headers=headers) as r:
                assert r.status == 400
                assert (await r.json())["error"]["type"] == "invalid_request_error"
            big = b'{"model":"chat-small","messages":[{"role":"user","content":"' + b"x" * 2000
            async with s.post(
                gw.v1 + "/chat/completions", data=big + b'"}]}', headers=headers
            ) as r:
                assert r.status == 413
            async with s.post(gw.url + "/v1/nowhere", headers=headers) as r:
                assert r.status == 404
                assert "error" in await r.json()


async def test_billing_debits_exactly_and_records_the_call(gateway) -> None:
    before = await balance(gateway)
    async with client(gateway) as c:
        r = await c.chat.completions.create(
            model="chat-small", messages=[{"role": "user", "content": "bill me"}]
        )
    assert await balance(gateway) == pytest.approx(before - cost(r.usage), abs=1e-9)
    usage = await admin_get(gateway, "/admin/usage?account=alice&limit=1")
    rec = usage["data"][0]
    assert rec["model"] == "chat-small"
    assert rec["channel"] == "oa"
    assert rec["protocol"] == "openai"
    assert rec["endpoint"] == "chat"
    assert rec["status"] == 200
    assert rec["prompt_tokens"] == r.usage.prompt_tokens
    assert rec["completion_tokens"] == r.usage.completion_tokens
    assert rec["cost"] == pytest.approx(cost(r.usage))
    assert rec["ip_range"] == "127.0.0.0/24"
    assert isinstance(rec["latency_ms"], int)


async def test_stream_is_billed_even_without_usage_chunk(gateway) -> None:
    before = await balance(gateway)
    async with client(gateway) as c:
        stream = await c.chat.completions.create(
            model="chat-small", messages=[{"role": "user", "content": "stream bill"}], stream=True
        )
        async for _ in stream:
            pass
    rec = (await admin_get(gateway, "/admin/usage?account=alice&limit=1"))["data"][0]
    assert rec["completion_tokens"] > 0
    assert await balance(gateway) == pytest.approx(before - rec["cost"], abs=1e-9)
    assert rec["cost"] > 0


async def test_fifty_concurrent_requests_bill_exactly_fifty_times(gateway) -> None:
    before = await balance(gateway)
    async with client(gateway) as c:
        replies = await asyncio.gather(
            *(
                c.chat.completions.create(
                    model="chat-small", messages=[{"role": "user", "content": "same prompt"}]
                )
                for _ in range(50)
            )
        )
    one = cost(replies[0].usage)
    assert all(cost(r.usage) == one for r in replies)
    assert await balance(gateway) == pytest.approx(before - 50 * one, abs=1e-9)
    records = (await admin_get(gateway, "/admin/usage?account=alice&limit=100"))["data"]
    assert len(records) == 50


async def test_failed_request_leaves_a_record_and_costs_nothing(gateway) -> None:
    before = await balance(gateway)
    async with client(gateway) as c:
        with pytest.raises(openai.NotFoundError):
            await c.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}]
            )
    rec = (await admin_get(gateway, "/admin/usage?account=alice&limit=1"))["data"][0]
    assert rec["status"] == 404 and rec["channel"] is None and rec["cost"] == 0
    assert rec["model"] == "no-such-model"
    assert await balance(gateway) == before


async def test_a_huge_model_name_is_recorded_cut_short(gateway) -> None:
    """The model name is the client's to choose, and an unknown one is recorded with its 404:
    a megabyte of it must not become a megabyte of usage record."""
    name = "m" * 1_000_000
    async with client(gateway) as c:
        with pytest.raises(openai.NotFoundError):
            await c.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "hi"}]
            )
    rec = (await admin_get(gateway, "/admin/usage?account=alice&limit=1"))["data"][0]
    assert rec["status"] == 404 and rec["model"] == "m" * MAX_RECORDED_MODEL


async def test_client_disconnect_closes_the_upstream_stream(gateway, fake) -> None:
    body = {
        "model": "chat-small",
        "stream": True,
        "messages": [{"role": "user", "content": "[[fake chunks=200 delay_ms=50]]"}],
    }
    headers = {"Authorization": f"Bearer {KEYS['alice']}"}
    async with aiohttp.ClientSession() as s:
        r = await s.post(gateway.v1 + "/chat/completions", json=body, headers=headers)
        assert r.status == 200
        await r.content.readany()  # the first piece arrived: the stream is live
        r.close()  # the client goes away mid-stream
    # the upstream sees its connection closed (the issue asks: within one second)
    assert await fake.wait_disconnect(timeout=1.0)
    await gateway.state.writer.flush()
    rec = (await admin_get(gateway, "/admin/usage?account=alice&limit=1"))["data"][0]
    assert rec["status"] == 499
