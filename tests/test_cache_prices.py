"""A model's ``cache_read`` and ``cache_write`` prices (CONTRACT §2): read from the
configuration file, set through the admin API's model create and patch and the CLI's
``--cache-read`` / ``--cache-write``, shown where prices are shown; left out (or null), the
input price stands in (``billing.cache_prices``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway import cli
from gateway.cli import catalogue as cli_catalogue
from gateway.config import ConfigError, Price, parse_model, parse_settings
from gateway.errors import InvalidRequestError
from gateway.operator import catalogue
from gateway.policy.billing import Rate
from gateway.store import Store
from gateway.store.catalogue import model_json
from tests.plugins.stores import sqlite_url


def settings(price: dict[str, Any]) -> Any:
    return parse_settings(
        {
            "store": "sqlite:///unused.db",
            "models": [{"name": "m", "price": price}],
            "channels": [
                {"name": "c", "type": "openai", "base_url": "http://up.test/v1", "models": ["m"]}
            ],
        }
    )


def test_the_file_sets_cache_prices_or_leaves_them_to_the_input_price() -> None:
    price = settings({"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75})
    assert price.models[0].price == Price(input=3, output=15, cache_read=0.3, cache_write=3.75)
    unset = settings({"input": 3, "cache_read": None}).models[0].price
    assert (unset.cache_read, unset.cache_write) == (None, None)
    rate = Rate.from_price(unset)
    assert rate.cache_read == rate.cache_write == rate.input == 3_000_000
    free = Rate.from_price(settings({"input": 3, "cache_read": 0}).models[0].price)
    assert (free.cache_read, free.cache_write) == (0, 3_000_000)


@pytest.mark.parametrize("bad", [-1, "0.3", True, 1e308])
def test_a_bad_cache_price_names_its_field(bad: Any) -> None:
    with pytest.raises(ConfigError, match=r"^models\[0\]\.price\.cache_write: must be a number"):
        settings({"input": 1, "cache_write": bad})


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    from gateway.store.backends import open_store

    s = open_store(sqlite_url(tmp_path / "gw.db"))
    await s.open()
    yield s
    await s.close()


async def test_the_admin_api_creates_patches_and_shows_cache_prices(store: Store) -> None:
    cfg = settings({"input": 1})
    body = {"name": "m-api", "price": {"input": 3, "output": 15, "cache_read": 0.3}}
    made = await catalogue.create_model(store, cfg, body)
    shown = model_json(made)["price"]
    assert (shown["cache_read"], shown["cache_write"]) == (0.3, None)  # null: the input price
    assert shown["cache_write_1h"] is None  # null: the table's ratio, else cache_write's
    changed = await catalogue.update_model(
        store,
        cfg,
        "m-api",
        {"price": {"input": 3, "cache_write": 3.75, "cache_write_1h": 6, "cache_read": None}},
    )
    assert (changed.price.cache_read, changed.price.cache_write) == (None, 3.75)
    assert changed.price.cache_write_1h == 6
    again = parse_model(model_json(changed))  # what the store keeps reads back the same
    assert again.price == changed.price
    with pytest.raises(InvalidRequestError, match=r"^price\.cache_write_1h: must be a number"):
        await catalogue.update_model(store, cfg, "m-api", {"price": {"cache_write_1h": "x"}})
    with pytest.raises(InvalidRequestError, match=r"^price\.cache_read: must be a number"):
        await catalogue.update_model(store, cfg, "m-api", {"price": {"cache_read": -0.1}})


def test_the_cli_has_a_flag_per_price() -> None:
    args = cli.build_parser().parse_args(
        ["models", "add", "m", "--input", "3", "--cache-read", "0.3", "--cache-write", "3.75"]
    )
    body = cli_catalogue.model_body(args)
    assert body["price"] == {"input": 3, "cache_read": 0.3, "cache_write": 3.75}
    hour = cli.build_parser().parse_args(["models", "add", "m", "--cache-write-1h", "6"])
    assert cli_catalogue.model_body(hour)["price"] == {"cache_write_1h": 6}
    kept = cli_catalogue.model_body(args, {"input": 1, "output": 15, "cache_read": None})
    assert kept["price"] == {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75}
