"""The cheaper check of response headers accepts exactly what h11's own check accepts, and
refuses the rest with h11's own error; a served reply still carries its headers. (That the
mend fits the installed h11, and what a changed h11 does to it: tests/test_mends.py.)"""

from __future__ import annotations

import signal
import time
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import aiohttp
import h11
import pytest
from h11._headers import _field_name_re, _field_value_re
from h11._headers import normalize_and_validate as h11_check
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.fake_upstream import FakeUpstream
from gateway.server import mends
from gateway.server.h11_headers import (
    HEADER_CHECK,
    make_check,
    make_set_comma_header,
    name_ok,
    value_ok,
)
from tests.plugins.processes import KEY, Gateway, free_port, write_config

fast_check = make_check(h11_check)

# bytes that decide a header's fate (white space, NUL, separators, token bytes), and any byte
EDGY = st.sampled_from(list(b"\x00\t\n\x0b\x0c\r :;,\"'()/\\aZ09-_~\x7f\x80\xff"))
BYTES = st.binary(max_size=12) | st.lists(EDGY, max_size=12).map(bytes)
NAMES = BYTES | st.sampled_from([b"content-length", b"Transfer-Encoding", b"x-request-id"])
VALUES = BYTES | st.sampled_from([b"12", b"1,1", b"1, 2", b"chunked", b"gzip", b" 5", b"a b"])


@given(BYTES)
@settings(max_examples=2000)
def test_a_name_passes_when_h11_s_expression_matches_it(name: bytes) -> None:
    assert name_ok(name) == (_field_name_re.fullmatch(name) is not None)


@given(BYTES)
@settings(max_examples=2000)
def test_a_value_passes_when_h11_s_expression_matches_it(value: bytes) -> None:
    assert value_ok(value) == (_field_value_re.fullmatch(value) is not None)


def outcome(check: Any, headers: list[tuple[Any, Any]]) -> Any:
    try:
        return ("ok", list(check(headers)))
    except h11.LocalProtocolError as exc:
        return ("refused", str(exc))
    except (TypeError, ValueError, UnicodeError) as exc:
        return ("error", type(exc).__name__)


@given(st.lists(st.tuples(NAMES, VALUES), max_size=5))
@settings(max_examples=2000)
def test_a_header_list_gets_h11_s_answer(headers: list[tuple[bytes, bytes]]) -> None:
    assert outcome(fast_check, headers) == outcome(h11_check, headers)


def full(check: Any, headers: list[tuple[Any, Any]]) -> Any:
    """``outcome``, with the raw names too: the (raw name, name, value) items made."""
    try:
        return ("ok", check(headers)._full_items)
    except h11.LocalProtocolError as exc:
        return ("refused", str(exc))


@given(
    st.lists(st.tuples(NAMES, VALUES), max_size=5),
    st.sampled_from([b"transfer-encoding", b"connection", b"content-length", b"x-a"]),
    st.lists(VALUES, max_size=2),
)
@settings(max_examples=1000)
def test_h11_adding_a_header_gets_the_same_headers(
    headers: list[tuple[bytes, bytes]], name: bytes, values: list[bytes]
) -> None:
    """What h11 does to add its own header (``set_comma_header``), whatever the headers it
    adds it to (those that passed the check) and whatever it adds: through the mend's
    ``set_comma_header`` (which does not check the kept headers again), and through h11's
    own with the cheaper check, the same headers as h11's own gives, or the same refusal."""
    import h11._headers

    try:
        made = h11_check(headers)
    except h11.LocalProtocolError:
        return  # never reaches set_comma_header
    add = mends.original(h11._headers.set_comma_header)
    mended = make_set_comma_header(add, h11._headers.Headers)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(h11._headers, "normalize_and_validate", h11_check)
        own = full(lambda _: add(made, name, values), [])
        patch.setattr(h11._headers, "normalize_and_validate", fast_check)
        assert full(lambda _: add(made, name, values), []) == own
        assert full(lambda _: mended(made, name, values), []) == own
        assert full(lambda _: mended(made, name, values), []) == own  # remembered: the same


@pytest.mark.parametrize(
    "headers",
    [
        [("content-type", "text/plain")],  # text, not bytes: h11 encodes it
        [(b"x-a", 5)],  # h11 refuses an int
        [(bytearray(b"x-a"), b"1")],  # h11 takes any bytes-like name
        [(b"content-length", b"3"), (b"Content-Length", b"4")],  # conflicting lengths
        [(b"transfer-encoding", b"gzip")],  # h11 sends only chunked
        [(b"x-a", b"ok\r\nx-injected: 1")],  # a header smuggled into a value
        [(b"bad name", b"v")],
    ],
)
def test_odd_headers_get_h11_s_answer(headers: list[tuple[Any, Any]]) -> None:
    assert outcome(fast_check, headers) == outcome(h11_check, headers)


def test_a_chain_of_headers_is_read_once() -> None:
    def chain() -> Any:
        yield (b"content-type", b"application/json")
        yield (b"x-request-id", b"abc")

    assert list(fast_check(chain())) == list(h11_check(list(chain())))


async def test_replies_through_the_gateway_s_hypercorn_keep_their_headers(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    """``gateway serve`` (hypercorn, its h11 check replaced): a reply and a stream arrive
    whole, with the headers the relay set (a stream's are checked twice: once more when h11
    adds Transfer-Encoding)."""
    gw = Gateway(
        write_config(tmp_path, fake.url, f"sqlite:///{tmp_path}/gw.db"),
        free_port(),
        tmp_path / "gw.log",
        server="hypercorn",  # whatever server the suite runs on: this is hypercorn's
    )
    await gw.start()
    try:
        auth = {"Authorization": f"Bearer {KEY}", "x-request-id": "mine-1"}
        chat = {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{gw.url}/v1/chat/completions", json=chat, headers=auth) as r:
                assert r.status == 200
                assert r.headers["content-type"] == "application/json"
                assert r.headers["x-request-id"] == "mine-1"
                assert int(r.headers["content-length"]) == len(await r.read())
                # hypercorn's Date, made once a second; no Server header
                sent = parsedate_to_datetime(r.headers["date"]).timestamp()
                assert abs(sent - time.time()) < 5
                assert "server" not in r.headers
            stream = {**chat, "stream": True}
            async with s.post(f"{gw.url}/v1/chat/completions", json=stream, headers=auth) as r:
                assert r.status == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                assert r.headers["transfer-encoding"] == "chunked"
                assert r.headers["x-accel-buffering"] == "no"
                assert (await r.read()).endswith(b"data: [DONE]\n\n")
    finally:
        gw.kill(signal.SIGTERM)
        assert await gw.exit_code() == 0


def without_h11_mend(monkeypatch: pytest.MonkeyPatch) -> None:
    """h11 as installed, for the test; after it, h11 as it was before (mended or not)."""
    import h11._connection
    import h11._events
    import h11._headers

    for module in (h11._events, h11._headers):
        monkeypatch.setattr(module, "normalize_and_validate", h11_check)
    add = mends.original(h11._headers.set_comma_header)
    for module in (h11._connection, h11._headers):
        monkeypatch.setattr(module, "set_comma_header", add)
    # set, then taken away: the undo puts back whatever was there, or nothing
    monkeypatch.setattr(h11._headers.Headers, "__iter__", None, raising=False)
    monkeypatch.delattr(h11._headers.Headers, "__iter__")


def test_h11_is_given_the_cheaper_check_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import h11._connection
    import h11._events
    import h11._headers

    without_h11_mend(monkeypatch)
    mends.put_in_place(HEADER_CHECK)
    fast = h11._headers.normalize_and_validate
    mends.put_in_place(HEADER_CHECK)  # in place already: left as it is
    assert h11._headers.normalize_and_validate is fast
    assert fast is not h11_check and h11._events.normalize_and_validate is fast
    assert mends.original(fast) is h11_check
    adding = h11._connection.set_comma_header
    assert h11._headers.set_comma_header is adding and mends.mended(adding, "h11.header_check")
    with pytest.raises(h11.LocalProtocolError):
        h11.Response(status_code=200, headers=[(b"x-a", b"1\r\nx-b: 2")])
    ok = h11.Response(status_code=200, headers=[(b"Content-Type", b"text/plain")])
    assert list(ok.headers) == [(b"content-type", b"text/plain")]


def test_the_date_header_is_made_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.server import hypercorn_mend
    from gateway.server.hypercorn_mend import DATE_HEADER, ServerConfig

    for name in ("response_headers", "include_date_header"):  # restored after the test
        monkeypatch.setattr(ServerConfig, name, None, raising=False)
        monkeypatch.delattr(ServerConfig, name)
    now = [1_764_100_000.2]
    monkeypatch.setattr(hypercorn_mend.time, "time", lambda: now[0])
    first = hypercorn_mend.http_date()
    assert first == b"Tue, 25 Nov 2025 19:46:40 GMT"
    now[0] += 0.7
    assert hypercorn_mend.http_date() is first  # the same second: not formatted again
    now[0] += 0.2
    assert hypercorn_mend.http_date() == b"Tue, 25 Nov 2025 19:46:41 GMT"
    mends.put_in_place(DATE_HEADER)
    headers = ServerConfig().response_headers("h11")
    assert headers == [(b"date", b"Tue, 25 Nov 2025 19:46:41 GMT")]  # one Date, no Server


def test_h11_headers_iterate_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    import h11._headers

    without_h11_mend(monkeypatch)
    sent = [(b"Host", b"example.org"), (b"X-Many", b"a, b"), (b"x-many", b"c")]
    before = h11.Request(method="GET", target="/", headers=sent)
    expected = [before.headers[i] for i in range(len(before.headers))]
    mends.put_in_place(HEADER_CHECK)
    assert "__iter__" in vars(h11._headers.Headers)
    after = h11.Request(method="GET", target="/", headers=sent)
    assert list(after.headers) == list(before.headers) == expected
    assert dict(after.headers)[b"host"] == b"example.org"
    assert after.headers == before.headers
