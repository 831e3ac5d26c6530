"""The ``gateway`` command (also ``python -m gateway``): ``serve``, and the operator's commands
for keys, accounts, usage, and the catalogue's channels, models and groups.

The operator commands open the store the config names and go through the same service
functions as the admin API (``accounts.py``, ``catalogue.py``), so a running gateway sees a
change within a second. A channel's upstream api_key is never printed (a hint at most); give
it with ``--api-key-env NAME`` to keep it out of the shell's history.

Before the command they seed the store from the config like start-up does (accounts
and keys that are absent; never overwriting), so an account written in the file can be given a
key before the gateway first starts. Output is an aligned table for people, or with ``--json``
the admin API's JSON objects. Errors are one line on stderr: exit 1, or 2 for a usage or
config error.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation

import orjson
from redis.exceptions import RedisError

from gateway import config
from gateway.config import CHANNEL_STATUSES, CHANNEL_TYPES, ConfigError, Settings, load_settings
from gateway.errors import GatewayError, InvalidRequestError
from gateway.operator import accounts, catalogue
from gateway.store import Account, KeyRecord, Store, StoreError, UsageRecord
from gateway.store.backends import open_store
from gateway.store.catalogue import View, model_json
from gateway.types import JSON

PROG = "gateway"
SERVERS = ("hypercorn", "uvicorn", "granian")


@dataclass(frozen=True, slots=True)
class Output:
    payload: JSON  # what --json prints: the admin API's shape
    text: str  # what people see
    code: int = 0  # the exit status (a channel test that failed: 1)


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


# ---- catalogue -----------------------------------------------------------------------------


def channels_table(v: View, names: Sequence[str] | None = None) -> str:
    headers = ["NAME", "TYPE", "STATUS", "PRIORITY", "WEIGHT", "GROUPS", "MODELS", "BASE_URL",
               "KEY", "ORIGIN"]  # fmt: skip
    rows = []
    for ch in v.channels:
        if names is not None and ch.name not in names:
            continue
        shown = catalogue.channel_out(ch, v)
        rows.append([ch.name, ch.type, ch.status, str(ch.priority), str(ch.weight),
                     ",".join(ch.groups), ",".join(ch.models), ch.base_url,
                     str(shown["api_key_hint"]) or "-", str(shown["origin"])])  # fmt: skip
    return table(headers, rows, right=[3, 4])


def models_table(v: View, names: Sequence[str] | None = None) -> str:
    headers = ["NAME", "CAPABILITIES", "INPUT", "OUTPUT", "REQUEST", "MAX_TOKENS", "ORIGIN"]
    rows = [
        [m.name, ",".join(sorted(m.capabilities)), f"{m.price.input:g}", f"{m.price.output:g}",
         f"{m.price.request:g}", str(m.default_max_tokens), v.origin("model", m.name)]
        for m in v.models
        if names is None or m.name in names
    ]  # fmt: skip
    return table(headers, rows, right=[2, 3, 4, 5])


def groups_table(v: View) -> str:
    return table(["NAME", "ORIGIN"], [[g, v.origin("group", g)] for g in v.groups])


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def channel_body(args: argparse.Namespace) -> dict[str, object]:
    """The admin API body the flags given make (a flag not given: not in the body)."""
    body: dict[str, object] = {}
    if args.api_key_env is not None:
        if args.api_key_env not in os.environ:
            raise InvalidRequestError(f"--api-key-env: ${args.api_key_env} is not set")
        body["api_key"] = os.environ[args.api_key_env]
    elif args.api_key is not None:
        body["api_key"] = args.api_key
    for name in ("type", "base_url", "priority", "weight", "status", "responses"):
        value = getattr(args, name)
        if value is not None:
            body[name] = value
    if args.groups is not None:
        body["groups"] = _csv(args.groups)
    if args.models is not None:
        body["models"] = _csv(args.models)
    if args.map is not None:
        mapping: dict[str, str] = {}
        for item in args.map:
            model, sep, upstream = item.partition("=")
            if not sep or not model or not upstream:
                raise InvalidRequestError(f"--map: {item!r} is not MODEL=UPSTREAM_NAME")
            mapping[model] = upstream
        body["model_map"] = mapping
    return body


async def cmd_channels_list(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    v = await catalogue.load(store, settings)
    text = channels_table(v) if v.channels else "no channels"
    return Output({"data": [catalogue.channel_out(c, v) for c in v.channels]}, text)


async def cmd_channels_add(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    body = {"name": args.name, **channel_body(args)}
    ch = await catalogue.create_channel(store, settings, body)
    v = await catalogue.load(store, settings)
    return Output(catalogue.channel_out(ch, v), channels_table(v, [ch.name]))


async def cmd_channels_update(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    body = channel_body(args)
    if not body:
        raise InvalidRequestError("nothing to change: give at least one field flag")
    ch = await catalogue.update_channel(store, settings, args.name, body)
    v = await catalogue.load(store, settings)
    return Output(catalogue.channel_out(ch, v), channels_table(v, [ch.name]))


async def cmd_channels_delete(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    await catalogue.delete_channel(store, settings, args.name)
    return Output({"name": args.name, "deleted": True}, f"deleted channel {args.name}")


async def cmd_channels_test(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    from gateway.upstream.pool import Upstream

    upstream = Upstream(settings.upstream)
    await upstream.start()
    try:
        result = await catalogue.try_channel(store, settings, upstream, args.name)
    finally:
        await upstream.stop()
    text = f"{'ok' if result['ok'] else 'FAILED'}  status={result['status'] or '-'}  " + (
        f"latency_ms={result['latency_ms']}"
    )
    if "error" in result:
        text += f"\n{result['error']}"
    return Output(result, text, 0 if result["ok"] else 1)


PRICE_FLAGS = config.PRICE_FIELDS  # --input, --cache-read, ...: one flag per price


def model_body(args: argparse.Namespace, price: dict[str, JSON] | None = None) -> dict[str, object]:
    body: dict[str, object] = {}
    if args.capabilities is not None:
        body["capabilities"] = _csv(args.capabilities)
    given = {f: getattr(args, f) for f in PRICE_FLAGS if getattr(args, f) is not None}
    if given:
        body["price"] = {**(price or {}), **given}
    if args.default_max_tokens is not None:
        body["default_max_tokens"] = args.default_max_tokens
    return body


async def cmd_models_list(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    v = await catalogue.load(store, settings)
    text = models_table(v) if v.models else "no models"
    return Output({"data": [catalogue.model_out(m, v) for m in v.models]}, text)


async def cmd_models_add(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    model = await catalogue.create_model(store, settings, {"name": args.name, **model_body(args)})
    v = await catalogue.load(store, settings)
    return Output(catalogue.model_out(model, v), models_table(v, [model.name]))


async def cmd_models_update(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    v = await catalogue.load(store, settings)
    current = v.model(args.name)
    # a price flag changes that price only: the others are kept
    price = model_json(current)["price"] if current is not None else None
    body = model_body(args, price if isinstance(price, dict) else None)
    if not body:
        raise InvalidRequestError("nothing to change: give at least one field flag")
    model = await catalogue.update_model(store, settings, args.name, body)
    v = await catalogue.load(store, settings)
    return Output(catalogue.model_out(model, v), models_table(v, [model.name]))


async def cmd_models_delete(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    await catalogue.delete_model(store, settings, args.name)
    return Output({"name": args.name, "deleted": True}, f"deleted model {args.name}")


async def cmd_groups_list(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    v = await catalogue.load(store, settings)
    return Output({"data": [catalogue.group_out(g, v) for g in v.groups]}, groups_table(v))


async def cmd_groups_add(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    name = await catalogue.create_group(store, settings, {"name": args.name})
    v = await catalogue.load(store, settings)
    return Output(catalogue.group_out(name, v), f"added group {name}")


async def cmd_groups_delete(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    await catalogue.delete_group(store, settings, args.name)
    return Output({"name": args.name, "deleted": True}, f"deleted group {args.name}")


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

    chans = sub.add_parser("channels", help="list, add, update, delete and test channels")
    csub = chans.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = csub.add_parser("list", parents=leaf, help="list channels (never their api_key)")
    p.set_defaults(func=cmd_channels_list)
    for action, func in (("add", cmd_channels_add), ("update", cmd_channels_update)):
        adding = action == "add"
        what = "add a channel" if adding else "change a channel's fields"
        p = csub.add_parser(action, parents=leaf, help=what)
        p.add_argument("name")
        p.add_argument("--type", choices=CHANNEL_TYPES, required=adding, default=None)
        p.add_argument("--base-url", required=adding, default=None)
        key = p.add_mutually_exclusive_group()
        key.add_argument("--api-key", default=None, help="the upstream's credential")
        key.add_argument("--api-key-env", default=None, metavar="NAME",
                         help="read the credential from this environment variable")  # fmt: skip
        p.add_argument("--groups", default=None, metavar="G1,G2")
        p.add_argument("--models", required=adding, default=None, metavar="M1,M2")
        p.add_argument("--map", action="append", default=None, metavar="MODEL=UPSTREAM",
                       help="rename a model on the way out (repeatable)")  # fmt: skip
        p.add_argument("--priority", type=int, default=None, help="lower is tried first")
        p.add_argument("--weight", type=int, default=None)
        p.add_argument("--responses", action=argparse.BooleanOptionalAction, default=None,
                       help="an openai upstream that serves /responses itself")  # fmt: skip
        p.add_argument("--status", choices=CHANNEL_STATUSES, default=None)
        p.set_defaults(func=func)
    p = csub.add_parser("delete", parents=leaf, help="delete a channel")
    p.add_argument("name")
    p.set_defaults(func=cmd_channels_delete)
    p = csub.add_parser("test", parents=leaf, help="send the channel one small request")
    p.add_argument("name")
    p.set_defaults(func=cmd_channels_test)

    models = sub.add_parser("models", help="list, add, update and delete models")
    msub = models.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = msub.add_parser("list", parents=leaf, help="list models and prices")
    p.set_defaults(func=cmd_models_list)
    for action, func in (("add", cmd_models_add), ("update", cmd_models_update)):
        p = msub.add_parser(action, parents=leaf, help=f"{action} a model")
        p.add_argument("name")
        p.add_argument("--capabilities", default=None, metavar="C1,C2",
                       help="chat vision tools embeddings images audio rerank")  # fmt: skip
        for flag in PRICE_FLAGS:
            p.add_argument("--" + flag.replace("_", "-"), type=float, default=None,
                           metavar="PRICE", dest=flag)  # fmt: skip
        p.add_argument("--default-max-tokens", type=_positive_int, default=None)
        p.set_defaults(func=func)
    p = msub.add_parser("delete", parents=leaf, help="delete a model no channel serves")
    p.add_argument("name")
    p.set_defaults(func=cmd_models_delete)

    groups = sub.add_parser("groups", help="list, add and delete groups")
    gsub = groups.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = gsub.add_parser("list", parents=leaf, help="list groups")
    p.set_defaults(func=cmd_groups_list)
    p = gsub.add_parser("add", parents=leaf, help="add a group")
    p.add_argument("name")
    p.set_defaults(func=cmd_groups_add)
    p = gsub.add_parser("delete", parents=leaf, help="delete a group no key or channel uses")
    p.add_argument("name")
    p.set_defaults(func=cmd_groups_delete)

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
    return out.code
