"""The WHERE clauses that the usage and audit queries of ``SQLiteStore`` share: a status (an
HTTP status or ``ok``/``error``) and a period (``since`` included, ``until`` not), over the
``status`` and ``time`` (micro-seconds) columns both tables have."""

from __future__ import annotations

from datetime import datetime

from gateway.store.records import to_micros


def status_and_period(
    status: int | str | None, since: datetime | None, until: datetime | None
) -> tuple[list[str], list[object]]:
    """The clauses (ANDed) and their arguments for what is given."""
    clauses: list[str] = []
    args: list[object] = []
    if status == "ok":
        clauses.append("status < 400")
    elif status == "error":
        clauses.append("status >= 400")
    elif status is not None:
        clauses.append("status = ?")
        args.append(status)
    if since is not None:
        clauses.append("time >= ?")
        args.append(to_micros(since))
    if until is not None:
        clauses.append("time < ?")
        args.append(to_micros(until))
    return clauses, args
