"""The console's channel form for the cloud types, in real headless Chromium (as
``test_console_browser``): a bedrock channel (region, AWS keys), a vertex channel (project,
region, service account key) and an azure one (API version, deployments) are added through
the form, each type showing its own fields;
the admin API never shows their secrets back, and the form does not hold them when editing
(left blank, they stay as they were); then a request through each reaches the bundled fake,
which checks the SigV4 signature, the OAuth2 token and the api-key as the clouds do.
Screenshots go to ``tests/screenshots/``."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
import pytest

from bench.fake import FakeUpstream
from bench.fake.aws_auth import ACCESS_KEY, SECRET_KEY
from bench.fake.azure import AZURE_KEY
from tests.plugins.servers import ADMIN_TOKEN, KEYS, ServedGateway
from tests.test_console_browser import browser, catalogue_channels, shot, sign_in  # noqa: F401

CLAUDE = "anthropic.claude-3-5-sonnet-20240620-v1:0"
SESSION_TOKEN = "FwoGZXIvYXdzEXAMPLEsessiontoken"


async def add_models(gateway: ServedGateway) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with aiohttp.ClientSession() as s:
        for name in ("cloud-claude", "cloud-gemini", "cloud-gpt"):
            body = {"name": name, "capabilities": ["chat"], "price": {"input": 1, "output": 2}}
            async with s.post(gateway.url + "/admin/models", json=body, headers=headers) as r:
                assert r.status in (200, 201), await r.text()


async def test_cloud_channels_made_in_the_console_serve_requests(
    gateway: ServedGateway,
    fake: FakeUpstream,
    browser: Any,  # noqa: F811
) -> None:
    if gateway.settings.store.startswith("redis"):
        pytest.skip("one store is enough for the browser; the API tests cover both")
    await add_models(gateway)
    account = json.dumps(fake.service_account())
    page = await (await browser.new_context(viewport={"width": 1280, "height": 900})).new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    await sign_in(page, gateway.url, ADMIN_TOKEN)
    await page.get_by_role("link", name="Channels").click()
    form = page.locator("#new-channel")
    region = form.get_by_label("AWS region")
    assert not await region.is_visible()  # openai, the default type: no cloud fields

    await form.get_by_label("Name").fill("console-bedrock")
    await form.get_by_label("Type").select_option("bedrock")
    assert not await form.get_by_label("Upstream API key").is_visible()
    assert not await form.get_by_label("GCP project").is_visible()
    await form.get_by_label("Base URL").fill(fake.url)
    await region.fill("us-east-1")
    await form.get_by_label("AWS access key ID").fill(ACCESS_KEY)
    await form.get_by_label("AWS secret access key").fill(SECRET_KEY)
    await form.get_by_label("AWS session token").fill(SESSION_TOKEN)
    await form.get_by_label("Models (comma-separated)").fill("cloud-claude")
    await form.get_by_label("Model map").fill(f"cloud-claude={CLAUDE}")
    await form.get_by_role("button", name="Add channel").click()
    await page.get_by_role("cell", name="console-bedrock", exact=True).wait_for()

    await form.get_by_label("Name").fill("console-vertex")
    await form.get_by_label("Type").select_option("vertex")
    assert not await region.is_visible()
    await form.get_by_label("Base URL").fill(fake.url)
    await form.get_by_label("GCP project").fill("proj-1")
    await form.get_by_label("Vertex region").fill("us-east5")
    await form.get_by_label("Service account key").fill(account)
    await form.get_by_label("Models (comma-separated)").fill("cloud-gemini")
    await form.get_by_label("Model map").fill("cloud-gemini=gemini-2.5-flash")
    await shot(page, "07-channels-vertex-form")
    await form.get_by_role("button", name="Add channel").click()
    await page.get_by_role("cell", name="console-vertex", exact=True).wait_for()

    await form.get_by_label("Name").fill("console-azure")
    await form.get_by_label("Type").select_option("azure")
    await form.get_by_label("Base URL").fill(fake.url)
    await form.get_by_label("Upstream API key").fill(AZURE_KEY)
    await form.get_by_label("API version").fill("2024-10-21")
    await form.get_by_label("Models (comma-separated)").fill("cloud-gpt")
    await form.get_by_label("Deployments").fill("cloud-gpt=gpt-4o-deploy")
    await form.get_by_role("button", name="Add channel").click()
    await page.get_by_role("cell", name="console-azure", exact=True).wait_for()
    await shot(page, "07-channels-clouds-added")

    # the secrets went in and never come out: hints at most
    shown = {c["name"]: c for c in await catalogue_channels(gateway)}
    listed = json.dumps(shown)
    for secret in (SECRET_KEY, SESSION_TOKEN, fake.service_account()["private_key"]):
        assert secret not in listed
    bed, vx = shown["console-bedrock"], shown["console-vertex"]
    assert (bed["type"], bed["region"], vx["project"], vx["region"]) == (
        "bedrock", "us-east-1", "proj-1", "us-east5",
    )  # fmt: skip
    assert bed["aws_secret_access_key_hint"] and bed["aws_session_token_hint"]
    assert vx["credentials_hint"].startswith("service account ")
    assert shown["console-azure"]["api_version"] == "2024-10-21"
    assert AZURE_KEY not in listed

    # editing shows no secret, and a blank one stays as it was
    await page.get_by_role("button", name="Edit channel console-bedrock").click()
    assert await form.get_by_label("AWS region").input_value() == "us-east-1"
    assert await form.get_by_label("AWS secret access key").input_value() == ""
    await form.get_by_label("Priority").fill("2")
    await form.get_by_role("button", name="Save channel console-bedrock").click()
    await page.get_by_text("Channel console-bedrock saved.").wait_for()
    await page.get_by_role("button", name="Edit channel console-vertex").click()
    assert await form.get_by_label("Service account key").input_value() == ""
    await shot(page, "07-channels-vertex-edit")

    alice = openai.AsyncOpenAI(base_url=gateway.v1, api_key=KEYS["alice"], max_retries=0)
    for model in ("cloud-claude", "cloud-gemini", "cloud-gpt"):
        reply = await alice.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "[[fake text=through-the-cloud]]"}]
        )
        assert reply.choices[0].message.content == "through-the-cloud"
    paths = [r.path for r in fake.requests if r.path != "/token"]
    assert paths[-3] == f"/model/{CLAUDE}/invoke"
    assert paths[-1] == "/openai/deployments/gpt-4o-deploy/chat/completions"
    assert paths[-2].endswith("/projects/proj-1/locations/us-east5/publishers/google/models/"
                              "gemini-2.5-flash:generateContent")  # fmt: skip
    signed = [r for r in fake.requests if r.path == paths[-3]][-1]
    assert signed.headers["X-Amz-Security-Token"] == SESSION_TOKEN  # kept through the edit
    await gateway.state.writer.flush()
    records = await gateway.state.store.usage("alice", 3)
    assert {(r.model, r.channel, r.status) for r in records} == {
        ("cloud-claude", "console-bedrock", 200),
        ("cloud-gemini", "console-vertex", 200),
        ("cloud-gpt", "console-azure", 200),
    }

    # a new access key ID replaces the whole set: its secret is asked for, and the old session
    # token (not the new key's) is cleared
    await page.get_by_role("button", name="Edit channel console-bedrock").click()
    await form.get_by_label("AWS access key ID").fill(ACCESS_KEY)
    await form.get_by_role("button", name="Save channel console-bedrock").click()
    await page.get_by_text("AWS secret access key: required with a new access key ID.").wait_for()
    await form.get_by_label("AWS secret access key").fill(SECRET_KEY)
    await form.get_by_role("button", name="Save channel console-bedrock").click()
    await page.get_by_text("Channel console-bedrock saved.").wait_for()
    bed = {c["name"]: c for c in await catalogue_channels(gateway)}["console-bedrock"]
    assert bed["aws_access_key_id_hint"] and "aws_session_token_hint" not in bed
    reply = await alice.chat.completions.create(
        model="cloud-claude", messages=[{"role": "user", "content": "[[fake text=new-keys]]"}]
    )
    assert reply.choices[0].message.content == "new-keys"
    signed = [r for r in fake.requests if r.path == f"/model/{CLAUDE}/invoke"][-1]
    assert "X-Amz-Security-Token" not in signed.headers

    # and the stored keys can be dropped, for the environment's credentials
    await page.get_by_role("button", name="Edit channel console-bedrock").click()
    clear = form.get_by_label("Clear the stored AWS keys")
    await clear.check()
    assert await form.get_by_label("AWS secret access key").is_disabled()
    await shot(page, "07-channels-bedrock-clear-keys")
    await form.get_by_role("button", name="Save channel console-bedrock").click()
    await page.get_by_text("Channel console-bedrock saved.").wait_for()
    bed = {c["name"]: c for c in await catalogue_channels(gateway)}["console-bedrock"]
    assert not [k for k in bed if k.startswith("aws_")], bed
    assert bed["region"] == "us-east-1"
    row = page.get_by_role("row").filter(has_text="console-bedrock")
    await row.get_by_role("cell", name="—", exact=True).wait_for()  # the list drawn again: no key
    await row.get_by_role("button", name="Edit channel console-bedrock").click()
    assert not await form.get_by_label("Clear the stored AWS keys").is_visible()  # none left
    await alice.close()
    assert not errors
