"""What an operator command returns and how it is shown: an aligned table for people, the admin
API's JSON objects with ``--json``, and an error as one line on stderr."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import orjson

from gateway.config import Settings
from gateway.operator import accounts
from gateway.store import Store
from gateway.types import JSON

PROG = "gateway"


@dataclass(frozen=True, slots=True)
class Output:
    payload: JSON  # what --json prints: the admin API's shape
    text: str  # what people see
    code: int = 0  # the exit status (a channel test that failed: 1)


Command = Callable[[argparse.Namespace, Settings, Store], Awaitable[Output]]


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


def when(dt: datetime | None) -> str:
    """A time cell: RFC 3339, or ``-`` for none."""
    return accounts.format_time(dt) or "-"


def show(out: Output, as_json: bool) -> int:
    """Print a command's output on stdout; its exit status."""
    if as_json:
        sys.stdout.write(orjson.dumps(out.payload, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(out.text + "\n")
    return out.code


def fail(message: str, code: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code
