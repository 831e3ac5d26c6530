"""``gateway serve``: run the gateway. The server stack is imported only when this command
runs, so the operator commands do not load it."""

from __future__ import annotations

import argparse

from gateway.cli.arguments import Subcommands, port, positive_int
from gateway.cli.output import fail
from gateway.config import Settings

SERVERS = ("hypercorn", "uvicorn", "granian")


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:
    serve = sub.add_parser("serve", parents=[common], help="run the gateway")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=port, default=8080)
    serve.add_argument("--workers", type=positive_int, default=1)
    serve.add_argument("--server", choices=SERVERS, default="uvicorn")


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Serve until stopped; the exit status."""
    from gateway.server import serve

    try:
        serve(settings, args.host, args.port, args.workers, server=args.server)
    except OSError as exc:  # e.g. the port is taken
        return fail(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}", 1)
    return 0
