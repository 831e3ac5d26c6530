"""CSV the operator opens in a spreadsheet: every text cell that a spreadsheet would take for
a formula (it starts with ``= + - @``, a tab or a carriage return: a client chooses its model's
name, an operator a channel's) gets a ``'`` in front, so it opens as the text it is. The
console's own CSV (``console/static/ui.js``, ``csv``) does the same in the browser."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence

from gateway.types import JSON

FORMULA_STARTS = frozenset("=+-@\t\r")


def cell(value: JSON) -> JSON:
    """A value as a safe cell: None empty, a formula-like text quoted with ``'``."""
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in FORMULA_STARTS:
        return "'" + value
    return value


def csv_text(rows: Iterable[Mapping[str, JSON]], fields: Sequence[str]) -> str:
    """A header line of ``fields``, then a line per row, each cell made safe (``cell``)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: cell(r.get(k)) for k in fields} for r in rows)
    return out.getvalue()
