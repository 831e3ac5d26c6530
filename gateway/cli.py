"""The ``gateway`` command (also ``python -m gateway``): ``serve``, and the operator's commands
for keys, accounts and usage.

The operator commands open the store the config names and go through the same service
functions as the admin API (``accounts.py``), so a running gateway sees a change within a
second. Before the command they seed the store from the config like start-up does (accounts
and keys that are absent; never overwriting), so an account written in the file can be given a
key before the gateway first starts. Output is an aligned table for people, or with ``--json``
the admin API's JSON objects. Errors are one line on stderr: exit 1, or 2 for a usage or
config error.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation

import orjson
from redis.exceptions import RedisError

from gateway import accounts
from gateway.config import ConfigError, Settings, load_settings
from gateway.errors import GatewayError, InvalidRequestError
from gateway.store import Account, KeyRecord, Store, StoreError, UsageRecord, open_store
from gateway.types import JSON

PROG = "gateway"
SERVERS = ("hypercorn", "uvicorn", "granian")


@dataclass(frozen=True, slots=True)
class Output:
    payload: JSON  # what --json prints: the admin API's shape
    text: str  # what people see


Command = Callable[[argparse.Namespace, Settings, Store], Awaitable[Output]]


# ---- text rendering ------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Columns padded to their widest cell; the columns in ``right`` (numbers) align right."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def _t(dt: datetime | None) -> str:
    return accounts.format_time(dt) or "-"


def _key_status(rec: KeyRecord, now: datetime) -> str:
    if rec.status == "enabled" and rec.expires_at is not None and rec.expires_at <= now:
        return "expired"
    return rec.status


def keys_table(keys: Sequence[KeyRecord]) -> str:
    now = datetime.now(UTC)
    headers = ["ID", "NAME", "ACCOUNT", "GROUP", "STATUS", "EXPIRES", "CREATED", "HINT"]
    rows = [
        [k.id, k.name or "-", k.account, k.group, _key_status(k, now), _t(k.expires_at),
         _t(k.created_at), k.hint or "-"]
        for k in keys
    ]  # fmt: skip
    return table(headers, rows)


def accounts_table(accts: Sequence[Account]) -> str:
    rows = [[a.id, accounts.format_money(a.balance)] for a in accts]
    return table(["ID", "BALANCE"], rows, right=[1])


def usage_table(records: Sequence[UsageRecord]) -> str:
    headers = ["TIME", "ACCOUNT", "KEY", "MODEL", "CHANNEL", "PROTOCOL", "ENDPOINT", "STATUS",
               "PROMPT", "COMPLETION", "COST", "MS", "IP_RANGE"]  # fmt: skip
    rows = [
        [_t(r.time), r.account, r.key_id, r.model, r.channel or "-", r.protocol, r.endpoint,
         str(r.status), str(r.prompt_tokens), str(r.completion_tokens),
         accounts.format_money(r.cost), str(r.latency_ms), r.ip_range]
        for r in records
    ]  # fmt: skip
    return table(headers, rows, right=[7, 8, 9, 10, 11])


# ---- commands ------------------------------------------------------------------------------


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


async def cmd_accounts_create(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    acct = await accounts.create_account(store, args.id, args.balance)
    return Output(accounts.account_json(acct), accounts_table([acct]))


async def cmd_accounts_topup(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    acct = await accounts.topup(store, args.id, args.amount)
    return Output(accounts.account_json(acct), accounts_table([acct]))


async def cmd_accounts_show(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    acct = await accounts.get_account(store, args.id)
    return Output(accounts.account_json(acct), accounts_table([acct]))


async def cmd_accounts_list(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    accts = await accounts.list_accounts(store)
    text = accounts_table(accts) if accts else "no accounts"
    return Output({"data": [accounts.account_json(a) for a in accts]}, text)


async def cmd_usage(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    records = await accounts.usage(store, args.account, args.limit)
    text = usage_table(records) if records else "no usage records"
    return Output({"data": [accounts.usage_json(r) for r in records]}, text)


async def run_command(command: Command, args: argparse.Namespace, settings: Settings) -> Output:
    store = open_store(settings.store)
    await store.open()
    try:
        await store.seed(settings)
        return await command(args, settings, store)
    finally:
        await store.close()


# ---- argument parsing ----------------------------------------------------------------------


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _limit_arguments(p: argparse.ArgumentParser, clearing: bool) -> None:
    """A key's limits; with ``clearing``, also the flags that remove each."""
    limits = (
        ("quota", _amount, "AMOUNT", "what the key may spend in all (balance units)"),
        ("models", _names, "A,B", "the only models the key may use (comma-separated)"),
        ("allowed-ips", _names, "CIDR,...", "the only networks the key may be used from"),
    )
    for name, kind, metavar, text in limits:
        if clearing:
            group = p.add_mutually_exclusive_group()
            group.add_argument(f"--{name}", type=kind, default=None, metavar=metavar, help=text)
            group.add_argument(f"--no-{name}", action="store_true", help=f"no {name} limit")
        else:
            p.add_argument(f"--{name}", type=kind, default=None, metavar=metavar, help=text)


def _amount(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value.is_finite():
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    # --config and --json are accepted before or after the subcommand; SUPPRESS keeps a
    # subcommand's unset copy from overwriting a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=argparse.SUPPRESS, metavar="PATH",
                        help="the configuration file (default: $GATEWAY_CONFIG)")  # fmt: skip
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print JSON (the admin API's objects) instead of a table")  # fmt: skip

    parser = argparse.ArgumentParser(prog=PROG, description="The model gateway.")
    parser.add_argument("--config", default=None, metavar="PATH", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", default=False, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    serve = sub.add_parser("serve", parents=[common], help="run the gateway")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=_port, default=8080)
    serve.add_argument("--workers", type=_positive_int, default=1)
    serve.add_argument("--server", choices=SERVERS, default="hypercorn")

    leaf = [common, output]
    keys = sub.add_parser("keys", help="create, list, update, enable, disable and delete keys")
    ksub = keys.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = ksub.add_parser("create", parents=leaf, help="make a key (the secret is shown once)")
    p.add_argument("--account", required=True)
    p.add_argument("--group", default=None, help="default: the first configured group")
    p.add_argument("--name", default=None)
    p.add_argument("--expires-at", default=None, metavar="TIME",
                   help="RFC 3339, e.g. 2030-01-01T00:00:00Z")  # fmt: skip
    _limit_arguments(p, clearing=False)
    p.set_defaults(func=cmd_keys_create)
    p = ksub.add_parser("list", parents=leaf, help="list keys (never their secrets)")
    p.add_argument("--account", default=None)
    p.set_defaults(func=cmd_keys_list)
    for action, status in (("disable", "disabled"), ("enable", "enabled")):
        p = ksub.add_parser(action, parents=leaf, help=f"{action} a key")
        p.add_argument("id")
        p.set_defaults(func=_set_status(status))
    p = ksub.add_parser("update", parents=leaf, help="change a key's group, name or expiry")
    p.add_argument("id")
    p.add_argument("--group", default=None)
    p.add_argument("--name", default=None)
    expiry = p.add_mutually_exclusive_group()
    expiry.add_argument("--expires-at", default=None, metavar="TIME", help="RFC 3339")
    expiry.add_argument("--no-expiry", action="store_true", help="the key never expires")
    _limit_arguments(p, clearing=True)
    p.set_defaults(func=cmd_keys_update)
    p = ksub.add_parser("delete", parents=leaf, help="delete a key")
    p.add_argument("id")
    p.set_defaults(func=cmd_keys_delete)

    accts = sub.add_parser("accounts", help="create, top up and show accounts")
    asub = accts.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = asub.add_parser("create", parents=leaf, help="create an account")
    p.add_argument("id")
    p.add_argument("--balance", type=_amount, default=Decimal(0))
    p.set_defaults(func=cmd_accounts_create)
    p = asub.add_parser("topup", parents=leaf, help="add to a balance (negative: a correction)")
    p.add_argument("id")
    p.add_argument("amount", type=_amount)
    p.set_defaults(func=cmd_accounts_topup)
    p = asub.add_parser("show", parents=leaf, help="show an account's balance")
    p.add_argument("id")
    p.set_defaults(func=cmd_accounts_show)
    p = asub.add_parser("list", parents=leaf, help="list accounts and balances")
    p.set_defaults(func=cmd_accounts_list)

    p = sub.add_parser("usage", parents=leaf, help="usage records, newest first")
    p.add_argument("--account", default=None)
    p.add_argument("--limit", type=_positive_int, default=accounts.USAGE_DEFAULT_LIMIT,
                   help=f"at most {accounts.USAGE_MAX_LIMIT}")  # fmt: skip
    p.set_defaults(func=cmd_usage)
    return parser


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        return _fail(f"config error: {exc}", 2)

    if args.command == "serve":
        from gateway.server import serve

        try:
            serve(settings, args.host, args.port, args.workers, server=args.server)
        except OSError as exc:  # e.g. the port is taken
            return _fail(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}", 1)
        return 0

    try:
        out = asyncio.run(run_command(args.func, args, settings))
    except GatewayError as exc:
        return _fail(exc.message, 1)
    except (StoreError, OSError, RedisError, sqlite3.Error) as exc:
        return _fail(f"store error: {exc}", 1)
    if args.json:
        sys.stdout.write(orjson.dumps(out.payload, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(out.text + "\n")
    return 0
