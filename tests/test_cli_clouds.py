"""Cloud channels from the command line: ``gateway channels add`` takes each cloud type's
fields (secrets from the environment only), shows hints, never a secret, and ``gateway
channels test`` signs a Bedrock call as the gateway does (through the fake, which checks)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from bench.fake import FakeUpstream
from bench.fake.aws_auth import ACCESS_KEY, SECRET_KEY
from tests.test_cli import Runner, write_config

NOVA = "us.amazon.nova-pro-v1:0"


@pytest.fixture
def cli(
    tmp_path: Path, store_url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Runner:  # fmt: skip
    for name in ("GATEWAY_CONFIG", "GATEWAY_STORE", "GATEWAY_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    path = write_config(tmp_path)
    text = path.read_text()
    path.write_text(text.replace(text.splitlines()[0], f"store: {store_url}"))
    return Runner(path, capsys)


async def test_a_bedrock_channel_added_and_tested_from_the_command_line(
    cli: Runner, fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLI_AWS_SECRET", SECRET_KEY)
    argv = ["channels", "add", "bed", "--type", "bedrock", "--region", "us-east-1",
            "--base-url", fake.url, "--aws-access-key-id", ACCESS_KEY,
            "--aws-secret-access-key-env", "CLI_AWS_SECRET", "--models", "chat-small",
            "--map", f"chat-small={NOVA}", "--json"]  # fmt: skip
    out, _ = await asyncio.to_thread(cli, *argv)
    made = orjson.loads(out)
    assert SECRET_KEY not in out and ACCESS_KEY not in out
    assert made["region"] == "us-east-1" and made["aws_secret_access_key_hint"].endswith("0000")
    out, _ = await asyncio.to_thread(cli, "channels", "test", "bed", "--json")
    result = orjson.loads(out)
    assert result["ok"] is True and result["status"] == 200, result
    assert fake.requests[-1].path == f"/model/{NOVA}/converse"
    assert fake.requests[-1].headers["Authorization"].startswith("AWS4-HMAC-SHA256")


def test_a_secret_flag_reads_the_environment(cli: Runner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLI_ABSENT", raising=False)
    _, err = cli("channels", "add", "bed", "--type", "bedrock", "--region", "us-east-1",
                 "--aws-access-key-id", "AKIA", "--aws-secret-access-key-env", "CLI_ABSENT",
                 "--models", "chat-small", code=1)  # fmt: skip
    assert "--aws-secret-access-key-env: $CLI_ABSENT is not set" in err
    _, err = cli("channels", "add", "az", "--type", "azure", "--base-url", "https://x.openai.azure.com",
                 "--models", "chat-small", code=1)  # fmt: skip
    assert "api_version: must be a non-empty string" in err
