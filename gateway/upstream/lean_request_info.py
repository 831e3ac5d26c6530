"""A mend of aiohttp (written for 3.14) that lets an upstream response forget the headers of
the request it answers: ``aiohttp.lean_request_info``, of kind ``speed`` (it only makes a
response cheaper to hold: bench/RESULTS.md, "Memory per open stream, the request's
headers and the read's wait"); a ``gateway.server.mends.Mend``, checked before it is
applied, and left out with a warning when it does not fit.

Why: an aiohttp response keeps its request's ``RequestInfo`` (URL, method, headers) for as
long as it lives, for the errors it may raise (``raise_for_status``, ``json``) and for
redirects. Its headers are the request's whole ``CIMultiDict``, the upstream's credentials
among them: about 0.7 KiB an open stream, the largest part of a finished request that a
response holds. Once a response has started, the gateway raises none of those errors and
follows no redirect, and reads neither ``request_info`` nor its headers.

How: ``forget_request_headers(resp)``, called by ``pool.UpstreamResponse`` on each response
once its status and headers arrived, puts in its place a ``RequestInfo`` with the same URL,
method and real URL and an empty, shared ``CIMultiDictProxy`` for headers (and lets go of
``request_info`` as aiohttp's ``reify`` kept it, if it was read). The request's
headers then have nothing left holding them (aiohttp keeps no other reference to a sent
request; the gateway's ``UpstreamCall`` keeps its own plain dict of them). Without the mend
it does nothing.
"""

from __future__ import annotations

from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from gateway.server.mends import Mend, Needs, module_flag

_NAME = "aiohttp.lean_request_info"
FIELDS = ("url", "method", "headers", "real_url")  # RequestInfo's, in order
NO_HEADERS: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict())
_on = False  # the mend is in place


def forget_request_headers(resp: Any) -> None:
    """Under the mend: ``resp`` (a started ``aiohttp.ClientResponse``) keeps its request's
    URL, method and real URL, not its headers (module docstring)."""
    if _on:
        info = resp._request_info
        if info[2] is NO_HEADERS:  # made without them (``upstream.lean_send``'s)
            return
        resp._request_info = tuple.__new__(type(info), (info[0], info[1], NO_HEADERS, info[3]))
        resp._cache.pop("request_info", None)  # request_info, if it was read: read anew


def _check() -> list[str]:
    needs = Needs()
    module = needs.module("aiohttp.client_reqrep")
    where = "aiohttp.client_reqrep"
    info = needs.attr(module, "RequestInfo", where)
    response = needs.attr(module, "ClientResponse", where)
    if info is not None:
        fields = getattr(info, "_fields", None)
        needs.require(
            fields == FIELDS and issubclass(info, tuple),
            f"RequestInfo is not a tuple of ({', '.join(FIELDS)})",
        )
    # the response keeps it as _request_info, and hands that out as request_info, a property
    # (aiohttp's reify: kept in the response's _cache once read)
    init = getattr(response, "__init__", None)
    needs.uses(init, ["_request_info", "_cache"], "ClientResponse.__init__")
    prop = vars(response).get("request_info") if response is not None else None
    read = getattr(prop, "fget", None) or getattr(prop, "wrapped", None)
    if needs.require(read is not None, "ClientResponse.request_info is not a property"):
        needs.uses(read, ["_request_info"], "ClientResponse.request_info")
    return needs.missing


_apply, _in_place = module_flag(__name__)  # sets and reads _on


LEAN_REQUEST_INFO = Mend(
    name=_NAME,
    library="aiohttp",
    written_for="3.14",
    kind="speed",
    fixes="each response holds its request's headers (about 0.7 KiB) as long as it lasts",
    check=_check,
    apply=_apply,
    in_place=_in_place,
)
MENDS = (LEAN_REQUEST_INFO,)
