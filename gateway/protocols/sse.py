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

    __slots__ = ("_buf", "_pending_cr")

    def __init__(self) -> None:
        self._buf = b""
        self._pending_cr = False

    def feed(self, raw: bytes) -> list[SSEEvent]:
        if self._pending_cr and raw.startswith(b"\n"):
            raw = raw[1:]  # the LF of a CRLF split across two chunks
        self._pending_cr = False
        search = max(len(self._buf) - 1, 0)  # no event end in what was already searched
        buf = self._buf + raw if self._buf else raw
        if 13 in buf:  # a CR (an int is looked for with memchr, without parsing arguments)
            if buf.endswith(b"\r"):
                self._pending_cr = True
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        events: list[SSEEvent] = []
        start = 0
        # whole events, one blank line apart; the usual event is a single ``data:`` line, or
        # an ``event:`` line and a ``data:`` line (Anthropic's, the Responses API's): both
        # read here as ``parse_event`` would, without its loop over the lines
        while True:
            end = buf.find(b"\n\n", max(start, search))
            if end < 0:
                break
            line = buf.find(b"\n", start, end)
            if line < 0 and buf.startswith(b"data: ", start):
                events.append(SSEEvent(None, buf[start + 6 : end]))
            elif (
                line > start
                and buf.startswith(b"event: ", start)
                and buf.startswith(b"data: ", line + 1)
                and buf.find(b"\n", line + 1, end) < 0
            ):
                name = buf[start + 7 : line].decode("utf-8", "replace")
                events.append(SSEEvent(name, buf[line + 7 : end]))
            elif end > start:
                event = parse_event(buf[start:end])
                if event is not None:
                    events.append(event)
            start = end + 2
        self._buf = buf[start:]
        return events

    def close(self) -> list[SSEEvent]:
        """At EOF: an event not ended by a blank line is still delivered (lenient)."""
        events = self.feed(b"\n\n") if self._buf.strip(b"\n") else []
        self._buf = b""
        return events

    @property
    def pending(self) -> bool:
        return bool(self._buf.strip(b"\n"))


def parse_event(block: bytes) -> SSEEvent | None:
    """One event's lines (LF line ends, no blank line among them, a trailing blank line
    allowed): fields, comments, several data lines. None when it holds no data."""
    event: str | None = None
    data: list[bytes] = []
    for line in block.split(b"\n"):
        if not line or line[0] == 58:  # empty (a stray leading LF) or ":" comment
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
            data.append(value)
        elif name == b"event":
            event = value.decode("utf-8", "replace")
    if not data:
        return None
    return SSEEvent(event, b"\n".join(data))


def frame(data: bytes, event: str | None = None) -> bytes:
    """One SSE event. ``data`` must not contain a newline (orjson output never does)."""
    if event is None:
        return b"data: " + data + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"


DONE = b"data: [DONE]\n\n"
