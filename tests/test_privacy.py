"""Contract §6: prompts, replies and full client IPs are found nowhere after real traffic:
not in the SQLite files, not in Redis, not in the logs, not in the admin API."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

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


# ---- channels' upstream keys -----------------------------------------------------------------

CHANNEL_MARKER = "zq-channel-key-marker-51d2e8"
CHANNEL_KEY = f"sk-{CHANNEL_MARKER}-good"
WRONG_KEY = f"sk-{CHANNEL_MARKER}-wrong"  # the upstream refuses this one (401)
ADDED_KEY = f"sk-{CHANNEL_MARKER}-added"  # a channel made through the admin API


def test_no_secret_is_in_any_repr() -> None:
    """Whatever prints an object (a log line with ``%r``, a traceback's locals, a debugger)
    prints none of the secrets it holds."""
    from gateway.config import Channel, KeySeed, MetricsSettings, Settings
    from gateway.protocols.base import UpstreamCall, UpstreamTarget

    channel = Channel("c", "openai", "http://x/v1", CHANNEL_KEY, ("default",), ("m",))
    settings = Settings(
        store="redis://:store-password@127.0.0.1:6379/0",
        admin_token="admin-secret-token",
        groups=("default",),
        models=(),
        channels=(channel,),
        keys=(KeySeed("k", "sk-seeded-key-secret", "a", "default"),),
        metrics=MetricsSettings(token="metrics-secret-token"),
    )
    target = UpstreamTarget("c", "http://x/v1", CHANNEL_KEY, "m", 16, False)
    call = UpstreamCall("http://x/v1/chat", {"authorization": f"Bearer {CHANNEL_KEY}"}, b"hi")
    for obj in (channel, settings, target, call):
        text = repr(obj)
        for secret in (CHANNEL_MARKER, "store-password", "admin-secret-token",
                       "sk-seeded-key-secret", "metrics-secret-token"):  # fmt: skip
            assert secret not in text, (type(obj).__name__, secret)
    assert "name='c'" in repr(channel)  # the rest is still there to read


async def test_channel_keys_are_in_no_log_and_no_output(
    fake: Any, store_url: str, tmp_path: Path
) -> None:
    """A gateway process at debug level, with the channels' upstream keys marked: requests
    that succeed, fail upstream (500), find the upstream away or refusing the channel's key
    (401), channel tests, a channel made and changed at run time, the admin lists and the
    command line's: the marker is in none of it."""
    import subprocess

    import orjson
    import yaml

    from tests.plugins.processes import GATEWAY, Gateway, free_port
    from tests.plugins.servers import make_config
    from tests.test_relay import dead_port

    fake.require_key = CHANNEL_KEY
    cfg = make_config(fake.url, store_url)
    cfg["journal"] = str(tmp_path / "journal")
    cfg["logging"] = {"level": "debug", "format": "text"}
    for ch in cfg["channels"]:
        ch["api_key"] = CHANNEL_KEY
    cfg["models"] += [
        {"name": "away-small", "capabilities": ["chat"], "price": {"input": 1, "output": 1}},
        {"name": "refused-small", "capabilities": ["chat"], "price": {"input": 1, "output": 1}},
    ]
    cfg["channels"] += [
        {"name": "away", "type": "openai", "base_url": f"http://127.0.0.1:{dead_port()}/v1",
         "api_key": CHANNEL_KEY, "groups": ["default"], "models": ["away-small"]},
        {"name": "refused", "type": "anthropic", "base_url": fake.url, "api_key": WRONG_KEY,
         "groups": ["default"], "models": ["refused-small"]},
    ]  # fmt: skip
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(cfg))
    log = tmp_path / "gateway.log"
    gw = Gateway(config, free_port(), log)
    await gw.start()
    seen: list[bytes] = []  # every reply and every command's output
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    client = {"Authorization": f"Bearer {KEYS['alice']}"}
    try:
        async with aiohttp.ClientSession() as s:

            async def call(method: str, path: str, headers: dict[str, str], body: Any) -> int:
                async with s.request(method, gw.url + path, json=body, headers=headers) as r:
                    seen.append(await r.read())
                    return r.status

            for model, text, stream, want in [
                ("chat-small", "hi", False, 200),
                ("claude-small", "hi", True, 200),
                ("gemini-small", "hi", False, 200),
                ("chat-small", "[[fake status=500]]", False, 502),
                ("claude-small", "[[fake status=500]]", True, 502),
                ("away-small", "hi", False, 502),
                ("refused-small", "hi", False, 502),
                ("refused-small", "hi", True, 503),  # cooling down after its refusal
            ]:
                body = {"model": model, "stream": stream,
                        "messages": [{"role": "user", "content": text}]}  # fmt: skip
                got = await call("POST", "/v1/chat/completions", client, body)
                assert got == want or (want >= 500 and got >= 500), (model, text, got)
            added = {
                **{"name": "added", "type": "gemini", "base_url": fake.url},
                **{"api_key": ADDED_KEY, "groups": ["default"], "models": ["gemini-small"]},
            }
            assert await call("POST", "/admin/channels", admin, added) == 201
            assert await call("PATCH", "/admin/channels/added", admin, {"weight": 2}) == 200
            for name in ("oa", "an", "gm", "away", "refused", "added"):
                assert await call("POST", f"/admin/channels/{name}/test", admin, None) == 200
                assert await call("GET", f"/admin/channels/{name}", admin, None) == 200
            for path in ("/admin/channels", "/admin/usage?limit=100", "/admin/models",
                         "/metrics", "/openapi.json"):  # fmt: skip
                assert await call("GET", path, admin, None) == 200
        tests = [orjson.loads(raw) for raw in seen if raw.startswith(b'{"ok"')]
        assert [t["ok"] for t in tests] == [True, True, True, False, False, False]

        for argv in (["channels", "list"], ["channels", "list", "--json"],
                     ["channels", "test", "refused"], ["channels", "test", "away", "--json"],
                     ["channels", "test", "oa"], ["models", "list", "--json"]):  # fmt: skip
            done = await asyncio.to_thread(
                subprocess.run, [GATEWAY, *argv, "--config", str(config)],
                capture_output=True, timeout=120, check=False,
            )  # fmt: skip
            assert done.returncode in (0, 1), done.stderr
            seen += [done.stdout, done.stderr]
    finally:
        gw.kill(signal.SIGTERM)
        assert await gw.exit_code() == 0
    logged = log.read_bytes()
    assert b"DEBUG" in logged or b"debug" in logged.lower()  # the most talkative level ran
    assert b"channel=refused" in logged  # the failures were logged: the search means something
    marker = CHANNEL_MARKER.encode()
    assert marker not in logged, [ln for ln in logged.splitlines() if marker in ln][:3]
    for out in seen:
        assert marker not in out, out[:500]
    assert any(b"sk-" in out and "…".encode() in out for out in seen)  # hints, at most
