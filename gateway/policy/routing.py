"""Which channels may serve a request, in the order to try them (pure).

``Catalogue`` indexes one state of the catalogue once: (group, model) -> channels, sorted by
priority, each model's rate and each group's price ratio. It never changes once built: when
the catalogue changes (the file at start, the admin API at run time, seen through the cache
within a second) the relay swaps in a new one, and a request in flight keeps the one it
started with.
``candidates`` returns the retry order for one request: lower priority first; among equal
priority, a weighted random order (a channel of weight 2 comes first twice as often as one
of weight 1; weight 0 is a standby, tried last). Channels cooling down are left out; when every
channel of the model is cooling down the caller answers 503.

``Catalogue.resolve`` finds the model a client's name means: a catalogue name means its own
model; otherwise a model the key's group reaches that names it among its ``aliases``: an exact
alias first, else the most specific ``*`` pattern that matches (the most characters besides
``*``; between equals, the first in catalogue order). Requests are routed, priced and held by
that model; the usage record and the reply keep the name asked for.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Protocol

from gateway.config import Channel, Model
from gateway.errors import NotFoundError, UpstreamUnavailableError
from gateway.policy.billing import Rate


class CatalogueSource(Protocol):
    """What a catalogue is built from: ``config.Settings`` or ``store.catalogue.View``."""

    @property
    def groups(self) -> tuple[str, ...]: ...
    @property
    def models(self) -> tuple[Model, ...]: ...
    @property
    def channels(self) -> tuple[Channel, ...]: ...
    @property
    def group_ratios(self) -> Mapping[str, float]: ...
    @property
    def group_tools(self) -> Mapping[str, str]: ...


class LiveCatalogue:
    """The one reference to the catalogue the hot path reads: the file's until the store
    answers, then the store's, replaced whole when the store's version changes (the cache
    calls the app, which calls ``use``). A request reads ``current`` once, so it finishes
    on the catalogue it started with."""

    __slots__ = ("current",)

    def __init__(self, settings: CatalogueSource) -> None:
        self.current = Catalogue(settings)

    def use(self, source: CatalogueSource) -> Catalogue:
        self.current = Catalogue(source)
        return self.current


class Catalogue:
    """Groups, models and enabled channels, indexed for the hot path."""

    __slots__ = (
        "groups",
        "models",
        "rates",
        "ratios",
        "tools",
        "every_channel",
        "_by_group_model",
        "_group_models",
        "_tiers",
        "_aliases",
        "_patterns",
        "_resolved",
    )

    def __init__(self, settings: CatalogueSource) -> None:
        self.groups: tuple[str, ...] = tuple(settings.groups)
        self.every_channel: tuple[Channel, ...] = tuple(settings.channels)  # disabled too
        self.models: dict[str, Model] = {m.name: m for m in settings.models}
        self.rates: dict[str, Rate] = {
            m.name: Rate.from_price(m.price, m.table) for m in settings.models
        }
        # each group's price ratio as an exact fraction of its decimal text (1.5 -> 3/2); a
        # group without one is left out (``ratio``: 1)
        self.ratios: dict[str, Fraction] = {
            g: Fraction(str(r)) for g, r in settings.group_ratios.items() if r != 1
        }
        self.tools: dict[str, str] = dict(settings.group_tools)  # a group's tool kind, if any
        by: dict[tuple[str, str], list[Channel]] = {}
        for ch in settings.channels:
            if ch.status != "enabled":
                continue  # a disabled channel is never chosen
            for g in ch.groups:
                for m in ch.models:
                    by.setdefault((g, m), []).append(ch)
        self._by_group_model = {
            k: tuple(sorted(v, key=lambda c: c.priority)) for k, v in by.items()
        }
        self._group_models: dict[str, tuple[Model, ...]] = {}
        for g in settings.groups:
            names = [m.name for m in settings.models if (g, m.name) in self._by_group_model]
            self._group_models[g] = tuple(self.models[n] for n in names)
        # aliases: exact ones by name, patterns in order; each to its models in catalogue order
        self._aliases: dict[str, list[str]] = {}
        patterns: list[tuple[int, int, str, str]] = []
        for model in settings.models:
            for alias in model.aliases:
                if "*" in alias:  # the most specific first: the most characters but *
                    patterns.append(
                        (alias.count("*") - len(alias), len(patterns), alias, model.name)
                    )
                elif alias not in self.models:  # a catalogue name means its own model
                    self._aliases.setdefault(alias, []).append(model.name)
        self._patterns = [(alias_pattern(a), m) for _, _, a, m in sorted(patterns)]
        self._resolved: dict[tuple[str, str], str] = {}  # (group, name) -> model, as found
        # (group, model, capability, channel types) -> channels by priority tier, as asked
        self._tiers: dict[
            tuple[str, str, str, frozenset[str]], tuple[tuple[Channel, ...], ...]
        ] = {}

    def ratio(self, group: str) -> Fraction | int:
        """What every cost of a request made with a key of ``group`` is multiplied by."""
        return self.ratios.get(group, 1)

    def tool(self, group: str) -> str | None:
        """The kind of client the group's keys are made for (the console's set-up), if any."""
        return self.tools.get(group)

    def group_models(self, group: str) -> tuple[Model, ...]:
        """The models a key of this group can reach, in catalogue order."""
        return self._group_models.get(group, ())

    def resolve(self, group: str, name: str) -> str:
        """The catalogue model ``name`` means to a key of ``group`` (module docstring);
        ``name`` itself when it is a model's name or no alias matches."""
        if name in self.models:
            return name
        found = self._resolved.get((group, name))
        if found is not None:
            return found
        reach = self._by_group_model
        found = next((m for m in self._aliases.get(name, ()) if (group, m) in reach), None)
        if found is None:
            found = next(
                (m for p, m in self._patterns if (group, m) in reach and p.fullmatch(name)),
                None,
            )
        if found is None:
            return name
        if len(self._resolved) >= MAX_RESOLVED:  # names are the clients': the memo is bounded
            self._resolved.clear()
        self._resolved[(group, name)] = found
        return found

    def aliases(self, model: Model) -> tuple[str, ...]:
        """The exact aliases that mean ``model`` (what a model list shows besides its name)."""
        return tuple(
            a for a in model.aliases if "*" not in a and self._aliases.get(a, [""])[0] == model.name
        )

    def channels(self, group: str, model: str) -> tuple[Channel, ...]:
        return self._by_group_model.get((group, model), ())

    def tiers(
        self, group: str, model: str, capability: str, channel_types: frozenset[str]
    ) -> tuple[tuple[Channel, ...], ...]:
        """The channels that may serve a request, grouped by priority, lowest first: those of
        the group and model whose type is in ``channel_types`` (what the endpoint kind can
        reach from the client's protocol), the model having ``capability``. Worked out once
        per argument set. NotFoundError (404) when there are none."""
        cache_key = (group, model, capability, channel_types)
        found = self._tiers.get(cache_key)
        if found is None:
            found = self._tiers_of(group, model, capability, channel_types)
            self._tiers[cache_key] = found
        return found

    def _tiers_of(
        self, group: str, model: str, capability: str, channel_types: frozenset[str]
    ) -> tuple[tuple[Channel, ...], ...]:
        m = self.models.get(model)
        chans = self.channels(group, model) if m is not None else ()
        if m is None or not chans:
            raise NotFoundError(
                f"The model '{model}' does not exist or you do not have access to it."
            )
        if capability not in m.capabilities:
            raise NotFoundError(f"The model '{model}' does not support this endpoint.")
        chans = tuple(c for c in chans if c.type in channel_types)
        if not chans:
            raise NotFoundError(f"No channel serves '{model}' for this endpoint.")
        tiers: list[tuple[Channel, ...]] = []
        for ch in chans:  # sorted by priority
            if tiers and tiers[-1][0].priority == ch.priority:
                tiers[-1] += (ch,)
            else:
                tiers.append((ch,))
        return tuple(tiers)


MAX_RESOLVED = 4096  # names remembered per catalogue, with the model each means


def alias_pattern(alias: str) -> re.Pattern[str]:
    """An alias with ``*`` (any run of characters) as a regular expression to match whole."""
    return re.compile(".*".join(re.escape(part) for part in alias.split("*")), re.DOTALL)


def _weighted_order(channels: list[Channel], rng: random.Random) -> list[Channel]:
    if len(channels) < 2:
        return channels
    # Efraimidis-Spirakis: sort by u^(1/w), descending; weight 0 sorts last
    keyed = []
    for ch in channels:
        w = ch.weight
        keyed.append((rng.random() ** (1.0 / w) if w > 0 else -1.0, ch))
    keyed.sort(key=lambda kc: kc[0], reverse=True)
    return [ch for _, ch in keyed]


def candidates(
    catalogue: Catalogue,
    group: str,
    model: str,
    capability: str,
    channel_types: frozenset[str],
    rng: random.Random,
    cooling: Mapping[str, float] | None = None,
    now: float = 0.0,
) -> list[Channel]:
    """The channels to try for one request, in order. Raises NotFoundError (404) when the
    model is outside the group, lacks the capability or has no channel of those types, and
    UpstreamUnavailableError (503, with the seconds until the first is ready again as its
    ``retry_after``) when every channel is cooling down."""
    tiers = tiers_all = catalogue.tiers(group, model, capability, channel_types)
    if cooling:
        ready_tiers = []
        for tier in tiers:
            ready = tuple(c for c in tier if cooling.get(c.name, 0.0) <= now)
            if ready:
                ready_tiers.append(ready)
        tiers = tuple(ready_tiers)
        if not tiers:
            soonest = min(cooling.get(c.name, now) for tier in tiers_all for c in tier)
            raise UpstreamUnavailableError(
                f"Every channel of '{model}' is cooling down after failures; try again shortly.",
                retry_after=max(soonest - now, 1.0),
            )
    if len(tiers) == 1 and len(tiers[0]) == 1:
        return list(tiers[0])  # one channel: nothing to order
    out: list[Channel] = []
    for tier in tiers:
        out.extend(_weighted_order(list(tier), rng))
    return out
