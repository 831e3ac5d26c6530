"""Accept errors logged once per interval, not once per attempt.

When the process runs out of file descriptors (EMFILE, ENFILE) or buffers, asyncio's accept
loop reports every failed accept to the loop's exception handler, which logs a traceback
each time: under a flood of connections that was 118,783 tracebacks (51 MB) in minutes. This
handler counts them and logs one line per ``INTERVAL`` with the count. It also drops the
CancelledError that Python 3.11's streams report for each connection whose task was cancelled
(hypercorn's, when its graceful shutdown is over): a traceback per cut stream, which 3.12 no
longer logs. Every other exception goes to the handler that was there before.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from typing import Any

log = logging.getLogger("gateway.server")

INTERVAL = 60.0  # seconds between two lines about accept errors
ACCEPT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class AcceptErrors:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._previous = loop.get_exception_handler()
        self._since = 0.0  # when the last line was logged
        self.count = 0  # accept errors since then

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, asyncio.CancelledError):
            return
        if isinstance(exc, OSError) and exc.errno in ACCEPT_ERRNOS:
            self.count += 1
            now = time.monotonic()
            if now - self._since >= INTERVAL:
                log.error(
                    "server.accept_failed error=%s count=%d (logged once a minute at most)",
                    errno.errorcode.get(exc.errno or 0, exc.errno),
                    self.count,
                )
                self._since, self.count = now, 0
            return
        if self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)


def install(loop: asyncio.AbstractEventLoop) -> AcceptErrors:
    handler = AcceptErrors(loop)
    loop.set_exception_handler(handler)
    return handler
