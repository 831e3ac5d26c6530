"""The command line's side of the audit log (``operator/audit.py``): ``run`` writes one entry
for each command that changes something (``CHANGES``: its action and the argument naming its
object), as ``cli:<OS user>`` via ``cli``, with the flags given (secrets masked, as the admin
API's fields are) and the outcome as the admin API would have answered it (200, or the error's
status: 404, 409, ...). Commands that only read (list, show, test, usage, prices) write none.

``gateway audit list`` shows the log, newest first, with the admin API's filters
(``--actor``, ``--action``, ``--object``, ``--status``, ``--since``, ``--until``,
``--limit``), as a table, ``--json``, or ``--csv`` (cells safe to open in a spreadsheet).
"""

from __future__ import annotations

import argparse
import getpass
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal

import orjson

from gateway.cli.arguments import Parents, Subcommands, positive_int
from gateway.cli.output import Command, Output, table, when
from gateway.config import Settings
from gateway.errors import GatewayError
from gateway.operator import audit
from gateway.operator.accounts import USAGE_MAX_LIMIT
from gateway.operator.audit_api import CSV_FIELDS, query_of, read
from gateway.operator.spreadsheet import csv_text
from gateway.store import Store
from gateway.store.audit import AuditEntry
from gateway.types import JSON

# (command, action) -> (the audit action, the argument that names the object)
CHANGES: dict[tuple[str, str], tuple[str, str | None]] = {
    ("keys", "create"): ("key.create", None),
    ("keys", "enable"): ("key.update", "id"),
    ("keys", "disable"): ("key.update", "id"),
    ("keys", "update"): ("key.update", "id"),
    ("keys", "delete"): ("key.delete", "id"),
    ("accounts", "create"): ("account.create", "id"),
    ("accounts", "topup"): ("account.credit", "id"),
    **{
        (f"{noun}s", verb): (f"{noun}.{done}", "name")
        for noun in ("channel", "model", "group")
        for verb, done in (("add", "create"), ("update", "update"), ("delete", "delete"))
    },
    ("users", "add"): ("user.create", None),
    ("users", "update"): ("user.update", "id"),
    ("users", "delete"): ("user.delete", "id"),
    ("redemptions", "create"): ("redemption.create", None),
    ("sessions", "rotate"): ("sessions.rotate", None),
}
NOT_FIELDS = frozenset({"func", "command", "action", "config", "json", "csv"})
OK = 200  # the status of a command-line change that happened


def actor() -> str:
    try:
        return "cli:" + getpass.getuser()
    except (KeyError, OSError):  # no name for this process's user
        return "cli"


def flags(args: argparse.Namespace) -> dict[str, JSON]:
    """The flags and arguments a command was given (unset ones left out), masked."""
    given: dict[str, JSON] = {}
    for name, value in vars(args).items():
        if name in NOT_FIELDS or value is None or value is False:
            continue
        given[name] = float(value) if isinstance(value, Decimal) else value
    if args.command == "keys" and args.action in ("enable", "disable"):
        given["status"] = args.action + "d"
    return audit.fields_of(given)


def _named(payload: JSON) -> str:
    if isinstance(payload, Mapping):
        for name in ("id", "name"):
            if isinstance(payload.get(name), str):
                return str(payload[name])
    return ""


async def run(
    command: Command, args: argparse.Namespace, settings: Settings, store: Store
) -> Output:
    """Run the command; when it is a change, write its entry, whether it happened or not."""
    change = CHANGES.get((args.command, getattr(args, "action", "")))
    if change is None:
        return await command(args, settings, store)
    action, of = change
    object_id = str(getattr(args, of, "") or "") if of else ""
    try:
        out = await command(args, settings, store)
    except GatewayError as err:
        await _record(store, args, action, object_id, err.status)
        raise
    await _record(store, args, action, object_id or _named(out.payload), OK)
    return out


async def _record(
    store: Store, args: argparse.Namespace, action: str, object_id: str, status: int
) -> None:
    entry = AuditEntry(
        time=datetime.now(UTC),
        actor=actor(),
        action=action,
        object_type=action.partition(".")[0],
        object_id=object_id,
        fields=flags(args),
        status=status,
        via="cli",
    )
    await audit.record(store, entry)


def entries_table(entries: list[AuditEntry]) -> str:
    headers = ["TIME", "ACTOR", "ACTION", "OBJECT", "STATUS", "VIA", "IP_RANGE", "FIELDS"]
    rows = [
        [when(e.time), e.actor, e.action, e.object_id or "-", str(e.status), e.via,
         e.ip_range or "-", orjson.dumps(e.fields).decode()]
        for e in entries
    ]  # fmt: skip
    return table(headers, rows, right=[4])


async def cmd_list(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    given = {"action": args.action_filter}
    for name in ("actor", "object", "status", "since", "until"):
        given[name] = getattr(args, name)
    params = {name: value for name, value in given.items() if value}
    page = await read(store, query_of(params), min(args.limit, USAGE_MAX_LIMIT))
    data: list[JSON] = [audit.entry_json(e) for e in page.entries]
    if args.csv:
        rows = [{**d, "fields": orjson.dumps(d["fields"]).decode()} for d in data]
        text = csv_text(rows, CSV_FIELDS).rstrip("\n")
    else:
        text = entries_table(page.entries) if page.entries else "no audit entries"
    return Output({"data": data}, text)


def register(sub: Subcommands, parents: Parents) -> None:
    group = sub.add_parser("audit", help="the audit log: who changed what, when, from where")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser("list", parents=parents, help="audit entries, newest first")
    p.add_argument("--actor", default=None, help="admin, user:NAME, cli:NAME, or user, cli, ...")
    p.add_argument("--action", dest="action_filter", default=None, help="key.create, or key")
    p.add_argument("--object", default=None, metavar="TYPE[:ID]", help="channel or channel:oa-1")
    p.add_argument("--status", default=None, help="an HTTP status, ok or error")
    p.add_argument("--since", default=None, metavar="TIME", help="RFC 3339 or a day, included")
    p.add_argument("--until", default=None, metavar="TIME", help="RFC 3339 or a day, excluded")
    p.add_argument("--limit", type=positive_int, default=100, help="at most 1000")
    p.add_argument("--csv", action="store_true", help="print the entries as CSV")
    p.set_defaults(func=cmd_list)
