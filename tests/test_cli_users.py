"""``gateway users`` and ``gateway redemptions`` (CONTRACT §5b), on both stores: the same
service functions as the admin API, the password never an argument, the codes shown (and
printed as CSV) only by the command that made them."""

from __future__ import annotations

import asyncio
import csv
import io
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.cli.redemptions import listing_csv
from gateway.config import load_settings
from gateway.operator.passwords import verify_password
from gateway.operator.redemptions import code_hash
from gateway.store import MICRO, KeyRecord, hash_key
from gateway.store.backends import open_store
from tests.test_cli import Runner, one_error_line, rows, write_config

PASSWORD = "correct horse battery"


@pytest.fixture
def gw(
    tmp_path: Path,
    store_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Runner:
    for name in ("GATEWAY_CONFIG", "GATEWAY_STORE", "GATEWAY_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NEW_PASSWORD", PASSWORD)
    path = write_config(tmp_path)
    text = path.read_text()
    path.write_text(text.replace(text.splitlines()[0], f"store: {store_url}"))
    return Runner(path, capsys)


def in_store(gw: Runner, coro_of):  # type: ignore[no-untyped-def]
    """Run ``coro_of(store)`` on the config's store."""

    async def run():  # type: ignore[no-untyped-def]
        store = open_store(load_settings(gw.config).store)
        await store.open()
        try:
            return await coro_of(store)
        finally:
            await store.close()

    return asyncio.run(run())


def test_users_add_list_update_delete(gw: Runner) -> None:
    made = gw.json("users", "add", "dana", "--account", "alice", "--password-env", "NEW_PASSWORD")
    assert (made["username"], made["account"], made["groups"]) == ("dana", "alice", ["default"])
    out, _ = gw("users", "list")
    assert rows(out)[0] == ["ID", "USERNAME", "ACCOUNT", "GROUPS", "STATUS", "CREATED"]
    assert rows(out)[1][:5] == [made["id"], "dana", "alice", "default", "enabled"]
    stored = in_store(gw, lambda s: s.find_user("dana"))
    assert PASSWORD not in stored.password_hash
    assert asyncio.run(verify_password(stored.password_hash, PASSWORD))
    _, err = gw("users", "add", "DANA", "--account", "alice", "--password-env", "NEW_PASSWORD",
                code=1)  # fmt: skip
    assert "taken" in one_error_line(err)
    _, err = gw("users", "add", "erin", "--account", "alice", "--password-env", "UNSET", code=1)
    assert "UNSET is not set" in one_error_line(err)

    changed = gw.json("users", "update", made["id"], "--groups", "default,vip", "--status",
                      "disabled")  # fmt: skip
    assert (changed["groups"], changed["status"]) == (["default", "vip"], "disabled")
    _, err = gw("users", "update", made["id"], code=1)
    assert "nothing to change" in one_error_line(err)

    async def a_key(store):  # type: ignore[no-untyped-def]
        secret = "sk-dana-cli-000000000"
        await store.create_key(
            KeyRecord("k-dana", hash_key(secret), "alice", "default", owner=made["id"])
        )

    in_store(gw, a_key)
    out, _ = gw("users", "delete", made["id"])
    assert out.strip() == f"deleted user {made['id']} and its keys k-dana"
    assert in_store(gw, lambda s: s.get_key("k-dana")) is None
    _, err = gw("users", "delete", made["id"], code=1)
    assert "not found" in one_error_line(err)


def test_redemptions_create_as_csv_and_list(gw: Runner) -> None:
    out, _ = gw("redemptions", "create", "--amount", "2.5", "--count", "3", "--csv")
    lines = list(csv.DictReader(io.StringIO(out)))
    assert [(r["amount"], r["expires_at"]) for r in lines] == [("2.5", "")] * 3
    codes = [r["code"] for r in lines]
    assert len(set(codes)) == 3 and all(c.startswith("GW-") and len(c) == 22 for c in codes)

    async def redeem(store):  # type: ignore[no-untyped-def]
        return await store.redeem(code_hash(codes[0]), "alice", "u_1", datetime.now(UTC))

    _, account = in_store(gw, redeem)
    assert account.balance == 12_500_000
    listed = gw.json("redemptions", "list")["data"]
    assert [c["status"] for c in listed] == ["used", "unused", "unused"]
    assert listed[0]["account"] == "alice" and listed[0]["amount"] == 2.5
    assert not any(c in str(listed) for c in codes)  # hints, never the codes
    out, _ = gw("redemptions", "list", "--status", "unused")
    table = rows(out)
    assert table[0][:4] == ["ID", "HINT", "AMOUNT", "STATUS"] and len(table) == 3
    out, _ = gw("redemptions", "list", "--csv")
    assert out.splitlines()[0] == "id,hint,amount,status,created_at,expires_at,account,user,used_at"
    out, _ = gw("redemptions", "create", "--amount", "1")
    assert "shown only this once" in out and out.count("GW-") == 1
    _, err = gw("redemptions", "create", "--amount", "0", code=1)
    assert "amount" in one_error_line(err)
    assert in_store(gw, lambda s: s.load_balances())["alice"] == 12.5 * MICRO


def test_the_codes_listing_csv_writes_no_formula() -> None:
    """An account name a spreadsheet would take for a formula is written as text (``'``
    in front), as in the console's CSV; numbers and other text as they are."""
    row = {"id": "r-1", "hint": "ABCD…WXYZ", "amount": 5.0, "status": "used",
           "created_at": "2026-01-01T00:00:00Z", "expires_at": None,
           "account": "=HYPERLINK(\"http://evil.example\")", "user": "-2+3",
           "used_at": "2026-01-02T00:00:00Z"}  # fmt: skip
    [read] = list(csv.DictReader(io.StringIO(listing_csv([row]))))
    assert read["account"] == '\'=HYPERLINK("http://evil.example")'
    assert read["user"] == "'-2+3"
    assert (read["hint"], read["amount"], read["expires_at"]) == ("ABCD…WXYZ", "5.0", "")
