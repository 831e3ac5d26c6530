"""Reading a client's fields with checks: a value of the wrong JSON type is the client's
mistake, answered 400 with the field's name, never a ``TypeError`` deep in a conversion.

Each reader takes the value and the field's path as the client wrote it (``tools[0].function``)
and returns it typed, or raises ``InvalidRequestError``. Optional fields read ``None`` as their
empty value. They cost an ``isinstance`` each: conversions call them while converting, not in a
separate pass over the body.
"""

from __future__ import annotations

from gateway.errors import InvalidRequestError
from gateway.types import JSON


def obj(value: JSON, where: str) -> dict[str, JSON]:
    """An object field that must be there."""
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{where} must be an object")
    return value


def opt_obj(value: JSON, where: str) -> dict[str, JSON]:
    """An optional object field: absent or null is empty."""
    if value is None:
        return {}
    return obj(value, where)


def items(value: JSON, where: str) -> list[JSON]:
    """An optional array field: absent or null is empty."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequestError(f"{where} must be an array")
    return value


def objects(value: JSON, where: str) -> list[dict[str, JSON]]:
    """An optional array of objects."""
    out = items(value, where)
    for i, item in enumerate(out):
        if not isinstance(item, dict):
            raise InvalidRequestError(f"{where}[{i}] must be an object")
    return out


def text(value: JSON, where: str, default: str = "") -> str:
    """An optional string field."""
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidRequestError(f"{where} must be a string")
    return value


def texts(value: JSON, where: str) -> list[str]:
    """A string or an array of strings (``stop``, stop sequences)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidRequestError(f"{where} must be a string or an array of strings")
    return value
