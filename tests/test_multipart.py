"""The multipart reader-rewriter: exact output, round trips through a real encoder and the
standard library's parser, any chunk boundary, malformed bodies, and bounded memory."""

from __future__ import annotations

import os
import re
from email.parser import BytesParser
from email.policy import HTTP

import pytest
import urllib3
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gateway.edge.multipart import MAX_PADDING, MultipartRewriter, boundary_of
from gateway.errors import InvalidRequestError

B = b"XyZ-b0undary"
AUDIO = bytes(range(256)) + b"\r\n--XyZ-b0undar\r\n--XyZ-b0undaryx\n--XyZ-b0undary\r\r\n"

Part = tuple[str, str | None, bytes]  # (name, filename or None for a text field, content)


def rewrite(
    chunks: list[bytes], replace: dict[str, str] | None = None, boundary: bytes = B
) -> tuple[bytes, MultipartRewriter]:
    rw = MultipartRewriter(boundary, replace)
    return b"".join(rw.feed(c) for c in chunks) + rw.close(), rw


def build(parts: list[Part], boundary: bytes = B) -> bytes:
    """A body in the rewriter's normal form: no preamble, padding or epilogue."""
    out = []
    for name, filename, content in parts:
        cd = f'form-data; name="{name}"' + ("" if filename is None else f'; filename="{filename}"')
        ct = b"" if filename is None else b"Content-Type: audio/wav\r\n"
        head = b"--" + boundary + b"\r\nContent-Disposition: " + cd.encode() + b"\r\n" + ct
        out.append(head + b"\r\n" + content + b"\r\n")
    return b"".join(out) + b"--" + boundary + b"--\r\n"


def parse(body: bytes, content_type: str) -> list[tuple[str, str | None, bytes]]:
    """(name, filename, content) of each part, as the standard library reads them."""
    msg = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
    )
    assert msg.is_multipart() and not msg.defects
    parts = []
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        assert isinstance(name, str)
        payload = part.get_payload(decode=True)
        assert isinstance(payload, bytes)
        parts.append((name, part.get_filename(), payload))
    return parts


# --- exact output ----------------------------------------------------------------------------

HAND = (
    b"ignored preamble\r\n"
    b"--XyZ-b0undary\r\n"
    b'Content-Disposition: form-data; name="model"\r\n\r\n'
    b"whisper-1\r\n"
    b"--XyZ-b0undary \t\r\n"
    b'content-disposition: form-data; name="file"; filename="a \\"b\\".wav"\n'
    b"CONTENT-TYPE: audio/wav\n\n" + AUDIO + b"\r\n"
    b"--XyZ-b0undary\r\n"
    b"Content-Disposition: form-data; name=language\r\n\r\n"
    b"en\r\n"
    b"--XyZ-b0undary\r\n"
    b'Content-Disposition: form-data; name="model"\r\n\r\n'
    b"second\r\n"
    b"--XyZ-b0undary--\r\n"
    b"ignored epilogue"
)
HAND_OUT = (
    b"--XyZ-b0undary\r\n"
    b'Content-Disposition: form-data; name="model"\r\n\r\n'
    b"gpt-4o-transcribe\r\n"
    b"--XyZ-b0undary\r\n"
    b'content-disposition: form-data; name="file"; filename="a \\"b\\".wav"\r\n'
    b"CONTENT-TYPE: audio/wav\r\n\r\n" + AUDIO + b"\r\n"
    b"--XyZ-b0undary\r\n"
    b"Content-Disposition: form-data; name=language\r\n\r\n"
    b"en\r\n"
    b"--XyZ-b0undary\r\n"
    b'Content-Disposition: form-data; name="model"\r\n\r\n'
    b"gpt-4o-transcribe\r\n"
    b"--XyZ-b0undary--\r\n"
)


def test_exact_output() -> None:
    out, rw = rewrite([HAND], {"model": "gpt-4o-transcribe"})
    assert out == HAND_OUT
    assert rw.fields == {"model": "whisper-1", "language": "en"}
    assert rw.field_values == {"model": ["whisper-1", "second"], "language": ["en"]}
    assert rw.files == [("file", 'a "b".wav', "audio/wav")]
    assert rw.file_bytes == len(AUDIO)
    assert rw.done and rw.buffered == 0


def test_split_at_every_offset() -> None:
    for i in range(len(HAND) + 1):
        out, rw = rewrite([HAND[:i], HAND[i:]], {"model": "gpt-4o-transcribe"})
        assert out == HAND_OUT, i
        assert rw.fields == {"model": "whisper-1", "language": "en"}
    out, rw = rewrite([HAND[i : i + 1] for i in range(len(HAND))], {"model": "gpt-4o-transcribe"})
    assert out == HAND_OUT and rw.file_bytes == len(AUDIO)


def test_file_part_is_forwarded_before_the_body_ends() -> None:
    rw = MultipartRewriter(B)
    out = rw.feed(HAND[: HAND.index(AUDIO) + len(AUDIO)])
    held = len(b"\r\n--" + B) - 1  # a delimiter may begin in the last bytes
    assert out.endswith(AUDIO[:-held]) and rw.buffered == held
    assert rw.file_bytes == len(AUDIO) - held
    assert rw.fields == {"model": "whisper-1"} and not rw.done


def test_filename_star_and_defaults() -> None:
    body = (
        b"--XyZ-b0undary\r\n"
        b'Content-Disposition: form-data; name="file"; filename="x.wav"; '
        b"filename*=UTF-8''%C3%A9t%C3%A9.wav\r\n"
        b"\r\nRIFF\r\n--XyZ-b0undary--"
    )
    out, rw = rewrite([body])
    assert rw.files == [("file", "été.wav", "text/plain")]
    assert out == body + b"\r\n"


def test_empty_body_with_only_the_close_delimiter() -> None:
    out, rw = rewrite([b"--XyZ-b0undary--"])
    assert out == b"--XyZ-b0undary--\r\n" and rw.fields == {}


# --- a real encoder and the standard library's parser -----------------------------------------

FIELDS = [
    ("model", "whisper-1"),
    ("response_format", "verbose_json"),
    ("language", "de"),
    ("prompt", "Grüße,\r\nzwei Zeilen"),
    ("temperature", "0.2"),
    ("timestamp_granularities[]", "word"),
    ("timestamp_granularities[]", "segment"),
]


@pytest.mark.parametrize("file_first", [False, True], ids=["fields-first", "file-first"])
def test_urllib3_round_trip(file_first: bool) -> None:
    audio = os.urandom(200_000) + AUDIO
    file_field = ("file", ("speech.mp3", audio, "audio/mpeg"))
    body, content_type = urllib3.encode_multipart_formdata(
        [file_field, *FIELDS] if file_first else [*FIELDS, file_field]
    )
    chunks = [body[i : i + 4093] for i in range(0, len(body), 4093)]
    out, rw = rewrite(chunks, {"model": "gpt-4o-transcribe"}, boundary_of(content_type))
    assert rw.fields["model"] == "whisper-1" and rw.fields["prompt"] == "Grüße,\r\nzwei Zeilen"
    assert rw.field_values["timestamp_granularities[]"] == ["word", "segment"]
    assert rw.files == [("file", "speech.mp3", "audio/mpeg")]
    assert rw.file_bytes == len(audio)
    expected: list[tuple[str, str | None, bytes]] = [(n, None, v.encode()) for n, v in FIELDS]
    expected[0] = ("model", None, b"gpt-4o-transcribe")
    file_part = ("file", "speech.mp3", audio)
    assert parse(out, content_type) == (
        [file_part, *expected] if file_first else [*expected, file_part]
    )


# --- any chunk boundary, random contents -------------------------------------------------------

# every place a delimiter starts, overlapping ones too: contents ending in "\r\n--B" make a
# delimiter of their own with the CRLF of the one that follows them
DELIMITER = re.compile(rb"(?=\r\n--" + re.escape(B) + rb"(?:--|[ \t]*\r?\n))")
NEAR = [b"\r", b"\n", b"-", b"\r\n--", b"\r\n--" + B[:-1], b"\r\n--" + B + b"x", b"--" + B, b" "]
contents = st.lists(st.binary(max_size=12) | st.sampled_from(NEAR), max_size=8).map(b"".join)
names = st.sampled_from(["model", "language", "prompt", "file", "x[]"])
parts_st = st.lists(
    st.tuples(names, st.none() | st.sampled_from(["a.wav", "b c.mp3"]), contents), max_size=5
)


@settings(max_examples=200, deadline=None)
@given(
    parts=parts_st, values=st.lists(st.text(max_size=10), min_size=5, max_size=5), data=st.data()
)
def test_random_bodies_and_splits(
    parts: list[Part], values: list[str], data: st.DataObject
) -> None:
    # text fields get text values; file parts keep their near-delimiter binary contents
    parts = [(n, f, c if f else values[i].encode()) for i, (n, f, c) in enumerate(parts)]
    body = build(parts)
    # no delimiter hides in the contents: one per part and the close delimiter
    assume(len(DELIMITER.findall(b"\r\n" + body)) == len(parts) + 1)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=6)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    out, rw = rewrite(chunks, {"model": "MODEL"})
    assert out == build([(n, f, b"MODEL" if not f and n == "model" else c) for n, f, c in parts])
    expected: dict[str, str] = {}
    for n, f, c in parts:
        if f is None:
            expected.setdefault(n, c.decode())
    assert rw.fields == expected
    assert rw.files == [(n, f, "audio/wav") for n, f, _ in parts if f is not None]
    assert rw.file_bytes == sum(len(c) for _, f, c in parts if f is not None)


# --- malformed bodies ---------------------------------------------------------------------------

CD = b'Content-Disposition: form-data; name="model"\r\n'
FILE_CD = b"--XyZ-b0undary\r\nContent-Disposition: form-data; name=f; "
OPEN = b"--XyZ-b0undary\r\n"
END = b"\r\n--XyZ-b0undary--"
MALFORMED = {
    "no closing delimiter": (OPEN + CD + b"\r\nwhisper-1\r\n", "ended before its closing"),
    "cut in the closing delimiter": (OPEN + CD + b"\r\nx" + END[:-1], "ended before its closing"),
    "no boundary at all": (b"just some bytes", "ended before its closing"),
    "no headers": (OPEN + b"\r\nwhisper-1" + END, "no headers"),
    "no Content-Disposition": (OPEN + b"Content-Type: a/b\r\n\r\nx" + END, "no Content-Disp"),
    "no name": (OPEN + b"Content-Disposition: form-data\r\n\r\nx" + END, "not form-data; name="),
    "not form-data": (OPEN + b'Content-Disposition: inline; name="a"\r\n\r\n', "not form-data"),
    "header line without colon": (OPEN + CD + b"oops\r\n\r\nx" + END, "without a name"),
    "header block too long": (OPEN + CD + b"X: " + b"a" * 17000 + b"\r\n\r\n", "over 16384"),
    "field over the limit": (OPEN + CD + b"\r\n" + b"a" * 70000, "'model' is over 65536"),
    "field one over the limit": (OPEN + CD + b"\r\n" + b"a" * 65537 + END, "'model' is over"),
    "field not UTF-8": (OPEN + CD + b"\r\n\xff\xfe" + END, "'model' is not valid UTF-8"),
    "header not UTF-8": (OPEN + b"Content-Disposition: form-data; name=\xff\r\n\r\n", "UTF-8"),
    "bad filename*": (FILE_CD + b"filename*=UTF-8''%ff\n\n", "filename\\* is not valid"),
    "filename* charset": (FILE_CD + b"filename*=koi8-r''a\n\n", "UTF-8 or ISO-8859-1"),
}


@pytest.mark.parametrize(("body", "message"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_bodies(body: bytes, message: str) -> None:
    for size in (len(body), 1000, 7):
        with pytest.raises(InvalidRequestError, match=message):
            rewrite([body[i : i + size] for i in range(0, len(body), size)])


def test_field_error_names_the_field() -> None:
    with pytest.raises(InvalidRequestError, match="'model' is over 10 bytes"):
        MultipartRewriter(B, max_field_bytes=10).feed(
            b"--XyZ-b0undary\r\n" + CD + b"\r\n" + b"a" * 100
        )


@pytest.mark.parametrize(
    ("content_type", "boundary"),
    [
        ("multipart/form-data; boundary=abc", b"abc"),
        ('Multipart/Form-Data; charset=utf-8; BOUNDARY="a b:c?"', b"a b:c?"),
        (
            "multipart/form-data;boundary=----WebKitFormBoundary7MA4YWxk",
            b"----WebKitFormBoundary7MA4YWxk",
        ),
        ("multipart/form-data; boundary=" + "x" * 70, b"x" * 70),
    ],
)
def test_boundary_of(content_type: str, boundary: bytes) -> None:
    assert boundary_of(content_type) == boundary


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "multipart/mixed; boundary=abc",
        "multipart/form-data",
        "multipart/form-data; boundary=",
        'multipart/form-data; boundary=""',
        "multipart/form-data; boundary=" + "x" * 71,
        'multipart/form-data; boundary="ends with space "',
        "multipart/form-data; boundary=bad{char}",
        "",
    ],
)
def test_boundary_of_rejects(content_type: str) -> None:
    with pytest.raises(InvalidRequestError):
        boundary_of(content_type)


FRAGMENTS = [
    OPEN,
    b"\r\n--" + B + b"\r\n",
    END,
    b"--" + B,
    b"--",
    b"\r\n",
    b"\n",
    b" \t",
    CD,
    b'Content-Disposition: form-data; name="file"; filename="a"\r\n',
    b"Content-Disposition: form-data; name=f; filename*=UTF-8''%e9\r\n",
    b"Content-Type: audio/wav\r\n",
    b"X-Folded: a\r\n b\r\n",
    b"\xff",
    b"a" * 20,
]
pieces = st.sampled_from(FRAGMENTS) | st.binary(max_size=8)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A well-formed body with a few bytes deleted, inserted or overwritten."""
    body = bytearray(build(draw(parts_st)))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(body)))
        j = draw(st.integers(i, min(len(body), i + 8)))
        body[i:j] = draw(pieces)
    return bytes(body)


garbage = st.lists(pieces, max_size=24).map(b"".join) | mutated()


@settings(max_examples=200, deadline=None)
@given(garbage, st.data())
def test_garbage_raises_only_invalid_request(body: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(body)))
    rw = MultipartRewriter(B, {"model": "m"}, max_field_bytes=16)
    try:
        rw.feed(body[:cut])
        rw.feed(body[cut:])
        rw.close()
    except InvalidRequestError:
        pass


# --- bounded memory -----------------------------------------------------------------------------


def test_large_file_keeps_the_buffer_small() -> None:
    chunk = os.urandom(65536)
    rw = MultipartRewriter(B, {"model": "m"})
    head = build([("model", None, b"whisper-1")])[: -len(b"--" + B + b"--\r\n")]
    head += b"--" + B + b'\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
    sent = len(rw.feed(head))
    bound = len(b"\r\n--" + B) + MAX_PADDING + 2
    for _ in range(800):  # 50 MiB
        sent += len(rw.feed(chunk))
        assert rw.buffered < bound
    sent += len(rw.feed(b"\r\n--" + B + b"--\r\n")) + len(rw.close())
    assert rw.file_bytes == 800 * 65536
    assert sent == len(head) - len(b"whisper-1") + len(b"m") + 800 * 65536 + len(
        b"\r\n--" + B + b"--\r\n"
    )
