"""The built-in price table: providers' list prices per model and token class (pure).

The figures are data, in ``prices.csv`` beside this module (shipped in the package; the
configuration's ``prices_file:`` names a newer copy): US dollars per million tokens of fresh
input, output, cache reads and cache writes, each row with the date it was read and its
source. The table does two things (``config.pricing`` applies it to the catalogue):

- a catalogue model with no ``price`` takes the row of its upstream model, as its price;
- a model priced by hand without ``cache_read`` / ``cache_write`` / ``cache_write_1h`` takes
  the row's *ratio* of cache price to input price (``billing.cache_prices``): Anthropic's
  cache writes cost 1.25 times its input (2 times for a 1-hour write), reads 0.1 times, and a
  hand-set input price of 2 makes them 2.5 (4) and 0.2.

A model id is found by its own name first, then with what providers and clouds add taken off
(``table_name``): a publisher or router prefix (``models/``, ``openai/``, Bedrock's
``us.anthropic.``), a date (``-20241022``, ``-2024-08-06``, Vertex's ``@20241022``), a version
(``-v1:0``, ``-001``), ``-latest`` or ``-preview``. Nothing else is guessed: ``gpt-4o-audio``
is not ``gpt-4o``.

This module imports nothing of the gateway, so that the configuration can read it.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path

BUILTIN = Path(__file__).with_name("prices.csv")
COLUMNS = ("provider", "model", "input", "output", "cache_read", "cache_write",
           "cache_write_1h", "date", "source", "note")  # fmt: skip
# the header before ``cache_write_1h``: a file of an earlier version still reads (no 1-hour
# write prices: ``billing.cache_prices`` gives them the 5-minute write's)
EARLIER_COLUMNS = tuple(c for c in COLUMNS if c != "cache_write_1h")
PRICES = ("input", "output", "cache_read", "cache_write", "cache_write_1h")
MAX_TABLE_PRICE = 1_000_000  # dollars per million tokens: config.MAX_PRICE's bound
# what providers and clouds put around a model's id, taken off one at a time, in this order
_PREFIX = re.compile(r"^(?:.*/)?(?:(?:us|eu|apac|global|jp|au)\.)?(?:[a-z0-9-]+\.(?=[a-z]))?")
_SUFFIXES = (
    re.compile(r"-v\d+(?::\d+)?$"),  # Bedrock: -v1:0, -v2:0
    re.compile(r"@(?:\d{8}|latest|default)$"),  # Vertex: @20241022
    re.compile(r"-(?:latest|preview|exp)(?:-\d{2}-\d{2,4})?$"),  # -preview-05-20
    re.compile(r"-\d{4}-\d{2}-\d{2}$"),  # OpenAI: -2024-08-06
    re.compile(r"-\d{8}$"),  # Anthropic: -20241022
    re.compile(r"-\d{3}$"),  # Google: -001
)


class PriceTableError(ValueError):
    """A price table file that cannot be read: the message says where (``line 12: ...``)."""


@dataclass(frozen=True, slots=True)
class TablePrice:
    """One row: dollars per million tokens; a cache price None when the row has none."""

    provider: str
    model: str
    input: float
    output: float
    cache_read: float | None
    cache_write: float | None
    date: str
    source: str
    note: str = ""
    cache_write_1h: float | None = None  # Anthropic's 1-hour cache writes

    def ratio(self, cache_price: float | None) -> float | None:
        """A cache price as a share of the input price; None when there is none to take."""
        if cache_price is None or self.input <= 0:
            return None
        return cache_price / self.input


def table_name(model: str) -> str:
    """``model`` as the table names it: lower case, its prefix and one suffix of each kind
    taken off (see the module docstring)."""
    name = model.strip().lower()
    if "/" in name or "." in name.split("-", 1)[0]:
        name = _PREFIX.sub("", name, count=1) or name
    for suffix in _SUFFIXES:
        name = suffix.sub("", name)
    return name


class PriceTable:
    """The rows of one price file, by model name."""

    __slots__ = ("rows", "path")

    def __init__(self, rows: list[TablePrice], path: str = "") -> None:
        self.rows = {r.model: r for r in rows}
        self.path = path

    @classmethod
    def load(cls, path: str | Path | None = None) -> PriceTable:
        """The file at ``path`` (None: the built-in table). PriceTableError when it cannot be
        read or a row is not a price."""
        where = Path(path) if path else BUILTIN
        try:
            text = where.read_text(encoding="utf-8")
        except OSError as exc:
            raise PriceTableError(f"cannot read {where}: {exc.strerror or exc}") from None
        return cls(parse_rows(text), str(where))

    def lookup(self, model: str) -> TablePrice | None:
        """The row for an upstream model id, or None."""
        found = self.rows.get(model)
        if found is None:
            found = self.rows.get(table_name(model))
        return found


_BUILTIN: PriceTable | None = None


def builtin() -> PriceTable:
    """The table shipped with the gateway, read once."""
    global _BUILTIN
    if _BUILTIN is None:
        _BUILTIN = PriceTable.load()
    return _BUILTIN


def _price(value: str, line: int, column: str, optional: bool) -> float | None:
    text = value.strip()
    if not text and optional:
        return None
    try:
        number = float(text)
    except ValueError:
        raise PriceTableError(f"line {line}: {column}: not a number: {text!r}") from None
    if not math.isfinite(number) or not 0 <= number <= MAX_TABLE_PRICE:
        raise PriceTableError(f"line {line}: {column}: must be from 0 to {MAX_TABLE_PRICE}")
    return number


def parse_rows(text: str) -> list[TablePrice]:
    """The rows of a price file: CSV with the header ``COLUMNS`` (or ``EARLIER_COLUMNS``);
    lines starting with ``#`` and blank lines are comments."""
    lines = [
        (n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()
        and not line.lstrip().startswith("#")
    ]  # fmt: skip
    if not lines:
        raise PriceTableError("no header line")
    header = tuple(h.strip() for h in next(csv.reader([lines[0][1]])))
    if header not in (COLUMNS, EARLIER_COLUMNS):
        raise PriceTableError(f"line {lines[0][0]}: the header must be {','.join(COLUMNS)}")
    rows: list[TablePrice] = []
    seen: set[str] = set()
    reader = csv.reader(io.StringIO("\n".join(line for _, line in lines[1:])))
    for (n, _), cells in zip(lines[1:], reader, strict=True):
        if len(cells) != len(header):
            raise PriceTableError(f"line {n}: {len(cells)} columns, not {len(header)}")
        row = dict(zip(header, (c.strip() for c in cells), strict=True))
        model = row["model"]
        if not model or model != model.lower():
            raise PriceTableError(f"line {n}: model: must be a lower-case model id")
        if model in seen:
            raise PriceTableError(f"line {n}: model: {model!r} is listed twice")
        if not row["date"] or not row["source"]:
            raise PriceTableError(f"line {n}: every row needs its date and source")
        seen.add(model)
        price = {c: _price(row.get(c, ""), n, c, c.startswith("cache")) for c in PRICES}
        rows.append(
            TablePrice(
                row["provider"],
                model,
                price["input"] or 0.0,
                price["output"] or 0.0,
                price["cache_read"],
                price["cache_write"],
                row["date"],
                row["source"],
                row["note"],
                price["cache_write_1h"],
            )  # fmt: skip
        )
    return rows
