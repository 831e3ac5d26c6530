"""The SSE parser: WHATWG line rules across any chunk boundary (table-driven)."""

from __future__ import annotations

import pytest

from gateway.protocols.sse import SSEEvent, SSEParser, frame

CASES = [
    ("one data line", b'data: {"a":1}\n\n', [(None, b'{"a":1}')]),
    (
        "named events",
        b"event: ping\ndata: {}\n\nevent: x\ndata: 1\n\n",
        [("ping", b"{}"), ("x", b"1")],
    ),
    ("CRLF lines", b"event: a\r\ndata: 1\r\n\r\ndata: 2\r\n\r\n", [("a", b"1"), (None, b"2")]),
    ("CR lines", b"data: 1\r\rdata: 2\r\r", [(None, b"1"), (None, b"2")]),
    ("several data lines join with LF", b"data: a\ndata: b\n\n", [(None, b"a\nb")]),
    ("comments and unknown fields", b": keep-alive\nid: 7\nretry: 10\ndata: x\n\n", [(None, b"x")]),
    ("no space after colon", b"data:x\n\n", [(None, b"x")]),
    ("event without data is dropped", b"event: ping\n\n: c\n\ndata: y\n\n", [(None, b"y")]),
    ("extra blank lines", b"\n\n\ndata: z\n\n\n\n", [(None, b"z")]),
    ("unterminated last event (close)", b"data: end", [(None, b"end")]),
    ("[DONE]", b"data: [DONE]\n\n", [(None, b"[DONE]")]),
    # an event line and a data line, and the shapes near it that read otherwise
    ("event then data, spaces kept", b"event:  a\ndata:  1 \n\n", [(" a", b" 1 ")]),
    ("data then event", b"data: 1\nevent: a\n\n", [("a", b"1")]),
    ("event then two data lines", b"event: a\ndata: 1\ndata: 2\n\n", [("a", b"1\n2")]),
    (
        "event line without data after data",
        b"data: 0\n\nevent: a\n\ndata: 1\n\n",
        [(None, b"0"), (None, b"1")],
    ),
    ("event then a field", b"event: a\nid: 3\ndata: 1\n\n", [("a", b"1")]),
    ("two event lines: the last", b"event: a\nevent: b\ndata: 1\n\n", [("b", b"1")]),
    ("event name not UTF-8", b"event: \xff\ndata: 1\n\n", [("\ufffd", b"1")]),
]


def parse(chunks: list[bytes]) -> list[tuple[str | None, bytes]]:
    p = SSEParser()
    events: list[SSEEvent] = []
    for c in chunks:
        events += p.feed(c)
    events += p.close()
    return [(e.event, e.data) for e in events]


@pytest.mark.parametrize(("raw", "expected"), [pytest.param(r, e, id=n) for n, r, e in CASES])
def test_whole(raw: bytes, expected: list[tuple[str | None, bytes]]) -> None:
    assert parse([raw]) == expected


@pytest.mark.parametrize(("raw", "expected"), [pytest.param(r, e, id=n) for n, r, e in CASES])
def test_split_at_every_offset_and_byte_by_byte(
    raw: bytes, expected: list[tuple[str | None, bytes]]
) -> None:
    for i in range(len(raw) + 1):
        assert parse([raw[:i], raw[i:]]) == expected, f"split at {i}"
    assert parse([raw[i : i + 1] for i in range(len(raw))]) == expected


def test_frame_round_trips() -> None:
    raw = frame(b'{"x":1}') + frame(b"2", event="delta")
    assert parse([raw]) == [(None, b'{"x":1}'), ("delta", b"2")]


def test_events_are_returned_as_soon_as_complete() -> None:
    p = SSEParser()
    assert p.feed(b"data: 1\n") == []
    assert [e.data for e in p.feed(b"\ndata: 2")] == [b"1"]
    assert p.pending
