"""``gateway keys``: create, list, update, enable, disable and delete keys. A key's secret is
shown once, when it is made."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import UTC, datetime

from gateway.cli.arguments import Parents, Subcommands, amount, comma_separated
from gateway.cli.output import Command, Output, table, when
from gateway.config import Settings
from gateway.errors import InvalidRequestError
from gateway.operator import accounts
from gateway.store import KeyRecord, Store


def _key_status(rec: KeyRecord, now: datetime) -> str:
    if rec.status == "enabled" and rec.expires_at is not None and rec.expires_at <= now:
        return "expired"
    return rec.status


def keys_table(keys: Sequence[KeyRecord]) -> str:
    now = datetime.now(UTC)
    headers = ["ID", "NAME", "ACCOUNT", "GROUP", "STATUS", "EXPIRES", "CREATED", "HINT"]
    rows = [
        [k.id, k.name or "-", k.account, k.group, _key_status(k, now), when(k.expires_at),
         when(k.created_at), k.hint or "-"]
        for k in keys
    ]  # fmt: skip
    return table(headers, rows)


async def cmd_keys_create(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    rec, secret = await accounts.create_key(
        store,
        settings,
        account=args.account,
        group=args.group,
        name=args.name,
        expires_at=args.expires_at,
        quota=args.quota,
        models=args.models,
        allowed_ips=args.allowed_ips,
    )
    payload = accounts.key_json(rec, secret)
    rows = [[k, "-" if v is None or v == "" else str(v)] for k, v in payload.items()]
    text = table(["FIELD", "VALUE"], rows).split("\n", 1)[1]
    text += "\n\nThe key is shown only this once: store it now."
    return Output(payload, text)


async def cmd_keys_list(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    keys = await accounts.list_keys(store, args.account)
    spent = await accounts.spent_by_key(store)
    text = keys_table(keys) if keys else "no keys"
    data = [accounts.key_json(k, spent=spent.get(k.id, 0)) for k in keys]
    return Output({"data": data}, text)


def _set_status(status: str) -> Command:
    async def run(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
        rec = await accounts.update_key(store, settings, args.id, {"status": status})
        return Output(accounts.key_json(rec), keys_table([rec]))

    return run


async def cmd_keys_update(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    changes: dict[str, object] = {}
    if args.group is not None:
        changes["group"] = args.group
    if args.name is not None:
        changes["name"] = args.name
    if args.no_expiry:
        changes["expires_at"] = None
    elif args.expires_at is not None:
        changes["expires_at"] = args.expires_at
    for name in ("quota", "models", "allowed_ips"):
        if getattr(args, f"no_{name}"):
            changes[name] = None
        elif getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    if not changes:
        raise InvalidRequestError(
            "nothing to change: give --group, --name, --expires-at, --no-expiry or a limit"
        )
    rec = await accounts.update_key(store, settings, args.id, changes)
    return Output(accounts.key_json(rec), keys_table([rec]))


async def cmd_keys_delete(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    await accounts.delete_key(store, args.id)
    return Output({"id": args.id, "deleted": True}, f"deleted key {args.id}")


def _limit_arguments(p: argparse.ArgumentParser, clearing: bool) -> None:
    """A key's limits; with ``clearing``, also the flags that remove each."""
    limits = (
        ("quota", amount, "AMOUNT", "what the key may spend in all (balance units)"),
        ("models", comma_separated, "A,B", "the only models the key may use (comma-separated)"),
        ("allowed-ips", comma_separated, "CIDR,...", "the only networks the key may be used from"),
    )
    for name, kind, metavar, text in limits:
        if clearing:
            group = p.add_mutually_exclusive_group()
            group.add_argument(f"--{name}", type=kind, default=None, metavar=metavar, help=text)
            group.add_argument(f"--no-{name}", action="store_true", help=f"no {name} limit")
        else:
            p.add_argument(f"--{name}", type=kind, default=None, metavar=metavar, help=text)


def register(sub: Subcommands, parents: Parents) -> None:
    keys = sub.add_parser("keys", help="create, list, update, enable, disable and delete keys")
    ksub = keys.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = ksub.add_parser("create", parents=parents, help="make a key (the secret is shown once)")
    p.add_argument("--account", required=True)
    p.add_argument("--group", default=None, help="default: the first configured group")
    p.add_argument("--name", default=None)
    p.add_argument("--expires-at", default=None, metavar="TIME",
                   help="RFC 3339, e.g. 2030-01-01T00:00:00Z")  # fmt: skip
    _limit_arguments(p, clearing=False)
    p.set_defaults(func=cmd_keys_create)
    p = ksub.add_parser("list", parents=parents, help="list keys (never their secrets)")
    p.add_argument("--account", default=None)
    p.set_defaults(func=cmd_keys_list)
    for action, status in (("disable", "disabled"), ("enable", "enabled")):
        p = ksub.add_parser(action, parents=parents, help=f"{action} a key")
        p.add_argument("id")
        p.set_defaults(func=_set_status(status))
    p = ksub.add_parser("update", parents=parents, help="change a key's group, name or expiry")
    p.add_argument("id")
    p.add_argument("--group", default=None)
    p.add_argument("--name", default=None)
    expiry = p.add_mutually_exclusive_group()
    expiry.add_argument("--expires-at", default=None, metavar="TIME", help="RFC 3339")
    expiry.add_argument("--no-expiry", action="store_true", help="the key never expires")
    _limit_arguments(p, clearing=True)
    p.set_defaults(func=cmd_keys_update)
    p = ksub.add_parser("delete", parents=parents, help="delete a key")
    p.add_argument("id")
    p.set_defaults(func=cmd_keys_delete)
