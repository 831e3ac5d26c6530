"""A mend of aiohttp (written for 3.14) that opens a new upstream connection to a single
address in one step of the event loop: ``aiohttp.lean_connect``, of kind ``speed``
(bench/RESULTS.md, "A new connection in one step"); a ``gateway.server.mends.Mend``, checked
before it is applied, and left out with a warning when it does not fit.

Why: aiohttp opens every connection through ``aiohappyeyeballs``, written for a name with
several addresses: it makes a ``socket.socket`` (its family and type turned into enums),
connects it with ``loop.sock_connect`` (a writer registered and removed, a future, a turn of
the loop), then hands it to ``loop.create_connection(sock=...)`` (another future, another
turn). A turn is short on a quiet loop; in a burst each one holds hundreds of other
streams' set-ups and reads, and every turn a new connection waits adds to its stream's
first byte.

How: the pool's connector (``pool.RecentFirstConnector``, a ``LeanConnector``) wraps
``_wrap_create_connection``. Where aiohttp has one address to try (an IP literal, or a name
its resolver gave one address for) and the connector binds no local address and makes no
socket of its own, the wrapper asks the event loop to connect to that address and make the
transport in one call (``loop.create_connection(host=, port=)``, with the TLS context and
server name aiohttp gives, TLS's shutdown timeout as aiohttp adds it), under aiohttp's own
connect timeout (``ceil_timeout`` of the call's ``sock_connect``): a timeout is raised as
aiohttp raises it. A connect that fails otherwise (refused, reset, a certificate not
trusted) is tried again aiohttp's way, which says why in its own errors
(``ClientConnectorError`` and its TLS kinds). Several addresses go aiohttp's way too (happy
eyeballs across them).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import aiohttp.connector
import aiohttp.helpers

from gateway.server.mends import Mend, Needs, mended, wrapping

_NAME = "aiohttp.lean_connect"
# what aiohttp's own ``_wrap_create_connection`` takes and reads, which the wrapper relies on
WRAP_PARAMS = ("self", "args", "addr_infos", "req", "timeout", "client_error", "kwargs")
WRAP_READS = ("ceil_timeout", "sock_connect", "ceil_threshold", "_local_addr_infos",
              "_socket_factory", "_ssl_shutdown_timeout", "create_connection",
              "start_connection")  # fmt: skip
CONNECTOR_FIELDS = ("_loop", "_local_addr_infos", "_socket_factory", "_ssl_shutdown_timeout")


class LeanConnector(aiohttp.TCPConnector):
    """A ``TCPConnector`` whose ``_wrap_create_connection`` is the mend's once it is in place
    (aiohttp's own until then, and where the mend does not fit)."""


def _one_address(addr_infos: list[Any]) -> tuple[int, str, int] | None:
    """(family, host, port) of the only address to try; None for several, or for an IPv6
    address with a flow label or a scope (which only a socket address carries)."""
    if len(addr_infos) != 1:
        return None
    family, _, _, _, address = addr_infos[0]
    if family == socket.AF_INET:
        return family, address[0], address[1]
    if family == socket.AF_INET6 and address[2] == 0 and address[3] == 0:
        return family, address[0], address[1]
    return None


def _lean_connect(wrap: Any) -> Any:
    """``_wrap_create_connection`` over aiohttp's own ``wrap`` (module docstring)."""

    async def _wrap_create_connection(
        self: aiohttp.TCPConnector,
        *args: Any,
        addr_infos: list[Any],
        req: Any,
        timeout: aiohttp.ClientTimeout,
        client_error: type[Exception] = aiohttp.ClientConnectorError,
        **kwargs: Any,
    ) -> Any:
        one = _one_address(addr_infos)
        if one is not None and self._local_addr_infos is None and self._socket_factory is None:
            family, host, port = one
            shutdown = self._ssl_shutdown_timeout if kwargs.get("ssl") else None
            tls = {"ssl_shutdown_timeout": shutdown} if shutdown else {}  # as aiohttp adds it
            try:
                async with aiohttp.helpers.ceil_timeout(
                    timeout.sock_connect, ceil_threshold=timeout.ceil_threshold
                ):
                    loop: Any = self._loop  # a factory and aiohttp's TLS arguments: ``*args``
                    return await loop.create_connection(
                        *args, host=host, port=port, family=family, **kwargs, **tls
                    )
            except TimeoutError:
                raise  # as aiohttp's own raises a connect timeout
            except OSError:
                pass  # aiohttp's way, for its own account of what failed
        return await wrap(
            self, *args, addr_infos=addr_infos, req=req, timeout=timeout,
            client_error=client_error, **kwargs,
        )  # fmt: skip

    return _wrap_create_connection


def _check() -> list[str]:
    needs = Needs()
    where = "aiohttp.TCPConnector"
    wrap = needs.function(
        aiohttp.TCPConnector, "_wrap_create_connection", where, WRAP_PARAMS, coroutine=True
    )
    needs.uses(wrap, WRAP_READS, f"{where}._wrap_create_connection")
    direct = needs.attr(aiohttp.TCPConnector, "_create_direct_connection", where)
    needs.uses(direct, ["_wrap_create_connection"], f"{where}._create_direct_connection")
    needs.require(
        getattr(aiohttp.connector, "ceil_timeout", None) is aiohttp.helpers.ceil_timeout,
        "aiohttp.connector.ceil_timeout is not aiohttp.helpers.ceil_timeout",
    )
    loop = asyncio.new_event_loop()  # a connector of its own to look at, never run
    try:
        sample = aiohttp.TCPConnector(loop=loop)
        for name in CONNECTOR_FIELDS:
            needs.attr(sample, name, f"{where}()")
    finally:
        loop.close()
    return needs.missing


def _apply() -> None:
    wrap = aiohttp.TCPConnector._wrap_create_connection
    LeanConnector._wrap_create_connection = wrapping(  # type: ignore[method-assign]
        _NAME, wrap, _lean_connect(wrap)
    )


def _in_place() -> bool:
    return mended(vars(LeanConnector).get("_wrap_create_connection"), _NAME)


LEAN_CONNECT = Mend(
    name=_NAME,
    library="aiohttp",
    written_for="3.14",
    kind="speed",
    fixes="a new upstream connection takes aiohappyeyeballs' two turns of the loop",
    check=_check,
    apply=_apply,
    in_place=_in_place,
)
MENDS = (LEAN_CONNECT,)
