"""People who serve themselves, in real headless Chromium (as ``test_console_browser.py``
drives it): the admin makes an account, a user of it and three top-up codes (downloaded as
CSV once); the user signs in with its password, makes a key in its group, copies it, calls
``/v1/chat/completions`` with it through the openai SDK, runs out of balance (402, which says
where to top up), redeems a code and sees the new balance at once, calls again (200), sees
the calls in its usage, makes a key in the group made for Codex CLI and sees that tool's
set-up first, tries a model from the square with its own key after a reload (the console sends
it: the page no longer holds the secret), and the admin sees the code used.
Screenshots of each page go to ``tests/screenshots/users-*.png``."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.plugins.servers import ADMIN_TOKEN, ServedGateway
from tests.test_console_browser import browser, shot  # noqa: F401 (the fixture)

PASSWORD = "a long enough password"


async def admin_part(page: Any, url: str) -> list[str]:
    """The admin's pages: an account, a user, three codes; the codes as downloaded."""
    await page.goto(url + "/console")
    await page.get_by_label("Admin token, or your sk- API key").fill(ADMIN_TOKEN)
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await page.get_by_role("heading", name="Overview, last 30 days").wait_for()
    await page.get_by_role("link", name="Accounts").click()
    form = page.locator("#new-account")
    await form.get_by_label("Id").fill("dana-acct")
    await form.get_by_label("Balance").fill("0.000001")
    await form.get_by_role("button", name="Create account").click()
    await page.get_by_role("cell", name="dana-acct", exact=True).wait_for()

    await page.get_by_role("link", name="Users").click()
    form = page.locator("#new-user")
    await form.get_by_label("Username").fill("dana")
    await form.get_by_label("Password").fill(PASSWORD)
    await form.get_by_label("Account").fill("dana-acct")
    await form.get_by_label("Groups").fill("default, vip")
    await form.get_by_role("button", name="Create user").click()
    await page.get_by_role("cell", name="dana", exact=True).wait_for()
    await shot(page, "users-01-admin-users")

    await page.get_by_role("link", name="Top-up codes").click()
    form = page.locator("#new-codes-form")
    await form.get_by_label("Amount").fill("5")
    await form.get_by_label("Count").fill("3")
    async with page.expect_download() as download:
        await form.get_by_role("button", name="Create codes").click()
    saved = Path(await (await download.value).path()).read_text()
    codes = [row["code"] for row in csv.DictReader(saved.splitlines())]
    assert len(codes) == 3 and all(c.startswith("GW-") for c in codes)
    await page.get_by_text("3 codes made and saved as redemption-codes.csv.").wait_for()
    assert await page.locator("#made-codes tbody tr").count() == 3
    await shot(page, "users-02-admin-codes")
    await page.get_by_role("link", name="Groups").click()
    await page.get_by_role("cell", name="×1", exact=True).first.wait_for()
    # a group for Gemini CLI's keys; the file's vip group is Codex CLI's
    form = page.locator("#new-group")
    await form.get_by_label("Name").fill("gemini-team")
    await form.get_by_label("Tool its keys are for").select_option(label="Gemini CLI")
    await form.get_by_role("button", name="Add group").click()
    row = page.get_by_role("row").filter(has_text="gemini-team")
    await row.get_by_role("cell", name="Gemini CLI", exact=True).wait_for()
    vip = page.get_by_role("row").filter(has_text="×1.5")
    assert await vip.get_by_role("cell", name="Codex CLI", exact=True).count() == 1
    await shot(page, "users-03-admin-groups")
    await page.get_by_role("button", name="Sign out").click()
    await page.get_by_role("button", name="Sign in", exact=True).wait_for()
    return codes


async def make_a_key(page: Any, url: str) -> str:
    await page.get_by_label("Username").fill("dana")
    await page.get_by_label("Password", exact=True).fill(PASSWORD)
    await page.get_by_role("button", name="Sign in with password").click()
    await page.get_by_role("heading", name="My keys").wait_for()
    form = page.locator("#new-key")
    assert await form.get_by_label("Group").input_value() == "default"
    await form.get_by_label("Name").fill("laptop")
    await form.get_by_role("button", name="Create key").click()
    secret = (await page.locator("#new-secret").text_content() or "").strip()
    assert secret.startswith("sk-")
    await page.locator("#secret-box").get_by_role("button", name="Copy", exact=True).click()
    assert await page.evaluate("navigator.clipboard.readText()") == secret
    snippet = await page.locator("#key-snippet").text_content() or ""
    assert f"ANTHROPIC_BASE_URL={url}" in snippet and secret in snippet  # Claude Code, first
    await page.get_by_role("tab", name="Codex CLI").click()
    assert f'base_url = "{url}/v1"' in (await page.locator("#key-snippet").text_content() or "")
    await page.get_by_role("cell", name="laptop", exact=True).wait_for()
    await shot(page, "users-04-user-keys")

    # a key in the group made for Codex CLI (tool: codex): its set-up is the one shown, chosen;
    # the other tools' are a tab away
    await form.get_by_label("Group").select_option(label="vip (for Codex CLI)")
    await form.get_by_label("Name").fill("codex")
    await form.get_by_role("button", name="Create key").click()
    await page.get_by_text("New key codex:").wait_for()
    cli = (await page.locator("#new-secret").text_content() or "").strip()
    snippet = await page.locator("#key-snippet").text_content() or ""
    assert snippet.startswith("# ~/.codex/config.toml") and f'base_url = "{url}/v1"' in snippet
    assert f"export GATEWAY_API_KEY={cli}" in snippet
    own = page.get_by_role("tab", name="Codex CLI (this group's tool)")
    assert await own.get_attribute("aria-selected") == "true"
    assert await page.locator("#secret-box [role=tab]").first.text_content() == (
        "Codex CLI (this group's tool)"
    )
    await page.get_by_text("Set-up with chat-small (group vip, made for Codex CLI):").wait_for()
    await shot(page, "users-04b-user-key-for-codex")
    await page.get_by_role("tab", name="Claude Code").click()
    assert "ANTHROPIC_BASE_URL" in (await page.locator("#key-snippet").text_content() or "")
    return secret


async def test_a_user_serves_itself(
    gateway_factory: Callable[..., Any],
    browser: Any,  # noqa: F811
    store_url: str,
) -> None:
    if store_url.startswith("redis"):
        pytest.skip("one store is enough for the browser; the API tests cover both")
    groups = ["default", {"name": "vip", "ratio": 1.5, "tool": "codex"}]
    async with gateway_factory(groups=groups) as gateway:
        await the_story(gateway, browser)


async def the_story(gateway: ServedGateway, browser: Any) -> None:  # noqa: F811
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    await context.grant_permissions(["clipboard-read", "clipboard-write"], origin=gateway.url)
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # a refused request is logged by the browser; anything else logged as an error is a fault
    page.on(
        "console",
        lambda m: (
            errors.append(m.text) if m.type == "error" and "status of 4" not in m.text else None
        ),
    )
    codes = await admin_part(page, gateway.url)
    await shot(page, "users-00-sign-in")
    secret = await make_a_key(page, gateway.url)

    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key=secret, max_retries=0)
    hello = [{"role": "user", "content": "hello from dana"}]
    reply = await client.chat.completions.create(model="chat-small", messages=hello)
    assert reply.choices[0].message.content
    with pytest.raises(openai.APIStatusError) as refused:
        await client.chat.completions.create(model="chat-small", messages=hello)
    assert refused.value.status_code == 402
    assert "top up in the console" in str(refused.value)

    await page.get_by_role("link", name="Top up").click()
    await page.get_by_label("Redemption code").fill(codes[0])
    await page.get_by_role("button", name="Redeem").click()
    await page.get_by_text("Code redeemed: your balance is now").wait_for()
    balance = float((await page.locator("#balance").text_content() or "0").replace(",", ""))
    assert 4.99 < balance < 5
    await shot(page, "users-05-user-top-up")
    await page.get_by_label("Redemption code").fill(codes[0])
    await page.get_by_role("button", name="Redeem").click()
    await page.get_by_role("alert").get_by_text("this code has been used").wait_for()

    reply = await client.chat.completions.create(model="chat-small", messages=hello)
    assert reply.choices[0].message.content
    await client.close()
    await gateway.state.writer.flush()
    await page.get_by_role("link", name="Usage").click()
    await page.get_by_role("heading", name="My usage").wait_for()
    await page.locator("#usage-results").get_by_role("cell", name="chat-small").first.wait_for()
    statuses = await page.locator("#usage-results tbody td:nth-child(6)").all_text_contents()
    assert sorted(statuses) == ["200", "200", "402"], statuses
    await shot(page, "users-06-user-usage")

    await page.get_by_role("link", name="Model square").click()
    card = page.get_by_role("region", name="chat-small")
    await card.locator("ul.prices li").last.wait_for()
    prices = await card.locator("ul.prices li").all_text_contents()
    assert prices == ["default in 1/M, out 2/M", "vip×1.5 in 1.5/M, out 3/M"], prices
    await page.locator("#square-group").select_option("default")
    await page.get_by_role("region", name="vip-model").wait_for(state="detached")
    await page.locator("#square-group").select_option("vip")
    await page.get_by_role("region", name="vip-model").wait_for()
    await page.locator("#square-capability").select_option("embeddings")
    await page.get_by_text("No model matches.").wait_for()
    await page.locator("#square-capability").select_option("chat")
    # the page reloaded: no secret in it any more, and the user's keys are still there to try
    # (the console sends the message for the chosen key; the secret is not asked for)
    await page.reload()
    form = page.locator("#try-it")
    await form.locator("select[name=model]").select_option("chat-small")
    options = await form.locator("select[name=key] option").all_text_contents()
    # the user's keys in the order of their making (to the second: these two may tie), then
    # the choice to paste one
    assert sorted(options[:2]) == ["codex (vip)", "laptop (default)"], options
    assert options[2:] == ["a key I paste below"], options
    await form.locator("select[name=key]").select_option(label="laptop (default)")
    assert not await form.get_by_label("Paste a key").is_visible()
    await form.get_by_role("button", name="Send").click()
    await page.locator("#try-reply").filter(has_not_text="Waiting").wait_for()
    answer = await page.locator("#try-reply").text_content() or ""
    assert answer and not answer.startswith("Failed"), answer
    await page.get_by_text("billed to this key like any call").wait_for()
    await shot(page, "users-07-user-square")
    await gateway.state.writer.flush()  # the try is the laptop key's fourth call
    records = await gateway.state.store.usage("dana-acct", 10)
    assert sorted(r.status for r in records) == [200, 200, 200, 402]
    laptop = [k.id for k in await gateway.state.store.list_keys("dana-acct") if k.name == "laptop"]
    assert {r.key_id for r in records} == set(laptop)
    await form.locator("select[name=key]").select_option(label="a key I paste below")
    await form.get_by_label("Paste a key").wait_for()
    await page.get_by_role("link", name="Password").click()
    await page.get_by_role("heading", name="Signed in as dana").wait_for()
    await shot(page, "users-08-user-password")
    # a phone-width screen: the user's sections in sight, no sideways scroll of the page
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.get_by_role("link", name="My keys").click()
    await page.get_by_role("heading", name="My keys").wait_for()
    for link in await page.locator("#nav a").all():
        place = await link.bounding_box()
        assert place is not None and place["x"] >= 0 and place["x"] + place["width"] <= 390
    assert await page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    await shot(page, "users-10-user-phone-keys")
    await page.set_viewport_size({"width": 1280, "height": 900})
    await page.get_by_role("button", name="Sign out").click()
    await page.get_by_role("button", name="Sign in", exact=True).wait_for()

    # the admin sees the code used, by whom and when (never the code)
    await page.get_by_label("Admin token, or your sk- API key").fill(ADMIN_TOKEN)
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await page.get_by_role("link", name="Top-up codes").click()
    await page.get_by_role("cell", name="dana-acct").wait_for()
    await page.get_by_role("cell", name="dana (u_").wait_for()  # who, by name
    assert codes[0] not in await page.content()
    await shot(page, "users-09-admin-codes-used")
    await context.close()
    assert not errors, errors
