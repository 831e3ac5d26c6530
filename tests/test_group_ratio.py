"""A group's price ratio (CONTRACT §2, §5b): ``groups: [default, {name: vip, ratio: 1.5}]``
in the file, or ``ratio`` on a group made through the admin API, multiplies every cost of a
request made with a key of that group: the usage record's cost, the balance it is debited
from, the billing endpoints, and what the request holds while it runs. In process, on both
stores."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gateway.config import ConfigError, parse_settings
from gateway.store import MICRO
from tests.plugins.inprocess import ADMIN_TOKEN, KEYS, InProcess, Scripted, drive, running
from tests.plugins.servers import make_config
from tests.test_pipeline import openai_reply

# max_tokens above the 333 output tokens the upstream reports: a count past the request's own
# maximum is not believed (policy/spend.py)
CHAT = {"model": "chat-small", "max_tokens": 500, "messages": [{"role": "user", "content": "hi"}]}
GROUPS = ["default", {"name": "vip", "ratio": 1.5}]
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"}


async def admin(app: InProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    import orjson

    raw = b"" if body is None else orjson.dumps(body)
    reply = await drive(app.app, method, path, raw, ADMIN)
    return reply.status, reply.json()


async def cost_of(app: InProcess, key: str, prompt: int = 1000, completion: int = 333) -> Any:
    """One chat with ``key``, the upstream reporting these tokens; its usage record, and what
    the account held while it ran."""
    held: list[int] = []
    scripted = app.upstream.request

    async def watching(*args: Any, **kwargs: Any) -> Any:
        held.append(app.services.cache.held("alice"))
        return await scripted(*args, **kwargs)

    app.upstream.request = watching  # type: ignore[method-assign]
    app.upstream.answer("oa", Scripted.json(openai_reply("hi", prompt, completion)))
    try:
        reply = await app.post("/v1/chat/completions", CHAT, key=key)
    finally:
        app.upstream.request = scripted  # type: ignore[method-assign]
    assert reply.status == 200, reply.body
    await app.settled()
    record = (await app.services.store.usage("alice", 1))[0]
    return record, held[0]


def test_the_file_gives_a_group_a_ratio_and_names_a_bad_one() -> None:
    settings = parse_settings(make_config("http://x", "sqlite:///x.db", groups=GROUPS))
    assert settings.groups == ("default", "vip")
    assert settings.group_ratios == {"vip": 1.5}
    for groups, message in (
        (["default", {"name": "vip", "ratio": 0}], "groups[1].ratio: must be a number from"),
        (["default", {"name": "vip", "ratio": "x"}], "groups[1].ratio: must be a number"),
        (["default", {"name": "vip", "colour": 1}], "groups[1].colour: unknown field"),
        (["default", "default"], "groups[1].name: duplicate 'default'"),
        ([], "groups: at least one group is needed"),
    ):
        with pytest.raises(ConfigError) as err:
            parse_settings(make_config("http://x", "sqlite:///x.db", groups=groups))
        assert str(err.value).startswith(message), err.value


async def test_every_cost_of_a_vip_request_is_one_and_a_half_times(store_url: str) -> None:
    async with running(store_url, groups=GROUPS) as app:
        plain, plain_held = await cost_of(app, KEYS["alice"])
        vip, vip_held = await cost_of(app, KEYS["vip"])
        assert (plain.key_id, vip.key_id) == ("k-alice", "k-vip")
        assert plain.cost == 1000 * 1 + 333 * 2  # the test price: 1 and 2 micro-units a token
        exact = plain.cost * 3  # 1.5 x, in half micro-units
        assert (vip.cost, vip.cost_pico) == (exact // 2, (exact % 2) * 500_000)
        assert vip_held == math.ceil(plain_held * 1.5)  # the hold too
        account = await app.services.store.get_account("alice")
        assert account is not None
        # 10 units less both requests (the half micro-unit is carried, CONTRACT §6)
        assert account.balance == 10 * MICRO - plain.cost - vip.cost
        assert account.carry == vip.cost_pico
        # the billing endpoint a chat UI reads: what the vip key's account spent
        today = datetime.now(UTC).date()
        days = f"start_date={today - timedelta(days=1)}&end_date={today + timedelta(days=1)}"
        reply = await app.get(
            f"/v1/dashboard/billing/usage?{days}", authorization=f"Bearer {KEYS['vip']}"
        )
        assert reply.status == 200, reply.body
        # in hundredths of a unit: what was debited (the carried half micro-unit not yet)
        spent = (plain.cost + vip.cost) / MICRO * 100
        assert reply.json()["total_usage"] == pytest.approx(spent)


async def test_a_group_made_through_the_admin_api_takes_a_ratio(store_url: str) -> None:
    async with running(store_url, groups=GROUPS) as app:
        status, made = await admin(app, "POST", "/admin/groups", {"name": "team", "ratio": 2})
        assert (status, made) == (
            201,
            {"name": "team", "ratio": 2.0, "tool": None, "origin": "api"},
        )
        status, err = await admin(app, "POST", "/admin/groups", {"name": "t2", "ratio": -1})
        assert status == 400 and err["error"]["message"].startswith("ratio: must be a number")
        status, err = await admin(app, "PATCH", "/admin/groups/vip", {"ratio": 3})
        assert status == 409  # the file's
        status, changed = await admin(app, "PATCH", "/admin/groups/team", {"ratio": 0.5})
        assert (status, changed["ratio"]) == (200, 0.5)
        status, groups = await admin(app, "GET", "/admin/groups")
        assert [(g["name"], g["ratio"]) for g in groups["data"]] == [
            ("default", 1.0), ("vip", 1.5), ("team", 0.5),
        ]  # fmt: skip
        channel = {
            "name": "oa-team", "type": "openai", "base_url": "http://oa.test/v1",
            "api_key": "upstream-key", "groups": ["team"], "models": ["chat-small"],
        }  # fmt: skip
        assert (await admin(app, "POST", "/admin/channels", channel))[0] == 201
        status, key = await admin(app, "POST", "/admin/keys", {"account": "alice", "group": "team"})
        assert status == 201
        record, _ = await cost_of(app, key["key"], prompt=1000, completion=0)
        assert (record.key_id, record.cost) == (key["id"], 500)  # 1000 micro-units x 0.5
