"""Typed readers of JSON fields, for the decoders of both sides.

A decoder reads each field it converts through one of these as it converts it (no separate
validation pass): the value comes back unchanged when it has the type asked for, else the
reader raises the side's error naming the field. ``REQUEST`` raises ``InvalidRequestError``
(400: the client's body), ``REPLY`` raises ``UpstreamError`` (502: the upstream sent a reply
that is not what its protocol says). A field's name is built only when it is wrong: callers
pass where the object is (``messages[2]``, ``messages.2`` in Anthropic's own style) and the
key apart, so a valid body pays for a type test per field and nothing more.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.errors import GatewayError, InvalidRequestError, UpstreamError
from gateway.types import JSON

Key = str | int | None


def name_of(where: str, key: Key) -> str:
    """The name of ``key`` inside ``where``: ``messages[2]``, ``messages[2].content``."""
    if key is None:
        return where or "the request body"
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


class Reader:
    """The readers of one side; ``error(name, expected)`` makes that side's error."""

    __slots__ = ("error",)

    def __init__(self, error: Callable[[str, str], GatewayError]) -> None:
        self.error = error

    def bad(self, where: str, key: Key, expected: str) -> GatewayError:
        return self.error(name_of(where, key), expected)

    def text(self, value: JSON, where: str, key: Key = None) -> str:
        if type(value) is str:
            return value
        raise self.bad(where, key, "a string")

    def opt_text(self, value: JSON, where: str, key: Key = None) -> str | None:
        """A string, or None when absent (null)."""
        if value is None or type(value) is str:
            return value
        raise self.bad(where, key, "a string")

    def obj(self, value: JSON, where: str, key: Key = None) -> dict[str, JSON]:
        if type(value) is dict:
            return value
        raise self.bad(where, key, "an object")

    def opt_obj(self, value: JSON, where: str, key: Key = None) -> dict[str, JSON] | None:
        if value is None or type(value) is dict:
            return value
        raise self.bad(where, key, "an object")

    def array(self, value: JSON, where: str, key: Key = None) -> list[JSON]:
        if type(value) is list:
            return value
        raise self.bad(where, key, "a list")

    def opt_array(self, value: JSON, where: str, key: Key = None) -> list[JSON]:
        """A list; absent (null) reads as an empty one."""
        if type(value) is list:
            return value
        if value is None:
            return []
        raise self.bad(where, key, "a list")

    def texts(self, value: JSON, where: str, key: Key = None) -> list[str]:
        """A list of strings."""
        if type(value) is list and all(type(v) is str for v in value):
            return value
        raise self.bad(where, key, "a list of strings")

    def integer(self, value: JSON, where: str, key: Key = None) -> int:
        if type(value) is int:
            return value
        raise self.bad(where, key, "an integer")

    def opt_integer(self, value: JSON, where: str, key: Key = None) -> int | None:
        if value is None or type(value) is int:
            return value
        raise self.bad(where, key, "an integer")

    def number(self, value: JSON, where: str, key: Key = None) -> int | float:
        if type(value) is float or type(value) is int:
            return value
        raise self.bad(where, key, "a number")

    def boolean(self, value: JSON, where: str, key: Key = None) -> bool:
        if type(value) is bool:
            return value
        raise self.bad(where, key, "a boolean")

    def opt_bool(self, value: JSON, where: str, key: Key = None) -> bool | None:
        if value is None or type(value) is bool:
            return value
        raise self.bad(where, key, "a boolean")

    def stop(self, value: JSON, where: str, key: Key = None) -> list[str]:
        """Stop sequences: a string or a list of strings, as a list."""
        if type(value) is str:
            return [value]
        if type(value) is list and all(type(v) is str for v in value):
            return value
        raise self.bad(where, key, "a string or a list of strings")


def _client_error(name: str, expected: str) -> GatewayError:
    return InvalidRequestError(f"{name} must be {expected}")


def _reply_error(name: str, expected: str) -> GatewayError:
    return UpstreamError(f"upstream sent a malformed reply: {name} must be {expected}")


REQUEST = Reader(_client_error)
REPLY = Reader(_reply_error)
