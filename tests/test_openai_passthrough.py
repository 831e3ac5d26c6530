"""The openai pass-through stream: bytes forwarded as they came, usage read however spelt."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.protocols.base import Ctx, RelayStream, RouteMatch, UpstreamTarget
from gateway.protocols.openai import OpenAIAdapter
from gateway.protocols.openai.passthrough import OpenAIPassthrough

OPENAI = OpenAIAdapter()
ROUTE = RouteMatch(protocol="openai", capability="chat")
USAGE = {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}


def passthrough(*, include_usage: bool = True, upstream_model: str = "chat-small") -> RelayStream:
    ctx = Ctx(request_id="r", model="chat-small", created=1, include_usage=include_usage)
    target = UpstreamTarget(
        channel="c",
        base_url="http://up.test/v1",
        api_key="k",
        model=upstream_model,
        default_max_tokens=16,
        stream=True,
    )
    return OPENAI.passthrough_stream(ctx, ROUTE, target)


def chunk(text: str | None, *, finish: str | None = None, spaced: bool = False) -> bytes:
    body: dict[str, object] = {
        "id": "x",
        "object": "chat.completion.chunk",
        "model": "chat-small",
        "choices": []
        if text is None
        else [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],  # noqa: E501
        "usage": USAGE if text is None else None,
    }
    if not spaced:
        return orjson.dumps(body)
    import json

    return json.dumps(body).encode()


def stream(events: list[bytes], sep: bytes = b"\n\n", prefix: bytes = b"data: ") -> bytes:
    return b"".join(prefix + e + sep for e in events) + prefix + b"[DONE]" + sep


def run(ps: RelayStream, raw: bytes, split: int | None = None) -> bytes:
    pieces = [raw] if split is None else [raw[:split], raw[split:]]
    out = b"".join(ps.feed(p) for p in pieces)
    return out + ps.finish()


RAW_FORMS = {
    "comments and data without a space": b": PROCESSING\n\ndata:"
    + chunk("Hi")
    + b"\n\n: keep-alive\n\n"
    + stream([chunk("!", finish="stop"), chunk(None)]),
    "blank lines beyond the separator": stream([chunk("Hi"), chunk(None)], sep=b"\n\n\n"),
    "python json spacing": stream([chunk("Hi", spaced=True), chunk(None, spaced=True)]),
    "usage chunk on two data lines": stream(
        [chunk("Hi", finish="stop"), chunk(None).replace(b'"usage"', b'\ndata: "usage"')]
    ),
    "an event line before the usage chunk": b"data: "
    + chunk("Hi", finish="stop")
    + b"\n\nevent: chunk\ndata: "
    + chunk(None)
    + b"\n\ndata: [DONE]\n\n",
}


@pytest.mark.parametrize("raw", RAW_FORMS.values(), ids=RAW_FORMS.keys())
def test_a_stream_needing_no_change_goes_out_byte_for_byte_however_it_is_split(raw: bytes) -> None:
    for split in [None, *range(1, len(raw))]:
        ps = passthrough()
        assert run(ps, raw, split) == raw, f"split at {split}"
        assert ps.usage == USAGE


SPELLINGS = {
    "compact": stream([chunk("Hi", finish="stop"), chunk(None)]),
    "spaced": stream([chunk("Hi", finish="stop", spaced=True), chunk(None, spaced=True)]),
    "crlf": stream([chunk("Hi", finish="stop"), chunk(None)], sep=b"\r\n\r\n"),
    "cr": stream([chunk("Hi", finish="stop", spaced=True), chunk(None)], sep=b"\r\r"),
}


@pytest.mark.parametrize("raw", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_usage_is_read_and_dropped_when_not_asked_for_whatever_the_spelling(raw: bytes) -> None:
    ps = passthrough(include_usage=False, upstream_model="up-model")
    out = run(ps, raw.replace(b'"chat-small"', b'"up-model"'))
    assert ps.usage == USAGE
    assert b"prompt_tokens" not in out and b"up-model" not in out
    assert out.count(b"chat-small") == 1 and out.endswith(b"data: [DONE]\n\n")


def test_content_before_an_error_in_the_same_read_reaches_the_client_first() -> None:
    error = b'{"error":{"message":"overloaded","type":"server_error","code":503}}'
    raw = b"data: " + chunk("Hel") + b"\n\ndata: " + error + b"\n\n"
    ps = passthrough()
    with pytest.raises(GatewayError) as caught:
        ps.feed(raw)
    out = ps.error(caught.value)
    assert out.index(b'"Hel"') < out.index(b"overloaded")
    assert caught.value.status == 503


ERROR = b'{"error":{"message":"overloaded","type":"server_error","code":503}}'
ERROR_ENDINGS = {
    "last event": b"data: " + ERROR + b"\n\n",
    "before [DONE]": b"data: " + ERROR + b"\n\ndata: [DONE]\n\n",
    "blank lines after": b"data: " + ERROR + b"\n\n\n\n",
    "first of its read": b"data: " + ERROR + b"\n\n",
}


# a small read is searched whole for an error; a larger one from its last events
READS_BEFORE = {
    "small read": b"data: " + chunk("Hel") + b"\n\n",
    "read over 1 KiB": b"".join(b"data: " + chunk(t) + b"\n\n" for t in ["Hel"] + ["l"] * 12),
}


@pytest.mark.parametrize("include_usage", [True, False], ids=["usage asked", "usage not asked"])
@pytest.mark.parametrize("ending", ERROR_ENDINGS.values(), ids=ERROR_ENDINGS.keys())
@pytest.mark.parametrize("before", READS_BEFORE.values(), ids=READS_BEFORE.keys())
def test_an_error_that_ends_a_read_stops_the_stream_with_its_status(
    ending: bytes, include_usage: bool, before: bytes
) -> None:
    ps = passthrough(include_usage=include_usage)
    first = ps.feed(before) if ending is ERROR_ENDINGS["first of its read"] else b""
    with pytest.raises(GatewayError) as caught:
        ps.feed(ending if first else before + ending)
    assert caught.value.status == 503
    out = first + ps.error(caught.value)
    assert out.index(b'"Hel"') < out.index(b"overloaded") and b"[DONE]" not in out


@pytest.mark.parametrize("padding", [0, 12], ids=["small read", "read over 1 KiB"])
def test_an_error_followed_by_content_in_the_same_read_goes_out_as_it_came(padding: int) -> None:
    raw = stream(
        [chunk("Hel"), *[chunk("l")] * padding, ERROR, chunk("lo", finish="stop"), chunk(None)]
    )
    ps = passthrough()
    assert run(ps, raw) == raw
    assert ps.usage == USAGE


def test_a_stream_cut_before_its_end_is_an_error_and_one_ended_without_done_is_not() -> None:
    cut = b"data: " + chunk("Hel") + b"\n\n"
    with pytest.raises(GatewayError):
        run(passthrough(), cut)
    ended = b"data: " + chunk("Hel", finish="stop") + b"\n\n"
    assert run(passthrough(), ended).endswith(b"data: [DONE]\n\n")


DONE_EVENTS = (b"data: [DONE]\n\n", b"data: [DONE]\r\n\r\n", b"data: [DONE]\r\r")
SNAPSHOT = b'"gpt-4o-2024-08-06"'  # real OpenAI reports a dated snapshot of the name asked for
ONE_WRITER = {  # one serializer writes a whole stream
    "compact": SPELLINGS["compact"],
    "spaced": SPELLINGS["spaced"],
    "crlf": SPELLINGS["crlf"],
    "cr, spaced": stream(
        [chunk("Hi", finish="stop", spaced=True), chunk(None, spaced=True)], sep=b"\r\r"
    ),
}


@pytest.mark.parametrize("include_usage", [True, False], ids=["usage asked", "usage not asked"])
@pytest.mark.parametrize("raw", ONE_WRITER.values(), ids=ONE_WRITER.keys())
def test_the_model_name_the_upstream_reports_goes_back_as_the_clients(
    raw: bytes, include_usage: bool
) -> None:
    raw = raw.replace(b'"chat-small"', SNAPSHOT)
    for split in [None, *range(1, len(raw))]:
        ps = passthrough(include_usage=include_usage, upstream_model="gpt-4o")
        out = run(ps, raw, split)
        assert SNAPSHOT not in out, f"split at {split}"
        assert out.count(b'"chat-small"') == (2 if include_usage else 1), f"split at {split}"
        assert ps.usage == USAGE
        assert out.endswith(DONE_EVENTS), f"split at {split}"


def tool_chunk(arguments: str) -> bytes:
    call = {"index": 0, "function": {"arguments": arguments}}
    body = {
        "id": "x",
        "model": "chat-small",
        "choices": [{"index": 0, "delta": {"tool_calls": [call]}}],
    }
    return orjson.dumps(body)


# (text chunks, tool-argument chunks): a few, and enough to pass the bytes left uncounted
GENERATED = {"three chunks": (3, 0), "text and tool arguments": (5, 4), "a long stream": (600, 90)}
ASKED = {"at the cut": False, "after every read, as a meter asks": True}


@pytest.mark.parametrize("asked_each_read", ASKED.values(), ids=ASKED.keys())
@pytest.mark.parametrize("crlf", [False, True], ids=["LF", "CRLF"])
@pytest.mark.parametrize("counts", GENERATED.values(), ids=GENERATED.keys())
def test_a_stream_cut_short_counts_each_chunk_of_text_or_arguments_that_passed(
    counts: tuple[int, int], crlf: bool, asked_each_read: bool
) -> None:
    texts, calls = counts
    events = [chunk(f"w{i} ") for i in range(texts)] + [tool_chunk('{"a"') for _ in range(calls)]
    raw = b"".join(b"data: " + e + b"\n\n" for e in events)
    if crlf:
        raw = raw.replace(b"\n", b"\r\n")
    ps = passthrough()
    seen = 0
    for at in range(0, len(raw), 700):  # reads that cut events anywhere
        ps.feed(raw[at : at + 700])
        if asked_each_read:
            assert ps.generated >= seen  # never goes back
            seen = ps.generated
    assert ps.generated == texts + calls
    with pytest.raises(GatewayError):  # no [DONE], no finish: cut short
        ps.finish()


class EveryReadInSteps(OpenAIPassthrough):
    """The pass-through with its steady reads' shortcut never taken: every read goes through
    ``_block``'s steps, the reference the shortcut must match."""

    __slots__ = ()

    def feed(self, raw: bytes) -> bytes:
        self._steady = False
        return super().feed(raw)


# what a read may hold: chunks as OpenAI sends them (with "usage":null when usage is asked
# for), spaced, with tool arguments, the usage chunk, an error, a comment, [DONE]
PIECES = [
    b"data: " + chunk("Hi") + b"\n\n",
    b"data: " + chunk("there").replace(b',"usage":null', b"") + b"\n\n",
    b"data: " + chunk("x", spaced=True) + b"\n\n",
    b"data: " + tool_chunk('{"q":') + b"\n\n",
    b"data: " + chunk("!", finish="stop") + b"\n\n",
    b"data: " + chunk(None) + b"\n\n",
    b"data: " + ERROR + b"\n\n",
    b": keep-alive\n\n",
    b"data: [DONE]\n\n",
    b"data: " + chunk("crlf") + b"\r\n\r\n",
]


def relayed(ps: RelayStream, reads: list[bytes]) -> tuple[list[bytes], object, int, str]:
    out: list[bytes] = []
    try:
        for raw in reads:
            out.append(ps.feed(raw))
        out.append(ps.finish())
        end = "finished"
    except GatewayError as err:
        out.append(ps.error(err))
        end = f"error {err.status}"
    return out, ps.usage, ps.generated, end


KEEP_ALIVE_LAST = [0, 4, 7]  # a comment after the last chunk, no [DONE]: still complete
# CR line ends from the second event on, the read after them starting inside an event
CR_THEN_LF = [0, 9, 1, 0]
CR_THEN_LF_CUTS = [len(PIECES[0]), len(PIECES[9]) + 10]


@settings(max_examples=600, deadline=None)
@given(
    picks=st.lists(st.integers(0, len(PIECES) - 1), min_size=1, max_size=8),
    cuts=st.lists(st.integers(1, 400), max_size=6),
    include_usage=st.booleans(),
    renamed=st.booleans(),
    by_piece=st.booleans(),
)
@example(picks=KEEP_ALIVE_LAST, cuts=[], include_usage=False, renamed=False, by_piece=True)
@example(picks=CR_THEN_LF, cuts=CR_THEN_LF_CUTS, include_usage=True, renamed=True, by_piece=False)
def test_steady_reads_go_out_as_every_step_would_send_them(
    picks: list[int], cuts: list[int], include_usage: bool, renamed: bool, by_piece: bool
) -> None:
    pieces = [PIECES[i] for i in picks]
    if renamed:
        pieces = [p.replace(b'"model":"chat-small"', b'"model":"up-model-2024"') for p in pieces]
    raw, reads, at = b"".join(pieces), [], 0
    if by_piece:  # a read per event, as a paced stream's come
        reads = pieces
    else:  # reads that end anywhere, events whole or not
        for cut in cuts:
            reads.append(raw[at : at + cut])
            at += cut
        reads.append(raw[at:])
        reads = [r for r in reads if r]
    model = "up-model-2024" if renamed else "chat-small"
    ctx = Ctx(request_id="r", model="chat-small", created=1, include_usage=include_usage)
    target = UpstreamTarget(
        channel="c", base_url="http://up.test/v1", api_key="k", model=model,
        default_max_tokens=16, stream=True,
    )  # fmt: skip
    fast = relayed(OpenAIPassthrough(ctx, target), reads)
    steps = relayed(EveryReadInSteps(ctx, target), reads)
    assert fast == steps  # each read's bytes, the usage, the estimate, how it ended
