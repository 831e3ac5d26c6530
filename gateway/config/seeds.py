"""Accounts and keys seeded from the file: created when absent, never overwriting what
changed at run time."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gateway.config.values import (
    ConfigError,
    mapping,
    name_of,
    no_unknown,
    number,
    parse_time,
    string,
)

KEY_STATUSES = ("enabled", "disabled")


@dataclass(frozen=True, slots=True)
class AccountSeed:
    id: str
    balance: float


@dataclass(frozen=True, slots=True)
class KeySeed:
    id: str
    key: str = field(repr=False)  # the key's secret
    account: str
    group: str
    status: str = "enabled"
    name: str = ""
    expires_at: datetime | None = None


def parse_account(v: Any, where: str) -> AccountSeed:
    d = mapping(v, where)
    no_unknown(d, {"id", "balance"}, where)
    return AccountSeed(
        id=name_of(d.get("id"), f"{where}.id"),
        balance=number(d.get("balance", 0), f"{where}.balance", minimum=-1e15),
    )


def parse_key(v: Any, where: str, groups: set[str], accounts: set[str]) -> KeySeed:
    d = mapping(v, where)
    no_unknown(d, {"id", "key", "account", "group", "status", "expires_at", "name"}, where)
    key = string(d.get("key"), f"{where}.key")
    if not key.startswith("sk-") or len(key) < 8:
        raise ConfigError(f"{where}.key: must start with 'sk-' and be at least 8 characters")
    account = name_of(d.get("account"), f"{where}.account")
    if account not in accounts:
        raise ConfigError(f"{where}.account: unknown account {account!r}")
    group = string(d.get("group", "default"), f"{where}.group")
    if group not in groups:
        raise ConfigError(f"{where}.group: unknown group {group!r}")
    status = d.get("status", "enabled")
    if status not in KEY_STATUSES:
        raise ConfigError(f"{where}.status: must be enabled or disabled")
    return KeySeed(
        id=name_of(d.get("id"), f"{where}.id"),
        key=key,
        account=account,
        group=group,
        status=status,
        name=string(d.get("name", ""), f"{where}.name", allow_empty=True),
        expires_at=parse_time(d.get("expires_at"), f"{where}.expires_at"),
    )
