"""A mend of aiohttp (written for 3.14) that makes each upstream response smaller:
``aiohttp.lean_buffers``, of kind ``speed`` (it only makes a response cheaper to hold:
bench/RESULTS.md, "Memory per open stream"); a ``gateway.server.mends.Mend``, checked before
it is applied, and left out with a warning when it does not fit.

Why: an open stream holds three ``collections.deque`` of aiohttp's ``aiohttp.streams``: the
connection's queue of responses (``DataQueue._buffer``), the body's buffer of chunks
(``StreamReader._buffer``) and, for a chunked body, its chunk boundaries
(``StreamReader._http_chunk_splits``). A deque allocates a block of 64 slots as it is made,
so each costs about 760 bytes empty, where they hold one or two items while a stream flows.

How: that module makes its deques as ``collections.deque()`` and uses them only through
``append``, ``appendleft``, ``popleft``, ``len``, truth and ``[0]``/``[-1]``; the mend gives
it a ``collections`` of its own, the same module in every name but ``deque``, whose deques
are ``LeanDeque``: a list with ``popleft`` and ``appendleft`` (56 bytes empty). ``popleft``
is a Python call (about 100 ns more than a deque's, two for each chunk a stream reads) and
moves what follows (the chunks buffered: one or two while a stream flows, at most aiohttp's
high-water marks while a client reads slowly).
"""

from __future__ import annotations

import collections
from typing import Any

from gateway.server.mends import DEQUE_ONLY, Mend, Needs, module_but

_NAME = "aiohttp.lean_buffers"
_MODULE = "aiohttp.streams"
# what aiohttp.streams may do to its deques under the mend: a list with popleft and
# appendleft does the same; any other deque-only name (rotate, extendleft, maxlen...) fails
SUPPORTED = frozenset({"popleft", "appendleft"})
UNSUPPORTED = DEQUE_ONLY - SUPPORTED


class LeanDeque(list[Any]):
    """A deque as ``aiohttp.streams`` uses one (module docstring), over a list."""

    __slots__ = ()

    def popleft(self) -> Any:
        return self.pop(0)

    def appendleft(self, item: Any) -> None:
        self.insert(0, item)


# collections as aiohttp.streams sees it under the mend: but for its deque
_COLLECTIONS = module_but(collections, deque=LeanDeque)


def _streams() -> Any:
    try:
        from aiohttp import streams
    except ImportError:
        return None
    return streams


def _code_names(module: Any) -> set[str]:
    """Every name the functions of ``module``'s classes and the module itself use."""
    names: set[str] = set()
    for value in vars(module).values():
        members = vars(value).values() if isinstance(value, type) else [value]
        for member in members:
            code = getattr(getattr(member, "__func__", member), "__code__", None)
            if code is not None and getattr(member, "__module__", _MODULE) == _MODULE:
                names.update(code.co_names)
    return names


def _check() -> list[str]:
    needs = Needs()
    module = needs.module(_MODULE)
    found = needs.attr(module, "collections", _MODULE)
    needs.require(
        found is None or found is collections or found is _COLLECTIONS,
        f"{_MODULE}.collections is not the collections module",
    )
    reader = needs.attr(module, "StreamReader", _MODULE)
    queue = needs.attr(module, "DataQueue", _MODULE)
    # the three deques of a response, made as collections.deque()
    for owner, name in ((reader, "__init__"), (reader, "begin_http_chunk_receiving")):
        needs.uses(getattr(owner, name, None), ["collections", "deque"], f"StreamReader.{name}")
    needs.uses(getattr(queue, "__init__", None), ["collections", "deque"], "DataQueue.__init__")
    if module is not None:
        others = sorted(_code_names(module) & UNSUPPORTED)
        needs.require(not others, f"{_MODULE} uses its deques' {', '.join(others)}")
    return needs.missing


def _apply() -> None:
    _streams().collections = _COLLECTIONS


LEAN_BUFFERS = Mend(
    name=_NAME,
    library="aiohttp",
    written_for="3.14",
    kind="speed",
    fixes="each response holds three deques (about 2 KiB) for as long as it lasts",
    check=_check,
    apply=_apply,
    in_place=lambda: getattr(_streams(), "collections", None) is _COLLECTIONS,
)
MENDS = (LEAN_BUFFERS,)
