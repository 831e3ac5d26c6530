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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from gateway.store import MICRO, UsageRecord
from tests.plugins.servers import ADMIN_TOKEN, KEYS, ServedGateway
from tests.test_console_api import free_record

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


async def admin_get(gateway: ServedGateway, path: str) -> list[dict[str, Any]]:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with s.get(gateway.url + path, headers=headers) as r:
            data: list[dict[str, Any]] = (await r.json())["data"]
            return data


def usage(n: int, key_id: str, model: str, start: datetime) -> UsageRecord:
    return free_record(n, "carol", key_id, model, start)


async def sign_in(page: Any, url: str, token: str) -> None:
    await page.goto(url + "/console")
    await page.get_by_label("Admin token, or your sk- API key").fill(token)
    await page.get_by_role("button", name="Sign in", exact=True).click()


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
    usage_form = page.locator("#usage-filter")
    await usage_form.get_by_label("Account").fill("carol")
    await usage_form.get_by_role("button", name="Filter").click()
    await page.get_by_role("cell", name="chat-small").first.wait_for()
    await shot(page, "04-usage")

    # filters run in the store: three older records of a rare model behind 1,200 newer ones
    # (the newest 1,000 held none of them), found by the model filter; pages follow cursors
    carol_key = (await gateway.state.store.usage("carol", 1))[0].key_id
    now = datetime.now(UTC)
    bulk = [usage(n, carol_key, "rare-model", now - timedelta(hours=1)) for n in range(3)]
    bulk += [usage(n, carol_key, "chat-small", now - timedelta(minutes=30)) for n in range(1200)]
    await gateway.state.store.settle(bulk)
    await usage_form.get_by_label("Model").fill("rare-model")
    await usage_form.get_by_role("button", name="Filter").click()
    await page.get_by_text("Page 1: 3 records").wait_for()
    rows = page.locator("#usage-results tbody tr")
    assert await rows.count() == 3
    assert set(await page.locator("#usage-results tbody td:nth-child(4)").all_text_contents()) == {
        "rare-model"
    }
    await shot(page, "04-usage-filtered")
    await usage_form.get_by_label("Model").fill("")
    await usage_form.get_by_role("button", name="Filter").click()
    await page.get_by_text("Page 1: 50 records").wait_for()
    first_page = await rows.all_text_contents()
    await page.locator("#usage-results").get_by_role("button", name="Next").click()
    await page.get_by_text("Page 2: 50 records").wait_for()
    second_page = await rows.all_text_contents()
    assert len(second_page) == 50 and not set(first_page) & set(second_page)
    await page.locator("#usage-results").get_by_role("button", name="Previous").click()
    await page.get_by_text("Page 1: 50 records").wait_for()
    assert await rows.all_text_contents() == first_page
    async with page.expect_download() as download:
        await usage_form.get_by_role("button", name="Export CSV").click()
    exported = Path(await (await download.value).path()).read_text().splitlines()
    assert len(exported) == 1 + 1204  # the header, then every record of carol's
    await page.get_by_text("Exported 1,204 records.").wait_for()
    await page.get_by_role("link", name="Overview").click()
    await page.get_by_role("img", name="Cost per day").wait_for()
    # the charts show the SDK's request: today's bar of its model, with its cost (the bulk
    # records above cost nothing)
    (record,) = [
        r for r in await gateway.state.store.usage("carol", 2000) if r.request_id[:5] != "bulk-"
    ]
    today = datetime.now(UTC).date().isoformat()
    shown = await page.evaluate(
        "v => Number(v).toLocaleString(undefined, { maximumFractionDigits: 6 })",
        record.cost / MICRO,
    )
    assert record.cost > 0
    chart = page.locator("figure.chart").filter(has=page.get_by_role("img", name="Cost per day"))
    titles = await chart.locator("rect title").all_text_contents()
    assert f"{today} chat-small: {shown}" in titles, titles
    assert await chart.locator(".legend").text_content() == "chat-small"
    assert await page.locator("figure.chart rect").count() > 0
    # each chart has its axes: the highest total and zero, the first and last day
    days = [(now - timedelta(days=d)).strftime("%Y-%m-%d") for d in (29, 0)]
    axis = await page.locator("figure.chart").first.locator("text.axis").all_text_contents()
    assert "0" in axis and days[0] in axis and days[1] in axis, axis
    box = await page.locator("figure.chart").first.bounding_box()
    heading = await page.get_by_role("heading", name="Overview, last 30 days").bounding_box()
    assert box is not None and heading is not None and abs(box["x"] - heading["x"]) < 2
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
    # free, and priced here: the price table knows no such model
    await form.get_by_label("Input price").fill("0")
    await form.get_by_label("Output price").fill("0")
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
    await page.get_by_role("heading", name="Edit channel console-ch").wait_for()  # not "Add"
    await form.get_by_label("Priority").fill("3")
    await form.get_by_role("button", name="Save channel console-ch").click()
    await page.get_by_text("Channel console-ch saved.").wait_for()
    await page.get_by_role("button", name="Edit channel console-ch").click()
    await form.get_by_label("Weight").fill("5")
    await form.get_by_label("Model map").fill("console-model=up-console")
    await form.get_by_role("button", name="Save channel console-ch").click()
    await page.get_by_text("Channel console-ch saved.").wait_for()
    await form.get_by_role("button", name="Add channel").wait_for()  # drawn again
    await page.get_by_role("heading", name="Add a channel").wait_for()
    await page.get_by_label("Search").fill("console")
    assert await page.locator("tbody tr").count() == 1  # only console-ch matches
    hint = await page.locator("td span.nowrap", has_text="…-key").bounding_box()
    assert hint is not None and hint["height"] < 30  # the key's hint on one line
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
    assert channel["weight"] == 5 and channel["model_map"] == {"console-model": "up-console"}

    # a model made here is edited here: every price kind and the default max tokens
    await page.get_by_role("link", name="Models").click()
    await page.get_by_role("button", name="Edit model console-model").click()
    form = page.locator("#new-model")
    await form.get_by_label("Capabilities").fill("chat, embeddings")
    await form.get_by_label("Price per request").fill("0.25")
    await form.get_by_label("Price per image").fill("0.5")
    await form.get_by_label("Cache read price").fill("0.1")
    await form.get_by_label("1-hour cache write price").fill("2")
    await form.get_by_label("Default max tokens").fill("777")
    await form.get_by_role("button", name="Save model console-model").click()
    await page.get_by_text("Model console-model saved.").wait_for()
    assert await page.get_by_role("button", name="Edit model chat-small").count() == 0
    await page.get_by_text("from the file (read-only)").first.wait_for()
    models = {m["name"]: m for m in await admin_get(gateway, "/admin/models")}
    edited = models["console-model"]
    assert edited["default_max_tokens"] == 777 and edited["capabilities"] == ["chat", "embeddings"]
    assert (edited["price"]["request"], edited["price"]["image"]) == (0.25, 0.5)
    # each class at its price; a cache price left empty is not sent (the input's stands in)
    assert (edited["price"]["input"], edited["price"]["output"]) == (0, 0)
    assert edited["price"]["cache_read"] == 0.1 and edited["price"].get("cache_write") is None
    assert edited["price"]["cache_write_1h"] == 2
    row = page.get_by_role("row").filter(has_text="console-model")
    assert "cache read 0.1/M, 1-hour cache write 2/M" in (await row.text_content() or "")
    await shot(page, "06-models-edited")

    # sign-out ends the session on the server: the old cookie, sent again, is refused
    (old,) = [c for c in await context.cookies() if c["name"] == "gw_console"]
    assert await admin_keys_status(page) == 200
    await page.get_by_role("button", name="Sign out").click()
    await page.get_by_role("button", name="Sign in", exact=True).wait_for()
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
    await card.get_by_role("tab").first.wait_for()  # the page draws after its link's click
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
    assert f"ANTHROPIC_BASE_URL={gateway.url}" in (await card.locator("pre").text_content() or "")
    card = page.get_by_role("region", name="console-model")  # chat and embeddings now
    # its prices as billed: the cache prices it was given (its writes: the input's, 0)
    prices = await card.locator("ul.prices").text_content() or ""
    assert "cache read 0.1/M" in prices and "1-hour cache write 2/M" in prices, prices
    assert "cache write 0" not in prices, prices
    await card.get_by_role("tab", name="curl embeddings").click()
    assert f"{gateway.url}/v1/embeddings" in (await card.locator("pre").text_content() or "")
    await card.get_by_role("tab", name="google-genai embed_content").click()
    assert "embed_content(" in (await card.locator("pre").text_content() or "")
    await shot(page, "08-model-square")
    assert await page.get_by_role("link", name="Keys").count() == 0  # no admin pages

    # a phone-width screen: no sideways scroll of the page itself
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.get_by_role("link", name="Usage").click()
    await page.get_by_role("heading", name="My usage").wait_for()
    # the only request of this key was free: no chart of zeros, an empty state instead
    await page.get_by_text("No cost in the last 30 days.").wait_for()
    assert await page.get_by_text("highest 1 a day").count() == 0
    await page.locator("#usage-results").get_by_role("cell", name="console-model").wait_for()
    assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    await shot(page, "09-phone-usage")
    await page.get_by_role("button", name="Sign out").click()
    await page.get_by_role("button", name="Sign in", exact=True).wait_for()

    # the operator's ten sections at phone width: every link in sight, none scrolled away
    await sign_in(page, gateway.url, ADMIN_TOKEN)
    await page.get_by_role("heading", name="Overview, last 30 days").wait_for()
    for link in await page.locator("#nav a").all():
        place = await link.bounding_box()
        assert place is not None and place["x"] >= 0 and place["x"] + place["width"] <= 390
    assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    await shot(page, "10-phone-overview")
    await context.close()
    assert not errors, errors


def test_ci_fails_rather_than_skips_without_chromium() -> None:
    """With ``CI`` set and no browser, the console's browser test fails; without ``CI`` it
    is skipped with the reason."""
    test = f"{Path(__file__).relative_to(REPO)}::test_the_console_as_an_operator_and_a_key_holder"
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", test]
    runs = {  # both at once: each is a pytest of its own, seconds of start-up that can overlap
        ci: subprocess.Popen(
            [*command, "-k", "sqlite"],
            cwd=REPO,
            env={
                **os.environ,
                "CI": ci,
                "GATEWAY_TEST_CHROMIUM": "/nonexistent/chromium",
                "PYTHONUNBUFFERED": "1",  # the summary written as it comes, whatever ends it
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for ci in ("1", "")
    }
    for ci, outcome in (("1", "1 error"), ("", "1 skipped")):
        stdout, stderr = runs[ci].communicate(timeout=300)
        ended = f"status {runs[ci].returncode}\n{stdout[-2000:]}\n{stderr[-2000:]}"
        assert outcome in stdout, ended
        if ci:
            assert runs[ci].returncode != 0 and "CI needs it" in stdout, ended
        else:
            assert runs[ci].returncode == 0 and "chromium is missing" in stdout + stderr, ended
