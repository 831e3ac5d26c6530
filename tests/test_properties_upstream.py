"""Upstream side: whatever a channel answers, each protocol's reply reader ends in a
``GatewayError`` (the upstream's bad reply, a 502), never a crash, on every path it takes to a
client: the whole reply decoded and encoded for every client protocol, a stream through each
channel's decoder and every client's encoder, and each pass-through.

Inputs are the fixtures' upstream replies (the .json and .sse replies the cases of
tests/fixtures/conversion name; the Responses pass-through reads what the gateway's Responses
encoder wrote, client_response.json and .sse of the responses__* cases), each field replaced
by a value of every JSON type and by numbers far past any real count (a table), by any JSON
value and, for whole replies, a wholly random body (hypothesis). Each endpoint kind has
replies here: chat, token counting, embeddings, images, rerank, transcription, and speech
(billed from the request's ``input``: the reply's bytes are never read).

What a whole reply bills, priced at the highest prices a model may have, must fit the stores:
a cost within ``billing.MAX_COST`` and a usage record the journal and SQLite can write.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import MAX_PRICE, PRICE_FIELDS, Price
from gateway.errors import GatewayError
from gateway.kinds.audio import transcription_used
from gateway.kinds.chat import ChatJob, chat_used, stream_used
from gateway.kinds.embeddings import EMBEDDINGS
from gateway.kinds.media import IMAGES, RERANK, SPEECH
from gateway.kinds.wire import PASSTHROUGH
from gateway.policy.billing import MAX_COST, Metered, Rate, billable_tokens
from gateway.protocols import ADAPTERS, CLIENTS
from gateway.protocols.base import ConvertedStream, Counter, Ctx, RouteMatch, UpstreamTarget
from gateway.protocols.embeddings import EmbeddingsRequest
from gateway.protocols.responses import ResponsesAdapter
from gateway.protocols.sse import SSEParser, frame
from gateway.store import UsageRecord
from gateway.store.records import journal_line, usage_row
from gateway.types import ChatChunk
from tests.fixture_tree import CONVERSION_TREE, EMBEDDINGS_TREE, FixtureCase, case_dirs
from tests.mutation import (
    BOUNDED,
    ODD_VALUES,
    Path_,
    copy,
    json_values,
    load,
    paths,
    replaced,
)

# numbers no upstream should report, that one may: past 64 bits, past a billable count
HUGE_VALUES: tuple[Any, ...] = (1e18, 1e300, -1e300, 2**64 - 1, 2**63, 1.5e19)
# every price at its highest: the most any reply can be billed
MOST = Rate.from_price(Price(**dict.fromkeys(PRICE_FIELDS, MAX_PRICE)))
RESPONSES = ResponsesAdapter()
# the client sides a reply is encoded for: every protocol, generate-content in both framings
ROUTES = [
    RouteMatch(protocol=name, capability="chat", model="m", stream=True, sse=sse)
    for name in CLIENTS
    for sse in ((True, False) if name == "gemini" else (True,))
]


def ctx() -> Ctx:
    return Ctx(request_id="req", model="m", created=1700000000, include_usage=True)


def target(stream: bool) -> UpstreamTarget:
    return UpstreamTarget("test", "http://up.test", "key", "up-model", 4096, stream)


@dataclass(frozen=True)
class Reply:
    id: str
    protocol: str  # the channel's protocol ("responses": the Responses pass-through)
    kind: str  # "chat" | "count" | "embeddings" | "images" | "rerank" | "transcription" | ...
    body: Any


@dataclass(frozen=True)
class Stream:
    id: str
    protocol: str
    events: tuple[tuple[str | None, Any], ...]  # (event name, JSON data or raw bytes)


def _unique(items: list[Any], key: Any) -> list[Any]:
    seen: set[Any] = set()
    out = []
    for item in items:
        k = key(item)
        if k not in seen:
            seen.add(k)
            out.append(item)
    return out


# the transcription replies of each format that reports what was used
TRANSCRIPTIONS: dict[str, Any] = {
    "duration": {"text": "hello", "usage": {"type": "duration", "seconds": 3}},
    "tokens": {
        "text": "hello",
        "usage": {
            "type": "tokens",
            "input_tokens": 14,
            "output_tokens": 3,
            "total_tokens": 17,
            "input_token_details": {"audio_tokens": 14, "text_tokens": 0},
        },
    },
    "verbose_json": {
        "task": "transcribe",
        "language": "english",
        "duration": 8.47,
        "text": "hello",
        "segments": [{"id": 0, "start": 0.0, "end": 8.47, "text": "hello", "tokens": [1, 2]}],
    },
}


def replies() -> list[Reply]:
    out = []
    for case in map(FixtureCase, case_dirs(CONVERSION_TREE)):
        if case.has_reply(".json"):
            kind = "count" if case.meta.get("capability") == "count_tokens" else "chat"
            body = load(case.reply(".json"))
            out.append(Reply(case.id, case.reply_protocol, kind, body))
    for path in sorted(CONVERSION_TREE.glob("responses__*/*/client_response.json")):
        name = f"responses-passthrough/{path.parent.parent.name}/{path.parent.name}"
        out.append(Reply(name, "responses", "chat", load(path)))
    for case in map(FixtureCase, case_dirs(EMBEDDINGS_TREE)):
        if case.has_reply(".json"):
            body = load(case.reply(".json"))
            out.append(Reply(f"embeddings/{case.id}", case.upstream, "embeddings", body))
    out.append(Reply("images", "openai", "images", {"created": 1, "data": [{"url": "u"}]}))
    rerank = {"results": [{"index": 0, "relevance_score": 0.5}], "usage": {"total_tokens": 3}}
    out.append(Reply("rerank", "openai", "rerank", rerank))
    for name, body in TRANSCRIPTIONS.items():
        out.append(Reply(f"transcription/{name}", "openai", "transcription", body))
    out.append(Reply("speech", "openai", "speech", {"model": "m", "input": "hi", "voice": "x"}))
    return _unique(out, lambda r: (r.protocol, r.kind, orjson.dumps(r.body)))


def _events(raw: bytes) -> tuple[tuple[str | None, Any], ...]:
    parser = SSEParser()
    out: list[tuple[str | None, Any]] = []
    for event in parser.feed(raw) + parser.close():
        try:
            out.append((event.event, orjson.loads(event.data)))
        except orjson.JSONDecodeError:
            out.append((event.event, event.data))  # [DONE], or garbage a fixture holds
    return tuple(out)


def streams() -> list[Stream]:
    out = []
    for case in map(FixtureCase, case_dirs(CONVERSION_TREE)):
        if case.has_reply(".sse"):
            events = _events(case.reply(".sse").read_bytes())
            out.append(Stream(case.id, case.reply_protocol, events))
    for path in sorted(CONVERSION_TREE.glob("responses__*/*/client_response.sse")):
        name = f"responses-passthrough/{path.parent.parent.name}/{path.parent.name}"
        out.append(Stream(name, "responses", _events(path.read_bytes())))
    return _unique(out, lambda s: (s.protocol, orjson.dumps(s.events, default=bytes.decode)))


REPLIES = replies()
STREAMS = streams()


# --- running them --------------------------------------------------------------------------
def embeddings_request(n: int) -> EmbeddingsRequest:
    return {"model": "m", "input": ["x"] * n}


def read_reply(r: Reply, body: Any) -> None:
    """Every path a whole reply of ``r``'s channel takes to a client, and what each bills
    (``settle``)."""
    if r.kind in ("images", "rerank", "speech"):
        kind = {"images": IMAGES, "rerank": RERANK, "speech": SPEECH}[r.kind]
        if isinstance(body, dict):
            asked = kind.asks(body) if r.kind == "speech" else Metered()
            settle(kind.meter(body, asked))
        return
    if r.kind == "transcription":
        settle(transcription_used(body))
        return
    if r.kind == "embeddings":
        upstream = EMBEDDINGS[r.protocol]
        _, usage = upstream.embeddings_passthrough_response(copy(body), ctx())
        settle(Metered(prompt_tokens=billable_tokens(usage["prompt_tokens"] if usage else 0)))
        items = body.get("data", body.get("embeddings")) if isinstance(body, dict) else None
        req = embeddings_request(len(items) if isinstance(items, list) else 1)
        resp = upstream.decode_embeddings_response(body, req)
        tokens = resp["usage"]["prompt_tokens"] if "usage" in resp else 0
        settle(Metered(prompt_tokens=billable_tokens(tokens)))
        for client in EMBEDDINGS.values():
            client.encode_embeddings(copy(resp), {**req, "encoding_format": "base64"}, ctx())
        return
    if r.protocol == "responses":
        settle(chat_used(RESPONSES.passthrough_response(body, ctx())[1]))
        return
    adapter = ADAPTERS[r.protocol]
    if r.kind == "count":
        assert isinstance(adapter, Counter)
        settle(Metered(prompt_tokens=billable_tokens(adapter.decode_count(body))))
        return
    settle(chat_used(PASSTHROUGH[r.protocol].passthrough_response(copy(body), ctx())[1]))
    resp = adapter.decode_response(body)
    settle(chat_used(resp.get("usage")))
    for client in CLIENTS.values():
        client.encode_response(copy(resp), ctx())


def chat_job() -> ChatJob:
    """A chat request whose prompt was estimated at 3 tokens: what a stream without the
    upstream's count bills for its prompt."""
    route = RouteMatch(protocol="openai", capability="chat", model="m", stream=True)
    return ChatJob(CLIENTS["openai"], route, None, estimate=3)


def settle(used: Metered) -> None:
    """What a reply used, priced at the highest prices, fits the stores: the cost within
    ``MAX_COST``, and its usage record written as the journal and SQLite write it."""
    cost = MOST.cost_of(used)
    assert 0 <= cost <= MAX_COST, used
    at = datetime(2024, 1, 1, tzinfo=UTC)
    rec = UsageRecord(
        at, "r", "a", "k", "m", "c", "openai", "chat",
        used.prompt_tokens, used.completion_tokens, cost, 200, 1, "",
    )  # fmt: skip
    journal_line(rec)
    assert all(-(2**63) <= v < 2**63 for v in usage_row(rec) if isinstance(v, int)), rec


def raw_stream(events: tuple[tuple[str | None, Any], ...]) -> bytes:
    return b"".join(
        frame(data if isinstance(data, bytes) else orjson.dumps(data), name)
        for name, data in events
    )


def read_stream(s: Stream, events: tuple[tuple[str | None, Any], ...]) -> None:
    """The stream through the channel's decoder and every client's encoder, and through the
    pass-through of its protocol. Each must end in a GatewayError or complete."""
    raw = raw_stream(events)
    passthrough = RESPONSES if s.protocol == "responses" else PASSTHROUGH[s.protocol]
    route = RouteMatch(protocol=s.protocol, capability="chat", model="m", stream=True)
    same = passthrough.passthrough_stream(ctx(), route, target(True))
    try:
        same.feed(raw)
        same.finish()
    except GatewayError as err:
        same.error(err)
    for complete in (True, False):  # what it bills, whole or cut short
        settle(stream_used(same, chat_job(), complete))
    if s.protocol == "responses":
        return
    chunks: list[ChatChunk] = []
    failure: GatewayError | None = None
    decoder = ADAPTERS[s.protocol].stream_decoder(ctx())
    parser = SSEParser()
    try:
        for event in parser.feed(raw) + parser.close():
            chunks.extend(decoder.feed(event))
        chunks.extend(decoder.close())
    except GatewayError as err:
        failure = err
    for client_route in ROUTES:
        encoder = CLIENTS[client_route.protocol].stream_encoder(ctx(), client_route)
        stream = ConvertedStream(_Replay(copy(chunks), failure), encoder)
        try:
            stream.feed(b"data: x\n\n")
            stream.finish()
        except GatewayError as err:
            stream.error(err)
        settle(stream_used(stream, chat_job(), failure is None))


class _Replay:
    """A stream decoder that gives what the channel's decoder gave (decoded once for every
    client's encoder), then its failure."""

    def __init__(self, chunks: list[ChatChunk], failure: GatewayError | None) -> None:
        self._chunks = chunks
        self._failure = failure

    def feed(self, event: object) -> list[ChatChunk]:
        chunks, self._chunks = self._chunks, []
        return chunks

    def close(self) -> list[ChatChunk]:
        if self._failure is not None:
            raise self._failure
        return []


def mutated_events(
    s: Stream, k: int, path: Path_, value: Any
) -> tuple[tuple[str | None, Any], ...]:
    name, data = s.events[k]
    return (
        *s.events[:k],
        (name, replaced(data, path, value) if path else copy(value)),
        *s.events[k + 1 :],
    )


def stream_fields(s: Stream) -> list[tuple[int, Path_]]:
    """(event, path) of every field of every JSON event, and each event as a whole."""
    out: list[tuple[int, Path_]] = []
    for k, (_, data) in enumerate(s.events):
        if not isinstance(data, bytes):
            out.append((k, ()))
            out.extend((k, path) for path in paths(data))
    return out


# --- the tests -------------------------------------------------------------------------
def test_the_fixtures_are_read_as_they_are() -> None:
    """The unmutated inputs: some are error cases, none crashes."""
    for r in REPLIES:
        try:
            read_reply(r, copy(r.body))
        except GatewayError:
            pass
    for s in STREAMS:
        read_stream(s, s.events)


def test_the_costliest_request_fits_the_stores() -> None:
    """The bound ``settle`` checks against is itself within 64 bits, with room for sums."""
    assert 0 < MAX_COST < 2**60


@pytest.mark.parametrize("r", REPLIES, ids=[r.id for r in REPLIES])
def test_reply_every_field_of_every_type(r: Reply) -> None:
    for path in list(paths(r.body)):
        for value in (*ODD_VALUES, *HUGE_VALUES):
            try:
                read_reply(r, replaced(r.body, path, value))
            except GatewayError:
                pass


@pytest.mark.parametrize("s", STREAMS, ids=[s.id for s in STREAMS])
def test_stream_every_field_of_every_type(s: Stream) -> None:
    for k, path in stream_fields(s):
        for value in ODD_VALUES:
            read_stream(s, mutated_events(s, k, path, value))


@BOUNDED
@given(st.sampled_from(REPLIES), st.data())
def test_reply_any_value_anywhere(r: Reply, data: st.DataObject) -> None:
    fields = list(paths(r.body))
    body = r.body
    if fields:
        body = replaced(body, data.draw(st.sampled_from(fields)), data.draw(json_values))
    try:
        read_reply(r, body)
    except GatewayError:
        pass


@BOUNDED
@given(st.sampled_from(REPLIES), json_values)
def test_reply_any_body(r: Reply, body: Any) -> None:
    try:
        read_reply(r, body)
    except GatewayError:
        pass


@BOUNDED
@given(st.sampled_from(STREAMS), st.data())
def test_stream_any_value_anywhere(s: Stream, data: st.DataObject) -> None:
    fields = stream_fields(s)
    k, path = data.draw(st.sampled_from(fields))
    read_stream(s, mutated_events(s, k, path, data.draw(json_values)))


@BOUNDED
@given(
    st.sampled_from(STREAMS),
    st.lists(
        st.tuples(
            st.none()
            | st.sampled_from(
                [
                    "message_start",
                    "content_block_start",
                    "content_block_delta",
                    "message_delta",
                    "error",
                ]
            ),
            json_values,
        ),
        max_size=5,
    ),
)
def test_stream_any_events(s: Stream, events: list[tuple[str | None, Any]]) -> None:
    """Random events, after the fixture's first (so the stream has begun)."""
    read_stream(s, (*s.events[:1], *events))
