"""Client side: whatever a client sends, each protocol's request reader answers with a
``GatewayError`` (a 400 naming the field it could not read), never a crash.

Every request fixture (tests/fixtures/conversion and tests/fixtures/embeddings) is read the way
the relay reads it (``match``, the chat-completions form, the local estimate, then the request
of every channel type, or the pass-through), first as it is, then with each field replaced by a
value of every JSON type (``test_every_field_of_every_type``: a table, exhaustive), by any JSON
value (``test_any_value_anywhere``: hypothesis), and as a wholly random body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import GatewayError, InvalidRequestError
from gateway.kinds.chat import max_output
from gateway.kinds.embeddings import EMBEDDINGS, estimate_tokens
from gateway.kinds.media import IMAGES, RERANK, SPEECH, MediaKind
from gateway.kinds.wire import PASSTHROUGH
from gateway.policy.tokens import estimate_prompt_tokens
from gateway.protocols import ADAPTERS, CLIENTS
from gateway.protocols.base import Counter, RouteMatch, UpstreamTarget
from tests.fixture_tree import CONVERSION_TREE, EMBEDDINGS_TREE, FixtureCase, case_dirs
from tests.mutation import (
    BOUNDED,
    ODD_VALUES,
    Path_,
    copy,
    json_values,
    names,
    paths,
    replaced,
)

BASE_URLS = {
    "openai": "http://up.test/v1",
    "responses": "http://up.test/v1",
    "anthropic": "http://up.test",
    "gemini": "http://up.test",
}


@dataclass(frozen=True)
class Request:
    """One fixture request and what its path says."""

    id: str
    kind: str  # "chat" | "count_tokens" | "embeddings"
    client: str
    body: Any
    meta: dict[str, Any]


def target(channel: str, stream: bool) -> UpstreamTarget:
    return UpstreamTarget("test", BASE_URLS[channel], "key", "up-model", 4096, stream)


def chat_requests() -> list[Request]:
    seen: set[str] = set()
    out = []
    for path in case_dirs(CONVERSION_TREE):
        case = FixtureCase(path)
        meta = case.meta
        key = f"{case.manifest['request']} {sorted(meta.items())!r}"  # the request stored once
        if key in seen:
            continue
        seen.add(key)
        out.append(
            Request(case.id, meta.get("capability", "chat"), case.client, case.request, meta)
        )
    return out


def embeddings_requests() -> list[Request]:
    out = []
    for path in case_dirs(EMBEDDINGS_TREE):
        case = FixtureCase(path)
        if "error" in case.manifest and "match" in path.name:
            continue
        out.append(
            Request(f"embeddings/{case.id}", "embeddings", case.client, case.request, case.meta)
        )
    return out


REQUESTS = chat_requests() + embeddings_requests()


def read_chat(r: Request, body: Any) -> None:
    """The chat and count paths as the relay takes them, for every channel type."""
    client = CLIENTS[r.client]
    query = b"alt=sse" if r.meta.get("sse", True) else b""
    route = client.match(r.kind, body, r.meta.get("path_model"), query, r.meta.get("path_stream"))
    max_output(body)  # the hold
    same = PASSTHROUGH.get(r.client)
    if same is not None:
        same.passthrough_request(copy(body), route, target(r.client, bool(route.stream)))
    req = client.decode_request(body, route)
    estimate_prompt_tokens(req)
    for name, upstream in ADAPTERS.items():
        if r.kind == "count_tokens":
            if isinstance(upstream, Counter):
                upstream.count_request(req, target(name, False))
        else:
            upstream.encode_request(req, target(name, bool(route.stream)))


def read_embeddings(r: Request, body: Any) -> None:
    client = EMBEDDINGS[r.client]
    route = client.match_embeddings(
        body,
        RouteMatch(
            protocol=r.client,
            capability="embeddings",
            model=r.meta.get("path_model"),
            stream=False,
            action=r.meta.get("action", ""),
        ),
    )
    client.embeddings_passthrough(copy(body), route, target(r.client, False))
    req = client.decode_embeddings(body, route)
    estimate_tokens(req)
    for name, upstream in EMBEDDINGS.items():
        try:
            upstream.embeddings_request(req, target(name, False))
        except InvalidRequestError:
            pass  # token arrays toward gemini: a 400 of the conversion, not of a field


def read(r: Request, body: Any) -> GatewayError | None:
    """What reading ``body`` as ``r``'s request raises: a GatewayError or nothing."""
    try:
        if r.kind == "embeddings":
            read_embeddings(r, body)
        else:
            read_chat(r, body)
    except GatewayError as err:
        return err
    return None


# errors about what a request means rather than the type of a field: a mutant may be a
# well-typed request of another meaning (a tool result whose call went missing)
MEANING_ERRORS = ("answers no earlier tool call",)


def valid(r: Request) -> bool:
    """Whether the fixture itself reads without an error (some are error cases)."""
    return read(r, copy(r.body)) is None


def check_mutant(r: Request, path: Path_, value: Any, named: bool) -> None:
    """Reading the mutant raises nothing but a GatewayError; with ``named``, a 400 names a
    field on the path (in either of Gemini's spellings)."""
    err = read(r, replaced(r.body, path, value))
    if named and isinstance(err, InvalidRequestError):
        if not any(m in err.message for m in MEANING_ERRORS):
            assert any(name in err.message for name in names(path)), (path, value, err.message)


@pytest.mark.parametrize("r", REQUESTS, ids=[r.id for r in REQUESTS])
def test_every_field_of_every_type(r: Request) -> None:
    """The table: each field of the fixture replaced by a value of each JSON type."""
    named = valid(r)  # the fixture itself may be an error case, but not a crash
    for path in list(paths(r.body)):
        for value in ODD_VALUES:
            check_mutant(r, path, value, named)


VALID = {r.id: valid(r) for r in REQUESTS}


@st.composite
def mutants(draw: st.DrawFn) -> tuple[Request, Path_, Any]:
    r = draw(st.sampled_from(REQUESTS))
    fields = list(paths(r.body))
    path = draw(st.sampled_from(fields)) if fields else ()
    return r, path, draw(json_values)


@BOUNDED
@given(mutants())
def test_any_value_anywhere(mutant: tuple[Request, Path_, Any]) -> None:
    r, path, value = mutant
    if path:
        check_mutant(r, path, value, VALID[r.id])


@BOUNDED
@given(st.sampled_from(REQUESTS), json_values)
def test_any_body(r: Request, body: Any) -> None:
    read(r, body)


@BOUNDED
@given(
    st.sampled_from(REQUESTS),
    st.dictionaries(
        st.sampled_from(sorted({k for r in REQUESTS if isinstance(r.body, dict) for k in r.body})),
        json_values,
        max_size=6,
    ),
)
def test_any_body_of_known_fields(r: Request, body: dict[str, Any]) -> None:
    """A random object of the fields the protocols know, each holding any JSON value."""
    read(r, body)


# --- the openai-only kinds: images, rerank, speech ---------------------------------------
MEDIA_BODIES: list[tuple[MediaKind, dict[str, Any]]] = [
    (IMAGES, {"model": "image-small", "prompt": "a cat", "n": 1, "size": "1024x1024"}),
    (RERANK, {"model": "rerank-small", "query": "q", "documents": ["a", "b"], "top_n": 1}),
    (SPEECH, {"model": "tts-small", "input": "hello", "voice": "alloy"}),
]


def read_media(kind: MediaKind, body: Any) -> GatewayError | None:
    try:
        kind.job(body)
    except GatewayError as err:
        return err
    return None


@pytest.mark.parametrize(("kind", "body"), MEDIA_BODIES, ids=[k.name for k, _ in MEDIA_BODIES])
def test_media_every_field_of_every_type(kind: MediaKind, body: dict[str, Any]) -> None:
    assert read_media(kind, copy(body)) is None
    for path in list(paths(body)):
        for value in ODD_VALUES:
            err = read_media(kind, replaced(body, path, value))
            if isinstance(err, InvalidRequestError):
                assert any(name in err.message for name in names(path)), (path, value, err)


@BOUNDED
@given(st.sampled_from([k for k, _ in MEDIA_BODIES]), json_values)
def test_media_any_body(kind: MediaKind, body: Any) -> None:
    read_media(kind, body)
