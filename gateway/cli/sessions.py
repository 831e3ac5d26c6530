"""``gateway sessions rotate``: a new console session secret, ending every session signed
until now on every instance within a second (the service goes on; people sign in again)."""

from __future__ import annotations

import argparse

from gateway.cli.arguments import Parents, Subcommands
from gateway.cli.output import Output
from gateway.config import Settings
from gateway.store import Store


async def cmd_rotate(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    await store.rotate_session_secret()
    return Output({"rotated": True}, "session secret rotated: every console session has ended")


def register(sub: Subcommands, parents: Parents) -> None:
    p = sub.add_parser("sessions", help="console sessions")
    commands = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    rotate = commands.add_parser(
        "rotate", parents=parents, help="a new session secret: every console session ends"
    )
    rotate.set_defaults(func=cmd_rotate)
