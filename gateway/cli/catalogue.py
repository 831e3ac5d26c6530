"""``gateway channels``, ``gateway models`` and ``gateway groups``: the catalogue's entries, edited
through the same service functions as the admin API (``operator/catalogue.py``).

Channels and models have the same four commands (list, add, update, delete), so each is one
``Resource`` row: how the command reads and writes it and how it is shown; ``_register_resource``
makes the commands of a row. A group has a name and a price ratio: its list, add and update
are its own, its delete is the rows' one. A channel's upstream api_key is never printed (a
hint at most).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from gateway.cli.arguments import Parents, Subcommands, amount, comma_separated, positive_int
from gateway.cli.output import Command, Output, table
from gateway.config import CHANNEL_STATUSES, CHANNEL_TYPES, PRICE_FIELDS, TOOLS, Settings
from gateway.errors import InvalidRequestError
from gateway.operator import catalogue
from gateway.store import Store
from gateway.store.catalogue import View, model_json
from gateway.types import JSON


class Named(Protocol):
    @property
    def name(self) -> str: ...


Entry = TypeVar("Entry", bound=Named)


@dataclass(frozen=True, slots=True)
class Resource(Generic[Entry]):
    """One kind of catalogue entry, as its commands read, write and show it."""

    noun: str  # "channel"; its commands are `gateway channels ...`
    help: str  # the command group's help line
    helps: Mapping[str, str]  # each action's
    entries: Callable[[View], Sequence[Entry]]
    out: Callable[[Entry, View], dict[str, JSON]]  # the admin API's object
    table: Callable[[View, Sequence[str] | None], str]  # all entries, or the named ones
    arguments: Callable[[argparse.ArgumentParser, bool], None]  # add's (True) or update's flags
    fields: Callable[[argparse.Namespace], dict[str, object]]  # add's body, but the name
    # update's body: the flags given (a model's price flags merged into its current price)
    changes: Callable[[argparse.Namespace, Settings, Store], Awaitable[dict[str, object]]]
    create: Callable[[Store, Settings, object], Awaitable[Entry]]
    update: Callable[[Store, Settings, str, object], Awaitable[Entry]]
    delete: Callable[[Store, Settings, str], Awaitable[None]]

    async def run_list(self, args: argparse.Namespace, settings: Settings, store: Store) -> Output:
        v = await catalogue.load(store, settings)
        entries = self.entries(v)
        text = self.table(v, None) if entries else f"no {self.noun}s"
        return Output({"data": [self.out(e, v) for e in entries]}, text)

    async def run_add(self, args: argparse.Namespace, settings: Settings, store: Store) -> Output:
        body = {"name": args.name, **self.fields(args)}
        return await self._shown(await self.create(store, settings, body), settings, store)

    async def run_update(
        self, args: argparse.Namespace, settings: Settings, store: Store
    ) -> Output:
        body = await self.changes(args, settings, store)
        if not body:
            raise InvalidRequestError("nothing to change: give at least one field flag")
        entry = await self.update(store, settings, args.name, body)
        return await self._shown(entry, settings, store)

    async def _shown(self, entry: Entry, settings: Settings, store: Store) -> Output:
        v = await catalogue.load(store, settings)
        return Output(self.out(entry, v), self.table(v, [entry.name]))


def _deleting(noun: str, delete: Callable[[Store, Settings, str], Awaitable[None]]) -> Command:
    async def run(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
        await delete(store, settings, args.name)
        return Output({"name": args.name, "deleted": True}, f"deleted {noun} {args.name}")

    return run


def _register_resource(sub: Subcommands, parents: Parents, r: Resource[Entry]) -> Subcommands:
    """`gateway <noun>s list|add|update|delete`; the group's subcommands, for any more."""
    group = sub.add_parser(f"{r.noun}s", help=r.help)
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser("list", parents=parents, help=r.helps["list"])
    p.set_defaults(func=r.run_list)
    for action, func in (("add", r.run_add), ("update", r.run_update)):
        p = actions.add_parser(action, parents=parents, help=r.helps[action])
        p.add_argument("name")
        r.arguments(p, action == "add")
        p.set_defaults(func=func)
    p = actions.add_parser("delete", parents=parents, help=r.helps["delete"])
    p.add_argument("name")
    p.set_defaults(func=_deleting(r.noun, r.delete))
    return actions


# ---- channels ------------------------------------------------------------------------------


def channels_table(v: View, names: Sequence[str] | None = None) -> str:
    headers = ["NAME", "TYPE", "STATUS", "PRIORITY", "WEIGHT", "GROUPS", "MODELS", "BASE_URL",
               "KEY", "ORIGIN"]  # fmt: skip
    rows = []
    for ch in v.channels:
        if names is not None and ch.name not in names:
            continue
        shown = catalogue.channel_out(ch, v)
        rows.append([ch.name, ch.type, ch.status, str(ch.priority), str(ch.weight),
                     ",".join(ch.groups), ",".join(ch.models), ch.base_url,
                     str(shown["api_key_hint"]) or "-", str(shown["origin"])])  # fmt: skip
    return table(headers, rows, right=[3, 4])


# the cloud types' fields (docs/channels.md), given as they are
CLOUD_FLAGS = {
    "api_version": "azure: the API version (2024-10-21, or v1)",
    "region": "bedrock, vertex: the region",
    "project": "vertex: the Google Cloud project",
    "credentials": "vertex: a service account's key file (its path)",
    "aws_access_key_id": "bedrock: the access key (none: the environment's AWS chain)",
    "max_tokens_field": "openai, azure: max_tokens or max_completion_tokens",
}
SECRET_FLAGS = ("aws_secret_access_key", "aws_session_token")


def channel_body(args: argparse.Namespace) -> dict[str, object]:
    """The admin API body the flags given make (a flag not given: not in the body)."""
    body: dict[str, object] = {}
    if args.api_key_env is not None:
        if args.api_key_env not in os.environ:
            raise InvalidRequestError(f"--api-key-env: ${args.api_key_env} is not set")
        body["api_key"] = os.environ[args.api_key_env]
    elif args.api_key is not None:
        body["api_key"] = args.api_key
    for name in ("type", "base_url", "priority", "weight", "status", "responses", *CLOUD_FLAGS):
        value = getattr(args, name)
        if value is not None:
            body[name] = value
    for name in SECRET_FLAGS:  # secrets from the environment, never from the command line
        variable = getattr(args, f"{name}_env")
        if variable is not None:
            if variable not in os.environ:
                raise InvalidRequestError(f"--{flag(name)}-env: ${variable} is not set")
            body[name] = os.environ[variable]
    if args.groups is not None:
        body["groups"] = comma_separated(args.groups)
    if args.models is not None:
        body["models"] = comma_separated(args.models)
    if args.map is not None:
        mapping: dict[str, str] = {}
        for item in args.map:
            model, sep, upstream = item.partition("=")
            if not sep or not model or not upstream:
                raise InvalidRequestError(f"--map: {item!r} is not MODEL=UPSTREAM_NAME")
            mapping[model] = upstream
        body["model_map"] = mapping
    return body


async def _channel_changes(
    args: argparse.Namespace, settings: Settings, store: Store
) -> dict[str, object]:
    return channel_body(args)


def flag(name: str) -> str:
    return name.replace("_", "-")


def _channel_arguments(p: argparse.ArgumentParser, adding: bool) -> None:
    p.add_argument("--type", choices=CHANNEL_TYPES, required=adding, default=None)
    p.add_argument("--base-url", default=None, help="bedrock and vertex: the region's if none")
    key = p.add_mutually_exclusive_group()
    key.add_argument("--api-key", default=None, help="the upstream's credential")
    key.add_argument("--api-key-env", default=None, metavar="NAME",
                     help="read the credential from this environment variable")  # fmt: skip
    p.add_argument("--groups", default=None, metavar="G1,G2")
    p.add_argument("--models", required=adding, default=None, metavar="M1,M2")
    p.add_argument("--map", action="append", default=None, metavar="MODEL=UPSTREAM",
                   help="rename a model on the way out (repeatable)")  # fmt: skip
    p.add_argument("--priority", type=int, default=None, help="lower is tried first")
    p.add_argument("--weight", type=int, default=None)
    p.add_argument("--responses", action=argparse.BooleanOptionalAction, default=None,
                   help="an openai upstream that serves /responses itself")  # fmt: skip
    p.add_argument("--status", choices=CHANNEL_STATUSES, default=None)
    for name, text in CLOUD_FLAGS.items():
        p.add_argument(f"--{flag(name)}", default=None, help=text)
    for name in SECRET_FLAGS:
        p.add_argument(f"--{flag(name)}-env", default=None, metavar="NAME",
                       help=f"read {name} from this environment variable")  # fmt: skip


async def cmd_channels_test(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    from gateway.upstream.auth import ChannelAuths
    from gateway.upstream.pool import Upstream

    upstream = ChannelAuths(Upstream(settings.upstream))  # the clouds' credentials added
    await upstream.start()
    try:
        result = await catalogue.try_channel(store, settings, upstream, args.name)
    finally:
        await upstream.stop()
    text = f"{'ok' if result['ok'] else 'FAILED'}  status={result['status'] or '-'}  " + (
        f"latency_ms={result['latency_ms']}"
    )
    if "error" in result:
        text += f"\n{result['error']}"
    return Output(result, text, 0 if result["ok"] else 1)


CHANNELS = Resource(
    noun="channel",
    help="list, add, update, delete and test channels",
    helps={
        "list": "list channels (never their api_key)",
        "add": "add a channel",
        "update": "change a channel's fields",
        "delete": "delete a channel",
    },
    entries=lambda v: v.channels,
    out=catalogue.channel_out,
    table=channels_table,
    arguments=_channel_arguments,
    fields=channel_body,
    changes=_channel_changes,
    create=catalogue.create_channel,
    update=catalogue.update_channel,
    delete=catalogue.delete_channel,
)


# ---- models --------------------------------------------------------------------------------


def models_table(v: View, names: Sequence[str] | None = None) -> str:
    headers = ["NAME", "CAPABILITIES", "INPUT", "OUTPUT", "REQUEST", "MAX_TOKENS", "ORIGIN"]
    rows = [
        [m.name, ",".join(sorted(m.capabilities)), f"{m.price.input:g}", f"{m.price.output:g}",
         f"{m.price.request:g}", str(m.default_max_tokens), v.origin("model", m.name)]
        for m in v.models
        if names is None or m.name in names
    ]  # fmt: skip
    return table(headers, rows, right=[2, 3, 4, 5])


def model_body(args: argparse.Namespace, price: dict[str, JSON] | None = None) -> dict[str, object]:
    body: dict[str, object] = {}
    if args.capabilities is not None:
        body["capabilities"] = comma_separated(args.capabilities)
    given = {f: getattr(args, f) for f in PRICE_FIELDS if getattr(args, f) is not None}
    if given:
        body["price"] = {**(price or {}), **given}
    if args.default_max_tokens is not None:
        body["default_max_tokens"] = args.default_max_tokens
    return body


async def _model_changes(
    args: argparse.Namespace, settings: Settings, store: Store
) -> dict[str, object]:
    """A price flag changes that price only: the model's other prices are kept."""
    current = (await catalogue.load(store, settings)).model(args.name)
    price = model_json(current)["price"] if current is not None else None
    return model_body(args, price if isinstance(price, dict) else None)


def _model_arguments(p: argparse.ArgumentParser, adding: bool) -> None:
    p.add_argument("--capabilities", default=None, metavar="C1,C2",
                   help="chat vision tools embeddings images audio rerank")  # fmt: skip
    for flag in PRICE_FIELDS:
        p.add_argument("--" + flag.replace("_", "-"), type=float, default=None,
                       metavar="PRICE", dest=flag)  # fmt: skip
    p.add_argument("--default-max-tokens", type=positive_int, default=None)


MODELS = Resource(
    noun="model",
    help="list, add, update and delete models",
    helps={
        "list": "list models and prices",
        "add": "add a model",
        "update": "update a model",
        "delete": "delete a model no channel serves",
    },
    entries=lambda v: v.models,
    out=catalogue.model_out,
    table=models_table,
    arguments=_model_arguments,
    fields=model_body,
    changes=_model_changes,
    create=catalogue.create_model,
    update=catalogue.update_model,
    delete=catalogue.delete_model,
)


# ---- groups --------------------------------------------------------------------------------


def groups_table(v: View, only: str | None = None) -> str:
    rows = [
        [g, f"{v.ratio(g):g}", v.tool(g) or "-", v.origin("group", g)]
        for g in v.groups
        if only in (None, g)
    ]
    return table(["NAME", "RATIO", "TOOL", "ORIGIN"], rows, right=[1])


def _group_body(args: argparse.Namespace) -> dict[str, object]:
    """The group's fields given on the command line (``--tool none`` clears the tool)."""
    body: dict[str, object] = {}
    if args.ratio is not None:
        body["ratio"] = float(args.ratio)
    if args.tool is not None:
        body["tool"] = None if args.tool == "none" else args.tool
    return body


async def cmd_groups_list(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    v = await catalogue.load(store, settings)
    return Output({"data": [catalogue.group_out(g, v) for g in v.groups]}, groups_table(v))


async def cmd_groups_add(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    body: dict[str, object] = {"name": args.name, **_group_body(args)}
    name = await catalogue.create_group(store, settings, body)
    v = await catalogue.load(store, settings)
    return Output(catalogue.group_out(name, v), f"added group {name}")


async def cmd_groups_update(args: argparse.Namespace, settings: Settings, store: Store) -> Output:
    body = _group_body(args)
    if not body:
        raise InvalidRequestError("give --ratio, --tool or both")
    await catalogue.update_group(store, settings, args.name, body)
    v = await catalogue.load(store, settings)
    return Output(catalogue.group_out(args.name, v), groups_table(v, args.name))


def _register_groups(sub: Subcommands, parents: Parents) -> None:
    groups = sub.add_parser("groups", help="list, add, update and delete groups")
    gsub = groups.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = gsub.add_parser("list", parents=parents, help="list groups")
    p.set_defaults(func=cmd_groups_list)
    ratio = "every cost of a request made with a key of the group is multiplied by it (1)"
    tool = "the tool its keys are made for: the console shows a new key's set-up for it first"
    for action, func, helps in (
        ("add", cmd_groups_add, "add a group"),
        ("update", cmd_groups_update, "change a group's price ratio or tool"),
    ):
        p = gsub.add_parser(action, parents=parents, help=helps)
        p.add_argument("name")
        p.add_argument("--ratio", type=amount, default=None, metavar="R", help=ratio)
        p.add_argument("--tool", choices=[*TOOLS, "none"], default=None, help=tool)
        p.set_defaults(func=func)
    p = gsub.add_parser("delete", parents=parents, help="delete a group no key or channel uses")
    p.add_argument("name")
    p.set_defaults(func=_deleting("group", catalogue.delete_group))


def register(sub: Subcommands, parents: Parents) -> None:
    channels = _register_resource(sub, parents, CHANNELS)
    p = channels.add_parser("test", parents=parents, help="send the channel one small request")
    p.add_argument("name")
    p.set_defaults(func=cmd_channels_test)
    _register_resource(sub, parents, MODELS)
    _register_groups(sub, parents)
