"""The web console in real headless Chromium (Debian's ``chromium``, driven by Playwright for
Python through ``executable_path``): sign in with the admin token; create an account and a
key; copy the secret; a request made with it through the ``openai`` SDK appears in the usage
table and the overview's charts; disabling the key makes the SDK get 401; sign in with a key
and see its balance and model square; sign out. A phone-width screen has no sideways scroll.
Screenshots of each page go to ``tests/screenshots/`` (git-ignored): look at them.

Without chromium (or Playwright) the test is skipped locally with the reason, and fails when
``CI`` is set: a CI run must not pass by skipping it. ``GATEWAY_TEST_CHROMIUM`` names another
browser binary."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from gateway.store import MICRO
from tests.plugins.servers import ADMIN_TOKEN, KEYS, ServedGateway

CHROMIUM = (
    os.environ.get("GATEWAY_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
)
SHOTS = Path(__file__).parent / "screenshots"
REPO = Path(__file__).resolve().parents[1]


def missing() -> str | None:
    """Why the browser cannot run here, or None."""
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed"
    if not Path(CHROMIUM).exists():
        return f"Debian's chromium is missing ({CHROMIUM})"
    return None


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    reason = missing()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: CI needs it (tests/ensure_packages.sh installs it)")
        pytest.skip(reason)
    from playwright import async_api as playwright_api

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
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with s.get(gateway.url + "/admin/channels", headers=headers) as r:
            data: list[dict[str, Any]] = (await r.json())["data"]
            return data


async def admin_keys_status(page: Any) -> int:
    """GET /admin/keys from the page, with the browser's cookies."""
    status: int = await page.evaluate(
        "fetch('/admin/keys', { credentials: 'same-origin' }).then(r => r.status)"
    )
    return status


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
    # the charts show that request: today's bar of its model, with its cost and its count
    (record,) = await gateway.state.store.usage("carol", 10)
    today = datetime.now(UTC).date().isoformat()
    shown = await page.evaluate(
        "v => Number(v).toLocaleString(undefined, { maximumFractionDigits: 6 })",
        record.cost / MICRO,
    )
    assert record.cost > 0
    for name, value in (("Cost per day", shown), ("Requests per day", "1")):
        chart = page.locator("figure.chart").filter(has=page.get_by_role("img", name=name))
        titles = await chart.locator("rect title").all_text_contents()
        assert titles == [f"{today} chat-small: {value}"], (name, titles)
        assert await chart.locator(".legend").text_content() == "chat-small"
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

    # sign-out ends the session on the server: the old cookie, sent again, is refused
    (old,) = [c for c in await context.cookies() if c["name"] == "gw_console"]
    assert await admin_keys_status(page) == 200
    await page.get_by_role("button", name="Sign out").click()
    await page.get_by_role("button", name="Sign in").wait_for()
    assert not [c for c in await context.cookies() if c["name"] == "gw_console"]
    await context.add_cookies([old])
    assert await admin_keys_status(page) == 401
    await context.clear_cookies()

    # a key holder's view
    await sign_in(page, gateway.url, KEYS["alice"])
    await page.get_by_role("heading", name="Key k-alice").wait_for()
    await page.get_by_text("Balance", exact=True).wait_for()
    await shot(page, "07-my-key")
    await page.get_by_role("link", name="Model square").click()
    card = page.get_by_role("region", name="chat-small")
    url = gateway.url
    # each client's snippet: its base URL (with /v1 where that client's SDK wants it), its
    # key setting and the model
    snippets = {
        "OpenAI SDK": [f'base_url="{url}/v1"', 'api_key="YOUR_KEY"', 'model="chat-small"'],
        "curl": [f"curl {url}/v1/chat/completions", "Authorization: Bearer YOUR_KEY",
                 '"model": "chat-small"'],
        "Anthropic SDK": [f'anthropic.Anthropic(base_url="{url}"', 'api_key="YOUR_KEY"',
                          'model="chat-small"'],
        "google-genai": [f'http_options={{"base_url": "{url}"}}', 'api_key="YOUR_KEY"',
                         'model="chat-small"'],
        "Claude Code": [f"export ANTHROPIC_BASE_URL={url}\n",
                        "export ANTHROPIC_API_KEY=YOUR_KEY", "claude --model chat-small"],
        "Gemini CLI": [f"export GOOGLE_GEMINI_BASE_URL={url}\n",
                       "export GEMINI_API_KEY=YOUR_KEY", "gemini -m chat-small"],
        "Codex CLI": [f'base_url = "{url}/v1"', 'wire_api = "responses"',
                      'env_key = "GATEWAY_API_KEY"', 'model = "chat-small"',
                      "export GATEWAY_API_KEY=YOUR_KEY"],
    }  # fmt: skip
    tabs = await card.get_by_role("tab").all_text_contents()
    assert sorted(tabs) == sorted(snippets)
    for tab, wanted in snippets.items():
        await card.get_by_role("tab", name=tab, exact=True).click()
        assert (
            await card.get_by_role("tab", name=tab, exact=True).get_attribute("aria-selected")
            == "true"
        )
        text = await card.locator("pre").text_content() or ""
        for part in wanted:
            assert part in text, (tab, part, text)
    await card.get_by_role("tab", name="Claude Code").click()
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


def test_ci_fails_rather_than_skips_without_chromium() -> None:
    """With ``CI`` set and no browser, the console's browser test fails; without ``CI`` it
    is skipped with the reason."""
    test = f"{Path(__file__).relative_to(REPO)}::test_the_console_as_an_operator_and_a_key_holder"
    for ci, outcome in (("1", "1 error"), ("", "1 skipped")):
        env = {**os.environ, "CI": ci, "GATEWAY_TEST_CHROMIUM": "/nonexistent/chromium"}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", test, "-k",
             "sqlite"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert outcome in done.stdout, done.stdout[-2000:]
        if ci:
            assert done.returncode != 0 and "CI needs it" in done.stdout
        else:
            assert done.returncode == 0 and "chromium is missing" in done.stdout + done.stderr
