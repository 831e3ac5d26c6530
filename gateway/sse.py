"""Server-sent events: an incremental parser that survives any chunk boundary, and framing.

The parser follows the WHATWG event-stream rules that matter for model APIs: lines end in
LF, CRLF or CR; ``event:`` and ``data:`` fields (several ``data:`` lines join with LF);
comments (``:``) and other fields are ignored; a blank line dispatches the event. Events with
no data are dropped (keep-alive pings).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SSEEvent:
    event: str | None
    data: bytes


class SSEParser:
    """Feed it bytes as they arrive; it returns the events completed so far."""

    __slots__ = ("_buf", "_event", "_data", "_pending_cr")

    def __init__(self) -> None:
        self._buf = b""
        self._event: str | None = None
        self._data: list[bytes] = []
        self._pending_cr = False

    def feed(self, raw: bytes) -> list[SSEEvent]:
        if self._pending_cr and raw.startswith(b"\n"):
            raw = raw[1:]  # the LF of a CRLF split across two chunks
        self._pending_cr = False
        buf = self._buf + raw if self._buf else raw
        events: list[SSEEvent] = []
        if b"\r" in buf:
            if buf.endswith(b"\r"):
                self._pending_cr = True
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                break
            line = buf[start:end]
            start = end + 1
            if not line:
                if self._data:
                    events.append(SSEEvent(self._event, b"\n".join(self._data)))
                self._event = None
                self._data = []
                continue
            if line[0] == 58:  # ":" comment
                continue
            colon = line.find(b":")
            if colon < 0:
                name, value = line, b""
            else:
                name = line[:colon]
                value = line[colon + 1 :]
                if value[:1] == b" ":
                    value = value[1:]
            if name == b"data":
                self._data.append(value)
            elif name == b"event":
                self._event = value.decode("utf-8", "replace")
        self._buf = buf[start:]
        return events

    def close(self) -> list[SSEEvent]:
        """At EOF: an event not ended by a blank line is still delivered (lenient)."""
        events = self.feed(b"\n\n") if (self._buf or self._data) else []
        self._buf = b""
        return events

    @property
    def pending(self) -> bool:
        return bool(self._buf or self._data)


def frame(data: bytes, event: str | None = None) -> bytes:
    """One SSE event. ``data`` must not contain a newline (orjson output never does)."""
    if event is None:
        return b"data: " + data + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


DONE = b"data: [DONE]\n\n"
