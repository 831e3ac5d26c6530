"""The whole configuration: read once at start-up (YAML, ``${NAME}`` expansion, ``GATEWAY_*``
overrides), validated into frozen ``Settings``. The CLI prints a ``ConfigError``'s one line and
exits with status 2."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.config.catalogue import (
    Channel,
    Model,
    parse_channel,
    parse_group,
    parse_model,
)
from gateway.config.pricing import priced_models
from gateway.config.sections import (
    ConsoleSettings,
    Limits,
    LoggingSettings,
    MetricsSettings,
    ServerSettings,
    TracingSettings,
    UpstreamSettings,
    parse_console,
    parse_limits,
    parse_logging,
    parse_metrics,
    parse_server,
    parse_tracing,
    parse_upstream,
)
from gateway.config.seeds import AccountSeed, KeySeed, parse_account, parse_key
from gateway.config.values import (
    ENV_REF,
    ConfigError,
    list_of,
    string,
    strings,
    unique,
)
from gateway.policy.prices import PriceTable, PriceTableError, builtin


@dataclass(frozen=True, slots=True)
class Settings:
    # secrets are in no repr: the store URL may hold a password, the admin token is one
    store: str = field(repr=False)
    admin_token: str = field(repr=False)
    groups: tuple[str, ...]
    models: tuple[Model, ...]
    channels: tuple[Channel, ...]
    accounts: tuple[AccountSeed, ...] = ()
    keys: tuple[KeySeed, ...] = ()
    limits: Limits = Limits()
    trusted_proxies: tuple[str, ...] = ("127.0.0.1/32", "::1/128")
    upstream: UpstreamSettings = UpstreamSettings()
    server: ServerSettings = ServerSettings()
    metrics: MetricsSettings = MetricsSettings()
    logging: LoggingSettings = LoggingSettings()
    tracing: TracingSettings = TracingSettings()
    # the settlement journal's directory (gateway.store.journal); beside a SQLite file, else
    # data/journal
    journal: str = ""
    path: str = ""
    # the groups' price ratios, in ``groups`` order (CONTRACT §2; a group without one: 1)
    ratios: tuple[tuple[str, float], ...] = ()
    console: ConsoleSettings = ConsoleSettings()
    # the price table (``policy/prices.py``): the built-in one, or ``prices_file``'s
    prices_file: str = ""
    prices: PriceTable = field(default_factory=builtin, repr=False)
    # the groups' tool kinds (``config.catalogue.TOOLS``), in ``groups`` order; left out: none
    tools: tuple[tuple[str, str], ...] = ()
    # ``demo: true``: the bundled demo configuration, where the public demo admin token serves
    demo: bool = False

    @property
    def group_ratios(self) -> dict[str, float]:
        """Each group's price ratio (``routing.CatalogueSource``); a group left out: 1."""
        return dict(self.ratios)

    @property
    def group_tools(self) -> dict[str, str]:
        """Each group's tool kind, for those that name one."""
        return dict(self.tools)

    def model(self, name: str) -> Model | None:
        for m in self.models:
            if m.name == name:
                return m
        return None


def load_settings(path: str | os.PathLike[str] | None = None) -> Settings:
    """Read, expand and validate the configuration file. Raises ConfigError."""
    if path is None:
        path = os.environ.get("GATEWAY_CONFIG", "")
        if not path:
            raise ConfigError("config: no --config given and GATEWAY_CONFIG is not set")
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config: cannot read {p}: {exc.strerror or exc}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config: not valid YAML{where}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("config: the top level must be a mapping")
    raw = expand(raw, "")
    if os.environ.get("GATEWAY_STORE"):
        raw["store"] = os.environ["GATEWAY_STORE"]
    if os.environ.get("GATEWAY_ADMIN_TOKEN"):
        raw["admin_token"] = os.environ["GATEWAY_ADMIN_TOKEN"]
    if os.environ.get("GATEWAY_JOURNAL"):
        raw["journal"] = os.environ["GATEWAY_JOURNAL"]
    return parse_settings(raw, path=str(p.resolve()))


def expand(value: Any, where: str) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in os.environ:
                # an unset variable becomes empty; fields that need a value say so below
                return ""
            return os.environ[name]

        return ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: expand(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [expand(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


# the top-level fields of the file
TOP_LEVEL = frozenset(
    {
        "store", "admin_token", "groups", "models", "channels", "accounts", "keys", "limits",
        "trusted_proxies", "upstream", "server", "metrics", "logging", "tracing", "journal",
        "console",
        "prices_file", "demo",
    }
)  # fmt: skip
MIN_ADMIN_TOKEN = 16  # characters: anything shorter is refused at start
DEMO_ADMIN_TOKEN = "admin-demo-token"  # ``make run``'s: public, so only in a ``demo: true`` file


def check_aliases(models: tuple[Model, ...]) -> None:
    """No exact alias is another model's name or another model's alias (a pattern may match
    either: a catalogue name wins, then the first model in catalogue order)."""
    names = {m.name for m in models}
    owner: dict[str, str] = {}
    for i, m in enumerate(models):
        for j, alias in enumerate(m.aliases):
            if "*" in alias:
                continue
            where = f"models[{i}].aliases[{j}]"
            if alias in names:
                raise ConfigError(f"{where}: {alias!r} is the name of a model")
            if alias in owner:
                raise ConfigError(f"{where}: {alias!r} is already an alias of {owner[alias]!r}")
            owner[alias] = m.name


def parse_settings(raw: dict[str, Any], path: str = "") -> Settings:
    """Validate an already-expanded mapping into Settings. Raises ConfigError."""
    for k in raw:
        if k not in TOP_LEVEL:
            raise ConfigError(f"{k}: unknown field")
    store = raw.get("store") or "sqlite:///data/gateway.db"
    check_store_url(store)
    demo = raw.get("demo", False)
    if not isinstance(demo, bool):
        raise ConfigError("demo: must be true or false")
    admin_token = check_admin_token(raw.get("admin_token", ""), demo)
    entries = parse_groups(raw.get("groups", ["default"]))
    groups = tuple(name for name, _, _ in entries)
    models = tuple(parse_model(m, f"models[{i}]") for i, m in enumerate(list_of(raw, "models")))
    names = [m.name for m in models]
    unique(names, "models", "name")
    check_aliases(models)
    channels = tuple(
        parse_channel(c, f"channels[{i}]", set(groups), set(names))
        for i, c in enumerate(list_of(raw, "channels"))
    )
    unique([c.name for c in channels], "channels", "name")
    prices_file, prices = price_table(raw.get("prices_file"), path)
    models = priced_models(models, channels, prices, lambda i, m: f"models[{i}]")
    accounts = tuple(
        parse_account(a, f"accounts[{i}]") for i, a in enumerate(list_of(raw, "accounts"))
    )
    unique([a.id for a in accounts], "accounts", "id")
    account_ids = {a.id for a in accounts}
    keys = tuple(
        parse_key(k, f"keys[{i}]", set(groups), account_ids)
        for i, k in enumerate(list_of(raw, "keys"))
    )
    unique([k.id for k in keys], "keys", "id")
    unique([k.key for k in keys], "keys", "key")
    limits = parse_limits(raw.get("limits") or {})
    proxies = trusted_proxies(raw.get("trusted_proxies", ["127.0.0.1/32", "::1/128"]))
    upstream = parse_upstream(raw.get("upstream") or {})
    server = parse_server(raw.get("server") or {})
    metrics = parse_metrics(raw.get("metrics") or {})
    logging_ = parse_logging(raw.get("logging") or {})
    tracing = parse_tracing(raw.get("tracing") or {})
    journal = string(raw.get("journal") or default_journal(store), "journal")
    console = parse_console(raw.get("console") or {}, groups)
    return Settings(
        store=store,
        admin_token=admin_token,
        groups=groups,
        models=models,
        channels=channels,
        accounts=accounts,
        keys=keys,
        limits=limits,
        trusted_proxies=proxies,
        upstream=upstream,
        server=server,
        metrics=metrics,
        logging=logging_,
        tracing=tracing,
        journal=journal,
        path=path,
        ratios=tuple((name, ratio) for name, ratio, _ in entries if ratio != 1.0),
        tools=tuple((name, tool) for name, _, tool in entries if tool is not None),
        console=console,
        prices_file=prices_file,
        prices=prices,
        demo=demo,
    )


def check_admin_token(v: Any, demo: bool) -> str:
    """``admin_token``: empty turns the admin API off; else at least ``MIN_ADMIN_TOKEN``
    characters, and not the public demo token unless the file says ``demo: true`` (the
    bundled example that ``make run`` serves)."""
    token = string(v, "admin_token", allow_empty=True)
    if not token:
        return ""
    if len(token) < MIN_ADMIN_TOKEN:
        raise ConfigError(
            f"admin_token (or GATEWAY_ADMIN_TOKEN): {len(token)} characters, at least "
            f"{MIN_ADMIN_TOKEN} are needed (e.g. openssl rand -hex 24); empty turns the admin "
            "API off"
        )
    if token == DEMO_ADMIN_TOKEN and not demo:
        raise ConfigError(
            f"admin_token (or GATEWAY_ADMIN_TOKEN): {DEMO_ADMIN_TOKEN!r} is the public demo "
            "token, accepted only in a configuration marked demo: true; choose your own"
        )
    return token


def parse_groups(v: Any) -> list[tuple[str, float, str | None]]:
    """``groups``: names, or ``{name, ratio, tool}`` entries; at least one, each name once."""
    if not isinstance(v, list) or not v:
        raise ConfigError("groups: at least one group is needed")
    out = [parse_group(g, f"groups[{i}]") for i, g in enumerate(v)]
    unique([name for name, _, _ in out], "groups", "name")
    return out


def price_table(value: Any, config_path: str) -> tuple[str, PriceTable]:
    """``prices_file``: a newer price table than the built-in one (a relative path is the
    configuration file's neighbour); none: the built-in table."""
    if value is None or value == "":
        return "", builtin()
    name = string(value, "prices_file")
    path = Path(name)
    if not path.is_absolute() and config_path:
        path = Path(config_path).parent / path
    try:
        return str(path), PriceTable.load(path)
    except PriceTableError as exc:
        raise ConfigError(f"prices_file: {exc}") from None


def trusted_proxies(v: Any) -> tuple[str, ...]:
    proxies = tuple(strings(v, "trusted_proxies"))
    for i, net in enumerate(proxies):
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError:
            raise ConfigError(f"trusted_proxies[{i}]: not an IP network") from None
    return proxies


def default_journal(store: str) -> str:
    """The journal's directory when the file names none: beside a SQLite file, else
    ``data/journal`` under the working directory."""
    if store.startswith("sqlite:///"):
        return os.path.join(os.path.dirname(store[len("sqlite:///") :]) or ".", "journal")
    return os.path.join("data", "journal")


def check_store_url(url: Any) -> None:
    if not isinstance(url, str):
        raise ConfigError("store: must be a string")
    if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
        return
    if url.startswith(("redis://", "rediss://", "unix://", "redis+cluster://")):
        return
    raise ConfigError(
        "store: must be sqlite:///path, redis://host:port/db or redis+cluster://host:port,..."
    )
