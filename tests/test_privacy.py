"""Contract §6: prompts, replies and full client IPs are found nowhere after real traffic:
not in the SQLite files, not in Redis, not in the logs, not in the admin API."""

from __future__ import annotations

import logging
from pathlib import Path

import aiohttp
import pytest
import redis.asyncio as aioredis

from tests.plugins.servers import ADMIN_TOKEN, KEYS, ServedGateway

MARKER = "zq-privacy-marker-7f3a9c"
CLIENT_IP = "203.0.113.77"  # sent as X-Forwarded-For from the trusted loopback proxy


async def traffic(gw: ServedGateway) -> None:
    """Every client protocol, stream and not, success and failure, with the marker inside."""
    text = f"{MARKER} [[fake echo]]"
    base = {"X-Forwarded-For": CLIENT_IP}
    oa = {**base, "Authorization": f"Bearer {KEYS['alice']}"}
    an = {**base, "x-api-key": KEYS["alice"], "anthropic-version": "2023-06-01"}
    gm = {**base, "x-goog-api-key": KEYS["alice"]}
    chat = {"messages": [{"role": "user", "content": text}]}
    requests = [
        ("/v1/chat/completions", oa, {"model": "chat-small", **chat}),
        ("/v1/chat/completions", oa, {"model": "chat-small", "stream": True, **chat}),
        ("/v1/chat/completions", oa, {"model": "claude-small", "stream": True, **chat}),
        ("/v1/chat/completions", oa, {"model": "no-such-model", **chat}),
        ("/v1/messages", an, {"model": "claude-small", "max_tokens": 64, **chat}),
        ("/v1/messages", an, {"model": "gemini-small", "max_tokens": 64, "stream": True, **chat}),
        ("/v1/messages/count_tokens", an, {"model": "claude-small", **chat}),
        (
            "/v1beta/models/gemini-small:generateContent",
            gm,
            {"contents": [{"role": "user", "parts": [{"text": text}]}]},
        ),
        (
            "/v1beta/models/chat-small:streamGenerateContent?alt=sse",
            gm,
            {"contents": [{"role": "user", "parts": [{"text": text}]}]},
        ),
    ]
    async with aiohttp.ClientSession() as s:
        for path, headers, body in requests:
            async with s.post(gw.url + path, json=body, headers=headers) as r:
                raw = await r.read()
                if r.status == 200 and "count_tokens" not in path:
                    assert MARKER.encode() in raw, path  # the reply really carried it back
        # malformed bodies that contain the marker: the error must not echo them
        for path, headers in (("/v1/chat/completions", oa), ("/v1/messages", an)):
            bad = b'{"model": "chat-small", "messages": "' + MARKER.encode() + b'" oops'
            async with s.post(gw.url + path, data=bad, headers=headers) as r:
                assert r.status == 400
                assert MARKER.encode() not in await r.read()
    await gw.state.writer.flush()


async def redis_contents(url: str) -> bytes:
    r = aioredis.Redis.from_url(url)
    out = []
    try:
        async for key in r.scan_iter(count=1000):
            out.append(key)
            kind = (await r.type(key)).decode()
            if kind == "string":
                out.append(await r.get(key) or b"")
            elif kind == "hash":
                for k, v in (await r.hgetall(key)).items():
                    out += [k, v]
            elif kind == "list":
                out += await r.lrange(key, 0, -1)
            elif kind == "set":
                out += list(await r.smembers(key))
            elif kind == "zset":
                out += await r.zrange(key, 0, -1)
            elif kind == "stream":
                for _id, fields in await r.xrange(key):
                    for k, v in fields.items():
                        out += [k, v]
    finally:
        await r.aclose()
    return b"\n".join(out)


async def test_marker_and_client_ip_are_found_nowhere(
    gateway: ServedGateway, store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await traffic(gateway)
    marker, ip = MARKER.encode(), CLIENT_IP.encode()

    async with aiohttp.ClientSession() as s:
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        seen = b""
        for path in ("/admin/usage?limit=1000", "/admin/keys", "/admin/accounts/alice"):
            async with s.get(gateway.url + path, headers=admin) as r:
                assert r.status == 200
                seen += await r.read()
    assert marker not in seen and ip not in seen
    assert b"203.0.113.0/24" in seen  # the record keeps the range, not the address

    logs = "\n".join(r.getMessage() for r in caplog.records).encode()
    logs += caplog.text.encode()
    assert marker not in logs and ip not in logs

    if store_url.startswith("sqlite:///"):
        db = Path(store_url[len("sqlite:///") :])
        files = [p for p in db.parent.iterdir() if p.name.startswith(db.name)]
        assert files
        stored = b"".join(p.read_bytes() for p in files)
    else:
        stored = await redis_contents(store_url)
    assert stored  # something was written: the search below is not vacuous
    assert marker not in stored and ip not in stored
    assert KEYS["alice"].encode() not in stored  # nor a key's secret
