"""Why the gateway stopped a request's task: the one way its timers interrupt a request.

Three timers may have to stop a request while it awaits something: the body deadline (its
upload stopped arriving: 408), the disconnect watch (its client went away: 499, and what was
generated is billed) and the keep-alive timer (a stream's upstream is long in answering: the
response starts, quiet). Each calls ``fire(cause)`` on the request's ``Interrupt``, which
records the cause and cancels the task. Where the ``CancelledError`` lands, ``absorb(cause)``
says whether it was that cause, and if so absorbs the cancellation so that the task goes on:
the pipeline reads the causes that end a request (``BODY_LATE``, ``CLIENT_GONE``), the attempt
the one that does not (``UPSTREAM_QUIET``). Any other cancellation (the server shutting down)
carries no cause and passes on untouched.
"""

from __future__ import annotations

import asyncio
from typing import Any

BODY_LATE = "body_late"
CLIENT_GONE = "client_gone"
UPSTREAM_QUIET = "upstream_quiet"


class Interrupt:
    """One request's interrupt: the task it stops, and the causes fired and not yet read."""

    __slots__ = ("task", "causes")

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.task = task
        self.causes: list[str] = []

    def fire(self, cause: str) -> None:
        """Stop the task for ``cause`` (once per cause; a second cause waits for the first
        to be read, then stops the task again)."""
        if self.task is None or cause in self.causes:
            return
        self.causes.append(cause)
        if len(self.causes) == 1:
            self.task.cancel()

    def absorb(self, cause: str) -> bool:
        """After a ``CancelledError``: True when ``cause`` fired (the cancellation is then
        absorbed; a cause still standing stops the task again at its next await), False
        for a cancellation that is not this cause's, to be passed on."""
        if cause not in self.causes:
            return False
        self.causes.remove(cause)
        if self.task is not None:
            self.task.uncancel()
            if self.causes:
                self.task.cancel()
        return True

    def fired(self, cause: str) -> bool:
        return cause in self.causes

    def release(self) -> None:
        """The request is over: nothing fires any more, and no reference to the task stays
        (a cycle through a cancelled task's traceback lives until a full collection)."""
        self.task = None
        self.causes.clear()
