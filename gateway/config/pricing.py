"""The price table applied to the catalogue (``policy/prices.py`` has the table itself).

A model's *upstream name* is what its channels call it (``model_map``), in the order routing
tries them: by priority, then as listed; its own name comes last. The first of those names the
table has a row for is the model's row:

- a model without ``price`` takes that row's prices (the table's dollars are balance units, as
  every price in the catalogue is), and is refused when no name has a row: at start-up a
  ``ConfigError`` naming ``models[i].price``, through the admin API a 400;
- a model priced by hand keeps its prices, and the row gives the ratios for the cache prices
  it leaves unset (``billing.cache_prices``).

When the channels of one model map it to different upstream models, the first channel's row
wins for every channel: a catalogue model has one price whichever channel serves it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from gateway.config.catalogue import Channel, Model, Price
from gateway.config.values import ConfigError
from gateway.policy.prices import PriceTable, TablePrice


def upstream_names(model: str, channels: Iterable[Channel]) -> list[str]:
    """What the channels serving ``model`` call it, in routing order, then its own name."""
    serving = sorted((c for c in channels if model in c.models), key=lambda c: c.priority)
    names: list[str] = []
    for name in [*(c.upstream_model(model) for c in serving), model]:
        if name not in names:
            names.append(name)
    return names


def table_price(row: TablePrice) -> Price:
    return Price(
        input=row.input,
        output=row.output,
        cache_read=row.cache_read,
        cache_write=row.cache_write,
        cache_write_1h=row.cache_write_1h,
    )


def priced_model(model: Model, channels: Iterable[Channel], table: PriceTable, where: str) -> Model:
    """The model with its table row (and, when it has no price, the row's prices). Raises
    ConfigError naming ``where``'s ``price`` when it has no price and no row."""
    names = upstream_names(model.name, channels)
    row = next((r for r in map(table.lookup, names) if r is not None), None)
    if model.priced:
        return model if row is None else replace(model, table=row)
    if row is None:
        field = f"{where}.price" if where else "price"
        shown = ", ".join(repr(n) for n in names)
        raise ConfigError(f"{field}: not given, and the price table has no price for {shown}")
    return replace(model, price=table_price(row), table=row)


def priced_models(
    models: Sequence[Model],
    channels: Sequence[Channel],
    table: PriceTable,
    where: Callable[[int, Model], str],
    dropped: Callable[[ConfigError], None] | None = None,
) -> tuple[Model, ...]:
    """``priced_model`` for each; a model that cannot be priced raises, or, with ``dropped``,
    is reported to it and left out (the store's entries: the rest is served)."""
    out: list[Model] = []
    for i, m in enumerate(models):
        try:
            out.append(priced_model(m, channels, table, where(i, m)))
        except ConfigError as exc:
            if dropped is None:
                raise
            dropped(exc)
    return tuple(out)
