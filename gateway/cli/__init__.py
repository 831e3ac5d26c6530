"""The ``gateway`` command (also ``python -m gateway``): ``serve``, and the operator's commands
for keys, accounts, usage, the catalogue's channels, models and groups, console users and
redemption codes.

One module per command group, each registering its own subcommands: ``serve``, ``keys``,
``accounts``, ``catalogue`` (channels, models, groups), ``usage``, ``prices`` (the price
table, and the catalogue against it), ``sessions`` (the console's session secret), ``users``,
``redemptions`` and ``audit`` (the audit log, which every change made here also writes to);
``output`` is what a command returns and how it is printed, ``arguments`` the flags' value types.

The operator commands open the store the config names and go through the same service
functions as the admin API (``operator/accounts.py``, ``operator/catalogue.py``), so a running
gateway sees a change within a second. A channel's upstream api_key is never printed (a hint at
most); give it with ``--api-key-env NAME`` to keep it out of the shell's history.

Before the command they seed the store from the config like start-up does (accounts
and keys that are absent; never overwriting), so an account written in the file can be given a
key before the gateway first starts. Output is an aligned table for people, or with ``--json``
the admin API's JSON objects. Errors are one line on stderr: exit 1, or 2 for a usage or
config error.
"""

from __future__ import annotations

import argparse
import asyncio

from gateway.cli import (
    accounts,
    audit,
    catalogue,
    keys,
    prices,
    redemptions,
    serve,
    sessions,
    usage,
    users,
)
from gateway.cli.output import PROG, Command, Output, fail, show
from gateway.config import ConfigError, Settings, load_settings
from gateway.errors import GatewayError
from gateway.store.backends import open_store, store_failures

__all__ = ["Command", "Output", "build_parser", "main", "run_command"]


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
    serve.register(sub, common)
    leaf = [common, output]  # an operator command's own flags
    keys.register(sub, leaf)
    accounts.register(sub, leaf)
    catalogue.register(sub, leaf)
    usage.register(sub, leaf)
    users.register(sub, leaf)
    redemptions.register(sub, leaf)
    prices.register(sub, leaf)
    sessions.register(sub, leaf)
    audit.register(sub, leaf)
    return parser


async def run_command(command: Command, args: argparse.Namespace, settings: Settings) -> Output:
    store = open_store(settings.store)
    await store.open()
    try:
        await store.seed(settings)
        return await audit.run(command, args, settings, store)  # a change: its audit entry
    finally:
        await store.close()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        return fail(f"config error: {exc}", 2)

    if args.command == "serve":
        return serve.run(args, settings)

    try:
        out = asyncio.run(run_command(args.func, args, settings))
    except GatewayError as exc:
        return fail(exc.message, 1)
    except store_failures() as exc:
        return fail(f"store error: {exc}", 1)
    return show(out, args.json)
