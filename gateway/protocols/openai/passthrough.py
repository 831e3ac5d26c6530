"""openai client, openai channel: the request with only its model renamed (and the usage
chunk asked for), the reply and its stream as they came, usage read on the way.
"""

from __future__ import annotations

import re

import orjson

from gateway.errors import GatewayError, UpstreamError
from gateway.protocols.base import Ctx, RouteMatch, UpstreamCall, UpstreamTarget
from gateway.protocols.openai.reply import error_body, stream_error
from gateway.protocols.openai.request import headers, output_limit, with_usage
from gateway.protocols.openai.stream import EVENT_STREAM, load_chunk
from gateway.protocols.sse import DONE, SSEEvent, SSEParser, frame, parse_event
from gateway.types import JSON, Usage

DONE_TAIL = 256  # bytes at a stream's end where its [DONE] is looked for (trailing comments)
NL_DONE = b"\n" + DONE
# a final "data: [DONE]" event and its blank line, with room for CRs and the LFs around it:
# the data event before it starts before this many bytes from a block's end
LAST_EVENT_MIN = 20
# a read up to this long (one or a few events, as paced streams come) is searched whole for an
# error at once: one search instead of finding its last event first
SMALL_BLOCK = 1024
USAGE_GAP = 16  # bytes between a "usage" key and its value looked at (colon and spaces)
# bytes are searched with find, not ``in``: CPython 3.11's ``bytes.__contains__`` tries its
# argument as an integer first, and raises and clears a TypeError with a formatted message
# for every bytes one (~1,600 instructions a search); an int (a CR, an LF) goes to memchr

# the events passed are counted for generated text only when asked (a stream cut short, a
# metered stream's reads) or once this many bytes of them wait: a stream that ends with its
# usage (nearly all) is never scanned for them, and what waits is bounded
UNCOUNTED_MAX = 8192
# a "model" key and its string value, escapes and all (group 1: the value, quotes included)
MODEL_VALUE = re.compile(rb'"model": *("[^"\\]*(?:\\.[^"\\]*)*")')


def passthrough_request(payload: JSON, route: RouteMatch, target: UpstreamTarget) -> UpstreamCall:
    payload["model"] = target.model
    output_limit(payload, target)
    if target.stream and not route.include_usage:  # match() read it from the body
        payload["stream_options"] = with_usage(payload.get("stream_options"))
    return UpstreamCall(
        url=target.base_url + "/chat/completions",
        headers=headers(target),
        body=orjson.dumps(payload),
    )


def passthrough_response(payload: JSON, ctx: Ctx) -> tuple[JSON, Usage | None]:
    # a chat completion has its choices: an object without them (``{}``) is no reply, and
    # fails over like any garbage instead of reaching the client billed nothing
    if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
        raise UpstreamError("upstream sent a malformed chat completion")
    if "model" in payload:
        payload["model"] = ctx.model
    return payload, payload.get("usage")


class OpenAIPassthrough:
    """openai client, openai channel: the upstream's bytes forwarded as they came, usage read
    on the way.

    Bytes go out up to the last complete event of each read (``\n\n``), with the model name
    the upstream reports (its first ``"model":"..."``, which may be a dated snapshot of the
    name asked for) replaced by the client's: a byte replacement, whose pattern holds
    unescaped quotes, which cannot occur inside a JSON string. Only the events that may hold
    a usage object or an error are parsed (about one per stream); the rest go out unread;
    when the client asked for usage, only the last usage object of a read is; an error is
    looked for in the last event of a read only, where one that ends a stream is. Once the
    stream is steady (its first event checked, its model name learnt), a small read of whole
    events with neither goes out without these steps. A stream with CR line ends is handled
    event by event from its first CR on. Whether the stream ended
    properly is told by ``[DONE]``, or at EOF by the last chunk carrying a finish reason or
    usage.
    """

    __slots__ = (
        "content_type",
        "usage",
        "_include_usage",
        "_mine",
        "_learning",
        "_steady",
        "_old",
        "_new",
        "_done",
        "_buf",
        "_last",
        "_parser",
        "_before_error",
        "_checked",
        "_counted",
        "_uncounted",
        "_uncounted_bytes",
    )
    # what precedes a chunk's generated text and tool arguments (counted for a stream cut
    # short; legacy completions' ``text`` in their pass-through)
    TEXT_MARKS = (b'"content":"', b'"arguments":"')

    def __init__(self, ctx: Ctx, target: UpstreamTarget) -> None:
        self.content_type = EVENT_STREAM
        self.usage: Usage | None = None
        self._include_usage = ctx.include_usage
        # right-sized: orjson keeps its 4 KiB working buffer otherwise (see Upstream.open)
        self._mine = memoryview(orjson.dumps(ctx.model)).tobytes()
        self._learning = True  # until the upstream's model name has been seen
        # the first data event was checked and the model name learnt, LF line ends: a read
        # of whole events that holds no error and no usage goes out at once (``feed``)
        self._steady = False
        self._old = b""  # '"model":"<upstream name>"' as the upstream spells it, once learnt
        self._new = b""
        self._done = False
        self._buf = b""  # bytes after the last complete event
        self._last = b""  # the last block that held data (its last event is read at EOF)
        self._parser: SSEParser | None = None  # from the first CR on
        self._before_error = b""
        self._checked = False  # the first data event was read: a garbage stream fails early
        # chunks that carried text or tool arguments: about a token each, as OpenAI streams
        # them; counted for a stream cut short before its usage chunk (``generated``)
        self._counted = 0
        self._uncounted: list[bytes] = []  # events passed, not yet counted
        self._uncounted_bytes = 0

    @property
    def generated(self) -> int:
        if self._uncounted:
            self._count()
        return self._counted

    def _passed(self, data: bytes) -> None:
        """Events passed, to count for ``generated`` when asked (or when enough wait)."""
        self._uncounted.append(data)
        self._uncounted_bytes += len(data)
        if self._uncounted_bytes > UNCOUNTED_MAX:
            self._count()

    def _count(self) -> None:
        text, arguments = self.TEXT_MARKS
        counted = self._counted
        for data in self._uncounted:
            counted += data.count(text) + data.count(arguments)
        self._counted = counted
        self._uncounted.clear()
        self._uncounted_bytes = 0

    def feed(self, raw: bytes) -> bytes:
        if (
            self._steady
            and not self._buf
            and len(raw) <= SMALL_BLOCK
            and raw[-2:] == b"\n\n"
            and 13 not in raw
            and raw.find(b'{"error"') < 0
            and (raw.find(b'"usage"') < 0 or raw.count(b'"usage"') == raw.count(b'"usage":null'))
            and (raw[:5] == b"data:" or raw.find(b"data:") >= 0)
        ):
            # a small read of whole events, as a paced stream's come, none of which can
            # hold an error or a usage object: what ``_block`` does with it, without its
            # searches (a large read costs more in these scans than in its steps)
            self._last = raw
            self._passed(raw)
            return self._rename_in(raw)
        if self._parser is not None:
            return self._rename_in(self._each(self._parser.feed(raw)))
        buf = self._buf + raw if self._buf else raw
        if 13 in buf:  # a CR (an int is looked for with memchr, without parsing arguments)
            self._buf = b""
            self._parser = SSEParser()
            self._steady = False
            return self.feed(buf)
        cut = buf.rfind(b"\n\n") + 2
        if cut < 2:
            self._buf = buf
            return b""
        if cut == len(buf):
            block, self._buf = buf, b""
        else:
            block, self._buf = buf[:cut], buf[cut:]
        out = self._block(block)
        self._steady = self._checked and not self._learning
        return out

    def _block(self, block: bytes) -> bytes:
        """Complete events, LF line ends: forwarded as they are but for the events that may
        hold usage or an error, which are read (and replaced where needed)."""
        if block[:5] == b"data:" or block.find(b"data:") >= 0:
            self._last = block  # [DONE] is looked for here at EOF, not in every block
            if not self._checked:
                self._check_first(block)
            self._passed(block)
        error = _trailing_error(block)
        if self._include_usage and error < 0:
            key = block.rfind(b'"usage"')
            if key >= 0:  # nothing to replace: only the last usage matters
                self._read_last_usage(block, key)
            return self._rename_in(block)
        start = _first_suspect(block, 0, error)
        if start < 0:
            return self._rename_in(block)
        out = [block[:start]]
        try:
            while start >= 0:
                end = block.find(b"\n\n", start) + 2  # a block ends with a blank line
                out.append(self._piece(block[start:end]))
                start = _first_suspect(block, end, error)
                out.append(block[end:] if start < 0 else block[end:start])
        except GatewayError:
            self._before_error = self._rename_in(b"".join(out))
            raise
        return self._rename_in(b"".join(out))

    def _check_first(self, block: bytes) -> None:
        """The stream's first data event must be a chunk (or [DONE]): an upstream that sends
        something else fails before anything reaches the client, and another channel is
        tried. Only the first is read; the rest go out unread."""
        self._checked = True
        start = block.find(b"data:")
        end = block.find(b"\n", start)
        if block[end + 1 : end + 6] == b"data:":
            return  # an event of several data lines: left to the client
        data = block[start + 5 : end].strip()
        if data != b"[DONE]":
            load_chunk(data)

    def _read_last_usage(self, block: bytes, key: int) -> None:
        """The last usage object of a block that holds no error, searched from its last
        ``"usage"`` key (``key``) backwards. An event that is one ``data:`` line (as every
        serializer writes them) is read straight from the block; any other shape through the
        SSE parser."""
        while key >= 0:
            if _usage_set(block, key):
                line = block.rfind(b"\n", 0, key) + 1
                end = block.find(b"\n", key)  # a block ends with a blank line: found
                if (
                    (line < 2 or block[line - 2] == 10)
                    and block[end + 1] == 10
                    and block.startswith(b"data:", line)
                ):
                    data = block[line + 5 : end]
                else:
                    start = block.rfind(b"\n\n", 0, key)
                    event = parse_event(block[0 if start < 0 else start + 2 : end + 2])
                    if event is None:
                        return
                    data = event.data
                usage = load_chunk(data).get("usage")
                if usage:
                    self.usage = usage
                return
            key = block.rfind(b'"usage"', 0, key)

    def _each(self, events: list[SSEEvent]) -> bytes:
        """Parser mode: one output per event; on an error, what came before it waits for
        ``error()``."""
        out: list[bytes] = []
        try:
            for event in events:
                out.append(self._framed(event))
        except GatewayError:
            self._before_error = self._rename_in(b"".join(out))
            raise
        return b"".join(out)

    def _piece(self, piece: bytes) -> bytes:
        """Block mode: one event's raw bytes, forwarded or replaced."""
        event = parse_event(piece)
        replaced = self._event(event.data) if event is not None else None
        return piece if replaced is None else replaced

    def _framed(self, event: SSEEvent) -> bytes:
        """Parser mode: one event, framed anew."""
        if not self._checked:
            self._checked = True
            if event.data != b"[DONE]":
                load_chunk(event.data)
        self._passed(event.data)
        framed = b"data: " + event.data.replace(b"\n", b"\ndata: ") + b"\n\n"
        self._last = framed
        replaced = self._event(event.data)
        return framed if replaced is None else replaced

    def _event(self, data: bytes) -> bytes | None:
        """What replaces one event, or None when it goes out as it came."""
        if data == b"[DONE]":
            self._done = True
            return None
        if data.startswith(b'{"error"') or (
            not data.endswith(b'"usage":null}') and data.find(b'"usage"') >= 0
        ):
            chunk = load_chunk(data)
            if "error" in chunk:
                raise stream_error(chunk)
            usage = chunk.get("usage")
            if usage:
                self.usage = usage
                if not self._include_usage:
                    if not chunk.get("choices"):
                        return b""
                    chunk.pop("usage", None)
                    return frame(orjson.dumps(chunk))
        return None

    def _rename_in(self, out: bytes) -> bytes:
        """The upstream's model name mapped back to the client's."""
        if self._learning:
            self._learn(out)
        if not self._old:
            return out
        parts = out.split(self._old)  # split and join: cheaper than bytes.replace here
        return self._new.join(parts) if len(parts) > 1 else out

    def _learn(self, out: bytes) -> None:
        """The upstream's ``"model":"<name>"`` as it spells it, from the first that comes
        (once per stream: one search and one match). An empty name is not one: Azure's first
        chunk (``prompt_filter_results`` only) says ``"model":""``; the next names it."""
        key = out.find(b'"model":')
        while key >= 0:
            found = MODEL_VALUE.match(out, key)
            if found is None:
                self._learning = False
                return  # not a string: left as it is
            if found[1] != b'""':
                self._learning = False
                if found[1] != self._mine:
                    self._old = found[0]
                    self._new = out[key : found.start(1)] + self._mine
                return
            key = out.find(b'"model":', found.end())

    def finish(self) -> bytes:
        if self._parser is not None:
            out = self._rename_in(self._each(self._parser.close()))
        elif self._buf.strip(b"\n"):  # an event not ended by a blank line (lenient)
            out = self._block(self._buf + b"\n\n")
        else:
            out = self._buf  # nothing, or the last line ends
        self._buf = b""
        # [DONE] is the last event: looked for in the last block's tail (a raw LF cannot occur
        # inside a JSON event, so "\ndata: [DONE]" is always an event of its own)
        if (
            self._done
            or self._last.startswith(DONE)
            or self._last.find(NL_DONE, -DONE_TAIL) >= 0  # find, not ``in`` (see above)
        ):
            return out
        events = SSEParser().feed(self._last)
        if events:
            last = load_chunk(events[-1].data)
            choices = last.get("choices")
            if last.get("usage") or any(
                isinstance(c, dict) and c.get("finish_reason")
                for c in (choices if isinstance(choices, list) else ())
            ):
                return out + DONE  # an upstream that ends without [DONE], but ended properly
        raise UpstreamError("upstream stream ended before it was complete")

    def error(self, err: GatewayError) -> bytes:
        return self._before_error + frame(orjson.dumps(error_body(err)))


def _trailing_error(block: bytes) -> int:
    """Where the event that holds an error starts when it is among a block's last two data
    events (the last, or the one before a final ``[DONE]``); -1 otherwise. An upstream
    error ends its stream, so it is the last event of its read: looking there only spares a
    search through every byte of every read (an error followed by more events goes out as
    it came, and the stream goes on). A small block is searched whole first: most hold no
    error, and one search costs less than two."""
    if len(block) <= SMALL_BLOCK and block.find(b'{"error"') < 0:
        return -1
    before_last = block.rfind(b"\n\ndata:", 0, len(block) - LAST_EVENT_MIN)
    found = block.find(b'{"error"', max(before_last, 0))
    if found < 0:
        return -1
    start = block.rfind(b"\n\n", 0, found)
    return 0 if start < 0 else start + 2


def _first_suspect(block: bytes, pos: int, error: int) -> int:
    """Where the first event from ``pos`` (an event's start) on that may hold a usage object
    starts, else the trailing error's (``error``, -1: none); -1 if neither. One pass: each
    ``"usage"`` key is looked at where found."""
    end = len(block) if error < 0 else error
    key = block.find(b'"usage"', pos, end)
    while key >= 0:
        if _usage_set(block, key):
            start = block.rfind(b"\n\n", pos, key)
            return pos if start < 0 else start + 2
        key = block.find(b'"usage"', key + 7, end)
    return error if error >= pos else -1


def _usage_set(block: bytes, key: int) -> bool:
    """Whether the ``"usage"`` key at ``key`` has a value other than null (an object, or
    something odd that deserves a look)."""
    return block[key + 7 : key + 7 + USAGE_GAP].lstrip(b" :")[:1] != b"n"
