"""``gateway usage``: usage records, newest first."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from gateway.cli.arguments import Parents, Subcommands, positive_int
from gateway.cli.output import Output, table, when
from gateway.config import Settings
from gateway.operator import accounts
from gateway.store import Store, UsageRecord


def usage_table(records: Sequence[UsageRecord]) -> str:
    headers = ["TIME", "ACCOUNT", "KEY", "MODEL", "CHANNEL", "PROTOCOL", "ENDPOINT", "STATUS",
               "PROMPT", "COMPLETION", "COST", "MS", "IP_RANGE"]  # fmt: skip
    rows = [
        [when(r.time), r.account, r.key_id, r.model, r.channel or "-", r.protocol, r.endpoint,
         str(r.status), str(r.prompt_tokens), str(r.completion_tokens),
         accounts.format_money(r.cost), str(r.latency_ms), r.ip_range]
        for r in records
    ]  # fmt: skip
    return table(headers, rows, right=[7, 8, 9, 10, 11])


async def cmd_usage(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    records = await accounts.usage(store, args.account, args.limit)
    text = usage_table(records) if records else "no usage records"
    return Output({"data": [accounts.usage_json(r) for r in records]}, text)


def register(sub: Subcommands, parents: Parents) -> None:
    p = sub.add_parser("usage", parents=parents, help="usage records, newest first")
    p.add_argument("--account", default=None)
    p.add_argument("--limit", type=positive_int, default=accounts.USAGE_DEFAULT_LIMIT,
                   help=f"at most {accounts.USAGE_MAX_LIMIT}")  # fmt: skip
    p.set_defaults(func=cmd_usage)
