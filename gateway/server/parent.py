"""A worker process that ends with the server process that started it.

Every server's workers (hypercorn's and uvicorn's with ``--workers 2`` or more, granian's
always) are processes of their own that went on serving when their parent was killed with
SIGKILL (the OOM killer, a supervisor's last resort): orphans that still hold the port, their
streams and their journal, beside the server the supervisor starts next. ``end_with_parent``
asks Linux to send the worker a signal when its parent dies (``PR_SET_PDEATHSIG``: SIGTERM, or
SIGKILL for a worker that ignores SIGTERM), and ends a worker still starting at once if its
parent is gone already. Elsewhere it does nothing.

That one SIGTERM can be lost: uvloop drops a signal that arrives while its loop is not running,
and a granian worker runs its loop twice (the lifespan's start-up, then serving), so a parent
killed between the two left the worker serving as an orphan. A worker that stops on SIGTERM
therefore also keeps a thread that waits for the parent's end (a pidfd: no wake-ups before it)
and kills the worker with SIGKILL if it still runs a deadline later, as the server would have.
It sends no second SIGTERM: a granian worker that got one already and is letting its streams
finish stopped relaying for good on the next (its loop blocked in granian's code).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import threading
import time

PARENT_ENV = "GATEWAY_SERVER_PID"  # set by the server process before it starts its workers
PR_SET_PDEATHSIG = 1
# what a worker gets past ``server.graceful_seconds`` to end of itself once its parent has died
# (its lifespan's end flushes the last usage records) before it is killed
SHUTDOWN_SECONDS = 5.0
POLL_SECONDS = 1.0  # between two looks at the parent where no pidfd tells of its end


def mark_parent() -> None:
    """In the server process, before its workers start: they end with it."""
    os.environ[PARENT_ENV] = str(os.getpid())


def end_with_parent(deadline_seconds: float) -> bool:
    """In a worker: SIGTERM when the process named by ``PARENT_ENV`` dies, and SIGKILL if the
    worker still runs ``deadline_seconds`` after that. Whether that was set up (Linux, and a
    parent named)."""
    parent = int(os.environ.get(PARENT_ENV, "0") or 0)
    if not parent or parent == os.getpid() or not sys.platform.startswith("linux"):
        return False
    ignored = signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    sig = signal.SIGKILL if ignored else signal.SIGTERM
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # it died before the request above was made: this worker,
        os._exit(0)  # still starting, has nothing to finish
    if sig == signal.SIGTERM:  # SIGKILL is never lost
        threading.Thread(
            target=_kill_after, args=(parent, deadline_seconds), name="end-with-parent", daemon=True
        ).start()
    return True


def _kill_after(parent: int, deadline_seconds: float) -> None:
    """Wait for ``parent`` to end, then kill this process if it runs ``deadline_seconds`` on."""
    _wait_for_end(parent)
    time.sleep(deadline_seconds)
    os.kill(os.getpid(), signal.SIGKILL)


def _wait_for_end(parent: int) -> None:
    """Return once ``parent`` has ended: a pidfd turns readable then (Linux 5.3); else a look
    at who the parent is every ``POLL_SECONDS``."""
    try:
        pidfd = os.pidfd_open(parent)
    except (AttributeError, OSError):  # an older kernel, or gone already
        while os.getppid() == parent:
            time.sleep(POLL_SECONDS)
        return
    try:
        select.select([pidfd], [], [])
    finally:
        os.close(pidfd)
