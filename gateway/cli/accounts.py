"""``gateway accounts``: create, top up, show and list accounts and their balances."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from decimal import Decimal

from gateway.cli.arguments import Parents, Subcommands, amount
from gateway.cli.output import Output, table
from gateway.config import Settings
from gateway.operator import accounts
from gateway.store import Account, Store


def accounts_table(accts: Sequence[Account]) -> str:
    rows = [[a.id, accounts.format_money(a.balance)] for a in accts]
    return table(["ID", "BALANCE"], rows, right=[1])


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


def register(sub: Subcommands, parents: Parents) -> None:
    accts = sub.add_parser("accounts", help="create, top up and show accounts")
    asub = accts.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = asub.add_parser("create", parents=parents, help="create an account")
    p.add_argument("id")
    p.add_argument("--balance", type=amount, default=Decimal(0))
    p.set_defaults(func=cmd_accounts_create)
    p = asub.add_parser("topup", parents=parents, help="add to a balance (negative: a correction)")
    p.add_argument("id")
    p.add_argument("amount", type=amount)
    p.set_defaults(func=cmd_accounts_topup)
    p = asub.add_parser("show", parents=parents, help="show an account's balance")
    p.add_argument("id")
    p.set_defaults(func=cmd_accounts_show)
    p = asub.add_parser("list", parents=parents, help="list accounts and balances")
    p.set_defaults(func=cmd_accounts_list)
