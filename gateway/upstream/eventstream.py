"""AWS's binary event-stream framing (``application/vnd.amazon.eventstream``), both ways.

The framing of Bedrock's streams (``converse-stream``, ``invoke-with-response-stream``). A
message is::

    total length (u32) | headers length (u32) | prelude CRC (u32, of the 8 bytes before)
    headers: name length (u8) | name (UTF-8) | type (u8) | value ...
    payload
    message CRC (u32, of every byte before it)

all big-endian; the CRCs are CRC-32 (zlib's). Header value types: 0 true, 1 false, 2 int8,
3 int16, 4 int32, 5 int64, 6 bytes (u16 length), 7 string (u16 length), 8 timestamp (int64
milliseconds, read as an int), 9 UUID (16 bytes, read as bytes): the values botocore's parser
gives, and it is the reference the tests hold this decoder to.

- ``EventStreamDecoder``: fed byte chunks split anywhere, it returns the messages completed so
  far as ``(headers, payload)``; every CRC is checked, and a corrupt, oversized or cut stream
  raises ``EventStreamError`` (an ``UpstreamError``: the upstream sent bytes that are not its
  protocol), never skipped. A read is read where it lies; a message split across reads waits
  until it is whole, and is copied once. The prelude's CRC is checked before any length it
  gives is believed; the message's is then computed from the prelude's CRC on, over the rest
  of its bytes (a slice: a message is a few hundred bytes, and slicing costs less than a
  view). A stream's messages carry the same few headers, so headers
  already read are looked up by their bytes rather than read again (``KNOWN_HEADERS``: their
  dicts are shared, read-only).
- ``EventStreamParser``: the same stream as the ``SSEEvent`` values the protocols' stream
  decoders read (see ``gateway.protocols.bedrock``): an event is ``SSEEvent(:event-type,
  payload)``; an exception (``:message-type: exception``) is ``SSEEvent("exception:" +
  :exception-type, payload)``, and an ``error`` message ``SSEEvent("exception:" + :error-code,
  {"message": :error-message})``. It has ``SSEParser``'s shape, so a converted stream's loop
  reads either.
- ``encode_message``: the other way, for the fake upstream and the tests.

Not hand-rolled crypto: CRC-32 is an integrity check, not a signature (SigV4 is ``sigv4.py``).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Mapping
from typing import NamedTuple
from zlib import crc32

import orjson

from gateway.errors import UpstreamError
from gateway.protocols.bedrock import EXCEPTION_PREFIX, is_exception
from gateway.protocols.sse import SSEEvent

HeaderValue = bool | int | bytes | str
PRELUDE = struct.Struct(">III")
PRELUDE_LENGTH = 12  # total length, headers length, prelude CRC
CRC_LENGTH = 4
MIN_LENGTH = PRELUDE_LENGTH + CRC_LENGTH
MAX_HEADERS_LENGTH = 128 * 1024  # botocore's limits: a larger message is refused
MAX_PAYLOAD_LENGTH = 24 * 1024 * 1024
INTEGERS = {2: struct.Struct(">b"), 3: struct.Struct(">h"), 4: struct.Struct(">i")}
INT64 = struct.Struct(">q")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
TRUE, FALSE, INT8, INT16, INT32, INT64_TYPE, BYTES, STRING, TIMESTAMP, UUID = range(10)
MAX_KNOWN_HEADERS = 64  # distinct header blocks remembered (Bedrock's streams use a few)


class EventStreamError(UpstreamError):
    """The upstream's event stream is not well framed (a CRC, a length, a header)."""

    def __init__(self, what: str) -> None:
        super().__init__(f"upstream sent a corrupt event stream: {what}")


class EventMessage(NamedTuple):
    headers: dict[str, HeaderValue]
    payload: bytes


def _headers(raw: bytes) -> dict[str, HeaderValue]:
    headers: dict[str, HeaderValue] = {}
    pos = 0
    end = len(raw)
    try:
        while pos < end:
            size = raw[pos]
            name = raw[pos + 1 : pos + 1 + size].decode()
            pos += 1 + size
            kind = raw[pos]
            pos += 1
            value: HeaderValue
            if kind == STRING or kind == BYTES:
                (size,) = U16.unpack_from(raw, pos)
                data = raw[pos + 2 : pos + 2 + size]
                if len(data) != size:
                    raise EventStreamError("a header value runs past the headers")
                value = data.decode() if kind == STRING else data
                pos += 2 + size
            elif kind == TRUE or kind == FALSE:
                value = kind == TRUE
            elif kind in INTEGERS:
                fmt = INTEGERS[kind]
                (value,) = fmt.unpack_from(raw, pos)
                pos += fmt.size
            elif kind == INT64_TYPE or kind == TIMESTAMP:
                (value,) = INT64.unpack_from(raw, pos)
                pos += 8
            elif kind == UUID:
                value = raw[pos : pos + 16]
                if len(value) != 16:
                    raise EventStreamError("a header value runs past the headers")
                pos += 16
            else:
                raise EventStreamError(f"unknown header type {kind}")
            if name in headers:
                raise EventStreamError(f"header {name!r} given twice")
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError):
        raise EventStreamError("malformed headers") from None
    if pos != end:
        raise EventStreamError("a header value runs past the headers")
    return headers


def _bad_lengths(headers_length: int, payload_length: int) -> str:
    if headers_length > MAX_HEADERS_LENGTH:
        return f"headers of {headers_length} bytes"
    if payload_length > MAX_PAYLOAD_LENGTH:
        return f"a payload of {payload_length} bytes"
    return "lengths that do not add up"


# the headers of the header blocks seen last, by their bytes (read-only: shared by messages)
KNOWN_HEADERS: dict[bytes, dict[str, HeaderValue]] = {}
# the names of plain events (``:message-type: event``), by their headers' bytes
KNOWN_EVENTS: dict[bytes, str] = {}


def headers_of(raw: bytes) -> dict[str, HeaderValue]:
    """``_headers(raw)``, read once per distinct block."""
    found = KNOWN_HEADERS.get(raw)
    if found is None:
        found = _headers(raw)
        if len(KNOWN_HEADERS) >= MAX_KNOWN_HEADERS:
            KNOWN_HEADERS.clear()
        KNOWN_HEADERS[raw] = found
    return found


class EventStreamDecoder:
    """Feed it bytes as they arrive; it returns the messages completed so far."""

    __slots__ = ("_buf", "_need")

    def __init__(self) -> None:
        self._buf = bytearray()  # a message begun and not yet whole
        self._need = 0  # the bytes ``_buf`` must hold before it can be looked at again

    def feed(self, raw: bytes) -> list[EventMessage]:
        return [EventMessage(headers_of(head), payload) for head, payload in self.frames(raw)]

    def frames(self, raw: bytes) -> list[tuple[bytes, bytes]]:
        """The messages completed so far as (their headers' bytes, their payload), checked.

        A read that begins a message is read in place; the bytes of a message begun and not
        yet whole wait in ``_buf`` and are read once it is (or its prelude is): a message
        that arrives in many reads is copied once, not once per read."""
        if self._buf:
            self._buf += raw
            if len(self._buf) < self._need:
                return []
            data = bytes(self._buf)
            self._buf.clear()
        else:
            data = raw
        frames: list[tuple[bytes, bytes]] = []
        pos = 0
        size = len(data)
        total = PRELUDE_LENGTH
        while size - pos >= PRELUDE_LENGTH:
            total, headers_length, prelude_crc = PRELUDE.unpack_from(data, pos)
            # the lengths are believed only once their CRC holds (checked only where the
            # message's failed, a changed length that still added up went through)
            if crc32(data[pos : pos + 8]) != prelude_crc:
                raise EventStreamError("prelude checksum mismatch")
            payload_length = total - headers_length - MIN_LENGTH
            if (
                headers_length > MAX_HEADERS_LENGTH
                or payload_length > MAX_PAYLOAD_LENGTH
                or payload_length < 0
            ):
                raise EventStreamError(_bad_lengths(headers_length, payload_length))
            end = pos + total - CRC_LENGTH
            if end + CRC_LENGTH > size:
                break
            # CRC-32 chains (crc(a + b) = crc(b, crc(a))): the prelude's CRC, checked, is the
            # CRC of its bytes, so the message's is computed on from it
            if crc32(data[pos + 8 : end], prelude_crc) != U32.unpack_from(data, end)[0]:
                raise EventStreamError("message checksum mismatch")
            split = pos + PRELUDE_LENGTH + headers_length
            frames.append((data[pos + PRELUDE_LENGTH : split], data[split:end]))
            pos = end + CRC_LENGTH
        if pos < size:
            self._buf += data[pos:] if pos else data
            self._need = total if size - pos >= PRELUDE_LENGTH else PRELUDE_LENGTH
        return frames

    @property
    def pending(self) -> bool:
        return bool(self._buf)

    def close(self) -> None:
        """At EOF: raises if the stream ended inside a message."""
        if self._buf:
            raise EventStreamError("the stream ended inside a message")


def event_of(message: EventMessage) -> SSEEvent:
    """A message as the protocols' stream decoders read it (see the module docstring)."""
    headers, payload = message
    kind = headers.get(":message-type", "event")
    if kind == "event":
        name = headers.get(":event-type")
        return SSEEvent(name if isinstance(name, str) else None, payload)
    if kind == "exception":
        name = headers.get(":exception-type")
        return SSEEvent(EXCEPTION_PREFIX + (name if isinstance(name, str) else ""), payload)
    if kind == "error":
        code = headers.get(":error-code")
        text = headers.get(":error-message")
        body = orjson.dumps({"message": text if isinstance(text, str) else ""})
        return SSEEvent(EXCEPTION_PREFIX + (code if isinstance(code, str) else ""), body)
    raise EventStreamError(f"unknown message type {kind!r}")


class EventStreamParser:
    """An event stream read as ``SSEEvent`` values: ``SSEParser``'s interface (``feed``,
    ``close``, ``pending``) over ``EventStreamDecoder``. A plain event whose headers are the
    last one's bytes (a stream's events mostly are: Bedrock's ``chunk``, Converse's deltas) is
    named without hashing them."""

    __slots__ = ("_decoder", "_head", "_name")

    def __init__(self) -> None:
        self._decoder = EventStreamDecoder()
        self._head: bytes | None = None  # the headers of the last plain event, and its name
        self._name = ""

    def feed(self, raw: bytes) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        for head, payload in self._decoder.frames(raw):
            if head == self._head:
                events.append(SSEEvent(self._name, payload))
                continue
            name = KNOWN_EVENTS.get(head)  # a plain event's name, by its headers' bytes
            if name is None:
                event = event_of(EventMessage(headers_of(head), payload))
                if len(KNOWN_EVENTS) >= MAX_KNOWN_HEADERS:
                    KNOWN_EVENTS.clear()
                if event.event and not is_exception(event):
                    KNOWN_EVENTS[head] = event.event
                    self._head, self._name = head, event.event
                events.append(event)
            else:
                self._head, self._name = head, name
                events.append(SSEEvent(name, payload))
        return events

    def close(self) -> list[SSEEvent]:
        self._decoder.close()
        return []

    @property
    def pending(self) -> bool:
        return self._decoder.pending


# encoding ------------------------------------------------------------------------------------
def header_bytes(name: str, kind: int, value: HeaderValue) -> bytes:
    """One header in its wire form, of the given type."""
    raw_name = name.encode()
    head = bytes((len(raw_name),)) + raw_name + bytes((kind,))
    if kind == TRUE or kind == FALSE:
        return head
    if kind in INTEGERS:
        return head + INTEGERS[kind].pack(value)
    if kind == INT64_TYPE or kind == TIMESTAMP:
        return head + INT64.pack(value)
    if kind == UUID:
        assert isinstance(value, bytes) and len(value) == 16
        return head + value
    data = value.encode() if isinstance(value, str) else value
    assert isinstance(data, bytes)
    return head + U16.pack(len(data)) + data


def frame(headers: bytes, payload: bytes) -> bytes:
    """One message from its encoded headers and its payload."""
    total = MIN_LENGTH + len(headers) + len(payload)
    prelude = struct.pack(">II", total, len(headers))
    prelude += U32.pack(zlib.crc32(prelude))
    body = prelude + headers + payload
    return body + U32.pack(zlib.crc32(body))


def _kind(value: HeaderValue) -> int:
    if isinstance(value, bool):
        return TRUE if value else FALSE
    if isinstance(value, int):
        return INT64_TYPE
    if isinstance(value, bytes):
        return BYTES
    return STRING


def encode_message(headers: Mapping[str, HeaderValue], payload: bytes) -> bytes:
    """One message; a header's type follows its value's (str: string, bytes: bytes, bool,
    int: int64)."""
    raw = b"".join(header_bytes(name, _kind(value), value) for name, value in headers.items())
    return frame(raw, payload)


def encode_event(event_type: str, payload: bytes) -> bytes:
    """An ``event`` message as AWS sends it (JSON payload)."""
    headers = {
        ":event-type": event_type,
        ":content-type": "application/json",
        ":message-type": "event",
    }
    return encode_message(headers, payload)


def encode_exception(exception_type: str, payload: bytes) -> bytes:
    """An ``exception`` message as AWS sends it (JSON payload, ``{"message": ...}``)."""
    headers = {
        ":exception-type": exception_type,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return encode_message(headers, payload)
