"""The ``gateway`` command line, run through ``main([...])`` against a config file with a
SQLite store in tmp_path."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.cli import main
from gateway.store import UsageRecord
from gateway.store.backends import open_store
from tests.plugins.records import usage_record
from tests.plugins.stores import sqlite_url

CONFIG = """\
store: sqlite:///{db}
admin_token: admin-token-for-the-cli
groups: [default, vip]
models:
  - name: chat-small
    capabilities: [chat]
    price: {{input: 0.5, output: 1.5}}
channels:
  - name: oa-1
    type: openai
    base_url: {base_url}
    api_key: upstream-key
    groups: [default]
    models: [chat-small]
accounts:
  - id: alice
    balance: 10
"""


def write_config(tmp_path: Path, base_url: str = "http://127.0.0.1:9001/v1") -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG.format(db=tmp_path / "data" / "gw.db", base_url=base_url))
    return path


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("GATEWAY_CONFIG", "GATEWAY_STORE", "GATEWAY_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return write_config(tmp_path)


class Runner:
    def __init__(self, config: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.config = config
        self.capsys = capsys

    def __call__(self, *argv: str, code: int = 0) -> tuple[str, str]:
        self.capsys.readouterr()
        rc = main([*argv, "--config", str(self.config)])
        out, err = self.capsys.readouterr()
        assert rc == code, (out, err)
        return out, err

    def json(self, *argv: str) -> Any:
        out, _ = self(*argv, "--json")
        return orjson.loads(out)


@pytest.fixture
def gw(config: Path, capsys: pytest.CaptureFixture[str]) -> Runner:
    return Runner(config, capsys)


def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("gateway: ")
    return lines[0]


def rows(table: str) -> list[list[str]]:
    return [line.split() for line in table.strip().splitlines()]


# ---- accounts ------------------------------------------------------------------------------


def test_accounts_create_show_and_table(gw: Runner) -> None:
    out, _ = gw("accounts", "create", "bob", "--balance", "2.5")
    assert rows(out) == [["ID", "BALANCE"], ["bob", "2.5"]]
    assert gw.json("accounts", "show", "bob") == {"id": "bob", "balance": 2.5}


def test_config_accounts_are_there_before_the_first_start(gw: Runner) -> None:
    assert gw.json("accounts", "show", "alice") == {"id": "alice", "balance": 10}


def test_topup_is_exact(gw: Runner) -> None:
    gw("accounts", "create", "bob")
    gw("accounts", "topup", "bob", "0.1")
    out, _ = gw("accounts", "topup", "bob", "0.2")
    assert rows(out)[1] == ["bob", "0.3"]
    assert gw.json("accounts", "show", "bob") == {"id": "bob", "balance": 0.3}
    out, _ = gw("accounts", "topup", "bob", "-1")
    assert rows(out)[1] == ["bob", "-0.7"]


def test_accounts_list_aligns_balances(gw: Runner) -> None:
    gw("accounts", "create", "a-much-longer-account-id", "--balance", "1234.5")
    out, _ = gw("accounts", "list")
    lines = out.rstrip("\n").splitlines()
    assert lines[0].split() == ["ID", "BALANCE"]
    # the balance column is right-aligned: every line ends at the same column
    assert len({len(line) for line in lines}) == 1
    assert gw.json("accounts", "list")["data"] == [
        {"id": "a-much-longer-account-id", "balance": 1234.5},
        {"id": "alice", "balance": 10},
    ]


def test_account_errors(gw: Runner) -> None:
    _, err = gw("accounts", "show", "nobody", code=1)
    assert one_error_line(err) == "gateway: account 'nobody' not found"
    _, err = gw("accounts", "create", "alice", code=1)
    assert "already exists" in one_error_line(err)
    _, err = gw("accounts", "topup", "alice", "lots", code=2)
    assert "not a number" in err
    _, err = gw("accounts", "create", "bad id!", code=1)
    assert "not a valid id" in one_error_line(err)
    assert gw.json("accounts", "show", "alice")["balance"] == 10


# ---- keys ----------------------------------------------------------------------------------


def test_keys_create_shows_the_secret_once(gw: Runner, config: Path) -> None:
    created = gw.json("keys", "create", "--account", "alice", "--name", "laptop")
    secret = created["key"]
    assert re.fullmatch(r"sk-[A-Za-z0-9_-]{48}", secret)
    assert created["group"] == "default"
    assert created["name"] == "laptop"

    out, _ = gw("keys", "list")
    assert secret not in out
    (header, row) = rows(out)
    assert header == ["ID", "NAME", "ACCOUNT", "GROUP", "STATUS", "EXPIRES", "CREATED", "HINT"]
    assert row[:6] == [created["id"], "laptop", "alice", "default", "enabled", "-"]
    assert row[7] == created["hint"]

    listed = gw.json("keys", "list")["data"]
    assert [k["id"] for k in listed] == [created["id"]]
    assert "key" not in listed[0]

    db = config.parent / "data" / "gw.db"
    for path in db.parent.iterdir():
        assert secret.encode() not in path.read_bytes()


def test_keys_create_table_output(gw: Runner) -> None:
    out, _ = gw("keys", "create", "--account", "alice", "--group", "vip",
                "--expires-at", "2030-01-01T00:00:00Z")  # fmt: skip
    fields = dict(line.split(None, 1) for line in out.splitlines() if line and " " in line)
    assert re.fullmatch(r"sk-[A-Za-z0-9_-]{48}", fields["key"])
    assert fields["group"] == "vip"
    assert fields["expires_at"] == "2030-01-01T00:00:00Z"
    assert "shown only this once" in out


def test_keys_disable_then_list_shows_disabled(gw: Runner) -> None:
    kid = gw.json("keys", "create", "--account", "alice")["id"]
    other = gw.json("keys", "create", "--account", "alice")["id"]
    out, _ = gw("keys", "disable", kid)
    assert rows(out)[1][:5] == [kid, "-", "alice", "default", "disabled"]

    statuses = {k["id"]: k["status"] for k in gw.json("keys", "list")["data"]}
    assert statuses == {kid: "disabled", other: "enabled"}
    out, _ = gw("keys", "list")
    table = {r[0]: r[4] for r in rows(out)[1:]}
    assert table == {kid: "disabled", other: "enabled"}

    assert gw.json("keys", "enable", kid)["status"] == "enabled"
    assert {k["status"] for k in gw.json("keys", "list")["data"]} == {"enabled"}


def test_keys_update_sets_and_clears_the_expiry(gw: Runner) -> None:
    kid = gw.json("keys", "create", "--account", "alice")["id"]
    updated = gw.json("keys", "update", kid, "--expires-at", "2031-05-06T07:08:09Z",
                      "--group", "vip", "--name", "ci")  # fmt: skip
    assert (updated["expires_at"], updated["group"], updated["name"]) == (
        "2031-05-06T07:08:09Z", "vip", "ci",
    )  # fmt: skip
    (listed,) = gw.json("keys", "list")["data"]
    assert listed["expires_at"] == "2031-05-06T07:08:09Z"
    assert gw.json("keys", "update", kid, "--no-expiry")["expires_at"] is None
    (listed,) = gw.json("keys", "list")["data"]
    assert listed["expires_at"] is None and listed["group"] == "vip"
    _, err = gw("keys", "update", kid, code=1)
    assert "nothing to change" in one_error_line(err)
    gw("keys", "update", kid, "--no-expiry", "--expires-at", "2031-01-01T00:00:00Z", code=2)


def test_keys_list_by_account(gw: Runner) -> None:
    gw("accounts", "create", "bob")
    gw("keys", "create", "--account", "alice")
    bobs = gw.json("keys", "create", "--account", "bob")["id"]
    assert [k["id"] for k in gw.json("keys", "list", "--account", "bob")["data"]] == [bobs]
    out, _ = gw("keys", "list", "--account", "carol")
    assert out.strip() == "no keys"


def test_keys_delete(gw: Runner) -> None:
    kid = gw.json("keys", "create", "--account", "alice")["id"]
    assert gw.json("keys", "delete", kid) == {"id": kid, "deleted": True}
    assert gw.json("keys", "list") == {"data": []}
    _, err = gw("keys", "delete", kid, code=1)
    assert one_error_line(err) == f"gateway: key '{kid}' not found"


def test_key_errors(gw: Runner) -> None:
    _, err = gw("keys", "create", "--account", "nobody", code=1)
    assert one_error_line(err) == "gateway: account 'nobody' not found"
    _, err = gw("keys", "create", "--account", "alice", "--group", "gold", code=1)
    assert "unknown group 'gold'" in one_error_line(err)
    _, err = gw("keys", "create", "--account", "alice", "--expires-at", "soon", code=1)
    assert "expires_at" in one_error_line(err)
    _, err = gw("keys", "disable", "k_nothere", code=1)
    assert one_error_line(err) == "gateway: key 'k_nothere' not found"
    assert gw.json("keys", "list") == {"data": []}


# ---- usage ---------------------------------------------------------------------------------


def settle(store_url: str, records: list[UsageRecord]) -> None:
    async def run() -> None:
        store = open_store(store_url)
        await store.open()
        try:
            await store.settle(records)
        finally:
            await store.close()

    asyncio.run(run())


def record(n: int, account: str) -> UsageRecord:
    return usage_record(
        time=datetime(2030, 1, 1, tzinfo=UTC) + timedelta(minutes=n),
        request_id=f"req-{n}",
        account=account,
        key_id="k_1",
        channel=None if n == 2 else "oa-1",
        protocol="anthropic",
        prompt_tokens=100 * n,
        completion_tokens=10 * n,
        cost=125_000 * n,
        latency_ms=40 + n,
        ip_range="198.51.100.0/24",
    )


def test_usage(gw: Runner, config: Path) -> None:
    gw("accounts", "create", "bob")
    settle(f"sqlite:///{config.parent / 'data' / 'gw.db'}",
           [record(1, "alice"), record(2, "bob"), record(3, "alice")])  # fmt: skip

    data = gw.json("usage")["data"]
    assert [r["request_id"] for r in data] == ["req-3", "req-2", "req-1"]
    assert data[0]["time"] == "2030-01-01T00:03:00Z"
    assert data[0]["cost"] == 0.375
    assert data[1]["channel"] is None
    assert [r["request_id"] for r in gw.json("usage", "--limit", "1")["data"]] == ["req-3"]
    assert [r["request_id"] for r in gw.json("usage", "--account", "alice")["data"]] == [
        "req-3",
        "req-1",
    ]

    out, _ = gw("usage", "--account", "alice")
    table = rows(out)
    assert table[0][:3] == ["TIME", "ACCOUNT", "KEY"]
    assert [r[0] for r in table[1:]] == ["2030-01-01T00:03:00Z", "2030-01-01T00:01:00Z"]
    assert table[1][10] == "0.375"
    assert gw.json("accounts", "show", "alice")["balance"] == 9.5

    _, err = gw("usage", "--limit", "0", code=2)
    assert "--limit" in err


# ---- config, usage errors and serve ----------------------------------------------------------


def test_bad_config_is_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GATEWAY_STORE", raising=False)
    path = write_config(tmp_path, base_url="not a url")
    for argv in (["keys", "list"], ["serve"], ["usage", "--json"]):
        assert main([*argv, "--config", str(path)]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert one_error_line(err) == "gateway: config error: channels[0].base_url: not a URL"


@pytest.mark.parametrize("price", ["1.0e+308", ".inf", ".nan", "1000001", "-0.5"])
def test_a_price_past_the_bound_is_one_line_exit_2(
    price: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a traceback at start-up (an overflow pricing it), nor a gateway that overflows on
    every catalogue load."""
    monkeypatch.delenv("GATEWAY_STORE", raising=False)
    path = write_config(tmp_path)
    path.write_text(path.read_text().replace("input: 0.5", f"input: {price}"))
    for argv in (["keys", "list"], ["serve"]):
        assert main([*argv, "--config", str(path)]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert one_error_line(err) == (
            "gateway: config error: models[0].price.input: must be a number from 0 to 1000000"
        )


@pytest.mark.parametrize("store", ["redis://127.0.0.1:1/0", "sqlite:///{dir}/not-a-db"])
def test_unusable_store_is_one_line_exit_1(
    store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GATEWAY_STORE", raising=False)
    (tmp_path / "not-a-db").write_bytes(b"this is not an sqlite file " * 100)
    path = write_config(tmp_path)
    path.write_text(path.read_text().replace(
        path.read_text().splitlines()[0], "store: " + store.format(dir=tmp_path)
    ))  # fmt: skip
    assert main(["keys", "list", "--config", str(path)]) == 1
    assert one_error_line(capsys.readouterr().err).startswith("gateway: store error: ")


def test_missing_config(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                        tmp_path: Path) -> None:  # fmt: skip
    monkeypatch.delenv("GATEWAY_CONFIG", raising=False)
    assert main(["keys", "list"]) == 2
    assert "GATEWAY_CONFIG" in one_error_line(capsys.readouterr().err)
    assert main(["keys", "list", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in one_error_line(capsys.readouterr().err)


def test_config_from_environment(
    config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_CONFIG", str(config))
    assert main(["accounts", "show", "alice", "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out) == {"id": "alice", "balance": 10}
    # --json and --config also work before the command
    assert main(["--json", "accounts", "show", "alice"]) == 0
    assert orjson.loads(capsys.readouterr().out)["id"] == "alice"


@pytest.mark.parametrize(
    "argv",
    [[], ["keys"], ["accounts", "topup", "alice"], ["nonsense"], ["serve", "--port", "0"],
     ["serve", "--workers", "x"], ["serve", "--server", "gunicorn"]],
)  # fmt: skip
def test_usage_errors_exit_2(
    argv: list[str], config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--config", str(config)]) == 2
    assert capsys.readouterr().err


def test_serve_passes_its_options_on(
    config: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []
    fake = types.ModuleType("gateway.server")

    def serve(settings: Any, host: str, port: int, workers: int, server: str = "x") -> None:
        calls.append((settings.admin_token, host, port, workers, server))

    fake.serve = serve  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gateway.server", fake)
    assert main(["serve", "--config", str(config)]) == 0
    assert main(["serve", "--config", str(config), "--host", "0.0.0.0", "--port", "9000",
                 "--workers", "4", "--server", "hypercorn"]) == 0  # fmt: skip
    assert calls == [
        ("admin-token-for-the-cli", "127.0.0.1", 8080, 1, "uvicorn"),
        ("admin-token-for-the-cli", "0.0.0.0", 9000, 4, "hypercorn"),
    ]


def test_python_dash_m_gateway(config: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "accounts", "show", "alice", "--json",
         "--config", str(config)],
        capture_output=True, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert orjson.loads(proc.stdout) == {"id": "alice", "balance": 10}


# ---- catalogue: channels, models, groups ----------------------------------------------------


@pytest.fixture
def catalogue_gw(
    tmp_path: Path, store_url: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Runner:  # fmt: skip
    """The CLI on a config whose store is each backend in turn."""
    for name in ("GATEWAY_CONFIG", "GATEWAY_STORE", "GATEWAY_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    path = write_config(tmp_path)
    text = path.read_text()
    path.write_text(text.replace(text.splitlines()[0], f"store: {store_url}"))
    return Runner(path, capsys)


def test_catalogue_verbs(catalogue_gw: Runner, monkeypatch: pytest.MonkeyPatch) -> None:
    gw = catalogue_gw
    secret = "sk-cli-upstream-secret-9a8b"
    out, _ = gw("groups", "list")
    header = ["NAME", "RATIO", "TOOL", "ORIGIN"]
    assert rows(out) == [header, ["default", "1", "-", "file"], ["vip", "1", "-", "file"]]
    gw("groups", "add", "team", "--ratio", "1.5")
    # the admin API's shape (GET /admin/groups), not bare names
    assert gw.json("groups", "list") == {
        "data": [
            {"name": "default", "ratio": 1.0, "tool": None, "origin": "file"},
            {"name": "vip", "ratio": 1.0, "tool": None, "origin": "file"},
            {"name": "team", "ratio": 1.5, "tool": None, "origin": "api"},
        ]
    }
    assert gw.json("groups", "update", "team", "--ratio", "2")["ratio"] == 2.0
    # a group's tool kind: set, kept when the ratio changes, cleared with none
    assert gw.json("groups", "update", "team", "--tool", "codex")["tool"] == "codex"
    assert gw.json("groups", "update", "team", "--ratio", "2")["tool"] == "codex"
    gw("groups", "add", "cc", "--tool", "claude-code")
    out, _ = gw("groups", "list")
    assert rows(out) == [
        header, ["default", "1", "-", "file"], ["vip", "1", "-", "file"],
        ["team", "2", "codex", "api"], ["cc", "1", "claude-code", "api"],
    ]  # fmt: skip
    assert gw.json("groups", "update", "team", "--tool", "none")["tool"] is None
    gw("groups", "delete", "cc")

    out, _ = gw("models", "add", "m2", "--capabilities", "chat,vision", "--input", "1",
                "--output", "2")  # fmt: skip
    assert rows(out)[1] == ["m2", "chat,vision", "1", "2", "0", "4096", "api"]
    made = gw.json("models", "update", "m2", "--output", "3")
    assert made["price"]["input"] == 1 and made["price"]["output"] == 3  # the others kept
    assert [m["name"] for m in gw.json("models", "list")["data"]] == ["chat-small", "m2"]

    monkeypatch.setenv("CLI_UPSTREAM_KEY", secret)
    out, _ = gw("channels", "add", "c2", "--type", "anthropic", "--base-url",
                "http://127.0.0.1:9", "--api-key-env", "CLI_UPSTREAM_KEY", "--models",
                "m2,chat-small", "--groups", "team", "--map", "m2=claude-x")  # fmt: skip
    assert secret not in out
    assert rows(out)[1] == ["c2", "anthropic", "enabled", "0", "1", "team", "m2,chat-small",
                            "http://127.0.0.1:9", "sk-…9a8b", "api"]  # fmt: skip
    listed = gw.json("channels", "list")["data"]
    assert [c["name"] for c in listed] == ["oa-1", "c2"]
    assert listed[1]["model_map"] == {"m2": "claude-x"} and "api_key" not in listed[1]
    changed = gw.json("channels", "update", "c2", "--status", "disabled", "--weight", "4")
    assert (changed["status"], changed["weight"]) == ("disabled", 4)
    out, _ = gw("channels", "list")
    assert secret not in out and "upstream-key" not in out

    # the file's entries, things in use, bad input: one line, exit 1
    for argv, words in [
        (["channels", "update", "oa-1", "--weight", "2"], "configuration file"),
        (["channels", "delete", "oa-1"], "configuration file"),
        (["models", "delete", "m2"], "c2"),
        (["groups", "delete", "team"], "c2"),
        (["groups", "delete", "default"], "configuration file"),
        (["channels", "add", "c3", "--type", "openai", "--base-url", "nope", "--models", "m2"],
         "base_url:"),
        (["channels", "update", "c2"], "nothing to change"),
        (["channels", "delete", "nope"], "not found"),
    ]:  # fmt: skip
        _, err = gw(*argv, code=1)
        assert words in one_error_line(err), (argv, err)

    out, _ = gw("channels", "delete", "c2")
    assert out.strip() == "deleted channel c2"
    assert gw.json("models", "delete", "m2") == {"name": "m2", "deleted": True}
    gw("groups", "delete", "team")
    assert [g["name"] for g in gw.json("groups", "list")["data"]] == ["default", "vip"]


def test_channels_test_verb(catalogue_gw: Runner) -> None:
    # the config's channel points at a port nothing serves
    out, _ = catalogue_gw("channels", "test", "oa-1", code=1)
    assert out.startswith("FAILED")
    result = orjson.loads(catalogue_gw("channels", "test", "oa-1", "--json", code=1)[0])
    assert result["ok"] is False and result["status"] is None and result["error"]


async def test_a_channel_added_by_the_cli_serves_on_a_running_gateway(
    gateway: Any, tmp_path: Path
) -> None:
    import aiohttp
    import yaml

    from tests.plugins.servers import KEYS

    config = tmp_path / "cli.yaml"
    config.write_text(yaml.safe_dump({
        "store": gateway.settings.store, "admin_token": "x" * 16, "groups": ["default", "vip"],
    }))  # fmt: skip
    upstream = gateway.settings.channels[0].base_url
    for argv in (["models", "add", "m-cli", "--input", "1"],
                 ["channels", "add", "c-cli", "--type", "openai", "--base-url", upstream,
                  "--api-key", "k", "--models", "m-cli"]):  # fmt: skip
        assert await asyncio.to_thread(main, [*argv, "--config", str(config)]) == 0
    chat = {"model": "m-cli", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {KEYS['alice']}"}
    async with aiohttp.ClientSession() as http:
        for _ in range(100):  # generous: the contract's one second, on a busy machine
            async with http.post(gateway.v1 + "/chat/completions", json=chat,
                                 headers=headers) as r:  # fmt: skip
                await r.read()
                if r.status == 200:
                    break
            await asyncio.sleep(0.05)
        assert r.status == 200
        # the gateway's own file entries are untouched by a CLI on another config
        chat["model"] = "chat-small"
        async with http.post(gateway.v1 + "/chat/completions", json=chat, headers=headers) as r:
            assert r.status == 200


def test_sessions_rotate_replaces_the_secret_console_sessions_are_signed_with(
    gw: Runner, tmp_path: Path
) -> None:
    async def secret() -> bytes:
        store = open_store(sqlite_url(tmp_path / "data" / "gw.db"))
        await store.open()
        try:
            return await store.session_secret()
        finally:
            await store.close()

    before = asyncio.run(secret())
    assert gw.json("sessions", "rotate") == {"rotated": True}
    after = asyncio.run(secret())
    assert after != before and len(after) >= 32
    out, _ = gw("sessions", "rotate")
    assert "rotated" in out and asyncio.run(secret()) != after
