"""Codex CLI (``@openai/codex`` from npm), which speaks only the Responses API, runs
``codex exec`` against the gateway with only its base URL and key changed, on every channel
type: the model (the fake upstream) asks for a shell command, Codex runs it, sends its output
back, and prints the model's answer. Codex offers tools no other provider runs (a
``namespace`` of functions, ``web_search``): the gateway carries the first and leaves the
second out, rather than refusing the request.

Codex is installed once per machine into the user's cache (about 400 MB). Where npm is
missing or cannot reach its registry (``npm ping`` fails) the test is skipped with the reason;
an install that fails while the registry answers is a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.fake_upstream import FakeUpstream
from tests.plugins.servers import KEYS, ServedGateway
from tests.test_sdk_matrix import Target, target_param

VERSION = "0.169.0"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "model-gateway"
CODEX = CACHE / f"codex-{VERSION}" / "node_modules" / ".bin" / "codex"
# the shell command the model asks for: its output (42-done) appears nowhere in the prompt
COMMAND = "echo $((6*7))-done | tee proof.txt"
PROMPT = f'[[fake tool=exec_command args={{"cmd":"{COMMAND}"}}]] make the proof file'


def registry_unreachable() -> str | None:
    """Why npm cannot reach its registry (``npm ping``'s complaint), or None when it can."""
    try:
        ping = subprocess.run(["npm", "ping"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "npm ping timed out"
    if ping.returncode != 0:
        return ping.stderr.strip()[-300:] or f"npm ping exited {ping.returncode}"
    return None


@pytest.fixture(scope="session")
def codex() -> Path:
    if CODEX.exists():
        return CODEX
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    unreachable = registry_unreachable()
    if unreachable is not None:
        pytest.skip(f"npm cannot reach its registry: {unreachable}")
    target = CODEX.parents[2]
    target.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(target)]
            + [f"@openai/codex@{VERSION}"],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        unreachable = registry_unreachable()
        if unreachable is not None:
            pytest.skip(f"npm lost its registry during the install: {unreachable}")
        pytest.fail("npm install @openai/codex took over 600 s with the registry reachable")
    if done.returncode != 0 or not CODEX.exists():
        unreachable = registry_unreachable()
        if unreachable is not None:
            pytest.skip(f"npm lost its registry during the install: {unreachable}")
        pytest.fail(f"npm could not install @openai/codex: {done.stderr.strip()[-300:]}")
    return CODEX


def codex_home(path: Path, gw: ServedGateway, model: str) -> Path:
    """The whole of a user's Codex configuration: a provider at the gateway's base URL."""
    path.mkdir()
    (path / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "gateway"\n'
        "[model_providers.gateway]\n"
        'name = "gateway"\n'
        f'base_url = "{gw.v1}"\n'
        'env_key = "GATEWAY_KEY"\n'
        'wire_api = "responses"\n'
    )
    return path


@target_param
async def test_codex_exec_runs_a_shell_tool_call_through_each_channel_type(
    codex: Path, gateway: ServedGateway, fake: FakeUpstream, target: Target, tmp_path: Path
) -> None:
    home = codex_home(tmp_path / "codex-home", gateway, target.model)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "CODEX_HOME": str(home), "GATEWAY_KEY": KEYS["alice"]}
    proc = await asyncio.create_subprocess_exec(
        str(codex),
        "exec",
        "--skip-git-repo-check",
        "-s",
        "danger-full-access",
        PROMPT,
        cwd=work,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 180)
    printed = out.decode(errors="replace")
    assert proc.returncode == 0, printed[-2000:]
    assert (work / "proof.txt").read_text().strip() == "42-done"  # Codex ran the call
    assert "Hello from the demo upstream" in printed  # and showed the answer after it
    # the second turn carried the command's output back to the channel
    chats = [r for r in fake.requests if r.path == target.chat_path(True)]
    assert len(chats) == 2
    assert b"42-done" in chats[1].body and b"42-done" not in chats[0].body
    await gateway.state.writer.flush()
    records = await gateway.state.store.usage("alice", 10)
    assert [(r.protocol, r.channel, r.status) for r in records] == [
        ("responses", target.channel, 200)
    ] * 2
    assert all(r.cost > 0 for r in records)


# a catalogue entry that makes Codex offer apply_patch as a freeform (custom) tool, as it does
# for OpenAI's own models; every other field is what Codex needs to read the entry
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello from the gateway\n*** End Patch\n"
PATCH_PROMPT = (
    "[[fake tool=apply_patch args=" + json.dumps({"input": PATCH}) + "]] create hello.txt"
)


def freeform_catalog(path: Path, model: str) -> Path:
    entry = {
        "slug": model, "display_name": model, "description": "through the gateway",
        "apply_patch_tool_type": "freeform", "shell_type": "shell_command",
        "supports_reasoning_summaries": False, "support_verbosity": False,
        "default_verbosity": None, "input_modalities": ["text", "image"],
        "truncation_policy": {"mode": "tokens", "limit": 10000},
        "supports_parallel_tool_calls": True, "context_window": 128000,
        "reasoning_summary_format": "none", "default_reasoning_level": None,
        "supported_reasoning_levels": [], "visibility": "list",
        "minimal_client_version": "0.0.1", "supported_in_api": True, "upgrade": None,
        "priority": 0, "base_instructions": "You are a coding agent.",
        "experimental_supported_tools": [],
    }  # fmt: skip
    path.write_text(json.dumps({"models": [entry]}))
    return path


@target_param
async def test_codex_exec_applies_a_freeform_patch_through_each_channel_type(
    codex: Path, gateway: ServedGateway, fake: FakeUpstream, target: Target, tmp_path: Path
) -> None:
    """apply_patch as Codex offers it to OpenAI's models, a custom tool: the channel gets a
    function of one string, its call comes back as a custom_tool_call Codex applies, and the
    patch's outcome goes back as the function's result."""
    home = codex_home(tmp_path / "codex-home", gateway, target.model)
    catalog = freeform_catalog(tmp_path / "models.json", target.model)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "CODEX_HOME": str(home), "GATEWAY_KEY": KEYS["alice"]}
    proc = await asyncio.create_subprocess_exec(
        str(codex), "exec", "--skip-git-repo-check", "-s", "danger-full-access",
        "-c", f"model_catalog_json={catalog}", PATCH_PROMPT,
        cwd=work, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 180)
    printed = out.decode(errors="replace")
    assert proc.returncode == 0, printed[-2000:]
    assert (work / "hello.txt").read_text() == "hello from the gateway\n"  # Codex applied it
    assert "Hello from the demo upstream" in printed
    chats = [r for r in fake.requests if r.path == target.chat_path(True)]
    assert len(chats) == 2
    assert b"apply_patch" in chats[0].body and b"hello.txt" in chats[1].body
    await gateway.state.writer.flush()
    records = await gateway.state.store.usage("alice", 10)
    assert [(r.protocol, r.channel, r.status) for r in records] == [
        ("responses", target.channel, 200)
    ] * 2
