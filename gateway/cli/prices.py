"""``gateway prices``: the price table in use (the built-in one, or the configuration's
``prices_file``), and how the catalogue's prices compare with it.

``gateway prices list`` shows the table's rows (``--provider`` narrows them); ``gateway prices
diff`` shows each catalogue model (the file's and the store's) beside the table's row for its
upstream name: the prices billing uses (a cache price left unset is shown as the one the
table's ratio gives it) and the fields where they differ from the table.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from gateway.cli.arguments import Parents, Subcommands
from gateway.cli.output import Output, table
from gateway.config import Model, Settings
from gateway.config.pricing import upstream_names
from gateway.operator import catalogue
from gateway.policy.billing import cache_price_map
from gateway.policy.prices import TablePrice
from gateway.store import Store
from gateway.types import JSON

CLASSES = ("input", "output", "cache_read", "cache_write", "cache_write_1h")


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def row_json(row: TablePrice) -> dict[str, JSON]:
    return {
        "provider": row.provider,
        "model": row.model,
        "input": row.input,
        "output": row.output,
        "cache_read": row.cache_read,
        "cache_write": row.cache_write,
        "cache_write_1h": row.cache_write_1h,
        "date": row.date,
        "source": row.source,
        "note": row.note,
    }


async def cmd_list(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    rows = [r for r in settings.prices.rows.values() if args.provider in (None, r.provider)]
    headers = ["PROVIDER", "MODEL", "INPUT", "OUTPUT", "CACHE_READ", "CACHE_WRITE",
               "CACHE_WRITE_1H", "DATE", "SOURCE"]  # fmt: skip
    cells = [
        [r.provider, r.model, _money(r.input), _money(r.output), _money(r.cache_read),
         _money(r.cache_write), _money(r.cache_write_1h), r.date, r.source]
        for r in rows
    ]  # fmt: skip
    where = settings.prices.path
    text = table(headers, cells, right=[2, 3, 4, 5, 6]) if rows else "no rows"
    payload: dict[str, JSON] = {"file": where, "data": [row_json(r) for r in rows]}
    return Output(payload, f"{text}\n\n{len(rows)} rows from {where}")


def billed(model: Model) -> dict[str, float]:
    """The prices per million tokens that billing uses for the model's token classes."""
    return {"input": model.price.input, "output": model.price.output,
            **cache_price_map(model.price, model.table)}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Compared:
    """One catalogue model beside its table row."""

    model: Model
    upstream: str  # the row's model, else the first upstream name
    prices: dict[str, float]  # what billing uses
    differs: tuple[str, ...]  # the classes whose price is not the row's

    def json(self) -> dict[str, JSON]:
        row = self.model.table
        return {
            "model": self.model.name,
            "upstream": self.upstream,
            "price_source": "config" if self.model.priced else "table",
            "price": dict(self.prices),
            "table": None if row is None else row_json(row),
            "differs": list(self.differs),
        }

    def status(self) -> str:
        row = self.model.table
        if row is None:
            return "no row"
        if not self.differs:
            return "same"
        return "differs: " + ", ".join(f"{c} {_money(getattr(row, c))}" for c in self.differs)


def compared(model: Model, upstream: str) -> Compared:
    prices = billed(model)
    row = model.table
    differs = () if row is None else tuple(
        c for c in CLASSES
        if (ref := getattr(row, c)) is not None and abs(prices[c] - ref) > 1e-12
    )  # fmt: skip
    return Compared(model, row.model if row is not None else upstream, prices, differs)


async def cmd_diff(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    v = await catalogue.load(store, settings)
    entries = [compared(m, upstream_names(m.name, v.channels)[0]) for m in v.models]
    headers = ["MODEL", "UPSTREAM", "SOURCE", "INPUT", "OUTPUT", "CACHE_READ", "CACHE_WRITE",
               "CACHE_WRITE_1H", "TABLE"]  # fmt: skip
    cells = [
        [e.model.name, e.upstream, "config" if e.model.priced else "table",
         *(_money(e.prices[c]) for c in CLASSES), e.status()]
        for e in entries
    ]  # fmt: skip
    text = table(headers, cells, right=[3, 4, 5, 6, 7]) if entries else "no models"
    data: list[JSON] = [e.json() for e in entries]
    return Output({"file": settings.prices.path, "data": data}, text)


def register(sub: Subcommands, parents: Parents) -> None:
    group = sub.add_parser("prices", help="the price table, and the catalogue against it")
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser("list", parents=parents, help="the price table's rows")
    p.add_argument("--provider", default=None, help="only this provider's rows")
    p.set_defaults(func=cmd_list)
    p = actions.add_parser(
        "diff", parents=parents, help="each catalogue model's prices beside the table's"
    )
    p.set_defaults(func=cmd_diff)
