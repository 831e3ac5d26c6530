"""The body chunks of a stream written to the client's connection past uvicorn's ASGI
``send`` (``gateway.server.body_writers``), for the httptools protocol of uvicorn 0.54.

What ``RequestResponseCycle.send`` does for an ``http.response.body`` with more to come on a
chunked response, done without the message or the coroutine: the chunk framed
(``<size in hex>\\r\\n<body>\\r\\n``) and written to the transport; nothing when the client
has gone (uvicorn drops the message too). Where uvicorn's ``send`` would wait (its flow
control paused by a client that reads slowly) or refuse (the response complete), the writer
says it cannot, and the ASGI ``send`` is used. A mend, ``uvicorn.direct_body``, of kind
``speed``: where the installed uvicorn's cycle differs, it is left out with a warning and
every chunk goes through ``send``.
"""

from __future__ import annotations

from typing import Any

from gateway.server.body_writers import BodyWriter
from gateway.server.mends import Mend, Needs, module_flag

_CYCLE = "uvicorn.protocols.http.httptools_impl.RequestResponseCycle"
_on = False  # the mend is in place


def _check() -> list[str]:
    needs = Needs()
    impl = needs.module("uvicorn.protocols.http.httptools_impl")
    cycle = needs.attr(impl, "RequestResponseCycle", "uvicorn.protocols.http.httptools_impl")
    # what the writer reads, and what send itself reads and writes a chunk with
    state = ["transport", "flow", "disconnected", "response_started", "response_complete",
             "chunked_encoding", "scope"]  # fmt: skip
    needs.uses(getattr(cycle, "__init__", None), state, f"{_CYCLE}.__init__")
    send = needs.function(cycle, "send", _CYCLE, ("self", "message"), coroutine=True)
    needs.uses(send, [*state, "write_paused", "write"], f"{_CYCLE}.send")
    flow = needs.module("uvicorn.protocols.http.flow_control")
    control = needs.attr(flow, "FlowControl", "uvicorn.protocols.http.flow_control")
    needs.uses(getattr(control, "pause_writing", None), ["write_paused"],
               "uvicorn.protocols.http.flow_control.FlowControl.pause_writing")  # fmt: skip
    return needs.missing


_apply, _in_place = module_flag(__name__)  # sets and reads _on


MEND = Mend(
    name="uvicorn.direct_body",
    library="uvicorn",
    written_for="0.54",
    kind="speed",
    fixes="each chunk of a stream goes through an ASGI message and a coroutine",
    check=_check,
    apply=_apply,
    in_place=_in_place,
)
MENDS = (MEND,)


def writer(cycle: Any) -> BodyWriter | None:
    """The writer of ``cycle``'s body chunks: for a chunked response under way (not a
    HEAD's); else None."""
    if not cycle.response_started or cycle.chunked_encoding is not True:
        return None
    if cycle.scope["method"] == "HEAD":
        return None
    flow, transport = cycle.flow, cycle.transport

    def write(body: bytes) -> bool:
        if flow.write_paused or cycle.response_complete:
            return False  # uvicorn's send waits for the client, or refuses
        if not cycle.disconnected:
            transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return True

    return write
