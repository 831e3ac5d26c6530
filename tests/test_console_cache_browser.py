"""The console's prompt-cache hit rates in real headless Chromium (the set-up of
tests/test_console_browser.py): a coding session of two turns per key reaches the fake, whose
second turn reads the first's prefix from its cache; the operator's overview shows the hit rate
(cache reads over every prompt token: fresh, read and written) per model and per key, a key
holder's usage page per model, and a user's per key and per model, each the records' own.
Screenshots go to ``tests/screenshots/console-cache-*.png``."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from gateway.store import UsageRecord
from tests.plugins.servers import ADMIN_TOKEN, KEYS, ServedGateway
from tests.test_console_browser import browser, shot, sign_in  # noqa: F401

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
SYSTEM = "You are a coding agent. Read the repository before you change it. " * 90
EPHEMERAL = {"type": "ephemeral"}
PASSWORD = "correct horse battery"


def turn(n: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for i in range(n):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"Task {i}. " * 50}]})
        if i < n - 1:
            messages.append({"role": "assistant", "content": "Hello from the demo upstream."})
    messages[-1]["content"][-1]["cache_control"] = EPHEMERAL
    system = [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}]
    return {"model": "claude-small", "max_tokens": 64, "system": system, "messages": messages}


async def session(s: aiohttp.ClientSession, gw: ServedGateway, key: str) -> None:
    headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
    for n in (1, 2):
        async with s.post(gw.v1 + "/messages", json=turn(n), headers=headers) as r:
            assert r.status == 200, await r.text()


async def user_key(s: aiohttp.ClientSession, gw: ServedGateway) -> tuple[str, str]:
    """A user of alice's account and a key it made: (its id, its secret)."""
    body = {"username": "erin", "password": PASSWORD, "account": "alice", "groups": ["default"]}
    async with s.post(gw.url + "/admin/users", json=body, headers=ADMIN) as r:
        assert r.status in (200, 201), await r.text()
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as user:
        login = {"username": "erin", "password": PASSWORD}
        async with user.post(gw.url + "/console/session", json=login) as r:
            csrf = (await r.json())["csrf"]
        async with user.post(gw.url + "/console/keys", json={"group": "default", "name": "cli"},
                             headers={"x-console-csrf": csrf}) as r:  # fmt: skip
            made = await r.json()
    return made["id"], made["key"]


def rate(records: list[UsageRecord]) -> str:
    read = sum(r.cache_read_tokens for r in records)
    return f"{100 * read / sum(r.prompt_tokens for r in records):.1f}%"


async def row_text(page: Any, table: str, first_cell: str) -> str:
    row = page.locator(f"#{table} tr", has=page.get_by_role("cell", name=first_cell, exact=True))
    return " ".join((await row.first.inner_text()).split())


async def test_the_console_shows_cache_hit_rates_per_key_and_model(
    gateway: ServedGateway,
    browser: Any,  # noqa: F811
) -> None:
    if gateway.settings.store.startswith("redis"):
        pytest.skip("one store is enough for the browser; the API tests cover both")
    async with aiohttp.ClientSession() as s:
        user_key_id, user_secret = await user_key(s, gateway)
        await session(s, gateway, KEYS["alice"])
        await session(s, gateway, user_secret)
    await gateway.state.writer.flush()
    records = await gateway.state.store.usage("alice", limit=10)
    alice = [r for r in records if r.key_id == "k-alice"]
    erin = [r for r in records if r.key_id == user_key_id]
    assert len(alice) == len(erin) == 2
    assert sorted(r.cache_read_tokens > 0 for r in alice) == [False, True]  # turn 2 reads
    page = await (await browser.new_context(viewport={"width": 1280, "height": 900})).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))

    await sign_in(page, gateway.url, ADMIN_TOKEN)
    await page.get_by_role("heading", name="By key").wait_for()
    assert rate(records) in await row_text(page, "by-model", "claude-small")
    assert rate(alice) in await row_text(page, "by-key", "k-alice")
    assert rate(erin) in await row_text(page, "by-key", user_key_id)
    await shot(page, "console-cache-1-overview")
    await page.get_by_role("button", name="Sign out").click()

    await sign_in(page, gateway.url, KEYS["alice"])  # the key holder: its own records only
    await page.get_by_role("link", name="Usage").click()
    await page.get_by_role("heading", name="By model (30 days)").wait_for()
    assert rate(alice) in await row_text(page, "by-model", "claude-small")
    await shot(page, "console-cache-2-key-usage")
    await page.get_by_role("button", name="Sign out").click()

    await page.get_by_label("Username").fill("erin")  # the user: its keys' records
    await page.get_by_label("Password", exact=True).fill(PASSWORD)
    await page.get_by_role("button", name="Sign in with password").click()
    await page.get_by_role("navigation").get_by_role("link", name="Usage").click()
    await page.get_by_role("heading", name="Per model (30 days)").wait_for()
    assert rate(erin) in await row_text(page, "by-model", "claude-small")
    assert rate(erin) in await row_text(page, "by-key", "cli")
    await shot(page, "console-cache-3-user-usage")
    assert not errors
