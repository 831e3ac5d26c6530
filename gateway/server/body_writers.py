"""A stream's chunk written straight to the client's connection, past the server's ASGI
``send``, where the server serving the request allows it (``body_writer``).

A stream whose reads are direct (``upstream.direct_reads``) sends a chunk for every read of
its upstream; through ASGI each is a message dict, a coroutine made and stepped, and the
server's checks of what the message is. A ``BodyWriter`` writes the chunk in the response's
framing at once, or says it cannot (False: the client reads slowly, the response is over),
when the ASGI ``send`` is used as before. Which servers have one is found from the owner of
the ``send`` the app was given (``_MAKERS``); each is a speed mend of that server's
(``gateway.server.mends``), checked once in the process that first asks, so none is needed
for the gateway to serve.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from gateway.server.mends import fits
from gateway.types import Send

BodyWriter = Callable[[bytes], bool]
Maker = Callable[[Any], BodyWriter | None]

# the class of a server's ``send`` owner -> the module of ours that makes its writers (a
# ``writer(owner)`` and the mend ``MEND`` it relies on)
_MAKERS = {
    ("uvicorn.protocols.http.httptools_impl", "RequestResponseCycle"):
        "gateway.server.uvicorn_body",
}  # fmt: skip
_made: dict[type, Maker | None] = {}


def body_writer(send: Send) -> BodyWriter | None:
    """The writer of this response's body chunks, or None where the server has none (or its
    mend does not fit the installed server)."""
    owner = getattr(send, "__self__", None)
    if owner is None:
        return None
    kind = type(owner)
    try:
        make = _made[kind]
    except KeyError:
        make = _made[kind] = _maker(kind)
    return make(owner) if make is not None else None


def _maker(kind: type) -> Maker | None:
    name = _MAKERS.get((kind.__module__, kind.__qualname__))
    if name is None:
        return None
    module = importlib.import_module(name)
    maker: Maker = module.writer
    return maker if fits(module.MEND) else None
