"""The relay loop over real sockets: backpressure, retries before the first byte, failover and
cooldown, errors inside a stream."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import aiohttp
import openai
import pytest

from bench.fake_upstream import Reply
from tests.plugins.servers import KEYS, make_config

HEADERS = {"Authorization": f"Bearer {KEYS['alice']}"}


def dead_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def two_channels(fake_url: str, store_url: str, first_url: str, first_key: str) -> dict:
    cfg = make_config(fake_url, store_url)
    first = {
        "name": "first",
        "type": "openai",
        "base_url": first_url,
        "api_key": first_key,
        "groups": ["default"],
        "models": ["chat-small"],
        "priority": 0,
    }
    second = {**first, "name": "second", "base_url": fake_url + "/v1", "api_key": "upstream-key",
              "priority": 1}  # fmt: skip
    cfg["channels"] = [first, second] + [c for c in cfg["channels"] if c["name"] != "oa"]
    return cfg


async def last_record(gw) -> dict:
    await gw.state.writer.flush()
    return (await gw.state.store.usage("alice", 1))[0]


async def test_slow_client_slows_the_upstream_read(gateway, fake) -> None:
    """A client that stops reading stops the gateway reading: the upstream is still writing a
    40 MB stream long after it would have finished had the gateway buffered it."""
    text = "word " * 8_000_000
    # a count the account can pay for: 8M tokens would be cut at the balance (policy.spend)
    fake.queue(Reply(text=text, chunks=4000, completion_tokens=4000))
    body = {"model": "chat-small", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(gateway.v1 + "/chat/completions", json=body, headers=HEADERS) as r:
            received = len(await r.content.readany())
            await asyncio.sleep(1.5)  # the client stalls
            assert fake.open_streams == 1  # the upstream is held back, not drained into memory
            async for piece in r.content.iter_any():
                received += len(piece)
    assert received > len(text)  # then everything arrives, nothing lost
    rec = await last_record(gateway)
    assert rec.status == 200 and rec.completion_tokens > 0


async def test_unreachable_channel_fails_over_before_the_first_byte(fake, store_url) -> None:
    from gateway.config import parse_settings
    from tests.plugins.servers import serve_app

    cfg = two_channels(fake.url, store_url, f"http://127.0.0.1:{dead_port()}/v1", "k")
    async with serve_app(parse_settings(cfg)) as gw:
        async with openai.AsyncOpenAI(base_url=gw.v1, api_key=KEYS["alice"], max_retries=0) as c:
            r = await c.chat.completions.create(
                model="chat-small", messages=[{"role": "user", "content": "[[fake text=ok]]"}]
            )
            assert r.choices[0].message.content == "ok"
            rec = await last_record(gw)
            assert rec.channel == "second" and rec.status == 200


async def test_rejected_channel_credentials_fail_over_and_cool_down(fake, store_url) -> None:
    from gateway.config import parse_settings
    from tests.plugins.servers import serve_app

    fake.require_key = "upstream-key"
    cfg = two_channels(fake.url, store_url, fake.url + "/v1", "revoked-key")
    async with serve_app(parse_settings(cfg)) as gw:
        async with openai.AsyncOpenAI(base_url=gw.v1, api_key=KEYS["alice"], max_retries=0) as c:
            for _ in range(3):
                r = await c.chat.completions.create(
                    model="chat-small", messages=[{"role": "user", "content": "[[fake text=ok]]"}]
                )
                assert r.choices[0].message.content == "ok"
    keys_used = [req.headers.get("Authorization") for req in fake.requests]
    # the revoked channel was tried once, then left alone while it cools down
    assert keys_used.count("Bearer revoked-key") == 1
    assert keys_used.count("Bearer upstream-key") == 3


async def test_every_channel_cooling_down_is_503(fake, store_url) -> None:
    from gateway.config import parse_settings
    from tests.plugins.servers import serve_app

    fake.require_key = "nobody-has-this"
    async with serve_app(parse_settings(make_config(fake.url, store_url))) as gw:
        async with openai.AsyncOpenAI(base_url=gw.v1, api_key=KEYS["alice"], max_retries=0) as c:
            with pytest.raises(openai.APIStatusError) as first:
                await c.chat.completions.create(
                    model="chat-small", messages=[{"role": "user", "content": "hi"}]
                )
            with pytest.raises(openai.APIStatusError) as second:
                await c.chat.completions.create(
                    model="chat-small", messages=[{"role": "user", "content": "hi"}]
                )
    assert first.value.status_code == 502
    assert second.value.status_code == 503
    # the cooldown is 30 s: the client is told when to come back
    assert 25 <= int(second.value.response.headers["retry-after"]) <= 30


async def test_error_inside_a_stream_reaches_the_client_and_the_record(gateway) -> None:
    async with openai.AsyncOpenAI(base_url=gateway.v1, api_key=KEYS["alice"], max_retries=0) as c:
        stream = await c.chat.completions.create(
            model="chat-small",
            messages=[{"role": "user", "content": "[[fake chunks=6 error_after=2]]"}],
            stream=True,
        )
        got = []
        with pytest.raises(openai.APIError):
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    got.append(chunk.choices[0].delta.content)
    assert len(got) == 2  # what came before the error arrived
    rec = await last_record(gateway)
    assert rec.status >= 500


async def test_upstream_cut_mid_stream_is_an_in_stream_error(gateway) -> None:
    body = {
        "model": "chat-small",
        "stream": True,
        "messages": [{"role": "user", "content": "[[fake chunks=6 drop_after=2]]"}],
    }
    async with aiohttp.ClientSession() as s:
        async with s.post(gateway.v1 + "/chat/completions", json=body, headers=HEADERS) as r:
            assert r.status == 200
            raw = await r.read()
    assert b'"error"' in raw and b"[DONE]" not in raw
    rec = await last_record(gateway)
    assert rec.status == 502


async def test_failing_channel_cools_down_only_after_failures_in_a_row(gateway) -> None:
    """One 5xx is passed on and the channel keeps serving; three in a row rest it (503)."""
    async with aiohttp.ClientSession() as s:

        async def ask(text: str) -> int:
            body = {"model": "chat-small", "messages": [{"role": "user", "content": text}]}
            async with s.post(gateway.v1 + "/chat/completions", json=body, headers=HEADERS) as r:
                await r.read()
                return r.status

        assert [await ask("[[fake status=500]]"), await ask("hi")] == [502, 200]
        statuses = [await ask("[[fake status=500]]") for _ in range(3)]
        assert statuses == [502, 502, 502]
        assert await ask("hi") == 503  # resting now


async def test_client_leaving_a_slow_reply_closes_the_upstream_call(gateway, fake) -> None:
    """A plain (non-stream) call whose client goes away stops the upstream call too."""
    body = {"model": "chat-small", "messages": [{"role": "user", "content": "[[fake hang]]"}]}
    async with aiohttp.ClientSession() as s:
        request = asyncio.ensure_future(
            s.post(gateway.v1 + "/chat/completions", json=body, headers=HEADERS)
        )
        await asyncio.sleep(1.5)  # past the moment the gateway starts watching
        request.cancel()  # the client gives up and closes its connection
        with contextlib.suppress(asyncio.CancelledError):
            await request
    assert await fake.wait_disconnect(timeout=5.0)
    rec = await last_record(gateway)
    assert rec.status == 499


async def test_a_record_handed_to_the_writer_is_not_changed_afterwards(gateway) -> None:
    """A stream is recorded before its last byte leaves (the balance is right when the client
    reads it); a client leaving during that last send must not turn the written 200 into a
    499, nor bill it again."""
    from datetime import UTC, datetime

    from gateway.policy.auth import key_hash
    from gateway.policy.billing import Metered
    from gateway.relay.call import Call

    services = gateway.state
    rate = services.catalogue.current.rates["chat-small"]
    ids = ("req-recorded", "req-recorded")
    call = Call.arriving(datetime.now(UTC), ids, "openai", "chat", "127.0.0.0/24")
    call.model, call.channel = "chat-small", "oa"
    call.key = services.cache.key(key_hash(KEYS["alice"]))
    call.bill(Metered(prompt_tokens=10, completion_tokens=5), rate)
    call.record(services.writer, services.observers.metrics, None)
    call.set_status(499)
    call.bill(Metered(prompt_tokens=1_000, completion_tokens=1_000), rate)
    call.record(services.writer, services.observers.metrics, None)

    rec = await last_record(gateway)
    assert (rec.request_id, rec.status, rec.prompt_tokens, rec.completion_tokens) == (
        "req-recorded", 200, 10, 5,
    )  # fmt: skip
    assert rec.cost == 10 * 1 + 5 * 2 and rec.account == "alice"


@pytest.mark.parametrize("stream", [False, True], ids=["reply", "stream"])
async def test_implausible_upstream_token_counts_bill_nothing_and_keep_records_flowing(
    gateway, stream: bool
) -> None:
    """An upstream that reports more tokens than fit the store's integers, or a negative
    count, is broken: its numbers must neither credit the account nor jam the usage writer
    (an unwritable record would hold back every record after it)."""
    before = (await gateway.state.store.get_account("alice")).balance
    async with openai.AsyncOpenAI(base_url=gateway.v1, api_key=KEYS["alice"], max_retries=0) as c:
        directive = (
            "[[fake prompt_tokens=10000000000000000000 completion_tokens=-7]]"  # 1e19 > 2**63
        )
        reply = await c.chat.completions.create(
            model="chat-small",
            messages=[{"role": "user", "content": f"hi {directive}"}],
            stream=stream,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        )
        if stream:
            chunks = [chunk async for chunk in reply]
            usage = chunks[-1].usage
        else:
            usage = reply.usage
        assert (usage.prompt_tokens, usage.completion_tokens) == (10**19, -7)  # passed on as is
        rec = await last_record(gateway)
        assert (rec.status, rec.prompt_tokens, rec.completion_tokens, rec.cost) == (200, 0, 0, 0)

        await c.chat.completions.create(  # the next record is written, and billed
            model="chat-small",
            messages=[
                {"role": "user", "content": "hi [[fake prompt_tokens=10 completion_tokens=5]]"}
            ],
        )
    rec = await last_record(gateway)
    assert (rec.prompt_tokens, rec.completion_tokens, rec.cost) == (10, 5, 10 * 1 + 5 * 2)
    assert len(await gateway.state.store.usage("alice", 10)) == 2
    after = (await gateway.state.store.get_account("alice")).balance
    assert after == before - rec.cost
