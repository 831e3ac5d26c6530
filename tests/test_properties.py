"""No input makes a decoder fail with anything but a gateway error (a 4xx for the client's
mistake, a 502 for an upstream's), on both sides of every conversion.

Hypothesis takes each conversion fixture (tests/fixtures/conversion: every client protocol to
every channel type, pass-through included) and replaces one field, anywhere in the body, with
a value of another JSON type (or the whole body with arbitrary JSON), then runs what the
relay runs: the client side's ``match`` and request decoding and the channel side's request
encoding; the channel side's reply decoding and the client side's encoding; the stream pair
fed the upstream's events with one event's field replaced. Only ``GatewayError`` may come out,
and for the client's body only a 4xx. Bounded: derandomized, a few hundred
examples per side, well under a minute in all."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from tests.fixture_tree import CONVERSION_TREE, EMBEDDINGS_TREE, FixtureCase, case_dirs, load
from tests.test_conversion import Case, run_stream, upstream_request
from tests.test_embeddings_conversion import Case as EmbedCase

CASES = case_dirs(CONVERSION_TREE)
REPLY_CASES = [p for p in CASES if FixtureCase(p).has_reply(".json")]
STREAM_CASES = [p for p in CASES if FixtureCase(p).has_reply(".sse")]
BOUNDED = settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value where a field or an item sits."""
    out: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append((*prefix, k))
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.append((*prefix, i))
            out += paths(v, (*prefix, i))
    return out


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    out = copy.deepcopy(value)
    if not path:
        return new
    here = out
    for step in path[:-1]:
        here = here[step]
    here[path[-1]] = new
    return out


@st.composite
def mutated(draw: st.DrawFn, value: Any) -> Any:
    """``value`` with one field replaced by a value of any JSON type, or arbitrary JSON."""
    places = paths(value)
    if not places or draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    return replaced(value, draw(st.sampled_from(places)), draw(json_values))


@st.composite
def client_requests(draw: st.DrawFn) -> tuple[Path, Any]:
    path = draw(st.sampled_from(CASES))
    return path, draw(mutated(FixtureCase(path).request))


def decode_request(path: Path, request: Any) -> None:
    """What the relay does with a client's body before anything goes upstream."""
    case = Case.__new__(Case)
    meta = FixtureCase(path).manifest
    Case.__init__(case, path)  # the fixture's own request: the target, ctx and adapters
    case.request = request
    case.route = case.client.match(
        meta.get("capability", "chat"),
        request,
        meta.get("path_model"),
        b"alt=sse" if meta.get("sse", True) else b"",
        meta.get("path_stream"),
    )
    upstream_request(case)


@BOUNDED
@given(client_requests())
def test_a_client_body_of_any_shape_is_a_gateway_error_at_worst(
    example: tuple[Path, Any],
) -> None:
    path, request = example
    try:
        decode_request(path, request)
    except GatewayError as err:
        assert err.status < 500, (err.status, err.message)


@st.composite
def upstream_replies(draw: st.DrawFn) -> tuple[Path, Any]:
    path = draw(st.sampled_from(REPLY_CASES))
    return path, draw(mutated(load(FixtureCase(path).reply(".json"))))


@BOUNDED
@given(upstream_replies())
def test_an_upstream_reply_of_any_shape_is_a_gateway_error_at_worst(
    example: tuple[Path, Any],
) -> None:
    path, payload = example
    exchange = Case(path).attempt()  # the kind's choice: pass-through or conversion
    try:
        exchange.reply(orjson.dumps(payload), {})
    except GatewayError as err:
        assert err.status >= 500, (err.status, err.message)  # the upstream's fault, not ours


def sse_events(raw: bytes) -> list[tuple[bytes, Any]]:
    """An SSE body as (event lines before data, data JSON or raw bytes) blocks."""
    out: list[tuple[bytes, Any]] = []
    for block in raw.split(b"\n\n"):
        if not block.strip():
            continue
        head, data = b"", None
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                text = line[5:].strip()
                try:
                    data = orjson.loads(text)
                except orjson.JSONDecodeError:
                    data = text
            else:
                head += line + b"\n"
        out.append((head, data))
    return out


def sse_bytes(events: list[tuple[bytes, Any]]) -> bytes:
    out = b""
    for head, data in events:
        body = data if isinstance(data, bytes) else orjson.dumps(data)
        out += head + b"data: " + body + b"\n\n"
    return out


@st.composite
def upstream_streams(draw: st.DrawFn) -> tuple[Path, bytes]:
    path = draw(st.sampled_from(STREAM_CASES))
    events = sse_events(FixtureCase(path).reply(".sse").read_bytes())
    i = draw(st.integers(0, len(events) - 1))
    head, data = events[i]
    if not isinstance(data, bytes):
        events[i] = (head, draw(mutated(data)))
    return path, sse_bytes(events)


@BOUNDED
@given(upstream_streams())
def test_an_upstream_stream_of_any_shape_is_a_gateway_error_at_worst(
    example: tuple[Path, bytes],
) -> None:
    path, raw = example
    run_stream(Case(path), raw)  # a GatewayError is caught there and sent in the stream


# --- the embeddings endpoints (their own adapters and fixtures) ----------------------------

EMBED_CASES = case_dirs(EMBEDDINGS_TREE)
EMBED_REPLIES = [p for p in EMBED_CASES if FixtureCase(p).has_reply(".json")]


@st.composite
def embed_requests(draw: st.DrawFn) -> tuple[Path, Any]:
    path = draw(st.sampled_from(EMBED_CASES))
    return path, draw(mutated(FixtureCase(path).request))


@BOUNDED
@given(embed_requests())
def test_an_embeddings_body_of_any_shape_is_a_gateway_error_at_worst(
    example: tuple[Path, Any],
) -> None:
    path, request = example
    c = EmbedCase(path)
    c.request, c.error = request, None
    try:
        c.run_request()
    except GatewayError as err:
        assert err.status < 500, (err.status, err.message)


@st.composite
def embed_replies(draw: st.DrawFn) -> tuple[Path, Any]:
    path = draw(st.sampled_from(EMBED_REPLIES))
    return path, draw(mutated(load(FixtureCase(path).reply(".json"))))


@BOUNDED
@given(embed_replies())
def test_an_embeddings_reply_of_any_shape_is_a_gateway_error_at_worst(
    example: tuple[Path, Any],
) -> None:
    path, payload = example
    c = EmbedCase(path)
    if c.error is not None:
        return  # an error case: its reply is not the point
    exchange = c.run_request()  # the kind's choice: pass-through or conversion
    try:
        exchange.reply(orjson.dumps(payload), {})
    except GatewayError as err:
        assert err.status >= 500, (err.status, err.message)
