"""The model square's try-it box for a key the page does not hold (``POST /console/try``): a
key's secret is stored only as its hash, so a signed-in user names one of its own keys by id
and the console relays one small chat as that key, billed and recorded like any call of it.
Another user's key is a 404, a key session may try only its own key, the admin none; the CSRF
header is needed; a disabled key answers 401, an exhausted account 402, as the key's own calls
would. In process, on both stores."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.store import MICRO
from tests.plugins.inprocess import ADMIN_TOKEN, KEYS, Scripted
from tests.test_pipeline import openai_reply
from tests.test_users_api import Client, gateway, new_user, signed_in

MESSAGE = "a message only the upstream may read"


async def try_it(client: Client, key: str, model: str = "chat-small", **more: Any) -> Any:
    return await client.call(
        "POST", "/console/try", {"key": key, "model": model, "message": MESSAGE, **more}
    )


async def own_key(client: Client, group: str = "default") -> dict[str, Any]:
    reply = await client.call("POST", "/console/keys", {"group": group, "name": "laptop"})
    assert reply.status == 201, reply.body
    made: dict[str, Any] = reply.json()
    return made


async def test_a_user_tries_its_own_key_and_pays_for_it_like_any_call(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with gateway(store_url) as app:
        await new_user(app, "dana")
        client = await signed_in(app, "dana")
        key = await own_key(client)
        before = app.services.cache.balance("alice")
        app.upstream.answer("oa", Scripted.json(openai_reply("hello from upstream", 11, 5)))
        reply = await try_it(client, key["id"])
        assert reply.status == 200, reply.body
        out = reply.json()
        assert out["reply"] == "hello from upstream"
        assert out["usage"]["prompt_tokens"] == 11 and out["usage"]["completion_tokens"] == 5
        assert out["request_id"]
        (sent,) = app.upstream.sent
        assert sent.body["messages"] == [{"role": "user", "content": MESSAGE}]
        assert sent.body["max_tokens"] == 512  # a small test, whatever the model's default
        # billed to that key, recorded as its chat, from the browser's address
        await app.settled()
        (record,) = await app.services.store.usage("alice", 5)
        assert (record.key_id, record.model, record.endpoint, record.status) == (
            key["id"], "chat-small", "chat", 200,
        )  # fmt: skip
        assert record.cost == 11 * 1 + 5 * 2 and record.ip_range == "127.0.0.0/24"
        await app.services.cache.refresh()
        assert app.services.cache.balance("alice") == before - record.cost
        keys = (await client.call("GET", "/console/keys")).json()["data"]
        assert [k["spent"] for k in keys] == [record.cost / MICRO]
        assert MESSAGE not in capsys.readouterr().err  # nothing of the exchange is logged


async def test_only_ones_own_key_and_with_the_csrf_header(store_url: str) -> None:
    async with gateway(store_url) as app:
        await new_user(app, "dana")
        await new_user(app, "erin")
        dana, erin = await signed_in(app, "dana"), await signed_in(app, "erin")
        theirs = await own_key(erin)
        for key_id in (theirs["id"], "k-alice", "k-nobody"):  # another user's, the admin's
            reply = await try_it(dana, key_id)
            assert reply.status == 404, key_id
            assert reply.json()["error"]["message"] == f"key {key_id!r} not found"
        mine = await own_key(dana)
        reply = await dana.call("POST", "/console/try", {"key": mine["id"], "model": "chat-small",
                                "message": "hi"}, csrf=False)  # fmt: skip
        assert reply.status == 403 and reply.json()["error"]["code"] == "csrf"
        assert (await Client(app).call("POST", "/console/try", {"key": mine["id"]})).status == 401
        # bad bodies: the console's 400
        too_long = {"key": mine["id"], "model": "chat-small", "message": "x" * 4001}
        for body in ({"key": mine["id"], "model": "chat-small"}, [], {"key": 1}, too_long):
            reply = await dana.call("POST", "/console/try", body)
            assert reply.status == 400, body
        assert app.upstream.sent == []  # none of these reached the upstream


async def test_the_key_s_limits_hold_as_for_its_own_calls(store_url: str) -> None:
    async with gateway(store_url) as app:
        await new_user(app, "dana")
        await new_user(app, "bob", account="broke")
        dana, bob = await signed_in(app, "dana"), await signed_in(app, "bob")
        key = await own_key(dana)
        reply = await try_it(dana, key["id"], model="vip-model")  # not in its group
        assert reply.status == 404 and "vip-model" in reply.json()["error"]["message"]
        reply = await dana.call("PATCH", f"/console/keys/{key['id']}", {"status": "disabled"})
        assert reply.status == 200
        assert (await try_it(dana, key["id"])).status == 401
        broke = await own_key(bob)
        reply = await try_it(bob, broke["id"])
        assert reply.status == 402 and "top up" in reply.json()["error"]["message"]
        assert app.upstream.sent == []


async def test_a_key_session_tries_its_own_key_and_the_admin_none(store_url: str) -> None:
    async with gateway(store_url) as app:
        key_client, admin_client = Client(app), Client(app)
        assert (await key_client.sign_in(token=KEYS["alice"])).status == 200
        assert (await admin_client.sign_in(token=ADMIN_TOKEN)).status == 200
        app.upstream.answer("oa", Scripted.json(openai_reply("hi")))
        reply = await try_it(key_client, "k-alice")
        assert (reply.status, reply.json()["reply"]) == (200, "hi")
        assert (await try_it(key_client, "k-vip")).status == 404  # the same account's other key
        reply = await try_it(admin_client, "k-alice")
        assert reply.status == 403 and "pasting" in reply.json()["error"]["message"]
