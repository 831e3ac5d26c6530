"""h11's check of the headers a server sends, made cheaper without checking less: the mend
``h11.header_check`` (speed; a ``gateway.server.mends.Mend``), kept while hypercorn, which
writes HTTP/1.1 through h11, is the default server. What it saves is in bench/RESULTS.md
("Mends").

h11 checks every header of every response it is given (``normalize_and_validate``): a name
must be a token, a value must hold no NUL, CR, LF, form feed or vertical tab and neither start
nor end with white space. It does so with two regular expressions per header, the value's one
backtracking over every byte. Here the same rules are
checked with one ``bytes.translate`` over a ready table and two byte lookups per header; then
h11's own function runs on headers that passed, told they are already parsed, so that
everything else (lower-cased names, the ``Content-Length`` and ``Transfer-Encoding`` rules)
is h11's own code, unchanged. A header h11 would refuse goes to h11's own check, and gets h11's
own error (``tests/test_h11_headers.py`` holds the two to the same answers). Headers h11 parsed
itself (``_parsed=True``) are left to h11, as it leaves them unchecked.

To a stream's reply h11 adds ``Transfer-Encoding: chunked`` (and takes out any
``Content-Length``) through ``set_comma_header``, which hands every header to the check and
to the normalising of names and values again, twice per stream. Those headers are the items of a
``Headers`` that check made: valid, normalised, and normalised again to themselves. The
wrapper keeps them as they are and adds what h11 adds, made by h11's own ``set_comma_header``
on no other headers (checked, with h11's errors) and remembered by name and values (h11 adds
a handful: ``chunked``, ``close``). The result is the ``Headers`` h11's would make: its kept
headers hold no header of the name set, so none of h11's rules (one Content-Length, one
Transfer-Encoding) can meet them (``tests/test_h11_headers.py`` holds the two to the same
answers).

h11's ``Headers`` is a ``Sequence`` without an ``__iter__`` of its own: every loop over a
request's headers (hypercorn makes four per request) went through the abstract class's, one
``__getitem__`` call per header. It is given one that runs in C (``map`` of an
``itemgetter``), yielding the same (name, value) pairs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import Any

from gateway.server.mends import Mend, Needs, mended, original, wrapping

_NAME = "h11.header_check"
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


# the headers h11 adds (made by its own set_comma_header), by name and values: a handful
_ADDED_KEPT = 16


def make_set_comma_header(
    original: Callable[..., Any], headers_type: type[Any]
) -> Callable[..., Any]:
    """h11's ``set_comma_header`` (``original``) that does not check again the headers it
    keeps (module docstring); anything but h11's own ``Headers`` goes to ``original``."""
    added: dict[tuple[bytes, ...], list[tuple[bytes, bytes, bytes]]] = {}
    nothing = headers_type([])

    def set_comma_header(headers: Any, name: bytes, new_values: list[bytes]) -> Any:
        if type(headers) is not headers_type:
            return original(headers, name, new_values)
        kept = [item for item in headers._full_items if item[1] != name]
        if new_values:
            key = (name, *new_values)
            made = added.get(key)
            if made is None:
                made = original(nothing, name, new_values)._full_items
                if len(added) < _ADDED_KEPT:
                    added[key] = made
            kept += made
        return headers_type(kept)

    return set_comma_header


_NAME_AND_VALUE = operator.itemgetter(1, 2)


def _pairs(self: Any) -> Iterator[tuple[bytes, bytes]]:
    """h11 ``Headers``' (lower-cased name, value) pairs, as its ``__getitem__`` gives them."""
    return map(_NAME_AND_VALUE, self._full_items)


def _check() -> list[str]:
    needs = Needs()
    headers = needs.module("h11._headers")
    events = needs.module("h11._events")
    params = ["headers", "_parsed"]
    check = needs.function(
        headers, "normalize_and_validate", "h11._headers", params, coroutine=False
    )
    # h11's events import it by name: that copy is replaced too
    bound = needs.attr(events, "normalize_and_validate", "h11._events")
    if check is None or bound is None:
        return needs.missing
    needs.require(original(bound) is check, "h11._events.normalize_and_validate is another one")
    # h11's own function, told the headers are parsed, still applies its Content-Length rules
    import h11

    lengths = [(b"Content-Length", b"1"), (b"Content-Length", b"2")]
    try:
        check(lengths, _parsed=True)
        needs.missing.append("normalize_and_validate(_parsed=True) skips the Content-Length rules")
    except h11.LocalProtocolError:
        pass
    # Headers keeps (raw name, lower-cased name, value), and __getitem__ gives the last two
    made = check([(b"X-A", b"1")], _parsed=True)
    needs.require(
        getattr(made, "_full_items", None) == [(b"X-A", b"x-a", b"1")],
        "h11 Headers._full_items is missing or not [(raw name, name, value)]",
    )
    try:
        first = made[0]
    except Exception as exc:  # whatever a changed Headers raises
        first = exc
    needs.require(first == (b"x-a", b"1"), "h11 Headers[i] is not (lower-cased name, value)")
    if not needs.missing:  # its sample needs the Headers found right
        _check_set_comma_header(needs, headers, check)
    return needs.missing


def _check_set_comma_header(needs: Needs, headers: Any, check: Any) -> None:
    """h11 adds its headers through ``set_comma_header`` (``_connection`` imports it by name),
    and the wrapper makes the same ``Headers`` from a sample as h11's own does."""
    connection = needs.module("h11._connection")
    params = ["headers", "name", "new_values"]
    add = needs.function(headers, "set_comma_header", "h11._headers", params, coroutine=False)
    bound = needs.attr(connection, "set_comma_header", "h11._connection")
    if add is None or bound is None or headers is None:
        return
    needs.require(original(bound) is add, "h11._connection.set_comma_header is another one")
    sample = check([(b"content-type", b"text/plain"), (b"content-length", b"5")])
    wrapper = make_set_comma_header(add, headers.Headers)
    for name, values in ((b"content-length", []), (b"transfer-encoding", [b"chunked"])):
        ours, own = wrapper(sample, name, values), add(sample, name, values)
        needs.require(
            getattr(ours, "_full_items", None) == getattr(own, "_full_items", False),
            f"h11 set_comma_header(..., {name!r}, {values!r}) makes other headers",
        )


def _apply() -> None:
    import h11._connection as connection
    import h11._events as events
    import h11._headers as headers

    check = headers.normalize_and_validate
    fast = wrapping(_NAME, check, make_check(check))
    events.normalize_and_validate = fast  # type: ignore[attr-defined]
    headers.normalize_and_validate = fast
    add = headers.set_comma_header
    adding = wrapping(_NAME, add, make_set_comma_header(add, headers.Headers))
    connection.set_comma_header = adding  # type: ignore[attr-defined]
    headers.set_comma_header = adding
    if "__iter__" not in vars(headers.Headers):  # an h11 with its own keeps it
        pairs = wrapping(_NAME, headers.Headers.__iter__, _pairs)
        headers.Headers.__iter__ = pairs  # type: ignore[method-assign]


def _in_place() -> bool:
    try:
        import h11._connection as connection
        import h11._events as events
        import h11._headers as headers
    except ImportError:
        return False
    bound = events.normalize_and_validate  # type: ignore[attr-defined]
    adding = connection.set_comma_header  # type: ignore[attr-defined]
    return all(
        mended(func, _NAME)
        for func in (headers.normalize_and_validate, bound, headers.set_comma_header, adding)
    )


HEADER_CHECK = Mend(
    name=_NAME,
    library="h11",
    written_for="0.16",
    kind="speed",
    fixes="h11 checks every response header with two regular expressions (a stream's 3 times)",
    check=_check,
    apply=_apply,
    in_place=_in_place,
)
MENDS = (HEADER_CHECK,)
