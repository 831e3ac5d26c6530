"""The process's log set-up: level and line format as ``logging:`` says, and one line, not a
traceback, for each request uvicorn cancels once ``server.graceful_seconds`` are over."""

from __future__ import annotations

import asyncio
import logging

from gateway.config import Settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(process)d %(message)s"


def configure_logging(settings: Settings) -> None:
    """The log's level and line format, as ``logging:`` says: in the server's process, and
    again in each worker process (``create_app()``), which starts with logging unset (a
    spawned process inherits none of it). A process whose logging is set up already keeps
    its handlers (``basicConfig`` adds none then); its level is set all the same."""
    level = settings.logging.level.upper()
    logging.basicConfig(level=level, format=LOG_FORMAT)
    logging.getLogger().setLevel(level)
    logging.getLogger("uvicorn.error").addFilter(CUT_AT_SHUTDOWN)  # once: the same filter


class CutAtShutdown(logging.Filter):
    """uvicorn logs "Exception in ASGI application" with a traceback for each request it
    cancels when its graceful shutdown is over (a stream longer than ``graceful_seconds``, at
    every rolling restart). It cancels a request nowhere else (a client that leaves is an
    ``http.disconnect``), so each such record becomes one warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError):
            record.msg, record.args = "server.request_cut reason=graceful_seconds_over", ()
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


CUT_AT_SHUTDOWN = CutAtShutdown()
