"""Cancellation for the store's background tasks (the cache's reload, the usage writer).

Some clients (redis-py's pipelines) swallow a cancellation that lands mid-command, so a task
that was cancelled can find itself running on after a store call: it checks with
``raise_if_cancelled`` after every one. ``cancel_and_wait`` stops such a task from outside.
"""

from __future__ import annotations

import asyncio


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def raise_if_cancelled() -> None:
    """Raise ``CancelledError`` if the current task was cancelled, even if the cancellation
    was swallowed on the way here."""
    if _cancelling():
        raise asyncio.CancelledError


async def cancel_and_wait(task: asyncio.Task[object]) -> None:
    """Cancel ``task`` and wait until it ends. Its cancellation stops here; the caller's own
    goes on."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if _cancelling():
            raise
