"""A group's tool kind (``tool``: claude-code, codex, gemini-cli or sdk): command-line tools
need a key of the group made for them, so a group may say which tool its keys are for. Set
in the file (``groups: [{name, ratio, tool}]``) or through ``/admin/groups`` (kept by both
stores, shown on every instance), it reaches the console's model square (``tools``), where a
new key's box shows that tool's set-up first. In process, on both stores."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.config import ConfigError, parse_settings
from tests.plugins.inprocess import ADMIN_TOKEN, InProcess, drive, running
from tests.plugins.servers import make_config
from tests.test_users_api import PASSWORD, Client

GROUPS = ["default", {"name": "vip", "ratio": 1.5, "tool": "claude-code"}]
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"}


async def admin(app: InProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    raw = b"" if body is None else orjson.dumps(body)
    reply = await drive(app.app, method, path, raw, ADMIN)
    return reply.status, reply.json()


def test_the_file_gives_a_group_a_tool_and_names_a_bad_one() -> None:
    settings = parse_settings(make_config("http://x", "sqlite:///x.db", groups=GROUPS))
    assert settings.group_tools == {"vip": "claude-code"}
    bad = ["default", {"name": "vip", "tool": "vim"}]
    with pytest.raises(ConfigError, match=r"^groups\[1\]\.tool: must be one of claude-code, "):
        parse_settings(make_config("http://x", "sqlite:///x.db", groups=bad))


async def test_a_group_made_through_the_admin_api_takes_a_tool(store_url: str) -> None:
    async with running(store_url, groups=GROUPS) as app:
        status, made = await admin(app, "POST", "/admin/groups", {"name": "cx", "tool": "codex"})
        assert (status, made) == (
            201,
            {"name": "cx", "ratio": 1.0, "tool": "codex", "origin": "api"},
        )
        status, err = await admin(app, "POST", "/admin/groups", {"name": "c2", "tool": "emacs"})
        assert status == 400 and err["error"]["message"].startswith("tool: must be one of")
        # a change of one field keeps the other; null clears
        status, changed = await admin(app, "PATCH", "/admin/groups/cx", {"ratio": 2})
        assert (status, changed["ratio"], changed["tool"]) == (200, 2.0, "codex")
        status, changed = await admin(app, "PATCH", "/admin/groups/cx", {"tool": "gemini-cli"})
        assert (status, changed["ratio"], changed["tool"]) == (200, 2.0, "gemini-cli")
        status, err = await admin(app, "PATCH", "/admin/groups/cx", {"tool": "nano"})
        assert status == 400
        status, groups = await admin(app, "GET", "/admin/groups")
        assert [(g["name"], g["tool"]) for g in groups["data"]] == [
            ("default", None), ("vip", "claude-code"), ("cx", "gemini-cli"),
        ]  # fmt: skip
        status, changed = await admin(app, "PATCH", "/admin/groups/cx", {"tool": None})
        assert (status, changed["ratio"], changed["tool"]) == (200, 2.0, None)
        assert (await admin(app, "PATCH", "/admin/groups/vip", {"tool": "sdk"}))[0] == 409


async def test_the_model_square_tells_each_group_s_tool(store_url: str) -> None:
    """What the console's key box reads to show the group's tool first."""
    async with running(store_url, groups=GROUPS) as app:
        await admin(app, "POST", "/admin/groups", {"name": "cx", "tool": "codex"})
        body = {"username": "tess", "password": PASSWORD, "account": "alice"}
        body["groups"] = ["default", "vip", "cx"]  # type: ignore[assignment]
        assert (await admin(app, "POST", "/admin/users", body))[0] == 201
        user = Client(app)
        assert (await user.sign_in(username="tess", password=PASSWORD)).status == 200
        await app.services.cache.refresh()
        square = (await user.call("GET", "/console/square")).json()
        assert square["tools"] == {"default": None, "vip": "claude-code", "cx": "codex"}
