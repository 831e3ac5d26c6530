"""The audit log's console page in real headless Chromium (as ``test_console_browser.py``
drives it): the admin creates an account on the Accounts page, and changes made through the
admin API (a channel with its upstream key, a key named like a formula, a refused account)
show on the Audit log page, newest first, with who, what, from where and how it ended; the
filters narrow it; no secret is on the page; Export CSV saves every entry with formula-like
cells written as text. Screenshots go to ``tests/screenshots/audit-*.png``."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.plugins.servers import ADMIN_TOKEN, ServedGateway
from tests.test_console_browser import browser, shot, sign_in  # noqa: F401, F811 (the fixture)

UPSTREAM_SECRET = "sk-upstream-browser-5e6f7a8b9c"
FORMULA = '=HYPERLINK("http://evil.test","open me")'


async def admin_call(gateway: ServedGateway, method: str, path: str, body: Any) -> int:
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with s.request(method, gateway.url + path, json=body, headers=headers) as r:
            return r.status


async def test_the_admin_reads_the_audit_log_in_the_console(
    gateway: ServedGateway,
    browser: Any,  # noqa: F811 (the fixture)
) -> None:
    if gateway.settings.store.startswith("redis"):
        pytest.skip("one store is enough for the browser; the API tests cover both")
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # the page's first look for a session is a 401 the browser logs; anything else is a fault
    page.on(
        "console",
        lambda m: (
            errors.append(m.text) if m.type == "error" and "status of 401" not in m.text else None
        ),
    )

    await sign_in(page, gateway.url, ADMIN_TOKEN)
    await page.get_by_role("heading", name="Overview, last 30 days").wait_for()
    await page.get_by_role("link", name="Accounts").click()
    form = page.locator("#new-account")
    await form.get_by_label("Id").fill("erin")
    await form.get_by_role("button", name="Create account").click()
    await page.get_by_role("cell", name="erin", exact=True).wait_for()

    channel = {"name": "oa-audit", "type": "openai", "base_url": "http://x.test/v1",
               "api_key": UPSTREAM_SECRET, "groups": ["default"],
               "models": ["chat-small"]}  # fmt: skip
    assert await admin_call(gateway, "POST", "/admin/channels", channel) == 201
    key = {"account": "erin", "group": "default", "name": FORMULA}
    assert await admin_call(gateway, "POST", "/admin/keys", key) == 201
    assert await admin_call(gateway, "POST", "/admin/accounts", {"id": FORMULA}) == 400

    await page.get_by_role("link", name="Audit log").click()
    await page.get_by_role("heading", name="Audit log").wait_for()
    rows = page.locator("#audit-results tbody tr")
    await page.get_by_text("Page 1: 4 entries").wait_for()
    actions = await page.locator("#audit-results tbody td:nth-child(3)").all_text_contents()
    assert actions == ["account.create", "key.create", "channel.create", "account.create"]
    first = await rows.nth(0).locator("td").all_text_contents()
    last = await rows.nth(3).locator("td").all_text_contents()
    assert (first[1], first[3], first[6], first[7]) == ("admin", f"account {FORMULA}", "api", "400")
    assert (last[1], last[3], last[6], last[7]) == ("admin", "account erin", "console", "201")
    assert last[5] == "127.0.0.0/24"
    text = await page.locator("main").inner_text()
    assert UPSTREAM_SECRET not in text and "api_key=[secret]" in text
    await shot(page, "audit-01-log")

    filters = page.locator("#audit-filter")
    await filters.get_by_label("Action").fill("key")
    await filters.get_by_role("button", name="Filter").click()
    await page.get_by_text("Page 1: 1 entry").wait_for()
    await filters.get_by_label("Action").fill("")
    await filters.get_by_label("Status").fill("error")
    await filters.get_by_role("button", name="Filter").click()
    # the page said "1 entry" already (the filter before): wait for the new entry itself
    await rows.locator("td:nth-child(8)", has_text="400").wait_for()
    await page.get_by_text("Page 1: 1 entry").wait_for()
    assert await rows.locator("td:nth-child(8)").all_text_contents() == ["400"]
    await shot(page, "audit-02-filtered")

    await filters.get_by_label("Status").fill("")
    await filters.get_by_role("button", name="Filter").click()
    await page.get_by_text("Page 1: 4 entries").wait_for()
    async with page.expect_download() as download:
        await filters.get_by_role("button", name="Export CSV").click()
    saved = Path(await (await download.value).path()).read_text()
    exported = list(csv.DictReader(saved.splitlines()))
    assert [r["action"] for r in exported] == actions
    assert UPSTREAM_SECRET not in saved
    assert exported[0]["object_id"] == "'" + FORMULA  # opens as text, not as a formula
    assert FORMULA.replace('"', '\\"') in exported[1]["fields"]  # inside the fields' JSON
    assert not any(v.startswith(("=", "+", "-", "@")) for r in exported for v in r.values())
    await page.get_by_text("Exported 4 entries.").wait_for()

    # a phone-width screen has no sideways scroll
    await page.set_viewport_size({"width": 390, "height": 844})
    wide = await page.evaluate("document.documentElement.scrollWidth > window.innerWidth")
    await shot(page, "audit-03-phone")
    assert not wide
    assert errors == []
