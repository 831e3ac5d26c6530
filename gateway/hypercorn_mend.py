"""A mend for hypercorn (0.18, the newest): a connection its client closed while idle is let go
at once instead of after the keep-alive.

hypercorn's ``TCPServer`` runs a connection in a TaskGroup that holds, between requests, an
idle task sleeping ``keep_alive_timeout``. When the client closes an idle connection, the read
loop ends, but the idle task is only stopped in the ``finally`` that runs after the TaskGroup
exits, and the TaskGroup waits for it: the socket stays in CLOSE_WAIT and the connection's
objects (TaskGroup, tasks, StreamWriter, the tracebacks of its cancelled tasks) stay alive for
the whole keep-alive (bench/RESULTS.md, "Garbage collection", has what that cost).

The mend stops the idle task as soon as the read loop has ended. Nothing can arrive on the
connection any more, so nothing is lost; a request still being answered is not touched (its
stream was closed by the read loop, as before). A hypercorn without that read loop or idle task
is left alone, and says so in the log once.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("gateway.server")
_MENDED = "_gateway_mended_idle_close"


def mend_hypercorn() -> bool:
    """Mend hypercorn's TCPServer if this process has loaded it; True when it is mended."""
    module = sys.modules.get("hypercorn.asyncio.tcp_server")
    server_class = getattr(module, "TCPServer", None)
    if server_class is None:
        return False
    if getattr(server_class, _MENDED, False):
        return True
    read_data: Callable[[Any], Coroutine[Any, Any, None]] | None = getattr(
        server_class, "_read_data", None
    )
    if read_data is None:
        log.warning("server.hypercorn_not_mended reason=no_read_loop")
        return False

    async def _read_data(self: Any) -> None:
        await read_data(self)
        idle_task = getattr(self, "idle_task", None)
        if idle_task is not None:
            await idle_task.stop()

    server_class._read_data = _read_data
    setattr(server_class, _MENDED, True)
    return True
