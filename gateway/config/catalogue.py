"""The catalogue's configuration: groups (a name, and a price ratio), models (capabilities,
prices, aliases) and channels (type, base URL, keys, groups, models, routing weights,
timeouts; the cloud types' own fields are ``config.clouds``'s).

A model's ``aliases`` are more names clients may send for it: exact names (a client's
built-in default, ``claude-sonnet-4-5``) and ``*`` patterns (``claude-*``). A catalogue name
always means its own model; an exact alias the model that names it, a name that only patterns
match the model of the most specific one; either among the models the key's group can reach
(``policy.routing.Catalogue.resolve``).

An openai-type channel sends a request's output limit as ``max_tokens``, or as
``max_completion_tokens`` to the models that take only that (OpenAI's reasoning models):
``max_tokens_field`` says which for every model of the channel; left out, the upstream model's
name decides, by the prefixes in ``COMPLETION_TOKENS_MODELS``."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from gateway.config.clouds import (
    CLOUD_FIELDS,
    CLOUD_TYPES,
    DEFAULT_URL_TYPES,
    NO_CLOUD,
    CloudAccess,
    default_base_url,
    parse_cloud,
)
from gateway.config.values import (
    ConfigError,
    at,
    credential,
    integer,
    mapping,
    name_of,
    no_unknown,
    number,
    string,
    strings,
)
from gateway.policy.prices import TablePrice

CHANNEL_TYPES = ("openai", "anthropic", "gemini", *CLOUD_TYPES)
# the client protocols whose bodies a channel type may take unconverted (a cloud type's own
# models decide among them: a bedrock channel passes the messages protocol through to Claude
# only, a vertex channel the messages protocol to Claude and generate-content to Gemini)
NATIVE: dict[str, frozenset[str]] = {
    "openai": frozenset({"openai"}),
    "anthropic": frozenset({"anthropic"}),
    "gemini": frozenset({"gemini"}),
    "azure": frozenset({"openai"}),
    "bedrock": frozenset({"anthropic"}),
    "vertex": frozenset({"anthropic", "gemini"}),
}
# the types that speak chat completions upstream (the Responses API too, with responses: true)
OPENAI_TYPES = frozenset({"openai", "azure"})
MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens")
# upstream model names (their beginnings) that take ``max_completion_tokens`` only: OpenAI's
# reasoning models. Data, not a rule of the adapters: a channel's ``max_tokens_field`` wins
COMPLETION_TOKENS_MODELS = ("o1", "o3", "o4", "gpt-5")
MAX_ALIASES = 100  # per model
ALIAS_RE = re.compile(r"^[A-Za-z0-9*][A-Za-z0-9._:/@*-]*$")  # a name, with * anywhere
CAPABILITIES = frozenset({"chat", "vision", "tools", "embeddings", "images", "audio", "rerank"})
PRICE_FIELDS = (
    "input", "output", "cache_read", "cache_write", "cache_write_1h", "request", "image",
    "audio_second", "speech_char",
)  # fmt: skip
# the prices that may be left unset (None): ``billing.cache_prices`` says what stands in for them
OPTIONAL_PRICES = frozenset({"cache_read", "cache_write", "cache_write_1h"})
# the highest price of any kind (balance units per million tokens, per call, ...): far above
# any real one, low enough that no request's cost overflows the stores' 64-bit micro-units
# (``billing.MAX_COST``)
MAX_PRICE = 1_000_000
# the most ``default_max_tokens`` may be (``billing.MAX_TOKENS``: no request uses more)
MAX_DEFAULT_TOKENS = 2**31 - 1
CHANNEL_STATUSES = ("enabled", "disabled")  # a disabled channel is never chosen
# a group's price ratio (CONTRACT §2: every cost of a request made with a key of the group is
# multiplied by it): above 0, so that a request with a price is never free, and at most
# MAX_RATIO, far above any real one (``billing.MAX_COST`` is at ratio 1)
MIN_RATIO = 0.001
MAX_RATIO = 100.0
GROUP_FIELDS = frozenset({"name", "ratio", "tool"})
# the kind of client a group's keys are made for (CONTRACT §2, an extension): the console shows
# a new key of the group the set-up of that tool first; left out, the SDKs'
TOOLS = ("claude-code", "codex", "gemini-cli", "sdk")


def parse_ratio(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not MIN_RATIO <= v <= MAX_RATIO:
        raise ConfigError(f"{where}: must be a number from {MIN_RATIO} to {MAX_RATIO:g}")
    return float(v)


def parse_tool(v: Any, where: str) -> str | None:
    """A group's ``tool``: one of ``TOOLS``, or none (null or left out)."""
    if v is None:
        return None
    if v not in TOOLS:
        raise ConfigError(f"{where}: must be one of {', '.join(TOOLS)}")
    return str(v)


def parse_group(v: Any, where: str) -> tuple[str, float, str | None]:
    """A ``groups[]`` entry: a name, or ``{name, ratio, tool}`` (ratio 1 when left out; tool
    none)."""
    if isinstance(v, str):
        return string(v, where), 1.0, None
    d = mapping(v, where)
    no_unknown(d, GROUP_FIELDS, where)
    name = string(d.get("name"), at(where, "name"))
    ratio = parse_ratio(d.get("ratio", 1.0), at(where, "ratio"))
    return name, ratio, parse_tool(d.get("tool"), at(where, "tool"))


@dataclass(frozen=True, slots=True)
class Price:
    """Balance units per million tokens (input, output; prompt tokens read from and written to
    the provider's prompt cache, and written to it for an hour: Anthropic's ``ttl: "1h"``), per
    call, per image, per second of audio transcribed, per million characters spoken. A cache
    price left out is None: ``billing.cache_prices`` is the one place that decides what stands
    in for it."""

    input: float = 0.0
    output: float = 0.0
    cache_read: float | None = None
    cache_write: float | None = None
    cache_write_1h: float | None = None
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
    # False: no ``price`` was given, and ``price`` is the price table's (``config.pricing``)
    priced: bool = True
    # the price table's row for the model's upstream name, when it has one: its prices when
    # the model has none, its cache ratios when the model leaves them unset
    table: TablePrice | None = None
    aliases: tuple[str, ...] = ()  # more names clients may send: exact, or * patterns


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
    # ``api_keys``: several upstream credentials, one chosen per request
    # (``policy/upstream_keys.py``); ``api_key`` is the one a request uses (the first, unless
    # the relay chose another); empty for a channel of one key
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    # ``prompt_cache: auto``: cache breakpoints added to requests converted to the messages
    # protocol that carry none (default on for anthropic channels and Claude on bedrock and
    # vertex; ``off`` to leave them out)
    prompt_cache: bool = False
    cloud: CloudAccess = NO_CLOUD  # azure, bedrock, vertex: their own fields
    # openai-type channels: the output limit's field, "" for the upstream model's name to say
    max_tokens_field: str = ""

    def __post_init__(self) -> None:
        if not self.speaks:
            object.__setattr__(self, "speaks", NATIVE.get(self.type, frozenset({self.type})))

    def upstream_model(self, model: str) -> str:
        return self.model_map.get(model, model)

    def output_limit_field(self, upstream_model: str) -> str:
        """Where this channel's requests to ``upstream_model`` carry their output limit."""
        if self.max_tokens_field:
            return self.max_tokens_field
        if upstream_model.startswith(COMPLETION_TOKENS_MODELS):
            return "max_completion_tokens"
        return "max_tokens"

    def __hash__(self) -> int:
        return hash(self.name)


def price_value(v: Any, where: str) -> float:
    """A price: a finite number from 0 to ``MAX_PRICE``, the one rule for the file and the
    admin API."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= MAX_PRICE:
        raise ConfigError(f"{where}: must be a number from 0 to {MAX_PRICE}")
    return float(v)


MODEL_FIELDS = frozenset({"name", "capabilities", "price", "default_max_tokens", "aliases"})
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
        "api_keys",
        "prompt_cache",
        "max_tokens_field",
        *CLOUD_FIELDS,
    }
)
PROMPT_CACHE_VALUES = ("auto", "off")
# the channel types whose requests carry cache breakpoints: those that speak the messages
# protocol (bedrock to Claude through invoke, vertex to Claude through rawPredict; the flag
# changes nothing for their other models, whose encoders take no marks)
PROMPT_CACHE_TYPES = frozenset({"anthropic", "bedrock", "vertex"})


def parse_model(v: Any, where: str = "") -> Model:
    """One ``models[]`` entry (the file's or an admin API body). Raises ConfigError naming
    the field under ``where``."""
    d = mapping(v, where or "model")
    no_unknown(d, MODEL_FIELDS, where)
    name = name_of(d.get("name"), at(where, "name"))
    caps = strings(d.get("capabilities", ["chat"]), at(where, "capabilities"))
    for i, c in enumerate(caps):
        if c not in CAPABILITIES:
            raise ConfigError(f"{at(where, 'capabilities')}[{i}]: unknown capability {c!r}")
    price_at = at(where, "price")
    priced = d.get("price") is not None  # absent or null: the price table's (config.pricing)
    price_raw = mapping(d.get("price") or {}, price_at)
    no_unknown(price_raw, set(PRICE_FIELDS), price_at)
    price = Price(
        **{
            k: price_value(v, f"{price_at}.{k}")
            for k, v in price_raw.items()
            if v is not None or k not in OPTIONAL_PRICES  # null: left unset
        }
    )
    dmt_at = at(where, "default_max_tokens")
    dmt = integer(d.get("default_max_tokens", 4096), dmt_at, minimum=1)
    if dmt > MAX_DEFAULT_TOKENS:
        raise ConfigError(f"{dmt_at}: must be at most {MAX_DEFAULT_TOKENS}")
    return Model(
        name=name,
        capabilities=frozenset(caps),
        price=price,
        default_max_tokens=dmt,
        priced=priced,
        aliases=parse_aliases(d.get("aliases"), name, at(where, "aliases")),
    )


def parse_aliases(v: Any, name: str, where: str) -> tuple[str, ...]:
    """A model's ``aliases``: names (``*`` matching any run of characters), none its own."""
    if v is None:
        return ()
    aliases = strings(v, where)
    if len(aliases) > MAX_ALIASES:
        raise ConfigError(f"{where}: at most {MAX_ALIASES} aliases")
    for i, alias in enumerate(aliases):
        if not ALIAS_RE.match(alias):
            raise ConfigError(f"{where}[{i}]: {alias!r} is not a valid name or pattern")
        if alias == name:
            raise ConfigError(f"{where}[{i}]: {alias!r} is the model's own name")
    if len(set(aliases)) != len(aliases):
        raise ConfigError(f"{where}: an alias is listed twice")
    return tuple(aliases)


def parse_channel(v: Any, where: str, groups: Collection[str], models: Collection[str]) -> Channel:
    """One ``channels[]`` entry (the file's or an admin API body), its groups and models
    among those given. Raises ConfigError naming the field under ``where``."""
    d = mapping(v, where or "channel")
    no_unknown(d, CHANNEL_FIELDS, where)
    name = name_of(d.get("name"), at(where, "name"))
    ctype = d.get("type")
    if ctype not in CHANNEL_TYPES:
        raise ConfigError(f"{at(where, 'type')}: must be one of {', '.join(CHANNEL_TYPES)}")
    cloud = parse_cloud(d, ctype, where)
    base_url = parse_base_url(d.get("base_url"), ctype, cloud, where)
    api_key, api_keys = parse_keys(d, where)
    groups_at = at(where, "groups")
    ch_groups = strings(d.get("groups", ["default"]), groups_at)
    for i, g in enumerate(ch_groups):
        if g not in groups:
            raise ConfigError(f"{groups_at}[{i}]: unknown group {g!r}")
    models_at = at(where, "models")
    ch_models = strings(d.get("models", []), models_at)
    if not ch_models:
        raise ConfigError(f"{models_at}: at least one model is needed")
    for i, m in enumerate(ch_models):
        if m not in models:
            raise ConfigError(f"{models_at}[{i}]: {m!r} is not in the models catalogue")
    map_at = at(where, "model_map")
    mm = mapping(d.get("model_map") or {}, map_at)
    model_map = {string(k, map_at): string(x, f"{map_at}.{k}") for k, x in mm.items()}
    priority = integer(d.get("priority", 0), at(where, "priority"), minimum=-1_000_000)
    weight = integer(d.get("weight", 1), at(where, "weight"), minimum=0)
    responses = d.get("responses", False)
    if not isinstance(responses, bool):
        raise ConfigError(f"{at(where, 'responses')}: must be true or false")
    if responses and ctype not in OPENAI_TYPES:
        raise ConfigError(
            f"{at(where, 'responses')}: only an openai or azure channel serves the Responses API"
        )
    status = d.get("status", "enabled")
    if status not in CHANNEL_STATUSES:
        raise ConfigError(f"{at(where, 'status')}: must be enabled or disabled")
    return Channel(
        name=name,
        type=ctype,
        base_url=base_url,
        api_key=api_key,
        groups=tuple(ch_groups),
        models=tuple(ch_models),
        model_map=model_map,
        priority=priority,
        weight=weight,
        speaks=NATIVE[ctype] | {"responses"} if responses else NATIVE[ctype],
        timeouts=parse_timeouts(d.get("timeouts") or {}, at(where, "timeouts")),
        status=status,
        api_keys=api_keys,
        prompt_cache=parse_prompt_cache(d.get("prompt_cache"), ctype, where),
        cloud=cloud,
        max_tokens_field=parse_max_tokens_field(d.get("max_tokens_field"), ctype, where),
    )


def parse_base_url(v: Any, ctype: str, cloud: CloudAccess, where: str) -> str:
    """``base_url``: an http(s) URL, without its trailing ``/``; for a type in
    ``DEFAULT_URL_TYPES`` left out, the region's."""
    if v is None and ctype in DEFAULT_URL_TYPES:
        return default_base_url(ctype, cloud.region)
    base_url = string(v, at(where, "base_url"))
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{at(where, 'base_url')}: not a URL")
    return base_url.rstrip("/")


def parse_max_tokens_field(v: Any, ctype: str, where: str) -> str:
    if v is None:
        return ""
    field_at = at(where, "max_tokens_field")
    if v not in MAX_TOKENS_FIELDS:
        raise ConfigError(f"{field_at}: must be {' or '.join(MAX_TOKENS_FIELDS)}")
    if ctype not in OPENAI_TYPES:
        raise ConfigError(f"{field_at}: only openai and azure channels take it")
    return str(v)


def parse_keys(d: dict[str, Any], where: str) -> tuple[str, tuple[str, ...]]:
    """``api_key`` (one credential) or ``api_keys`` (several, each used for a share of the
    requests), not both: (the first key, every key when there are several)."""
    keys_at = at(where, "api_keys")
    if d.get("api_keys") is None:
        return credential(d.get("api_key", ""), at(where, "api_key"), allow_empty=True), ()
    if d.get("api_key"):
        raise ConfigError(f"{keys_at}: give api_key or api_keys, not both")
    keys = strings(d["api_keys"], keys_at, credential)
    if not keys:
        raise ConfigError(f"{keys_at}: at least one key is needed")
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{keys_at}: a key is listed twice")  # never echo a credential
    return keys[0], tuple(keys) if len(keys) > 1 else ()


def parse_prompt_cache(v: Any, ctype: str, where: str) -> bool:
    """``prompt_cache``: ``auto`` (the default for the types in ``PROMPT_CACHE_TYPES``) or
    ``off``."""
    if v is None:
        return ctype in PROMPT_CACHE_TYPES
    if v not in PROMPT_CACHE_VALUES:
        raise ConfigError(f"{at(where, 'prompt_cache')}: must be auto or off")
    if v == "auto" and ctype not in PROMPT_CACHE_TYPES:
        kinds = ", ".join(sorted(PROMPT_CACHE_TYPES))
        raise ConfigError(f"{at(where, 'prompt_cache')}: only {kinds} channels take breakpoints")
    return bool(v == "auto")


def parse_timeouts(v: Any, where: str) -> ChannelTimeouts:
    d = mapping(v, where)
    no_unknown(d, set(ChannelTimeouts.__dataclass_fields__), where)
    values = {
        name: None if d.get(name) is None else number(d[name], f"{where}.{name}", minimum=0.001)
        for name in ChannelTimeouts.__dataclass_fields__
    }
    return ChannelTimeouts(**values)
