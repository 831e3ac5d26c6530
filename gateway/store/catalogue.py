"""The catalogue in the store: groups, models and channels, one record per entry.

Both backends keep the same records (a JSON mapping per entry, named by kind and name) and
change them the same way: ``Store.edit_catalogue(edit)`` calls the pure function ``edit`` with
the records as they are and applies the ``CatalogueEdit`` it returns atomically (SQLite: in one
write transaction; Redis: one script on one hash, retried while another edit came first), then
bumps the store's ``version()`` so every cache reloads. ``edit`` may raise to change nothing.

A record is the entry's config-file shape (``channels[]``, ``models[]``: the same parser reads
both) plus ``origin`` (``file``: the configuration file's, applied again at every start;
``api``: made at run time) and ``seq`` (its place in lists: the file's order, then creation).
A file channel's upstream ``api_key`` is never stored: every process reads it from its own
file. One made through the API is stored as given (there is nowhere else to keep it) and
never shown again.

``view`` turns the records into what a process serves: its own file's entries always win
(they are its file's, whatever another process seeded), the rest come from the store.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from gateway.config import ConfigError, parse_channel, parse_model, parse_ratio, parse_tool
from gateway.config.clouds import DEFAULT_URL_TYPES, TYPE_FIELDS, default_base_url
from gateway.config.pricing import priced_models
from gateway.types import JSON

if TYPE_CHECKING:
    from gateway.config import Channel, Model, Settings

log = logging.getLogger("gateway.store.catalogue")

GROUP, MODEL, CHANNEL = "group", "model", "channel"
KINDS = (GROUP, MODEL, CHANNEL)
FILE, API = "file", "api"
META_FIELDS = ("origin", "seq")
API_SEQ_START = 1_000_000  # entries made at run time list after any file's
# a cloud channel's credentials: stored (as api_key is) only for channels made through the API
CREDENTIAL_FIELDS = (
    "aws_access_key_id", "aws_secret_access_key", "aws_session_token", "credentials",
)  # fmt: skip

Entry = tuple[str, str]  # (kind, name)


def model_json(model: Model) -> dict[str, JSON]:
    price = model.price
    return {
        "name": model.name,
        "capabilities": sorted(model.capabilities),
        "price": {
            "input": price.input,
            "output": price.output,
            "cache_read": price.cache_read,  # None: not set (``billing.cache_prices``)
            "cache_write": price.cache_write,
            "cache_write_1h": price.cache_write_1h,
            "request": price.request,
            "image": price.image,
            "audio_second": price.audio_second,
            "speech_char": price.speech_char,
        },
        "default_max_tokens": model.default_max_tokens,
        "aliases": list(model.aliases),
    }


def channel_json(ch: Channel) -> dict[str, JSON]:
    """A channel without its upstream api_key: the config file's fields and its status."""
    timeouts = {
        name: getattr(ch.timeouts, name)
        for name in ("connect", "first_byte", "idle", "total")
        if getattr(ch.timeouts, name) is not None
    }
    return {
        "name": ch.name,
        "type": ch.type,
        "base_url": ch.base_url,
        "groups": list(ch.groups),
        "models": list(ch.models),
        "model_map": dict(ch.model_map),
        "priority": ch.priority,
        "weight": ch.weight,
        "responses": "responses" in ch.speaks,
        "timeouts": timeouts,
        "status": ch.status,
        "prompt_cache": "auto" if ch.prompt_cache else "off",
        **cloud_json(ch),
    }


def cloud_json(ch: Channel) -> dict[str, JSON]:
    """A cloud channel's own fields but its credentials; a channel's ``max_tokens_field``."""
    out: dict[str, JSON] = {}
    for name in ("api_version", "region", "project"):
        if name in TYPE_FIELDS.get(ch.type, ()):
            out[name] = getattr(ch.cloud, name)
    if ch.max_tokens_field:
        out["max_tokens_field"] = ch.max_tokens_field
    return out


def channel_record(ch: Channel, origin: str, seq: int) -> dict[str, JSON]:
    """What the store keeps of a channel: its credentials only when made through the API; no
    ``base_url`` when it is the region's (a new region brings its own)."""
    out = channel_json(ch)
    if ch.type in DEFAULT_URL_TYPES and ch.base_url == default_base_url(ch.type, ch.cloud.region):
        del out["base_url"]
    if origin == API:
        if ch.api_keys:
            out["api_keys"] = list(ch.api_keys)
        else:
            out["api_key"] = ch.api_key
        for name in CREDENTIAL_FIELDS:
            if getattr(ch.cloud, name):
                out[name] = getattr(ch.cloud, name)
    return {**out, "origin": origin, "seq": seq}


def model_record(model: Model, origin: str, seq: int) -> dict[str, JSON]:
    """What the store keeps of a model: without a price when it had none (the price table's
    is found again at every view, so a newer table reprices it)."""
    out = model_json(model)
    if not model.priced:
        del out["price"]
    return {**out, "origin": origin, "seq": seq}


def group_record(
    name: str, origin: str, seq: int, ratio: float = 1.0, tool: str | None = None
) -> dict[str, JSON]:
    """A group's record: its price ratio and tool kind only when it has them (a record of a
    group without them is what earlier versions wrote)."""
    out: dict[str, JSON] = {"name": name, "origin": origin, "seq": seq}
    if ratio != 1.0:
        out["ratio"] = ratio
    if tool is not None:
        out["tool"] = tool
    return out


def entry_field(kind: str, name: str) -> str:
    """The entry's name in the store (a Redis hash field): ``channel:oa-1``."""
    return f"{kind}:{name}"


def body_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record without its store-only fields: what the config parser reads."""
    return {k: v for k, v in record.items() if k not in META_FIELDS}


@dataclass(slots=True)
class CatalogueRecords:
    """The catalogue as stored: kind -> name -> record."""

    entries: dict[str, dict[str, dict[str, Any]]] = field(
        default_factory=lambda: {kind: {} for kind in KINDS}
    )

    @classmethod
    def decode(cls, fields: Iterable[tuple[str, bytes | str]]) -> CatalogueRecords:
        """From (``kind:name``, JSON) pairs; pairs of other kinds are ignored, and so is a
        record that is not a JSON object named by a string (logged once)."""
        out = cls()
        for key, raw in fields:
            kind, _, name = key.partition(":")
            if kind in out.entries and name:
                try:
                    rec = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    rec = None
                if not isinstance(rec, dict) or not isinstance(rec.get("name"), str):
                    warn_once(kind, f"stored {kind} {name!r}: not a record")
                    continue
                out.entries[kind][name] = rec
        return out

    def of(self, kind: str) -> list[dict[str, Any]]:
        """The records of one kind in list order."""
        return sorted(self.entries[kind].values(), key=lambda r: (r.get("seq", 0), r["name"]))

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        return self.entries[kind].get(name)

    def next_seq(self, kind: str) -> int:
        seqs = [int(r.get("seq", 0)) for r in self.entries[kind].values()]
        return max([API_SEQ_START - 1, *seqs]) + 1


@dataclass(slots=True)
class CatalogueEdit:
    """Records to write (whole) and entries to delete, applied together."""

    put: dict[Entry, dict[str, JSON]] = field(default_factory=dict)
    delete: set[Entry] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.put or self.delete)

    def fields(self) -> tuple[list[tuple[str, bytes]], list[str]]:
        """(field, JSON) pairs to write and fields to delete, in the store's names."""
        put = [(entry_field(k, n), orjson.dumps(rec)) for (k, n), rec in sorted(self.put.items())]
        return put, sorted(entry_field(k, n) for k, n in self.delete)


Editor = Callable[[CatalogueRecords], CatalogueEdit]


def seed_edit(settings: Settings) -> Editor:
    """The file's groups, models and channels written as the file's (over anything of the same
    name), and the entries an earlier file gave that this one no longer names removed."""
    wanted: dict[Entry, dict[str, JSON]] = {}
    ratios, tools = settings.group_ratios, settings.group_tools
    for i, g in enumerate(settings.groups):
        wanted[(GROUP, g)] = group_record(g, FILE, i, ratios.get(g, 1.0), tools.get(g))
    for i, m in enumerate(settings.models):
        wanted[(MODEL, m.name)] = model_record(m, FILE, i)
    for i, ch in enumerate(settings.channels):
        wanted[(CHANNEL, ch.name)] = channel_record(ch, FILE, i)

    def edit(records: CatalogueRecords) -> CatalogueEdit:
        out = CatalogueEdit()
        for (kind, name), rec in wanted.items():
            if records.get(kind, name) != rec:
                out.put[(kind, name)] = rec
        for kind in KINDS:
            for name, rec in records.entries[kind].items():
                if rec.get("origin") == FILE and (kind, name) not in wanted:
                    out.delete.add((kind, name))
        return out

    return edit


@dataclass(frozen=True, slots=True)
class View:
    """The catalogue a process serves: its own file's entries, then the store's others, in
    list order; disabled channels included (routing leaves them out)."""

    groups: tuple[str, ...]
    models: tuple[Model, ...]
    channels: tuple[Channel, ...]
    file_entries: frozenset[Entry]  # the entries some configuration file owns
    group_ratios: Mapping[str, float] = field(default_factory=dict)  # 1 where left out
    group_tools: Mapping[str, str] = field(default_factory=dict)  # none where left out

    def origin(self, kind: str, name: str) -> str:
        return FILE if (kind, name) in self.file_entries else API

    def model_names(self) -> set[str]:
        return {m.name for m in self.models}

    def channel(self, name: str) -> Channel | None:
        return next((c for c in self.channels if c.name == name), None)

    def model(self, name: str) -> Model | None:
        return next((m for m in self.models if m.name == name), None)

    def ratio(self, group: str) -> float:
        return self.group_ratios.get(group, 1.0)

    def tool(self, group: str) -> str | None:
        return self.group_tools.get(group)


# the bad records this process has logged: every reload (and admin read) meets them again
_WARNED: set[tuple[str, str]] = set()
WARNED_MAX = 1000


def warn_once(kind: str, error: str) -> None:
    """Log a stored record left out, once per process for each record and error."""
    if (kind, error) in _WARNED:
        return
    if len(_WARNED) >= WARNED_MAX:
        _WARNED.clear()
    _WARNED.add((kind, error))
    log.warning("catalogue.bad_record kind=%s error=%s", kind, error)


def view(records: CatalogueRecords, settings: Settings) -> View:
    """What the records mean to a process with this configuration. A record that no longer
    parses (written by another version, or an older one's price past today's bound, or naming
    what is gone) is left out, logged once (``warn_once``): the rest is served."""
    own_groups = set(settings.groups)
    own_models = {m.name: m for m in settings.models}
    own_channels = {c.name: c for c in settings.channels}
    file_entries = {(GROUP, g) for g in own_groups}
    file_entries |= {(MODEL, n) for n in own_models} | {(CHANNEL, n) for n in own_channels}

    groups = list(settings.groups)
    ratios, tools = settings.group_ratios, settings.group_tools
    for rec in records.of(GROUP):
        name = rec["name"]
        if name not in own_groups:
            try:
                ratio = parse_ratio(rec.get("ratio", 1.0), f"stored group {name!r}.ratio")
                tool = parse_tool(rec.get("tool"), f"stored group {name!r}.tool")
            except ConfigError as exc:
                warn_once(GROUP, str(exc))
                continue
            groups.append(name)
            if ratio != 1.0:
                ratios[name] = ratio
            if tool is not None:
                tools[name] = tool
            if rec.get("origin") == FILE:
                file_entries.add((GROUP, name))

    models = list(settings.models)
    for rec in records.of(MODEL):
        if rec["name"] in own_models:
            continue
        try:
            models.append(parse_model(body_of(rec), f"stored model {rec['name']!r}"))
        except ConfigError as exc:
            warn_once(MODEL, str(exc))
            continue
        if rec.get("origin") == FILE:
            file_entries.add((MODEL, rec["name"]))

    group_set, model_set = set(groups), {m.name for m in models}
    channels = list(settings.channels)
    for rec in records.of(CHANNEL):
        if rec["name"] in own_channels:
            continue
        try:
            where = f"stored channel {rec['name']!r}"
            channels.append(parse_channel(body_of(rec), where, group_set, model_set))
        except ConfigError as exc:
            warn_once(CHANNEL, str(exc))
            continue
        if rec.get("origin") == FILE:
            file_entries.add((CHANNEL, rec["name"]))
    # priced again with every channel's model_map: a stored model without a price and without
    # a row in the price table is left out (a newer prices_file may have dropped its row)
    priced = priced_models(
        models,
        channels,
        settings.prices,
        lambda i, m: f"model {m.name!r}",
        lambda exc: warn_once(MODEL, str(exc)),
    )
    return View(tuple(groups), priced, tuple(channels), frozenset(file_entries), ratios, tools)
