"""The gateway's mends of third-party internals, in one registry.

A mend changes a private part of a library the gateway runs on (hypercorn, aiohttp), for one
of three reasons, its *kind*: ``correctness`` (without it the server misbehaves), ``safety``
(it defends the process against clients that abuse it) or ``speed`` (it only makes something
cheaper; what each saves is in bench/RESULTS.md, "Mends"). Each mend module says which, and
why the mend is kept, and declares its mends as ``Mend`` values. hypercorn's mends are only
of the first two kinds: it is served on request (``--server hypercorn``), not by default, so
a mend that only made it cheaper was not worth its upkeep (``REMOVED``); aiohttp's speed
mends stay, as aiohttp serves the upstream calls under every server.

- ``check()`` lists what the mend relies on that the installed library lacks or has changed:
  every name it reads, wraps or calls, every parameter list, every shape (tried on a sample
  object where one can be made). Empty: the mend fits.
- ``apply()`` puts it in place, and is only called once ``check()`` came back empty.
- ``in_place()`` says whether it is.

A mend wraps what it changes (``wrapping``: the library's own function stays reachable as
``__wrapped__``, and is what the checks look at) or adds to it; none replaces a library
function with a copy of its code, which would silently undo the library's later fixes.

At start-up (``start``) a correctness or safety mend that does not fit stops the process with
one log line naming the mend and what is missing, unless ``GATEWAY_UNMENDED`` names it (mend
names separated by commas, or ``all``): the process then serves without it, and logs that as
an error. A speed mend that does not fit is left out, with one warning line. A name in
``GATEWAY_UNMENDED`` that is no mend's (a typo, or a mend since removed) gets one warning line
(``server.unmended_unknown``) and changes nothing: start-up goes on, as it did when that name
was a speed mend's, which ``GATEWAY_UNMENDED`` never concerned.
"""

from __future__ import annotations

import collections
import importlib
import importlib.metadata
import inspect
import logging
import os
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Literal

log = logging.getLogger("gateway.server")

Kind = Literal["correctness", "safety", "speed"]
UNMENDED_ENV = "GATEWAY_UNMENDED"
# the modules that declare mends (``MENDS`` in each), imported when the registry is asked for
MODULES = (
    "gateway.server.hypercorn_mend",
    "gateway.server.header_timeout",
    "gateway.server.uvicorn_guard",
    "gateway.server.uvicorn_body",
    "gateway.upstream.pool",
    "gateway.upstream.lean_buffers",
    "gateway.upstream.lean_request_info",
    "gateway.upstream.direct_reads",
    "gateway.upstream.lean_send",
    "gateway.upstream.lean_connect",
)
# mends the gateway had and has no more, and why: ``GATEWAY_UNMENDED`` naming one is told so
REMOVED = dict.fromkeys(
    (
        "hypercorn.date_header",
        "hypercorn.lean_app_queue",
        "hypercorn.lean_events",
        "hypercorn.lean_drain_waiters",
        "h11.header_check",
    ),
    "a speed mend of hypercorn's, removed when uvicorn became the default server",
)
_MARK = "__gateway_mend__"  # on a wrapper: the name of the mend that made it
_left_out: set[str] = set()  # speed mends found not to fit (and said so) in this process


@dataclass(frozen=True, slots=True)
class Mend:
    name: str  # "<library>.<what>", as the log and GATEWAY_UNMENDED name it
    library: str  # the distribution it mends, as pip names it
    written_for: str  # the versions it was written and tested against
    kind: Kind
    fixes: str  # what goes wrong without it, in one line
    check: Callable[[], list[str]]
    apply: Callable[[], None]
    in_place: Callable[[], bool]

    def problems(self) -> list[str]:
        """What ``check()`` finds missing or changed; a check that fails is one more."""
        try:
            return self.check()
        except Exception as exc:  # a library changed past what the check foresaw
            return [f"its check raised {type(exc).__name__}: {exc}"]


class MendError(RuntimeError):
    """A mend does not fit the installed library: the message names the mend, the library
    found and what it lacks."""

    def __init__(self, mend: Mend, problems: Sequence[str]) -> None:
        self.mend = mend
        self.problems = list(problems)
        super().__init__(
            f"mend {mend.name} ({mend.kind}: {mend.fixes}) does not fit {mend.library} "
            f"{installed(mend.library)} (written for {mend.written_for}): "
            + "; ".join(self.problems)
        )


def installed(library: str) -> str:
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def registry() -> dict[str, Mend]:
    """Every mend the gateway has, by name, in the order they are applied."""
    found: dict[str, Mend] = {}
    for module in MODULES:
        for mend in importlib.import_module(module).MENDS:
            found[mend.name] = mend
    return found


def put_in_place(mend: Mend) -> None:
    """Check ``mend``, then apply it unless it is in place already; raises ``MendError``
    when it does not fit."""
    problems = mend.problems()
    if problems:
        raise MendError(mend, problems)
    if not mend.in_place():
        mend.apply()
    if not mend.in_place():
        raise MendError(mend, ["applied, but not found in place"])


def fits(mend: Mend) -> bool:
    """Put a speed mend in place if it fits; else say so once, and go on without it."""
    if mend.name in _left_out:
        return False
    if mend.in_place():  # checked when it was put there
        return True
    try:
        put_in_place(mend)
    except MendError as err:
        _left_out.add(mend.name)
        log.warning("server.mend_left_out %s", err)
        return False
    return True


def start(needed: Iterable[Mend], *, apply: bool = True) -> None:
    """Put ``needed`` in place, in order (``apply=False``: only check them). A speed mend
    that does not fit is left out; a correctness or safety one stops the process
    (``SystemExit``), unless ``GATEWAY_UNMENDED`` names it (module docstring)."""
    allowed = unmended()
    for mend in needed:
        if mend.kind == "speed":
            if apply:
                fits(mend)
            elif problems := mend.problems():
                log.warning("server.mend_left_out %s", MendError(mend, problems))
            continue
        try:
            if apply:
                put_in_place(mend)
            elif problems := mend.problems():
                raise MendError(mend, problems)
        except MendError as err:
            if mend.name in allowed or "all" in allowed:
                log.error("server.serving_unmended %s (%s=%s)", err, UNMENDED_ENV, mend.name)
                continue
            log.critical(
                "server.mend_refused %s. The gateway does not start without it: install %s "
                "%s, serve with another --server, or set %s=%s to serve without it",
                err,
                mend.library,
                mend.written_for,
                UNMENDED_ENV,
                mend.name,
            )
            raise SystemExit(1) from None


def unmended() -> set[str]:
    """The names ``GATEWAY_UNMENDED`` gives; one that is no mend's is said with a warning."""
    names = {name.strip() for name in os.environ.get(UNMENDED_ENV, "").split(",")} - {""}
    if not names - {"all"}:
        return names  # the registry (which imports aiohttp) not needed
    known = registry()
    for name in sorted(names - known.keys() - {"all"}):
        if name in REMOVED:
            why = f"a mend the gateway no longer has ({REMOVED[name]}): nothing to serve without"
        else:
            why = f"which is no mend of the gateway's (they are: {', '.join(known)})"
        log.warning("server.unmended_unknown %s names %s, %s", UNMENDED_ENV, name, why)
    return names


# what a deque has and a list has not: a mend that gives a library a list where it made a
# deque checks that the library's code uses none of these
DEQUE_ONLY = frozenset(n for n in dir(collections.deque) if not hasattr(list, n))


def module_flag(module: str, name: str = "_on") -> tuple[Callable[[], None], Callable[[], bool]]:
    """``apply`` and ``in_place`` for a mend whose code only reads a flag of its own module
    (``<module>.<name>``, False until the mend is applied): the flag set, the flag read. Tests
    reset the flag on the module as any of its globals."""

    def apply() -> None:
        setattr(sys.modules[module], name, True)

    def in_place() -> bool:
        return getattr(sys.modules[module], name) is True

    return apply, in_place


def module_but(module: types.ModuleType, **names: Any) -> types.ModuleType:
    """``module`` as a library's module is to see it under a mend (given to it in place of
    ``module``): every name is ``module``'s own, but ``names``, which stand in for theirs.

    ``module``'s names are copied into it as it is made, so that the library looks each up
    as fast as in ``module`` (a class-level ``__getattr__`` made every lookup a failed one
    first: about 1.3 µs a name); a name ``module`` gains later is looked up there (its module
    ``__getattr__``)."""
    stand_in = types.ModuleType(module.__name__, module.__doc__)
    members = vars(stand_in)
    members.update(vars(module))
    members.update(names)
    members["__getattr__"] = lambda name: getattr(module, name)
    return stand_in


def wrapping(mend: str, original: Callable[..., Any], wrapper: Callable[..., Any]) -> Any:
    """``wrapper``, marked as ``mend``'s, with the function it wraps as its ``__wrapped__``."""
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(wrapper, _MARK, mend)
    return wrapper


def original(func: Any) -> Any:
    """The library's own function under the gateway's wrappers of it."""
    while _MARK in getattr(func, "__dict__", {}):
        func = func.__wrapped__
    return func


def mended(func: Any, mend: str) -> bool:
    """Whether ``func`` is, or wraps, a wrapper made by ``mend``."""
    while _MARK in getattr(func, "__dict__", {}):
        if func.__dict__[_MARK] == mend:
            return True
        func = func.__wrapped__
    return False


class Needs:
    """What a mend relies on, checked one part at a time: ``missing`` says, part by part,
    what the library lacks or has changed. A part whose owner was missing is not reported
    again."""

    def __init__(self) -> None:
        self.missing: list[str] = []

    def require(self, ok: bool, problem: str) -> bool:
        if not ok:
            self.missing.append(problem)
        return ok

    def module(self, name: str) -> Any:
        try:
            return importlib.import_module(name)
        except ImportError:
            self.missing.append(f"module {name} is missing")
            return None

    def attr(self, owner: Any, name: str, where: str) -> Any:
        """``owner.name`` (``where`` names the owner in a problem); None when missing."""
        if owner is None:
            return None
        if not hasattr(owner, name):
            self.missing.append(f"{where}.{name} is missing")
            return None
        return getattr(owner, name)

    def function(
        self, owner: Any, name: str, where: str, params: Sequence[str], *, coroutine: bool
    ) -> Any:
        """The library's own ``owner.name`` (under any wrapper of ours), required to take
        exactly ``params`` and to be (or not be) a coroutine function; None when missing or
        taking other parameters (it is then not tried)."""
        func = self.attr(owner, name, where)
        if func is None:
            return None
        func = original(func)
        label = f"{where}.{name}"
        try:
            found: tuple[str, ...] | None = tuple(inspect.signature(func).parameters)
        except (TypeError, ValueError):  # not callable, or no signature to read
            found = None
        if inspect.iscoroutinefunction(func) != coroutine:
            self.missing.append(f"{label} is {'not ' if coroutine else ''}a coroutine function")
        if not self.require(
            found == tuple(params),
            f"{label} takes ({', '.join(found or ('?',))}), not ({', '.join(params)})",
        ):
            return None
        return func

    def uses(self, func: Any, names: Iterable[str], label: str) -> None:
        """``func``'s own code names each of ``names`` (an attribute it reads or sets, a global
        it calls): what a mend relies on it to do."""
        if func is None:
            return
        code = getattr(original(func), "__code__", None)
        found = set(code.co_names) if code is not None else set()
        for name in names:
            self.require(name in found, f"{label} no longer uses {name}")

    def fields(self, cls: Any, names: Iterable[str], where: str) -> None:
        """The dataclass ``cls`` has each of the fields ``names``."""
        if cls is None:
            return
        found = {f.name for f in fields(cls)} if is_dataclass(cls) else set()
        for name in names:
            self.require(name in found, f"{where} has no field {name}")
