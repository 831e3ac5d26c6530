"""A worker process that ends with the server process that started it.

Every server's workers (hypercorn's and uvicorn's with ``--workers 2`` or more, granian's
always) are processes of their own that went on serving when their parent was killed with
SIGKILL (the OOM killer, a supervisor's last resort): orphans that still hold the port, their
streams and their journal, beside the server the supervisor starts next. ``end_with_parent``
asks Linux to send the worker a signal when its parent dies (``PR_SET_PDEATHSIG``: SIGTERM, or
SIGKILL for a worker that ignores SIGTERM), and ends a worker still starting at once if its
parent is gone already. Elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "GATEWAY_SERVER_PID"  # set by the server process before it starts its workers
PR_SET_PDEATHSIG = 1


def mark_parent() -> None:
    """In the server process, before its workers start: they end with it."""
    os.environ[PARENT_ENV] = str(os.getpid())


def end_with_parent() -> bool:
    """In a worker: SIGTERM when the process named by ``PARENT_ENV`` dies. Whether that
    was set up (Linux, and a parent named)."""
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
    return True
