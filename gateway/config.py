"""The configuration file: YAML, ``${NAME}`` expansion, ``GATEWAY_*`` overrides, validation.

Read once at start-up into frozen dataclasses. Every error names the field it is about
(``channels[2].base_url: not a URL``) and is raised as ``ConfigError``; the CLI prints that one
line and exits with status 2.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

CHANNEL_TYPES = ("openai", "anthropic", "gemini")
CAPABILITIES = frozenset({"chat", "vision", "tools", "embeddings", "images", "audio", "rerank"})
PRICE_FIELDS = (
    "input", "output", "cache_read", "cache_write", "request", "image", "audio_second",
    "speech_char",
)  # fmt: skip
# the prices that may be left unset (None): ``billing.cache_prices`` says what stands in for them
OPTIONAL_PRICES = frozenset({"cache_read", "cache_write"})
# the highest price of any kind (balance units per million tokens, per call, ...): far above
# any real one, low enough that no request's cost overflows the stores' 64-bit micro-units
# (``billing.MAX_COST``)
MAX_PRICE = 1_000_000
# the most ``default_max_tokens`` may be (``billing.MAX_TOKENS``: no request uses more)
MAX_DEFAULT_TOKENS = 2**31 - 1
KEY_STATUSES = ("enabled", "disabled")
CHANNEL_STATUSES = ("enabled", "disabled")  # a disabled channel is never chosen
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$")


class ConfigError(Exception):
    """A bad configuration file; the message is one line naming the field."""


@dataclass(frozen=True, slots=True)
class Price:
    """Balance units per million tokens (input, output; prompt tokens read from and written to
    the provider's prompt cache), per call, per image, per second of audio transcribed, per
    million characters spoken. A cache price left out is None: ``billing.cache_prices`` is the
    one place that decides what stands in for it."""

    input: float = 0.0
    output: float = 0.0
    cache_read: float | None = None
    cache_write: float | None = None
    request: float = 0.0
    image: float = 0.0
    audio_second: float = 0.0
    speech_char: float = 0.0


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    capabilities: frozenset[str]
    price: Price
    default_max_tokens: int = 4096


@dataclass(frozen=True, slots=True)
class ChannelTimeouts:
    """A channel's own timeouts (its ``timeouts:``), in seconds; None: ``upstream:``'s."""

    connect: float | None = None
    first_byte: float | None = None  # the reply's status and a stream's first output
    idle: float | None = None  # the longest silence between two bytes
    total: float | None = None  # the whole request, stream included; None: no limit

    @property
    def custom(self) -> bool:
        """Whether any of the timeouts the upstream client applies is the channel's own."""
        return self.connect is not None or self.idle is not None or self.total is not None


@dataclass(frozen=True, slots=True)
class Channel:
    name: str
    type: str
    base_url: str
    api_key: str = field(repr=False)  # the upstream's credential: in no repr, so in no log
    groups: tuple[str, ...]
    models: tuple[str, ...]
    model_map: dict[str, str] = field(default_factory=dict)
    priority: int = 0
    weight: int = 1
    # the client protocols the upstream speaks natively, so their bodies go through unconverted:
    # its type, and the Responses API for an openai channel with ``responses: true``
    speaks: frozenset[str] = frozenset()
    timeouts: ChannelTimeouts = ChannelTimeouts()
    status: str = "enabled"  # enabled | disabled: a disabled channel is never chosen

    def __post_init__(self) -> None:
        if not self.speaks:
            object.__setattr__(self, "speaks", frozenset({self.type}))

    def upstream_model(self, model: str) -> str:
        return self.model_map.get(model, model)

    def __hash__(self) -> int:
        return hash(self.name)


@dataclass(frozen=True, slots=True)
class AccountSeed:
    id: str
    balance: float


@dataclass(frozen=True, slots=True)
class KeySeed:
    id: str
    key: str = field(repr=False)  # the key's secret
    account: str
    group: str
    status: str = "enabled"
    name: str = ""
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    max_request_bytes: int = 20 * 1024 * 1024
    max_upload_bytes: int = 100 * 1024 * 1024
    # the least a request holds against its balance while it runs (balance units; its
    # estimate when that is more)
    hold_floor: float = 0.0
    # seconds the gateway serves from its cache after the store last answered; past that,
    # model requests get 503 until it answers again (0: no limit)
    store_grace: float = 300.0


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    """Pool and timeouts of the one client session (optional ``upstream:`` section)."""

    connect_timeout: float = 10.0
    read_timeout: float = 300.0  # the longest silence allowed between two upstream bytes
    pool_size: int = 0  # upstream connections at once; 0: no limit (each stream holds one)
    pool_size_per_host: int = 0  # 0: no per-host cap beyond pool_size
    retries: int = 2  # further channels tried after the first fails (before any byte is sent)
    cooldown_seconds: float = 30.0
    # the longest wait for a reply's status and, for a stream, its first output, before the
    # next channel is tried; None: only read_timeout applies
    first_byte_timeout: float | None = None
    # a stream quiet this long gets its protocol's keep-alive (SSE comment, messages ping)
    stream_keepalive_seconds: float = 15.0


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """The HTTP server's own settings (optional ``server:`` section).

    ``keep_alive_seconds``: an idle client connection is closed after this long (hypercorn and
    uvicorn; granian keeps its own). Long suits clients that pool connections and load
    balancers (longer than their idle timeout: no request sent on a connection being closed);
    an idle connection costs its socket and a few KiB. A connection the client closed is let
    go at once (under hypercorn thanks to ``gateway.server.hypercorn_mend``)."""

    keep_alive_seconds: float = 75.0
    # a request body must arrive within this many seconds, plus one for every 16 KiB it has
    # sent by then (a slow-drip or lying-Content-Length client gets 408); 0: no limit
    body_timeout_seconds: float = 10.0
    # connections one process holds at once; past it a new one gets a short 503 and is
    # closed. 0: about half the open-file limit (each stream also holds an upstream socket)
    max_connections: int = 0
    # on SIGTERM, requests in flight (long streams) get this many seconds to end before they
    # are cut (hypercorn, uvicorn); a supervisor's own timeout (Kubernetes'
    # terminationGracePeriodSeconds, compose's stop_grace_period, systemd's TimeoutStopSec)
    # must be longer
    graceful_seconds: float = 30.0
    # a request's headers must arrive within this many seconds (a new connection's first from
    # its accept, a later one's from its first byte), else 408 and the connection is closed
    # (hypercorn; ``gateway.server.header_timeout``). 0: no limit
    header_timeout_seconds: float = 5.0


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """``GET /metrics`` (optional ``metrics:`` section): served unless ``enabled: false``;
    with a ``token``, only to ``Authorization: Bearer <token>``."""

    enabled: bool = True
    token: str = field(default="", repr=False)


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("json", "text")


@dataclass(frozen=True, slots=True)
class LoggingSettings:
    """Optional ``logging:`` section: the level of the gateway's log, and the one line per
    request (``access``) in JSON or text (``format``)."""

    level: str = "info"
    format: str = "json"
    access: bool = True


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """Optional ``tracing:``: OpenTelemetry spans exported by OTLP over HTTP to
    ``otlp_endpoint`` (e.g. http://collector:4318/v1/traces); empty: no tracing."""

    otlp_endpoint: str = ""
    service_name: str = "model-gateway"


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
    raw = _expand(raw, "")
    if os.environ.get("GATEWAY_STORE"):
        raw["store"] = os.environ["GATEWAY_STORE"]
    if os.environ.get("GATEWAY_ADMIN_TOKEN"):
        raw["admin_token"] = os.environ["GATEWAY_ADMIN_TOKEN"]
    if os.environ.get("GATEWAY_JOURNAL"):
        raw["journal"] = os.environ["GATEWAY_JOURNAL"]
    return parse_settings(raw, path=str(p.resolve()))


def _expand(value: Any, where: str) -> Any:
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in os.environ:
                # an unset variable becomes empty; fields that need a value say so below
                return ""
            return os.environ[name]

        return ENV_REF.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def parse_settings(raw: dict[str, Any], path: str = "") -> Settings:
    """Validate an already-expanded mapping into Settings. Raises ConfigError."""
    known = {
        "store",
        "admin_token",
        "groups",
        "models",
        "channels",
        "accounts",
        "keys",
        "limits",
        "trusted_proxies",
        "upstream",
        "server",
        "metrics",
        "logging",
        "tracing",
        "journal",
    }
    for k in raw:
        if k not in known:
            raise ConfigError(f"{k}: unknown field")
    store = raw.get("store") or "sqlite:///data/gateway.db"
    _check_store_url(store)
    admin_token = _str(raw.get("admin_token", ""), "admin_token", allow_empty=True)
    groups = tuple(_str_list(raw.get("groups", ["default"]), "groups"))
    if not groups:
        raise ConfigError("groups: at least one group is needed")
    models = tuple(parse_model(m, f"models[{i}]") for i, m in enumerate(_list(raw, "models")))
    names = [m.name for m in models]
    _unique(names, "models", "name")
    channels = tuple(
        parse_channel(c, f"channels[{i}]", set(groups), set(names))
        for i, c in enumerate(_list(raw, "channels"))
    )
    _unique([c.name for c in channels], "channels", "name")
    accounts = tuple(_account(a, f"accounts[{i}]") for i, a in enumerate(_list(raw, "accounts")))
    _unique([a.id for a in accounts], "accounts", "id")
    account_ids = {a.id for a in accounts}
    keys = tuple(
        _key(k, f"keys[{i}]", set(groups), account_ids) for i, k in enumerate(_list(raw, "keys"))
    )
    _unique([k.id for k in keys], "keys", "id")
    _unique([k.key for k in keys], "keys", "key")
    limits = _limits(raw.get("limits") or {})
    proxies = tuple(
        _str_list(raw.get("trusted_proxies", ["127.0.0.1/32", "::1/128"]), "trusted_proxies")
    )
    import ipaddress

    for i, net in enumerate(proxies):
        try:
            ipaddress.ip_network(net, strict=False)
        except ValueError:
            raise ConfigError(f"trusted_proxies[{i}]: not an IP network") from None
    upstream = _upstream(raw.get("upstream") or {})
    server = _server(raw.get("server") or {})
    metrics = _metrics(raw.get("metrics") or {})
    logging_ = _logging(raw.get("logging") or {})
    tracing = _tracing(raw.get("tracing") or {})
    journal = _str(raw.get("journal") or _default_journal(store), "journal")
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
    )


def _default_journal(store: str) -> str:
    """The journal's directory when the file names none: beside a SQLite file, else
    ``data/journal`` under the working directory."""
    if store.startswith("sqlite:///"):
        return os.path.join(os.path.dirname(store[len("sqlite:///") :]) or ".", "journal")
    return os.path.join("data", "journal")


def _check_store_url(url: Any) -> None:
    if not isinstance(url, str):
        raise ConfigError("store: must be a string")
    if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
        return
    if url.startswith(("redis://", "rediss://", "unix://", "redis+cluster://")):
        return
    raise ConfigError(
        "store: must be sqlite:///path, redis://host:port/db or redis+cluster://host:port,..."
    )


def _list(raw: dict[str, Any], name: str) -> list[Any]:
    v = raw.get(name)
    if v is None:
        return []
    if not isinstance(v, list):
        raise ConfigError(f"{name}: must be a list")
    return v


def _str(v: Any, where: str, *, allow_empty: bool = False) -> str:
    if v is None and allow_empty:
        return ""
    if not isinstance(v, str) or (not v and not allow_empty):
        raise ConfigError(f"{where}: must be a non-empty string")
    return v


def _name(v: Any, where: str) -> str:
    s = _str(v, where)
    if not NAME_RE.match(s):
        raise ConfigError(f"{where}: {s!r} is not a valid name")
    return s


def _str_list(v: Any, where: str) -> list[str]:
    if not isinstance(v, list):
        raise ConfigError(f"{where}: must be a list of strings")
    return [_str(x, f"{where}[{i}]") for i, x in enumerate(v)]


def _num(v: Any, where: str, *, minimum: float = 0.0) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"{where}: must be a number")
    try:
        number = float(v)
    except OverflowError:  # an integer past a double's range
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(f"{where}: must be a finite number")
    if number < minimum:
        raise ConfigError(f"{where}: must be at least {minimum:g}")
    return number


def _price(v: Any, where: str) -> float:
    """A price: a finite number from 0 to ``MAX_PRICE``, the one rule for the file and the
    admin API."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= MAX_PRICE:
        raise ConfigError(f"{where}: must be a number from 0 to {MAX_PRICE}")
    return float(v)


def _int(v: Any, where: str, *, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{where}: must be an integer")
    if v < minimum:
        raise ConfigError(f"{where}: must be at least {minimum}")
    return v


def _mapping(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ConfigError(f"{where}: must be a mapping")
    return v


def _no_unknown(d: dict[str, Any], allowed: Collection[str], where: str) -> None:
    for k in d:
        if k not in allowed:
            raise ConfigError(f"{_at(where, str(k))}: unknown field")


def _unique(values: list[str], where: str, fld: str) -> None:
    seen: set[str] = set()
    for i, v in enumerate(values):
        if v in seen:
            raise ConfigError(f"{where}[{i}].{fld}: duplicate {v!r}")
        seen.add(v)


MODEL_FIELDS = frozenset({"name", "capabilities", "price", "default_max_tokens"})
CHANNEL_FIELDS = frozenset(
    {
        "name",
        "type",
        "base_url",
        "api_key",
        "groups",
        "models",
        "model_map",
        "priority",
        "weight",
        "responses",
        "timeouts",
        "status",
    }
)


def _at(where: str, name: str) -> str:
    """The name of a field inside ``where`` (``channels[2].base_url``); at the top level
    (``where`` empty, an admin API body) just the field's name."""
    return f"{where}.{name}" if where else name


def parse_model(v: Any, where: str = "") -> Model:
    """One ``models[]`` entry (the file's or an admin API body). Raises ConfigError naming
    the field under ``where``."""
    d = _mapping(v, where or "model")
    _no_unknown(d, MODEL_FIELDS, where)
    name = _name(d.get("name"), _at(where, "name"))
    caps = _str_list(d.get("capabilities", ["chat"]), _at(where, "capabilities"))
    for i, c in enumerate(caps):
        if c not in CAPABILITIES:
            raise ConfigError(f"{_at(where, 'capabilities')}[{i}]: unknown capability {c!r}")
    price_at = _at(where, "price")
    price_raw = _mapping(d.get("price") or {}, price_at)
    _no_unknown(price_raw, set(PRICE_FIELDS), price_at)
    price = Price(
        **{
            k: _price(v, f"{price_at}.{k}")
            for k, v in price_raw.items()
            if v is not None or k not in OPTIONAL_PRICES  # null: left unset
        }
    )
    dmt_at = _at(where, "default_max_tokens")
    dmt = _int(d.get("default_max_tokens", 4096), dmt_at, minimum=1)
    if dmt > MAX_DEFAULT_TOKENS:
        raise ConfigError(f"{dmt_at}: must be at most {MAX_DEFAULT_TOKENS}")
    return Model(name=name, capabilities=frozenset(caps), price=price, default_max_tokens=dmt)


def parse_channel(v: Any, where: str, groups: Collection[str], models: Collection[str]) -> Channel:
    """One ``channels[]`` entry (the file's or an admin API body), its groups and models
    among those given. Raises ConfigError naming the field under ``where``."""
    d = _mapping(v, where or "channel")
    _no_unknown(d, CHANNEL_FIELDS, where)
    name = _name(d.get("name"), _at(where, "name"))
    ctype = d.get("type")
    if ctype not in CHANNEL_TYPES:
        raise ConfigError(f"{_at(where, 'type')}: must be one of {', '.join(CHANNEL_TYPES)}")
    base_url = _str(d.get("base_url"), _at(where, "base_url"))
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{_at(where, 'base_url')}: not a URL")
    api_key = _str(d.get("api_key", ""), _at(where, "api_key"), allow_empty=True)
    groups_at = _at(where, "groups")
    ch_groups = _str_list(d.get("groups", ["default"]), groups_at)
    for i, g in enumerate(ch_groups):
        if g not in groups:
            raise ConfigError(f"{groups_at}[{i}]: unknown group {g!r}")
    models_at = _at(where, "models")
    ch_models = _str_list(d.get("models", []), models_at)
    if not ch_models:
        raise ConfigError(f"{models_at}: at least one model is needed")
    for i, m in enumerate(ch_models):
        if m not in models:
            raise ConfigError(f"{models_at}[{i}]: {m!r} is not in the models catalogue")
    map_at = _at(where, "model_map")
    mm = _mapping(d.get("model_map") or {}, map_at)
    model_map = {_str(k, map_at): _str(x, f"{map_at}.{k}") for k, x in mm.items()}
    priority = _int(d.get("priority", 0), _at(where, "priority"), minimum=-1_000_000)
    weight = _int(d.get("weight", 1), _at(where, "weight"), minimum=0)
    responses = d.get("responses", False)
    if not isinstance(responses, bool):
        raise ConfigError(f"{_at(where, 'responses')}: must be true or false")
    if responses and ctype != "openai":
        raise ConfigError(
            f"{_at(where, 'responses')}: only an openai channel serves the Responses API"
        )
    status = d.get("status", "enabled")
    if status not in CHANNEL_STATUSES:
        raise ConfigError(f"{_at(where, 'status')}: must be enabled or disabled")
    return Channel(
        name=name,
        type=ctype,
        base_url=base_url.rstrip("/"),
        api_key=api_key,
        groups=tuple(ch_groups),
        models=tuple(ch_models),
        model_map=model_map,
        priority=priority,
        weight=weight,
        speaks=frozenset({ctype, "responses"} if responses else {ctype}),
        timeouts=_timeouts(d.get("timeouts") or {}, _at(where, "timeouts")),
        status=status,
    )


def _timeouts(v: Any, where: str) -> ChannelTimeouts:
    d = _mapping(v, where)
    _no_unknown(d, set(ChannelTimeouts.__dataclass_fields__), where)
    values = {
        name: None if d.get(name) is None else _num(d[name], f"{where}.{name}", minimum=0.001)
        for name in ChannelTimeouts.__dataclass_fields__
    }
    return ChannelTimeouts(**values)


def _account(v: Any, where: str) -> AccountSeed:
    d = _mapping(v, where)
    _no_unknown(d, {"id", "balance"}, where)
    return AccountSeed(
        id=_name(d.get("id"), f"{where}.id"),
        balance=_num(d.get("balance", 0), f"{where}.balance", minimum=-1e15),
    )


def parse_time(v: Any, where: str) -> datetime | None:
    """RFC 3339 (YAML may already have turned it into a datetime); naive means UTC."""
    if v is None:
        return None
    if isinstance(v, datetime):
        dt = v
    elif isinstance(v, str):
        try:
            dt = datetime.fromisoformat(v.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ConfigError(f"{where}: not an RFC 3339 time") from None
    else:
        raise ConfigError(f"{where}: not an RFC 3339 time")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC)


def _key(v: Any, where: str, groups: set[str], accounts: set[str]) -> KeySeed:
    d = _mapping(v, where)
    _no_unknown(d, {"id", "key", "account", "group", "status", "expires_at", "name"}, where)
    key = _str(d.get("key"), f"{where}.key")
    if not key.startswith("sk-") or len(key) < 8:
        raise ConfigError(f"{where}.key: must start with 'sk-' and be at least 8 characters")
    account = _name(d.get("account"), f"{where}.account")
    if account not in accounts:
        raise ConfigError(f"{where}.account: unknown account {account!r}")
    group = _str(d.get("group", "default"), f"{where}.group")
    if group not in groups:
        raise ConfigError(f"{where}.group: unknown group {group!r}")
    status = d.get("status", "enabled")
    if status not in KEY_STATUSES:
        raise ConfigError(f"{where}.status: must be enabled or disabled")
    return KeySeed(
        id=_name(d.get("id"), f"{where}.id"),
        key=key,
        account=account,
        group=group,
        status=status,
        name=_str(d.get("name", ""), f"{where}.name", allow_empty=True),
        expires_at=parse_time(d.get("expires_at"), f"{where}.expires_at"),
    )


def _limits(v: Any) -> Limits:
    d = _mapping(v, "limits")
    _no_unknown(d, {"max_request_bytes", "max_upload_bytes", "hold_floor", "store_grace"}, "limits")
    out = Limits()
    return Limits(
        max_request_bytes=_int(
            d.get("max_request_bytes", out.max_request_bytes), "limits.max_request_bytes", minimum=1
        ),
        max_upload_bytes=_int(
            d.get("max_upload_bytes", out.max_upload_bytes), "limits.max_upload_bytes", minimum=1
        ),
        hold_floor=_num(d.get("hold_floor", out.hold_floor), "limits.hold_floor", minimum=0.0),
        store_grace=_num(d.get("store_grace", out.store_grace), "limits.store_grace", minimum=0.0),
    )


def _server(v: Any) -> ServerSettings:
    d = _mapping(v, "server")
    _no_unknown(d, set(ServerSettings.__dataclass_fields__), "server")
    base = ServerSettings()
    keep_alive = d.get("keep_alive_seconds", base.keep_alive_seconds)
    body = d.get("body_timeout_seconds", base.body_timeout_seconds)
    connections = d.get("max_connections", base.max_connections)
    graceful = d.get("graceful_seconds", base.graceful_seconds)
    header = d.get("header_timeout_seconds", base.header_timeout_seconds)
    return ServerSettings(
        keep_alive_seconds=_num(keep_alive, "server.keep_alive_seconds", minimum=1.0),
        body_timeout_seconds=_num(body, "server.body_timeout_seconds", minimum=0.0),
        max_connections=_int(connections, "server.max_connections", minimum=0),
        graceful_seconds=_num(graceful, "server.graceful_seconds", minimum=0.0),
        header_timeout_seconds=_num(header, "server.header_timeout_seconds", minimum=0.0),
    )


def _metrics(v: Any) -> MetricsSettings:
    d = _mapping(v, "metrics")
    _no_unknown(d, set(MetricsSettings.__dataclass_fields__), "metrics")
    enabled = d.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError("metrics.enabled: must be true or false")
    token = _str(d.get("token", ""), "metrics.token", allow_empty=True)
    return MetricsSettings(enabled=enabled, token=token)


def _logging(v: Any) -> LoggingSettings:
    d = _mapping(v, "logging")
    _no_unknown(d, set(LoggingSettings.__dataclass_fields__), "logging")
    base = LoggingSettings()
    level = d.get("level", base.level)
    if level not in LOG_LEVELS:
        raise ConfigError(f"logging.level: must be one of {', '.join(LOG_LEVELS)}")
    fmt = d.get("format", base.format)
    if fmt not in LOG_FORMATS:
        raise ConfigError(f"logging.format: must be one of {', '.join(LOG_FORMATS)}")
    access = d.get("access", base.access)
    if not isinstance(access, bool):
        raise ConfigError("logging.access: must be true or false")
    return LoggingSettings(level=level, format=fmt, access=access)


def _tracing(v: Any) -> TracingSettings:
    d = _mapping(v, "tracing")
    _no_unknown(d, set(TracingSettings.__dataclass_fields__), "tracing")
    base = TracingSettings()
    endpoint = _str(d.get("otlp_endpoint", ""), "tracing.otlp_endpoint", allow_empty=True)
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise ConfigError("tracing.otlp_endpoint: must be an http(s) URL")
    name = _str(d.get("service_name", base.service_name), "tracing.service_name")
    return TracingSettings(otlp_endpoint=endpoint, service_name=name)


def _upstream(v: Any) -> UpstreamSettings:
    d = _mapping(v, "upstream")
    base = UpstreamSettings()
    _no_unknown(d, set(UpstreamSettings.__dataclass_fields__), "upstream")
    return UpstreamSettings(
        connect_timeout=_num(
            d.get("connect_timeout", base.connect_timeout), "upstream.connect_timeout"
        ),
        read_timeout=_num(d.get("read_timeout", base.read_timeout), "upstream.read_timeout"),
        pool_size=_int(d.get("pool_size", base.pool_size), "upstream.pool_size"),
        pool_size_per_host=_int(
            d.get("pool_size_per_host", base.pool_size_per_host), "upstream.pool_size_per_host"
        ),
        retries=_int(d.get("retries", base.retries), "upstream.retries"),
        cooldown_seconds=_num(
            d.get("cooldown_seconds", base.cooldown_seconds), "upstream.cooldown_seconds"
        ),
        first_byte_timeout=None
        if d.get("first_byte_timeout") is None
        else _num(d["first_byte_timeout"], "upstream.first_byte_timeout", minimum=0.001),
        stream_keepalive_seconds=_num(
            d.get("stream_keepalive_seconds", base.stream_keepalive_seconds),
            "upstream.stream_keepalive_seconds",
            minimum=0.01,
        ),
    )
