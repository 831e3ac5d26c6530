"""The process's log set-up: level and line format as ``logging:`` says."""

from __future__ import annotations

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
