"""multipart/form-data uploads: an incremental reader-rewriter for bodies relayed as they arrive.

Owns the wire format of RFC 7578 bodies (RFC 2046 framing): the boundary in a Content-Type,
part headers, capturing text fields, and forwarding file content without holding it. Pure: no
I/O and no clock; the relay feeds it the client's chunks and sends on what it returns.

Decisions:

- The preamble and the epilogue are dropped. Delimiter lines are normalised to ``--boundary``
  and CRLF (transport padding removed), header lines to CRLF endings; every other byte is
  forwarded unchanged, except the values of the fields named in ``replace``.
- File parts (a ``filename`` or ``filename*`` parameter) are forwarded as they arrive; only what
  may be the start of a delimiter (its length plus ``MAX_PADDING``) is held back. Text fields
  are held until complete, at most ``max_field_bytes``.
- ``replace`` is consulted as each field completes, after the field is recorded in ``fields``,
  so a lazy Mapping may compute a replacement from what has been read.
- ``--boundary`` followed by anything but ``--`` or padding and a line end is data, as in the
  standard library's email parser. A part's content ends only at CRLF ``--boundary``: a bare LF
  before it is file data, never a line end.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import unquote

from gateway.errors import InvalidRequestError

MAX_HEADER_BYTES = 16384  # one part's header block
MAX_PADDING = 32  # spaces or tabs after a delimiter, before its line end
MAX_PARTS = 256  # bounds the memory of ``fields`` and ``files``

_PREAMBLE, _HEADERS, _FIELD, _FILE, _DONE = range(5)
_NEED = -1  # the delimiter line is not complete yet
_CLOSE = -2  # the close delimiter, ``--boundary--``

_PARAM = re.compile(r';\s*([^\s=;]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)')
_ESCAPED = re.compile(r'\\([\\"])')
_BOUNDARY = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")


def boundary_of(content_type: str) -> bytes:
    """The boundary of a ``multipart/form-data`` Content-Type header value."""
    kind, params = _params(content_type)
    if kind != "multipart/form-data":
        raise InvalidRequestError(f"Content-Type must be multipart/form-data, not {kind[:80]!r}")
    boundary = params.get("boundary", "")
    if not _BOUNDARY.fullmatch(boundary):
        raise InvalidRequestError(
            "Content-Type multipart/form-data needs a boundary of 1 to 70 characters (RFC 2046)"
        )
    return boundary.encode("ascii")


def _params(value: str) -> tuple[str, dict[str, str]]:
    """The lower-cased type and the parameters (first wins) of ``type; a=1; b="x y"``."""
    kind, sep, rest = value.partition(";")
    params: dict[str, str] = {}
    for m in _PARAM.finditer(sep + rest):
        v = m[2].strip()
        if len(v) >= 2 and v[0] == v[-1] == '"':
            v = _ESCAPED.sub(r"\1", v[1:-1])
        params.setdefault(m[1].lower(), v)
    return kind.strip().lower(), params


def _read_headers(block: bytes) -> tuple[bytes, str, str | None, str]:
    """A part's header block (without its blank line): the block normalised to CRLF, the field
    name, the filename (None for a text field) and the content type (RFC 7578 default)."""
    lines = [line.removesuffix(b"\r") for line in block.split(b"\n")]
    headers: dict[str, str] = {}
    last = ""
    for raw in lines:
        try:
            line = raw.decode()
        except UnicodeDecodeError:
            raise InvalidRequestError("multipart part headers are not valid UTF-8") from None
        if line[:1] in (" ", "\t") and last:  # obsolete line folding
            headers[last] += " " + line.strip()
            continue
        header, colon, value = line.partition(":")
        last = header.strip().lower()
        if not colon or not last:
            raise InvalidRequestError("multipart part has a header line without a name")
        headers.setdefault(last, value.strip())
    if "content-disposition" not in headers:
        raise InvalidRequestError("multipart part has no Content-Disposition header")
    kind, params = _params(headers["content-disposition"])
    name = params.get("name")
    if kind != "form-data" or name is None:
        raise InvalidRequestError("multipart part's Content-Disposition is not form-data; name=")
    filename = params.get("filename")
    if "filename*" in params:  # RFC 8187: charset'language'percent-encoded
        charset, _, encoded = params["filename*"].partition("'")
        encoded = encoded.partition("'")[2]
        if charset.lower() not in ("utf-8", "iso-8859-1"):
            raise InvalidRequestError("multipart filename* must be UTF-8 or ISO-8859-1")
        try:
            filename = unquote(encoded, encoding=charset, errors="strict")
        except UnicodeDecodeError:
            raise InvalidRequestError(f"multipart filename* is not valid {charset}") from None
    return (
        b"\r\n".join(lines) + b"\r\n\r\n",
        name,
        filename,
        headers.get("content-type", "text/plain"),
    )


class MultipartRewriter:
    """Feed it the body as it arrives; it returns the rewritten bytes ready to forward.

    The buffer holds the unread rest of the body: a part's headers, a text field's value, or
    the tail of file content that may begin a delimiter. ``_scan`` is where the next search
    starts, so bytes already searched are not searched again.
    """

    __slots__ = (
        "_delim", "_replace", "_max_field", "_buf", "_scan", "_state", "_name",
        "_opened", "_parts", "fields", "field_values", "files", "file_bytes", "done",
    )  # fmt: skip

    def __init__(
        self,
        boundary: bytes,
        replace: Mapping[str, str] | None = None,
        max_field_bytes: int = 65536,
    ) -> None:
        self._delim = b"\r\n--" + boundary
        self._replace: Mapping[str, str] = replace if replace is not None else {}
        self._max_field = max_field_bytes
        self._buf = bytearray(b"\r\n")  # the first delimiter may open the body without a CRLF
        self._scan = 0
        self._state = _PREAMBLE
        self._name = ""  # of the part being read
        self._opened = False  # a delimiter went out: the next one needs its CRLF
        self._parts = 0
        self.fields: dict[str, str] = {}  # the first value of each text field
        self.field_values: dict[str, list[str]] = {}  # every value, in order
        self.files: list[tuple[str, str, str]] = []  # (field name, filename, content type)
        self.file_bytes = 0
        self.done = False

    @property
    def buffered(self) -> int:
        """Bytes held back: read but not yet forwarded or dropped."""
        return len(self._buf)

    def feed(self, data: bytes) -> bytes:
        if self.done:
            return b""  # the epilogue
        self._buf += data
        out: list[bytes] = []
        while self._state != _DONE and (
            self._headers(out) if self._state == _HEADERS else self._content(out)
        ):
            pass
        return b"".join(out)

    def close(self) -> bytes:
        """At the end of the body: everything was forwarded unless the body was cut short."""
        if not self.done:
            raise InvalidRequestError("multipart body ended before its closing delimiter")
        return b""

    def _next_delimiter(self) -> tuple[int, int]:
        """(start, end) of the first delimiter from ``_scan`` on: end is where its line ends,
        ``_CLOSE`` for the close delimiter, or ``_NEED`` (then start is -1 if none began)."""
        buf, delim = self._buf, self._delim
        start = buf.find(delim, self._scan)
        while start >= 0:
            at = start + len(delim)
            tail = bytes(buf[at : at + MAX_PADDING + 2])
            if tail.startswith(b"--"):
                return start, _CLOSE
            pad = len(tail) - len(tail.lstrip(b" \t"))
            rest = tail[pad:]
            if rest.startswith(b"\r\n"):
                return start, at + pad + 2
            if rest.startswith(b"\n"):
                return start, at + pad + 1
            if (rest in (b"", b"\r") and pad < MAX_PADDING) or tail == b"-":
                return start, _NEED
            start = buf.find(delim, start + 1)  # data that only looks like a delimiter
        return -1, _NEED

    def _content(self, out: list[bytes]) -> bool:
        """Preamble, field or file content up to the next delimiter; False if it needs more."""
        buf = self._buf
        start, end = self._next_delimiter()
        if end == _NEED:
            safe = start if start >= 0 else max(len(buf) - len(self._delim) + 1, 0)
            if self._state == _FIELD:
                if safe > self._max_field:
                    raise self._too_long()
                self._scan = safe
                return False
            if self._state == _FILE and safe:
                out.append(bytes(buf[:safe]))
                self.file_bytes += safe
            del buf[:safe]  # file content forwarded, or preamble dropped
            self._scan = 0
            return False
        if self._state == _FILE:
            out.append(bytes(buf[:start]))
            self.file_bytes += start
        elif self._state == _FIELD:
            out.append(self._field(bytes(buf[:start])))
        out.append(self._delim if self._opened else self._delim[2:])
        self._opened = True
        if end == _CLOSE:
            out.append(b"--\r\n")
            buf.clear()
            self.done, self._state = True, _DONE
            return False
        out.append(b"\r\n")
        del buf[:end]
        self._scan, self._state = 0, _HEADERS
        return True

    def _headers(self, out: list[bytes]) -> bool:
        """A part's header block; False if it needs more."""
        buf = self._buf
        if buf.startswith(b"\n") or buf.startswith(b"\r\n"):
            raise InvalidRequestError("multipart part has no headers")
        limit = MAX_HEADER_BYTES + 3
        found = [
            (i, n)
            for blank, n in ((b"\n\r\n", 3), (b"\n\n", 2))
            if (i := buf.find(blank, self._scan, limit)) >= 0
        ]
        if not found:
            if len(buf) >= limit:
                raise InvalidRequestError(
                    f"multipart part headers are over {MAX_HEADER_BYTES} bytes"
                )
            self._scan = max(len(buf) - 2, 0)
            return False
        end, n = min(found)
        if end > MAX_HEADER_BYTES:
            raise InvalidRequestError(f"multipart part headers are over {MAX_HEADER_BYTES} bytes")
        block, self._name, filename, content_type = _read_headers(bytes(buf[:end]))
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise InvalidRequestError(f"multipart body has over {MAX_PARTS} parts")
        if filename is None:
            self._state = _FIELD
        else:
            self._state = _FILE
            self.files.append((self._name, filename, content_type))
        out.append(block)
        del buf[: end + n]
        self._scan = 0
        return True

    def _field(self, raw: bytes) -> bytes:
        """A complete text field: record it, and return the bytes to forward as its value."""
        name = self._name
        if len(raw) > self._max_field:
            raise self._too_long()
        try:
            value = raw.decode()
        except UnicodeDecodeError:
            raise InvalidRequestError(
                f"multipart field {name[:100]!r} is not valid UTF-8"
            ) from None
        self.fields.setdefault(name, value)
        self.field_values.setdefault(name, []).append(value)
        replacement = self._replace.get(name)
        return raw if replacement is None else replacement.encode()

    def _too_long(self) -> InvalidRequestError:
        return InvalidRequestError(
            f"multipart field {self._name[:100]!r} is over {self._max_field} bytes"
        )
