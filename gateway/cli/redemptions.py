"""``gateway redemptions``: make redemption codes and list them (CONTRACT §5b). A code is shown
only by the command that made it: ``--csv`` prints those codes as CSV to hand out (``code,
amount, expires_at``); the list shows each code's hint, never the code."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import UTC, datetime

from gateway.cli.arguments import Parents, Subcommands, amount, positive_int
from gateway.cli.output import Output, table
from gateway.config import Settings
from gateway.operator import accounts, redemptions
from gateway.operator.spreadsheet import csv_text
from gateway.store import RedemptionRecord, Store
from gateway.store.redemptions import CODE_STATUSES, code_status
from gateway.types import JSON


def codes_table(codes: Sequence[RedemptionRecord]) -> str:
    now = datetime.now(UTC)
    headers = ["ID", "HINT", "AMOUNT", "STATUS", "EXPIRES", "ACCOUNT", "USER", "USED"]
    rows = [
        [c.id, c.hint, accounts.format_money(c.amount), code_status(c, now),
         accounts.format_time(c.expires_at) or "-", c.account or "-", c.user or "-",
         accounts.format_time(c.used_at) or "-"]
        for c in codes
    ]  # fmt: skip
    return table(headers, rows, right=[2])


def listing_csv(rows: Sequence[dict[str, JSON]]) -> str:
    fields = ["id", "hint", "amount", "status", "created_at", "expires_at", "account", "user",
              "used_at"]  # fmt: skip
    return csv_text(rows, fields)


async def cmd_create(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    made = await redemptions.create_codes(store, args.amount, args.count, args.expires_at)
    if args.csv:
        text = redemptions.made_csv(made).rstrip("\n")
    else:
        rows = [[code, accounts.format_money(rec.amount)] for code, rec in made]
        text = table(["CODE", "AMOUNT"], rows, right=[1])
        text += "\n\nThe codes are shown only this once: store them now (--csv for a file)."
    return Output(redemptions.made_json(made), text)


async def cmd_list(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    codes = await redemptions.list_codes(store, args.status)
    now = datetime.now(UTC)
    data = [redemptions.code_json(c, now) for c in codes]
    if args.csv:
        text = listing_csv(data).rstrip("\n")
    else:
        text = codes_table(codes) if codes else "no redemption codes"
    listed: list[JSON] = list(data)
    return Output({"data": listed}, text)


def register(sub: Subcommands, parents: Parents) -> None:
    group = sub.add_parser("redemptions", help="make and list redemption codes")
    rsub = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = rsub.add_parser("create", parents=parents, help="make codes (shown only now)")
    p.add_argument("--amount", type=amount, required=True, help="balance units each code adds")
    p.add_argument("--count", type=positive_int, default=1)
    p.add_argument("--expires-at", default=None, metavar="TIME", help="RFC 3339")
    p.add_argument("--csv", action="store_true", help="print the codes as CSV to hand out")
    p.set_defaults(func=cmd_create)
    p = rsub.add_parser("list", parents=parents, help="list codes (hints, never the codes)")
    p.add_argument("--status", choices=CODE_STATUSES, default=None)
    p.add_argument("--csv", action="store_true", help="print the list as CSV")
    p.set_defaults(func=cmd_list)
