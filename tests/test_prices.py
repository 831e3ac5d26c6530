"""The built-in price table (``policy/prices.py``, ``config/pricing.py``): a model without a
price takes its upstream model's row; a model priced by hand takes the row's cache ratios; a
model with neither is refused at start and by the admin API; ``prices_file`` replaces the
table; ``gateway prices`` lists it and compares the catalogue with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.cli import main
from gateway.config import ConfigError, load_settings, parse_settings
from gateway.errors import InvalidRequestError
from gateway.operator import catalogue
from gateway.policy.billing import Metered, Rate, cache_prices
from gateway.policy.prices import (
    BUILTIN,
    COLUMNS,
    EARLIER_COLUMNS,
    PriceTable,
    PriceTableError,
    builtin,
    parse_rows,
    table_name,
)
from gateway.policy.routing import Catalogue
from gateway.store import Store
from gateway.store.backends import open_store
from gateway.store.catalogue import model_record, view
from tests.plugins.stores import sqlite_url

ANTHROPIC = {"type": "anthropic", "base_url": "http://an.test"}


def settings(models: list[dict[str, Any]], channels: list[dict[str, Any]], **more: Any) -> Any:
    return parse_settings(
        {"store": "sqlite:///unused.db", "models": models, "channels": channels, **more}
    )


# ---- the table -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "found"),
    [
        ("claude-sonnet-4-5", "claude-sonnet-4-5"),
        ("claude-3-5-haiku-20241022", "claude-3-5-haiku"),  # Anthropic's dated id
        ("gpt-4o-2024-08-06", "gpt-4o"),  # OpenAI's dated id
        ("gpt-4o-mini-2024-07-18", "gpt-4o-mini"),  # not gpt-4o
        ("us.anthropic.claude-3-5-haiku-20241022-v1:0", "claude-3-5-haiku"),  # Bedrock
        ("anthropic.claude-3-haiku-20240307-v1:0", "claude-3-haiku"),
        ("claude-3-5-haiku@20241022", "claude-3-5-haiku"),  # Vertex
        ("models/gemini-2.5-flash", "gemini-2.5-flash"),  # Gemini's resource name
        ("gemini-2.5-flash-preview-05-20", "gemini-2.5-flash"),
        ("openai/gpt-oss-120b", "gpt-oss-120b"),  # a router's publisher prefix
        ("GPT-4.1", "gpt-4.1"),
    ],
)
def test_a_model_id_finds_its_row(given: str, found: str) -> None:
    row = builtin().lookup(given)
    assert row is not None and row.model == found


@pytest.mark.parametrize("given", ["gpt-4o-audio-preview", "claude-sonnet", "my-model", "o3-x"])
def test_nothing_else_is_guessed(given: str) -> None:
    assert builtin().lookup(given) is None
    assert table_name("gpt-4o-audio-preview") == "gpt-4o-audio"


def test_every_builtin_row_has_a_date_a_source_and_sane_prices() -> None:
    rows = list(builtin().rows.values())
    assert len(rows) >= 30
    assert {r.provider for r in rows} >= {"anthropic", "openai", "gemini", "deepseek"}
    for r in rows:
        assert r.date and r.source.startswith("https://"), r
        assert 0 < r.input <= r.output or r.output == 0, r  # output never cheaper than input
        if r.cache_read is not None:
            assert r.cache_read < r.input, r
        if r.cache_write is not None:
            assert r.cache_write >= r.input, r
        if r.cache_write_1h is not None:  # Anthropic's alone: twice its input, past 5 minutes'
            assert r.provider == "anthropic" and r.cache_write_1h == 2 * r.input, r
            assert r.cache_write is not None and r.cache_write_1h > r.cache_write, r
        else:
            assert r.provider != "anthropic", r
    sonnet = builtin().lookup("claude-sonnet-4")
    assert sonnet is not None
    assert (sonnet.input, sonnet.cache_write, sonnet.cache_write_1h) == (3, 3.75, 6)


def test_a_price_file_of_an_earlier_version_still_reads() -> None:
    """A file without the cache_write_1h column (a copy made before it): its rows read, none
    with a 1-hour write price."""
    text = ",".join(EARLIER_COLUMNS) + "\nacme,acme-1,7,9,0.7,8,2027-01-01,https://acme.test,\n"
    (row,) = parse_rows(text)
    assert (row.model, row.input, row.output, row.cache_read, row.cache_write) == (
        "acme-1",
        7,
        9,
        0.7,
        8,
    )
    assert row.cache_write_1h is None and row.date == "2027-01-01"
    (row,) = parse_rows(",".join(COLUMNS) + "\nacme,acme-1,7,9,0.7,8,14,2027-01-01,https://a,\n")
    assert (row.cache_write, row.cache_write_1h, row.source) == (8, 14, "https://a")


# the providers' published rules for cached input, as ratios of the input price: (provider,
# model prefix) -> (cache read, cache write); the first prefix that matches decides
CACHE_RULES = [
    (("anthropic", "claude-3-haiku"), (0.12, 1.2)),  # published rounded: 0.03 and 0.30 of 0.25
    (("anthropic", "claude"), (0.1, 1.25)),  # reads 0.1x, 5-minute writes 1.25x
    (("openai", "gpt-4o"), (0.5, 1.0)),
    (("openai", "gpt-4.1"), (0.25, 1.0)),
    (("openai", "o"), (0.25, 1.0)),  # o3, o4-mini
    (("openai", "gpt-5"), (0.1, 1.0)),
    (("gemini", "gemini"), (0.1, 1.0)),  # the 2.5 and 3 families' cached input
]


@pytest.mark.parametrize("row", list(builtin().rows.values()), ids=lambda r: r.model)
def test_cache_prices_follow_the_providers_rules(row: Any) -> None:
    rule = next(
        (r for (p, m), r in CACHE_RULES if row.provider == p and row.model.startswith(m)), None
    )
    if rule is None or row.cache_read is None:  # another provider's, or no cached price at all
        assert row.provider not in ("anthropic", "gemini") or row.cache_read is not None
        return
    assert (row.ratio(row.cache_read), row.ratio(row.cache_write)) == pytest.approx(rule), row


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "no header line"),
        ("model,input\n", "the header must be"),
        (",".join(COLUMNS) + "\nx,m,1,2,,,,2026-01-01\n", "line 2: 8 columns, not 10"),
        (",".join(COLUMNS) + "\nx,m,one,2,,,,2026-01-01,https://x,\n", "line 2: input: not a"),
        (",".join(COLUMNS) + "\nx,m,-1,2,,,,2026-01-01,https://x,\n", "line 2: input: must be"),
        (",".join(COLUMNS) + "\nx,M,1,2,,,,2026-01-01,https://x,\n", "line 2: model: must be"),
        (",".join(COLUMNS) + "\nx,m,1,2,,,,,https://x,\n", "its date and source"),
        (",".join(COLUMNS) + "\nx,m,1,2,,,,d,s,\nx,m,1,2,,,,d,s,\n", "line 3: model: 'm' is"),
        (",".join(COLUMNS) + "\nx,m,1,2,,,x,d,s,\n", "line 2: cache_write_1h: not a number"),
        (",".join(EARLIER_COLUMNS) + "\nx,m,1,2,,,,d,s,\n", "line 2: 10 columns, not 9"),
    ],
)
def test_a_bad_price_file_says_which_line(text: str, error: str) -> None:
    with pytest.raises(PriceTableError, match=error):
        parse_rows(text)


# ---- applied to the catalogue ----------------------------------------------------------------


def test_a_model_without_a_price_takes_its_upstream_models_row() -> None:
    s = settings(
        [{"name": "haiku"}],
        [
            {
                **ANTHROPIC,
                "name": "an",
                "models": ["haiku"],
                "model_map": {"haiku": "claude-3-5-haiku-20241022"},
            }
        ],  # fmt: skip
    )
    m = s.models[0]
    assert not m.priced and m.table is not None and m.table.model == "claude-3-5-haiku"
    assert (m.price.input, m.price.output, m.price.cache_read, m.price.cache_write) == (
        0.8, 4, 0.08, 1,
    )  # fmt: skip
    rate = Catalogue(s).rates["haiku"]
    used = Metered(prompt_tokens=1_000_000, completion_tokens=1_000_000,
                   cache_read_tokens=500_000, cache_write_tokens=100_000)  # fmt: skip
    # 400k fresh at 0.8, 500k read at 0.08, 100k written at 1, 1M out at 4 (balance units)
    assert rate.charge(used).micro == 320_000 + 40_000 + 100_000 + 4_000_000


def test_the_first_channel_in_routing_order_names_the_upstream_model() -> None:
    s = settings(
        [{"name": "smart"}],
        [
            {
                **ANTHROPIC,
                "name": "late",
                "priority": 5,
                "models": ["smart"],
                "model_map": {"smart": "claude-opus-4-1"},
            },
            {
                **ANTHROPIC,
                "name": "early",
                "priority": 0,
                "models": ["smart"],
                "model_map": {"smart": "claude-sonnet-4-5"},
            },
        ],  # fmt: skip
    )
    assert s.models[0].price.input == 3  # early's upstream, though listed second


def test_a_hand_price_takes_the_tables_cache_ratios() -> None:
    s = settings(
        [{"name": "s", "price": {"input": 2, "output": 10}},
         {"name": "t", "price": {"input": 2, "output": 10, "cache_read": 1.5}},
         {"name": "u", "price": {"input": 2, "output": 10}}],
        [{**ANTHROPIC, "name": "an", "models": ["s", "t"],
          "model_map": {"s": "claude-sonnet-4", "t": "claude-sonnet-4"}},
         {"type": "openai", "base_url": "http://oa.test/v1", "name": "oa", "models": ["u"]}],
    )  # fmt: skip
    by = {m.name: m for m in s.models}
    # Anthropic's sonnet: reads 0.1 times its input, writes 1.25 times, 1-hour writes 2 times
    assert cache_prices(by["s"].price, by["s"].table) == pytest.approx((0.2, 2.5, 4))
    assert cache_prices(by["t"].price, by["t"].table) == pytest.approx((1.5, 2.5, 4))  # its own
    assert by["u"].table is None  # no row for "u": the input price stands in
    assert cache_prices(by["u"].price, by["u"].table) == (2, 2, 2)
    rate = Rate.from_price(by["s"].price, by["s"].table)
    assert (rate.cache_read, rate.cache_write, rate.cache_write_1h) == (
        200_000,
        2_500_000,
        4_000_000,
    )  # pico-units a token


def test_a_model_with_neither_is_refused_at_start() -> None:
    with pytest.raises(ConfigError, match=r"^models\[1\]\.price: not given, and the price table "
                       r"has no price for 'up-x', 'mine'$"):  # fmt: skip
        settings(
            [{"name": "ok", "price": {"input": 1}}, {"name": "mine", "price": None}],
            [{**ANTHROPIC, "name": "an", "models": ["ok", "mine"], "model_map": {"mine": "up-x"}}],
        )


def test_prices_file_replaces_the_table(tmp_path: Path) -> None:
    newer = tmp_path / "prices.csv"
    newer.write_text(
        "# a newer table\n" + ",".join(COLUMNS) + "\n"
        "acme,acme-1,7,9,0.7,,,2027-01-01,https://acme.test/pricing,\n"
    )
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        "store: sqlite:///unused.db\nprices_file: prices.csv\n"  # beside the config file
        "models: [{name: a}]\n"
        "channels: [{name: c, type: openai, base_url: 'http://x/v1', models: [a],"
        " model_map: {a: acme-1-2026-05-01}}]\n"
    )
    s = load_settings(cfg)
    assert s.prices_file == str(newer) and s.models[0].price.input == 7
    assert s.prices.lookup("gpt-4o") is None  # the file replaces the built-in table
    cfg.write_text("store: sqlite:///unused.db\nprices_file: missing.csv\n")
    with pytest.raises(ConfigError, match=r"^prices_file: cannot read .*missing\.csv"):
        load_settings(cfg)
    assert PriceTable.load().path == str(BUILTIN)


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    s = open_store(sqlite_url(tmp_path / "gw.db"))
    await s.open()
    yield s
    await s.close()


async def test_the_admin_api_prices_from_the_table_or_refuses(store: Store) -> None:
    cfg = settings([{"name": "file", "price": {"input": 1}}], [])
    made = await catalogue.create_model(store, cfg, {"name": "gpt-4.1-mini"})
    assert (made.price.input, made.price.output, made.priced) == (0.4, 1.6, False)
    v = await catalogue.load(store, cfg)
    shown = catalogue.model_out(v.model("gpt-4.1-mini"), v)  # type: ignore[arg-type]
    assert shown["price_source"] == "table" and shown["price"]["input"] == 0.4  # type: ignore[index]
    assert "price" not in model_record(made, "api", 1)  # repriced by the table at each view
    with pytest.raises(InvalidRequestError, match=r"^price: not given, and the price table"):
        await catalogue.create_model(store, cfg, {"name": "house-model"})
    with pytest.raises(InvalidRequestError, match=r"^price: not given"):
        await catalogue.create_model(store, cfg, {"name": "house-model", "price": None})
    again = await catalogue.update_model(store, cfg, "gpt-4.1-mini", {"price": {"input": 9}})
    assert (again.price.input, again.priced) == (9, True)
    records = await store.load_catalogue()
    assert view(records, cfg).model("gpt-4.1-mini").price.input == 9  # type: ignore[union-attr]


# ---- gateway prices --------------------------------------------------------------------------


def run(config: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main([*argv, "--config", str(config)]) == 0
    out: str = capsys.readouterr().out
    return out


def test_the_cli_lists_the_table_and_diffs_the_catalogue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("GATEWAY_CONFIG", "GATEWAY_STORE", "GATEWAY_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(
        f"store: sqlite:///{tmp_path / 'gw.db'}\n"
        "models:\n"
        "  - {name: sonnet}\n"
        "  - {name: cheap, price: {input: 2, output: 10}}\n"
        "  - {name: house, price: {input: 1}}\n"
        "channels:\n"
        "  - {name: an, type: anthropic, base_url: 'http://x', models: [sonnet, cheap],\n"
        "     model_map: {sonnet: claude-sonnet-4-5-20250929, cheap: claude-haiku-4-5}}\n"
        "  - {name: oa, type: openai, base_url: 'http://x/v1', models: [house]}\n"
    )
    listed = run(cfg, capsys, "prices", "list", "--provider", "deepseek").splitlines()
    assert listed[0].split() == ["PROVIDER", "MODEL", "INPUT", "OUTPUT", "CACHE_READ",
                                 "CACHE_WRITE", "CACHE_WRITE_1H", "DATE", "SOURCE"]  # fmt: skip
    assert listed[1].split()[:7] == [
        "deepseek", "deepseek-chat", "0.56", "1.68", "0.07", "0.56", "-"
    ]  # fmt: skip
    assert listed[-1] == f"2 rows from {BUILTIN}"
    table = run(cfg, capsys, "prices", "diff").splitlines()
    assert [line.split()[:9] for line in table[1:]] == [
        ["sonnet", "claude-sonnet-4-5", "table", "3", "15", "0.3", "3.75", "6", "same"],
        ["cheap", "claude-haiku-4-5", "config", "2", "10", "0.2", "2.5", "4", "differs:"],
        ["house", "house", "config", "1", "0", "1", "1", "1", "no"],
    ]
    assert table[2].endswith(
        "differs: input 1, output 5, cache_read 0.1, cache_write 1.25, cache_write_1h 2"
    )
    data = orjson.loads(run(cfg, capsys, "prices", "diff", "--json"))["data"]
    assert data[1]["differs"] == ["input", "output", "cache_read", "cache_write", "cache_write_1h"]
    assert data[0]["price"]["cache_write_1h"] == 6 and data[0]["table"]["cache_write_1h"] == 6
    assert data[1]["table"]["source"].startswith("https://")
    assert data[2]["table"] is None
