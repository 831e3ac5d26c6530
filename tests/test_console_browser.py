"""The web console in real headless Chromium (Debian's ``chromium``, driven by Playwright for
Python through ``executable_path``): sign in with the admin token; create an account and a
key; copy the secret; a request made with it through the ``openai`` SDK appears in the usage
table and the overview's charts; disabling the key makes the SDK get 401; sign in with a key
and see its balance and model square; sign out. A phone-width screen has no sideways scroll.
Screenshots of each page go to ``tests/screenshots/`` (git-ignored): look at them."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.plugins.servers import ADMIN_TOKEN, KEYS, ServedGateway

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(__file__).parent / "screenshots"
playwright_api = pytest.importorskip("playwright.async_api")
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is missing")


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    async with playwright_api.async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            await b.close()


async def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


async def catalogue_channels(gateway: ServedGateway) -> list[dict[str, Any]]:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with s.get(gateway.url + "/admin/channels", headers=headers) as r:
            data: list[dict[str, Any]] = (await r.json())["data"]
            return data


async def sign_in(page: Any, url: str, token: str) -> None:
    await page.goto(url + "/console")
    await page.get_by_label("Admin token, or your sk- API key").fill(token)
    await page.get_by_role("button", name="Sign in").click()


async def test_the_console_as_an_operator_and_a_key_holder(
    gateway: ServedGateway, browser: Any
) -> None:
    if gateway.settings.store.startswith("redis"):
        pytest.skip("one store is enough for the browser; the API tests cover both")
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    await context.grant_permissions(["clipboard-read", "clipboard-write"], origin=gateway.url)
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # a refused sign-in is a 401 the browser logs; anything else logged as an error is a fault
    page.on(
        "console",
        lambda m: (
            errors.append(m.text) if m.type == "error" and "status of 401" not in m.text else None
        ),
    )

    await page.goto(gateway.url + "/console")
    await shot(page, "01-sign-in")
    await sign_in(page, gateway.url, "not-the-token")
    await page.get_by_role("alert").get_by_text("Check the token").wait_for()
    await sign_in(page, gateway.url, ADMIN_TOKEN)
    await page.get_by_role("heading", name="Overview, last 30 days").wait_for()
    # the token is nowhere the page's scripts can read
    assert ADMIN_TOKEN not in await page.evaluate("document.cookie + JSON.stringify(localStorage)")

    # an account and a key
    await page.get_by_role("link", name="Accounts").click()
    form = page.locator("#new-account")
    await form.get_by_label("Id").fill("carol")
    await form.get_by_label("Balance").fill("5")
    await form.get_by_role("button", name="Create account").click()
    await page.get_by_role("cell", name="carol", exact=True).wait_for()
    await shot(page, "02-accounts")

    await page.get_by_role("link", name="Keys").click()
    form = page.locator("#new-key")
    await form.get_by_label("Account").fill("carol")
    await form.get_by_label("Name").fill("from the console")
    await form.get_by_role("button", name="Create key").click()
    secret = (await page.locator("#new-secret").text_content() or "").strip()
    assert secret.startswith("sk-")
    await page.locator("#secret-box").get_by_role("button", name="Copy").click()
    assert await page.evaluate("navigator.clipboard.readText()") == secret
    await shot(page, "03-keys")

    # a request with that key through the openai SDK, seen in usage and the overview
    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key=secret, max_retries=0)
    reply = await client.chat.completions.create(
        model="chat-small", messages=[{"role": "user", "content": "hello from the console"}]
    )
    assert reply.choices[0].message.content
    await gateway.state.writer.flush()
    await page.get_by_role("link", name="Usage").click()
    usage = page.locator("#usage-filter")
    await usage.get_by_label("Account").fill("carol")
    await usage.get_by_role("button", name="Filter").click()
    await page.get_by_role("cell", name="chat-small").first.wait_for()
    await shot(page, "04-usage")
    await page.get_by_role("link", name="Overview").click()
    await page.get_by_role("img", name="Cost per day").wait_for()
    assert await page.locator("figure.chart rect").count() > 0
    await shot(page, "05-overview")

    # disable it: the SDK gets 401
    await page.get_by_role("link", name="Keys").click()
    await page.get_by_label("Search").fill("from the console")
    key_id = (await page.locator("tbody tr td").first.text_content() or "").strip()
    await page.get_by_role("button", name=f"Disable key {key_id}").click()
    await page.get_by_role("button", name=f"Enable key {key_id}").wait_for()
    with pytest.raises(openai.AuthenticationError):
        await client.chat.completions.create(
            model="chat-small", messages=[{"role": "user", "content": "again"}]
        )
    await client.close()

    for name in ("Channels", "Models", "Groups", "Model square"):
        await page.get_by_role("link", name=name).click()
        await page.get_by_role("heading", level=1).first.wait_for()
        await shot(page, f"06-{name.lower().replace(' ', '-')}")

    # a channel's test, from its row
    await page.get_by_role("link", name="Channels").click()
    await page.get_by_role("button", name="Test channel oa").click()
    await page.get_by_role("status").get_by_text("oa: ok, status 200").wait_for()
    await shot(page, "06-channels-tested")

    # a model and a channel added here serve a request
    await page.get_by_role("link", name="Models").click()
    form = page.locator("#new-model")
    await form.get_by_label("Name").fill("console-model")
    await form.get_by_role("button", name="Add model").click()
    await page.get_by_role("cell", name="console-model", exact=True).wait_for()
    await page.get_by_role("link", name="Channels").click()
    form = page.locator("#new-channel")
    await form.get_by_label("Name").fill("console-ch")
    await form.get_by_label("Base URL").fill(gateway.settings.channels[0].base_url)
    await form.get_by_label("Upstream API key").fill("upstream-key")
    await form.get_by_label("Models (comma-separated)").fill("console-model")
    await form.get_by_role("button", name="Add channel").click()
    await page.get_by_role("cell", name="console-ch", exact=True).wait_for()
    await page.get_by_role("button", name="Edit channel console-ch").click()
    await form.get_by_label("Priority").fill("3")
    await form.get_by_role("button", name="Save channel console-ch").click()
    await page.get_by_text("Channel console-ch saved.").wait_for()
    await shot(page, "06-channels-added")
    alice = openai.AsyncOpenAI(base_url=gateway.v1, api_key=KEYS["alice"], max_retries=0)
    reply = await alice.chat.completions.create(
        model="console-model", messages=[{"role": "user", "content": "via the new channel"}]
    )
    await alice.close()
    assert reply.choices[0].message.content
    await gateway.state.writer.flush()
    (last,) = await gateway.state.store.usage("alice", 1)
    assert (last.model, last.channel) == ("console-model", "console-ch")
    channel = next(c for c in await catalogue_channels(gateway) if c["name"] == "console-ch")
    assert channel["priority"] == 3  # the edit, and the key kept
    assert channel["api_key_hint"].endswith("-key")

    await page.get_by_role("button", name="Sign out").click()
    await page.get_by_role("button", name="Sign in").wait_for()

    # a key holder's view
    await sign_in(page, gateway.url, KEYS["alice"])
    await page.get_by_role("heading", name="Key k-alice").wait_for()
    await page.get_by_text("Balance", exact=True).wait_for()
    await shot(page, "07-my-key")
    await page.get_by_role("link", name="Model square").click()
    card = page.get_by_role("region", name="chat-small")
    await card.get_by_role("tab", name="Claude Code").click()
    assert f"ANTHROPIC_BASE_URL={gateway.url}" in (await card.locator("pre").text_content() or "")
    await shot(page, "08-model-square")
    assert await page.get_by_role("link", name="Keys").count() == 0  # no admin pages

    # a phone-width screen: no sideways scroll of the page itself
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.get_by_role("link", name="Usage").click()
    await page.get_by_role("heading", name="My usage").wait_for()
    assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    await shot(page, "09-phone-usage")
    await page.get_by_role("button", name="Sign out").click()
    await page.get_by_role("button", name="Sign in").wait_for()
    await context.close()
    assert not errors, errors
