"""Request ids: the gateway's own (a process tag and a counter: unique across workers and
restarts without a clock or a lock), and the client's ``x-request-id`` where it is safe to
echo. Used by the relay, the requests served outside it, and the server's own refusals."""

from __future__ import annotations

import itertools
import os
import re

_REQUEST_IDS = itertools.count(1)
_PROCESS_TAG = os.urandom(4).hex()

SAFE_ID = re.compile(rb"[A-Za-z0-9._:-]{1,128}")


def new_request_id() -> str:
    return f"{_PROCESS_TAG}{next(_REQUEST_IDS):08x}"


def request_ids(given: bytes | None) -> tuple[str, str]:
    """(the usage record's request_id, the reply's x-request-id). A client's own
    x-request-id that is a safe token (1-128 of A-Z a-z 0-9 . _ : -) is echoed, and is the
    record's id before ``/`` and the gateway's own id: a record's id stays unique (settlement
    recognises a record by it) even when a client sends the same id twice."""
    own = new_request_id()
    if given is None or not SAFE_ID.fullmatch(given):
        return own, own
    echoed = given.decode()
    return f"{echoed}/{own}", echoed
