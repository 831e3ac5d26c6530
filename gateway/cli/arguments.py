"""The value types of the command line's flags. A bad value is argparse's usage error (exit 2)
with the message given here."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import TypeAlias

# what add_subparsers() returns: each command group registers its commands on one
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
# the parsers of the flags every operator command takes (--config, --json)
Parents: TypeAlias = Sequence[argparse.ArgumentParser]


def comma_separated(text: str) -> list[str]:
    """A comma-separated list; blanks and empty items dropped."""
    return [part.strip() for part in text.split(",") if part.strip()]


def amount(text: str) -> Decimal:
    try:
        value = Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value.is_finite():
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
    return value
