"""Channels, models and groups as the operator manages them at run time: one set of service
functions behind both the admin API (``admin.py``) and the ``gateway`` command line (``cli/``).

Bodies are validated by the configuration file's own parsers (``config.parse_channel``,
``config.parse_model``), so an entry made here obeys the file's rules, and a mistake is a 400
naming the field. Every change is one ``Store.edit_catalogue``: the check (the name is free,
the groups and models named exist, nothing still uses what is deleted) and the write happen
together, against the catalogue as it is in the store. The configuration file's entries are
its own: changing or deleting one answers 409 (edit the file and restart instead).

A channel's upstream ``api_key`` (and a cloud channel's credentials) goes into the store as
given and never comes out of here: replies show ``api_key_hint`` (``aws_secret_access_key_hint``,
``credentials_hint``, ...) at most.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.config import (
    CHANNEL_FIELDS,
    GROUP_FIELDS,
    MODEL_FIELDS,
    NAME_RE,
    Channel,
    ConfigError,
    Model,
    Settings,
    parse_channel,
    parse_model,
    parse_ratio,
    parse_tool,
)
from gateway.config.pricing import priced_model
from gateway.errors import GatewayError, InvalidRequestError, NotFoundError
from gateway.kinds.wire import chat_target, wire_for
from gateway.operator.accounts import MAX_ID_LEN, AlreadyExistsError, only_fields
from gateway.policy.redaction import channel_secrets, redact
from gateway.protocols.base import UpstreamTarget
from gateway.store import Store
from gateway.store.catalogue import (
    API,
    CHANNEL,
    CREDENTIAL_FIELDS,
    FILE,
    GROUP,
    MODEL,
    CatalogueEdit,
    CatalogueRecords,
    View,
    body_of,
    channel_json,
    channel_record,
    group_record,
    model_json,
    model_record,
    view,
)
from gateway.types import JSON, ChatRequest
from gateway.upstream import UpstreamPool

CHANNEL_TEST_TIMEOUT = 30.0  # seconds a channel test waits for the upstream's whole reply
TEST_PROMPT = "ping"


class ConfigEntryError(GatewayError):
    """409: the entry is the configuration file's."""

    status = 409
    type = "conflict_error"
    code = "defined_in_config"


class InUseError(GatewayError):
    """409: something still uses what was to be deleted."""

    status = 409
    type = "conflict_error"
    code = "in_use"


# ---- JSON shapes ---------------------------------------------------------------------------


def secret_hint(secret: str) -> str:
    """Enough of an upstream credential to recognise it, never enough to use it."""
    if len(secret) >= 20:
        return f"{secret[:3]}…{secret[-4:]}"
    if len(secret) >= 12:
        return f"…{secret[-4:]}"
    return "…" if secret else ""


def channel_out(ch: Channel, v: View) -> dict[str, JSON]:
    out: dict[str, JSON] = {
        **channel_json(ch),
        "api_key_hint": secret_hint(ch.api_key),
        "origin": v.origin(CHANNEL, ch.name),
    }
    if ch.api_keys:  # several keys: a hint of each, never a key
        out["api_key_hints"] = [secret_hint(k) for k in ch.api_keys]
    for name in CREDENTIAL_FIELDS:  # a cloud channel's credentials: a hint of each
        value = getattr(ch.cloud, name)
        if value:
            out[f"{name}_hint"] = (
                credentials_hint(value) if name == "credentials" else (secret_hint(value))
            )
    return out


def credentials_hint(source: str) -> str:
    """A vertex channel's ``credentials``: the service account it names (a key file's JSON),
    or the file's path; never the key."""
    if not source.lstrip().startswith("{"):
        return source
    try:
        info = orjson.loads(source)
    except orjson.JSONDecodeError:
        return "…"
    email = info.get("client_email") if isinstance(info, dict) else None
    return f"service account {email}" if isinstance(email, str) else "…"


def model_out(m: Model, v: View) -> dict[str, JSON]:
    """A model as the admin API shows it: its price is the price table's when it was given
    none (``price_source``: ``table``, with the row's upstream name and date)."""
    out = {**model_json(m), "origin": v.origin(MODEL, m.name)}
    out["price_source"] = "config" if m.priced else "table"
    if m.table is not None:
        out["price_table"] = {"model": m.table.model, "date": m.table.date}
    return out


def group_out(name: str, v: View) -> dict[str, JSON]:
    return {
        "name": name,
        "ratio": v.ratio(name),
        "tool": v.tool(name),
        "origin": v.origin(GROUP, name),
    }


# ---- reading -------------------------------------------------------------------------------


async def load(store: Store, settings: Settings) -> View:
    """The catalogue as this process serves it: the file's entries, then the store's."""
    return view(await store.load_catalogue(), settings)


def _channel(v: View, name: str) -> Channel:
    ch = v.channel(name)
    if ch is None:
        raise NotFoundError(f"channel {name!r} not found")
    return ch


def _model(v: View, name: str) -> Model:
    m = v.model(name)
    if m is None:
        raise NotFoundError(f"model {name!r} not found")
    return m


# ---- changing ------------------------------------------------------------------------------


def _new_name(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidRequestError("name: must be a non-empty string")
    if len(value) > MAX_ID_LEN or not NAME_RE.match(value):
        raise InvalidRequestError(
            f"name: {value!r} is not a valid name (letters, digits and ._:/@-, "
            f"at most {MAX_ID_LEN} characters)"
        )
    return value


def _same_name(body: Mapping[str, object], name: str) -> None:
    if "name" in body and body["name"] != name:
        raise InvalidRequestError("name: cannot be changed (delete the entry and create another)")


def _not_the_files(v: View, kind: str, name: str) -> None:
    if v.origin(kind, name) == FILE:
        raise ConfigEntryError(
            f"{kind} {name!r} is defined in the configuration file; change it there"
        )


def _merged(record: Mapping[str, Any], body: Mapping[str, object]) -> dict[str, Any]:
    """A PATCH: each field given replaces the stored one; ``null`` restores the default."""
    out = body_of(record)
    for k, val in body.items():
        if val is None:
            out.pop(k, None)
        else:
            out[k] = val
    return out


def _parse_channel(body: Mapping[str, object], v: View) -> Channel:
    try:
        return parse_channel(dict(body), "", set(v.groups), v.model_names())
    except ConfigError as exc:
        raise InvalidRequestError(str(exc)) from None


def _parse_model(body: Mapping[str, object]) -> Model:
    try:
        return parse_model(dict(body))
    except ConfigError as exc:
        raise InvalidRequestError(str(exc)) from None


def _priced(model: Model, v: View, settings: Settings) -> Model:
    """The model with the price table applied (``config.pricing``): 400 when it has no price
    and the table none for it either."""
    try:
        return priced_model(model, v.channels, settings.prices, "")
    except ConfigError as exc:
        raise InvalidRequestError(str(exc)) from None


def _body(body: object) -> Mapping[str, object]:
    if not isinstance(body, Mapping):
        raise InvalidRequestError("request body: must be a JSON object")
    return body


async def create_channel(store: Store, settings: Settings, body: object) -> Channel:
    fields = _body(body)
    only_fields(fields, CHANNEL_FIELDS)
    name = _new_name(fields.get("name"))
    made: list[Channel] = []

    def edit(records: CatalogueRecords) -> CatalogueEdit:
        v = view(records, settings)
        if v.channel(name) is not None:
            raise AlreadyExistsError(f"channel {name!r} already exists")
        ch = _parse_channel(fields, v)
        made[:] = [ch]
        rec = channel_record(ch, API, records.next_seq(CHANNEL))
        return CatalogueEdit(put={(CHANNEL, name): rec})

    await store.edit_catalogue(edit)
    return made[0]


async def update_channel(store: Store, settings: Settings, name: str, body: object) -> Channel:
    fields = _body(body)
    only_fields(fields, CHANNEL_FIELDS)
    _same_name(fields, name)
    made: list[Channel] = []

    def edit(records: CatalogueRecords) -> CatalogueEdit:
        v = view(records, settings)
        _channel(v, name)
        _not_the_files(v, CHANNEL, name)
        record = records.get(CHANNEL, name)
        assert record is not None  # in the view and not the file's: the store's
        if "api_key" in fields or "api_keys" in fields:  # one replaces the other
            record = {k: x for k, x in record.items() if k not in ("api_key", "api_keys")}
        ch = _parse_channel(_merged(record, fields), v)
        made[:] = [ch]
        return CatalogueEdit(put={(CHANNEL, name): channel_record(ch, API, record["seq"])})

    await store.edit_catalogue(edit)
    return made[0]


async def delete_channel(store: Store, settings: Settings, name: str) -> None:
    def edit(records: CatalogueRecords) -> CatalogueEdit:
        v = view(records, settings)
        _channel(v, name)
        _not_the_files(v, CHANNEL, name)
        return CatalogueEdit(delete={(CHANNEL, name)})

    await store.edit_catalogue(edit)


async def create_model(store: Store, settings: Settings, body: object) -> Model:
    fields = _body(body)
    only_fields(fields, MODEL_FIELDS)
    name = _new_name(fields.get("name"))
    parsed = _parse_model(fields)
    made: list[Model] = []

    def edit(records: CatalogueRecords) -> CatalogueEdit:
        v = view(records, settings)
        if v.model(name) is not None:
            raise AlreadyExistsError(f"model {name!r} already exists")
        model = _priced(parsed, v, settings)
        made[:] = [model]
        rec = model_record(model, API, records.next_seq(MODEL))
        return CatalogueEdit(put={(MODEL, name): rec})

    await store.edit_catalogue(edit)
    return made[0]


async def update_model(store: Store, settings: Settings, name: str, body: object) -> Model:
    fields = _body(body)
    only_fields(fields, MODEL_FIELDS)
    _same_name(fields, name)
    made: list[Model] = []

    def edit(records: CatalogueRecords) -> CatalogueEdit:
        v = view(records, settings)
        _model(v, name)
        _not_the_files(v, MODEL, name)
        record = records.get(MODEL, name)
        assert record is not None
        model = _priced(_parse_model(_merged(record, fields)), v, settings)
        made[:] = [model]
        return CatalogueEdit(put={(MODEL, name): model_record(model, API, record["seq"])})

    await store.edit_catalogue(edit)
    return made[0]


async def delete_model(store: Store, settings: Settings, name: str) -> None:
    def edit(records: CatalogueRecords) -> CatalogueEdit:
        v = view(records, settings)
        _model(v, name)
        _not_the_files(v, MODEL, name)
        users = [c.name for c in v.channels if name in c.models]
        if users:
            raise InUseError(f"model {name!r} is served by channel(s) {', '.join(users)}")
        return CatalogueEdit(delete={(MODEL, name)})

    await store.edit_catalogue(edit)


def _group_fields(fields: Mapping[str, object], was: Mapping[str, Any]) -> tuple[float, str | None]:
    """A group's ``ratio`` and ``tool`` by the file's rules: a field left out keeps what
    ``was`` (the stored record; none: 1 and no tool), null clears it."""
    try:
        ratio = fields.get("ratio", was.get("ratio"))
        tool = fields.get("tool", was.get("tool"))
        return (1.0 if ratio is None else parse_ratio(ratio, "ratio")), parse_tool(tool, "tool")
    except ConfigError as exc:
        raise InvalidRequestError(str(exc)) from None


async def create_group(store: Store, settings: Settings, body: object) -> str:
    fields = _body(body)
    only_fields(fields, GROUP_FIELDS)
    name = _new_name(fields.get("name"))
    ratio, tool = _group_fields(fields, {})

    def edit(records: CatalogueRecords) -> CatalogueEdit:
        if name in view(records, settings).groups:
            raise AlreadyExistsError(f"group {name!r} already exists")
        rec = group_record(name, API, records.next_seq(GROUP), ratio, tool)
        return CatalogueEdit(put={(GROUP, name): rec})

    await store.edit_catalogue(edit)
    return name


async def update_group(store: Store, settings: Settings, name: str, body: object) -> None:
    """A group made through the API gets a new ``ratio`` or ``tool`` (left out: kept; null:
    1, none); the file's answer 409."""
    fields = _body(body)
    only_fields(fields, GROUP_FIELDS)
    _same_name(fields, name)
    _group_fields(fields, {})  # a bad value is a 400 before the store is asked

    def edit(records: CatalogueRecords) -> CatalogueEdit:
        v = view(records, settings)
        if name not in v.groups:
            raise NotFoundError(f"group {name!r} not found")
        _not_the_files(v, GROUP, name)
        rec = records.get(GROUP, name) or {}
        ratio, tool = _group_fields(fields, rec)
        seq = int(rec.get("seq", 0)) if rec else records.next_seq(GROUP)
        return CatalogueEdit(put={(GROUP, name): group_record(name, API, seq, ratio, tool)})

    await store.edit_catalogue(edit)


async def delete_group(store: Store, settings: Settings, name: str) -> None:
    """409 while a key or a channel is in the group. (A key made in it at the same moment
    can slip past the check: keys live apart from the catalogue.)"""
    keys = [k.id for k in await store.list_keys() if k.group == name]

    def edit(records: CatalogueRecords) -> CatalogueEdit:
        v = view(records, settings)
        if name not in v.groups:
            raise NotFoundError(f"group {name!r} not found")
        _not_the_files(v, GROUP, name)
        users = [f"channel {c.name}" for c in v.channels if name in c.groups]
        users += [f"key {k}" for k in keys]
        if users:
            shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
            raise InUseError(f"group {name!r} is still used by {shown}")
        return CatalogueEdit(delete={(GROUP, name)})

    await store.edit_catalogue(edit)


# ---- channel test --------------------------------------------------------------------------


async def try_channel(
    store: Store, settings: Settings, upstream: UpstreamPool, name: str
) -> dict[str, JSON]:
    """One one-token chat to the channel's first chat model, through the process's upstream
    pool and the channel type's adapter: ``{ok, status, latency_ms, error?}``. Not billed and
    not recorded; the channel's health is left alone."""
    v = await load(store, settings)
    ch = _channel(v, name)
    model = next(
        (m for m in (v.model(n) for n in ch.models) if m is not None and "chat" in m.capabilities),
        None,
    )
    if model is None:
        return {"ok": False, "status": None, "latency_ms": 0,
                "error": "the channel serves no chat model to test with"}  # fmt: skip
    req: ChatRequest = {
        "model": model.name,
        "messages": [{"role": "user", "content": TEST_PROMPT}],
        "max_tokens": 1,
        "stream": False,
    }
    target = UpstreamTarget(
        channel=ch.name,
        base_url=ch.base_url,
        api_key=ch.api_key,
        model=ch.upstream_model(model.name),
        default_max_tokens=1,
        stream=False,
    )
    wire = wire_for(ch, chat_target(ch, target))  # the wire of the channel type and model
    started = time.monotonic()
    status: int | None = None
    error: str | None = None
    try:
        call = wire.upstream.encode_request(req, target)
        async with asyncio.timeout(CHANNEL_TEST_TIMEOUT):
            resp = await upstream.request(call, None, ch.timeouts, ch)
            try:
                raw = await resp.read()
            finally:
                resp.close()
        status = resp.status
        if status >= 400:
            error = wire.errors(status, raw, resp.headers).message
    except GatewayError as err:
        error = err.message
    except TimeoutError:
        error = f"no reply within {CHANNEL_TEST_TIMEOUT:g} s"
    out: dict[str, JSON] = {
        "ok": error is None,
        "status": status,
        "latency_ms": round((time.monotonic() - started) * 1000),
    }
    if error is not None:
        out["error"] = redact(error, channel_secrets(ch))
    return out
