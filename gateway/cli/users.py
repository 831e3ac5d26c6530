"""``gateway users``: list, add, update and delete the people who sign in to the console with a
username and a password (CONTRACT §5b). A password is never an argument (it would stay in the
shell's history): ``--password-env NAME`` reads it from the environment, else it is asked for
(or read from the first line of standard input when that is not a terminal)."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Sequence

from gateway.cli.arguments import Parents, Subcommands, comma_separated
from gateway.cli.output import Output, table, when
from gateway.config import Settings
from gateway.errors import InvalidRequestError
from gateway.operator import users
from gateway.store import Store, UserRecord


def users_table(found: Sequence[UserRecord]) -> str:
    rows = [
        [u.id, u.username, u.account, ",".join(u.groups) or "-", u.status, when(u.created_at)]
        for u in found
    ]
    return table(["ID", "USERNAME", "ACCOUNT", "GROUPS", "STATUS", "CREATED"], rows)


def read_password(env: str | None) -> str:
    """The password from ``$env``, else asked for (a terminal) or read (a pipe)."""
    if env:
        value = os.environ.get(env)
        if value is None:
            raise InvalidRequestError(f"--password-env: ${env} is not set")
        return value
    if sys.stdin.isatty():
        return getpass.getpass("Password: ")
    return sys.stdin.readline().rstrip("\r\n")


async def cmd_users_list(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    found = await users.list_users(store)
    text = users_table(found) if found else "no users"
    return Output({"data": [users.user_json(u) for u in found]}, text)


async def cmd_users_add(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    body: dict[str, object] = {
        "username": args.username,
        "password": read_password(args.password_env),
        "account": args.account,
    }
    if args.groups is not None:
        body["groups"] = args.groups
    rec = await users.create_user(store, settings, body)
    return Output(users.user_json(rec), users_table([rec]))


async def cmd_users_update(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    body: dict[str, object] = {}
    if args.groups is not None:
        body["groups"] = args.groups
    if args.status is not None:
        body["status"] = args.status
    if args.password:
        body["password"] = read_password(args.password_env)
    if not body:
        raise InvalidRequestError("nothing to change: give --groups, --status or --password")
    rec = await users.update_user(store, settings, args.id, body)
    return Output(users.user_json(rec), users_table([rec]))


async def cmd_users_delete(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    keys = await users.delete_user(store, args.id)
    text = f"deleted user {args.id}" + (f" and its keys {', '.join(keys)}" if keys else "")
    return Output({"id": args.id, "deleted": True, "keys": keys}, text)


def register(sub: Subcommands, parents: Parents) -> None:
    group = sub.add_parser("users", help="list, add, update and delete console users")
    usub = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = usub.add_parser("list", parents=parents, help="list users (never their passwords)")
    p.set_defaults(func=cmd_users_list)
    env = "read the password from this environment variable (else: asked for, or stdin)"
    groups = "the groups the user may make keys in (comma-separated)"
    p = usub.add_parser("add", parents=parents, help="add a user of an account")
    p.add_argument("username")
    p.add_argument("--account", required=True)
    p.add_argument("--groups", type=comma_separated, default=None, metavar="G1,G2",
                   help=groups + "; default: console.default_groups")  # fmt: skip
    p.add_argument("--password-env", default=None, metavar="NAME", help=env)
    p.set_defaults(func=cmd_users_add)
    p = usub.add_parser(
        "update", parents=parents, help="change a user's groups, status or password"
    )
    p.add_argument("id")
    p.add_argument("--groups", type=comma_separated, default=None, metavar="G1,G2", help=groups)
    p.add_argument("--status", choices=["enabled", "disabled"], default=None,
                   help="disabled: its sessions end and its keys answer 401")  # fmt: skip
    p.add_argument("--password", action="store_true", help="set a new password")
    p.add_argument("--password-env", default=None, metavar="NAME", help=env)
    p.set_defaults(func=cmd_users_update)
    p = usub.add_parser("delete", parents=parents, help="delete a user and its keys")
    p.add_argument("id")
    p.set_defaults(func=cmd_users_delete)
