"""h11's check of the headers a server sends, made cheaper without checking less.

hypercorn writes HTTP/1.1 through h11, and h11 checks every header of every response it is
given (``normalize_and_validate``): a name must be a token, a value must hold no NUL, CR, LF,
form feed or vertical tab and neither start nor end with white space. It does so with two
regular expressions per header, the value's one backtracking over every byte; a response
with four headers (the date hypercorn adds among them) cost about 54,000 instructions, and a
stream's headers are checked twice (once more when h11 adds ``Transfer-Encoding``): 3-5% of
all that relaying a request costs the process. Here the same rules are checked with
one ``bytes.translate`` over a ready table and two byte lookups per header; everything else
(lower-cased names, the ``Content-Length`` and ``Transfer-Encoding`` rules, the errors
raised) is h11's own code path, unchanged: a header h11 would refuse is refused, with h11's
own error (``tests/test_h11_headers.py`` holds the two to the same answers).

Headers h11 parsed itself (``_parsed=True``) are left to h11, as it leaves them unchecked.
When h11 adds a header of its own (``Transfer-Encoding: chunked`` to a stream, ``Connection:
close``), its ``set_comma_header`` checks the headers again through the module's
``normalize_and_validate``: the cheaper check too.

h11's ``Headers`` is a ``Sequence`` without an ``__iter__`` of its own: every loop over a
request's headers (hypercorn makes four per request) went through the abstract class's,
one ``__getitem__`` call per header. It is given one that runs in C (``map`` of an
``itemgetter``), yielding the same (name, value) pairs.

An h11 whose module layout differs is left alone.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterator
from typing import Any, cast

log = logging.getLogger("gateway.server")

_MENDED = "_gateway_fast_header_check"
# RFC 9110's tchar: the bytes a header name is made of
TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# what a value may not hold anywhere (h11: field-vchar is [^\x00\s], and only space and tab
# may separate them), and what it may not start or end with
NEVER_IN_VALUE = b"\x00\n\r\x0b\x0c"
NOT_AT_EDGE = frozenset(b"\x00 \t\n\r\x0b\x0c")
# translation tables that turn every byte not allowed into NUL (itself never allowed): a
# check is one ``translate`` with a ready table and one search for NUL
_NAME_TABLE = bytes(b if b in TOKEN else 0 for b in range(256))
_VALUE_TABLE = bytes(0 if b in NEVER_IN_VALUE else b for b in range(256))
# header names seen valid (a handful: every response sends the same few)
_NAMES_KEPT = 256
_valid_names: set[bytes] = set()


def name_ok(name: bytes) -> bool:
    """h11's ``field_name`` (a token): one or more token bytes."""
    return bool(name) and 0 not in name.translate(_NAME_TABLE)


def value_ok(value: bytes) -> bool:
    """h11's ``field_value``: empty, or visible bytes (any byte but NUL and white space)
    with runs of spaces and tabs between them."""
    if not value:
        return True
    if value[0] in NOT_AT_EDGE or value[-1] in NOT_AT_EDGE:
        return False
    return 0 not in value.translate(_VALUE_TABLE)


def make_check(original: Callable[..., Any]) -> Callable[..., Any]:
    """h11's ``normalize_and_validate`` with its two regular expressions replaced by the
    checks of ``name_ok`` and ``value_ok`` (written out in the loop: two calls per header
    would cost a third of what is saved; a name seen valid is remembered): headers that pass
    are handed on as already parsed (h11 then lower-cases them and applies its
    Content-Length and Transfer-Encoding rules); anything else goes to h11's own check, which
    raises its own error for it."""
    valid_names = _valid_names

    def normalize_and_validate(headers: Any, _parsed: bool = False) -> Any:
        if _parsed:
            return original(headers, _parsed=True)
        headers = list(headers)  # hypercorn hands a list; h11 itself, sometimes a chain
        for name, value in headers:
            if type(name) is not bytes or type(value) is not bytes:
                return original(headers)  # h11 turns text into bytes, or refuses it
            if name not in valid_names:
                if not name_ok(name):
                    return original(headers)
                if len(valid_names) < _NAMES_KEPT:
                    valid_names.add(name)
            if value and (
                value[0] in NOT_AT_EDGE
                or value[-1] in NOT_AT_EDGE
                or 0 in value.translate(_VALUE_TABLE)
            ):
                return original(headers)
        return original(headers, _parsed=True)

    return normalize_and_validate


_NAME_AND_VALUE = operator.itemgetter(1, 2)


def _pairs(self: Any) -> Iterator[tuple[bytes, bytes]]:
    """h11 ``Headers``' (lower-cased name, value) pairs, as its ``__getitem__`` gives them."""
    return map(_NAME_AND_VALUE, self._full_items)


def speed_up() -> bool:
    """Give h11's ``Headers`` its ``__iter__`` and put the cheaper check in h11's place; True
    when the check is there (False: no h11, or one laid out otherwise, left as it is)."""
    try:
        import h11._events as events
        import h11._headers as headers
    except ImportError:
        return False
    header_class = getattr(headers, "Headers", None)
    if header_class is not None and "__iter__" not in vars(header_class):
        header_class.__iter__ = _pairs
    original = getattr(headers, "normalize_and_validate", None)
    if not callable(original):
        return False
    if getattr(original, _MENDED, False):
        return True
    if getattr(events, "normalize_and_validate", None) is not original:
        log.warning("server.h11_not_mended reason=layout")
        return False
    fast = make_check(cast(Callable[..., Any], original))
    setattr(fast, _MENDED, True)
    events.normalize_and_validate = fast  # type: ignore[attr-defined]
    headers.normalize_and_validate = fast
    return True
