"""Reading configuration values: each reader checks one value and raises ``ConfigError``
naming the field (``channels[2].base_url: not a URL``)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Any

ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$")
# a line break, a NUL or another control character: no credential holds one, and one sent in
# a header is refused by the HTTP client at every request (a key pasted with its line end)
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


class ConfigError(Exception):
    """A bad configuration file; the message is one line naming the field."""


def list_of(raw: dict[str, Any], name: str) -> list[Any]:
    v = raw.get(name)
    if v is None:
        return []
    if not isinstance(v, list):
        raise ConfigError(f"{name}: must be a list")
    return v


def string(v: Any, where: str, *, allow_empty: bool = False) -> str:
    if v is None and allow_empty:
        return ""
    if not isinstance(v, str) or (not v and not allow_empty):
        raise ConfigError(f"{where}: must be a non-empty string")
    return v


def credential(v: Any, where: str, *, allow_empty: bool = False) -> str:
    """A key, secret or token sent upstream: a string without control characters. The
    message names the field, never the value."""
    s = string(v, where, allow_empty=allow_empty)
    if CONTROL_RE.search(s):
        raise ConfigError(f"{where}: holds a line break or another control character; remove it")
    return s


def name_of(v: Any, where: str) -> str:
    s = string(v, where)
    if not NAME_RE.match(s):
        raise ConfigError(f"{where}: {s!r} is not a valid name")
    return s


def strings(v: Any, where: str, item: Callable[[Any, str], str] = string) -> list[str]:
    """A list of strings, each read by ``item`` (``credential`` for keys)."""
    if not isinstance(v, list):
        raise ConfigError(f"{where}: must be a list of strings")
    return [item(x, f"{where}[{i}]") for i, x in enumerate(v)]


def number(v: Any, where: str, *, minimum: float = 0.0) -> float:
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


def integer(v: Any, where: str, *, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{where}: must be an integer")
    if v < minimum:
        raise ConfigError(f"{where}: must be at least {minimum}")
    return v


def mapping(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise ConfigError(f"{where}: must be a mapping")
    return v


def no_unknown(d: dict[str, Any], allowed: Collection[str], where: str) -> None:
    for k in d:
        if k not in allowed:
            raise ConfigError(f"{at(where, str(k))}: unknown field")


def unique(values: list[str], where: str, fld: str) -> None:
    seen: set[str] = set()
    for i, v in enumerate(values):
        if v in seen:
            raise ConfigError(f"{where}[{i}].{fld}: duplicate {v!r}")
        seen.add(v)


def at(where: str, name: str) -> str:
    """The name of a field inside ``where`` (``channels[2].base_url``); at the top level
    (``where`` empty, an admin API body) just the field's name."""
    return f"{where}.{name}" if where else name


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
