"""One parametrized runner over the conversion fixture tree (pure, no event loop).

tests/fixtures/conversion/<client>__<upstream>/<case>/case.json names the case's inputs (its
``request`` under requests/<client>/, and its ``upstream_response`` (.json or .sse) or
``upstream_error`` under replies/<protocol>/, the protocol the channel answers in; each stored
once: tests/fixtures/README.md) and gives what the path says (``path_model``, ``path_stream``,
``sse``, ``capability``: the kind, ``chat`` unless ``count_tokens``), the channel (``channel``:
what its config entry adds, such as ``responses: true``; ``upstream_model``,
``default_max_tokens``, ``client_headers``) and, for a stream in a protocol the gateway has no
decoder of, the usage it reports (``stream_usage``); ``record``: the token classes the usage
record keeps (tests/test_token_classes.py); ``prompt_cache``: the channel places cache
breakpoints. Beside it are the golden files: upstream_request.json, and
client_response.{json,sse} or client_error.json.

The runner drives the objects the relay drives: the client adapter's ``match`` reads the
request's facts, and the kind's ``exchange`` makes each attempt on the case's channel, so the
kind chooses the pass-through (the channel speaks the client's protocol) or a conversion, and
the exchange's upstream call, reply, error and ``RelayStream`` (fed the upstream's bytes) give
the outputs. ``python -m tests.regenerate_fixtures`` (``make fixtures``) rewrites the golden
files from what :func:`outputs` gives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.errors import GatewayError
from gateway.kinds import KINDS
from gateway.kinds.base import Exchange
from gateway.kinds.chat import ChatJob
from gateway.protocols import ADAPTERS, CLIENTS
from gateway.protocols.base import Ctx, UpstreamTarget
from gateway.protocols.sse import SSEParser
from gateway.types import Usage
from tests.fixture_tree import CONVERSION_TREE as ROOT
from tests.fixture_tree import MANIFEST, FixtureCase, load, shared_inputs, used_inputs
from tests.fixture_tree import case_dirs as tree_cases

BASE_URLS = {
    "openai": "http://upstream.test/v1",
    "anthropic": "http://upstream.test",
    "gemini": "http://upstream.test",
}
JSON_ARRAY = "application/json"  # the content type of a generate-content stream without SSE


def case_dirs() -> list[Path]:
    return tree_cases(ROOT)


def cases() -> list[Any]:
    return [pytest.param(case, id=f"{case.parent.name}/{case.name}") for case in case_dirs()]


def dump(value: Any) -> bytes:
    """A golden JSON file's bytes: sorted keys, two-space indents, ASCII, a final newline."""
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


class Case:
    """One fixture directory, read as the relay would see its request."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.files = FixtureCase(path)
        client, upstream = self.files.client, self.files.upstream
        self.client = CLIENTS[client]
        meta = self.files.manifest
        self.kind = KINDS[meta.get("capability", "chat")]
        self.request = self.files.request
        self.route = self.client.match(
            self.kind.name,
            self.request,
            meta.get("path_model"),
            b"alt=sse" if meta.get("sse", True) else b"",
            meta.get("path_stream"),
        )
        self.stream = bool(self.route.stream)
        self.channel = self.files.channel(BASE_URLS[upstream])
        self.target = UpstreamTarget(
            channel="test",
            base_url=BASE_URLS[upstream],
            api_key="up-key",
            model=meta.get("upstream_model", "upstream-model"),
            default_max_tokens=meta.get("default_max_tokens", 4096),
            stream=self.stream,
            client_headers=meta.get("client_headers", {}),
            prompt_cache=meta.get("prompt_cache", False),  # a channel's prompt_cache: auto
        )

    def ctx(self) -> Ctx:
        """The request's values, as the relay's pipeline makes them for its attempts."""
        return Ctx(
            request_id="req-test",
            model=self.route.model or "",
            created=1700000000,
            include_usage=self.route.include_usage,
            tool_namespaces=self.route.tool_namespaces,
            custom_tools=self.route.custom_tools,
        )

    def attempt(self) -> Exchange:
        """One attempt on the case's channel, as the relay makes it: the kind's ``exchange``
        chooses the pass-through (the channel speaks the client's protocol) or a conversion.
        The job holds a copy of the request (an exchange may rename its model in place)."""
        raw = orjson.dumps(self.request)
        job = ChatJob(self.client, self.route, orjson.loads(raw), size=len(raw))
        return self.kind.exchange(job, self.channel, self.target, self.ctx(), last=True)


def upstream_request(c: Case) -> dict[str, Any]:
    """What goes to the channel: its URL and its body."""
    call = c.attempt().call
    assert call is not None, "a fixture case asks its upstream"
    return {"url": call.url, "body": orjson.loads(call.body)}


def run_stream(
    c: Case, raw: bytes, split: int | None = None, exchange: Exchange | None = None
) -> tuple[bytes, Usage | None]:
    """The upstream's bytes (in two pieces when ``split`` is given) through the ``RelayStream``
    of an attempt (``exchange``, else a new one), as the relay's loop feeds it: what the client
    gets, and the usage read."""
    pieces = [raw] if split is None else [raw[:split], raw[split:]]
    stream = (exchange or c.attempt()).stream({})
    out = b""
    try:
        for piece in pieces:
            out += stream.feed(piece)
        out += stream.finish()
    except GatewayError as err:
        out += stream.error(err)
    return out, stream.usage


def stream_file(c: Case) -> str:
    """The golden file of a stream's output: a JSON array for a generate-content client
    without ``alt=sse``, else the SSE bytes as they are sent."""
    array = c.attempt().stream({}).content_type == JSON_ARRAY
    return "client_response.json" if array else "client_response.sse"


def outputs(path: Path) -> dict[str, bytes]:
    """The golden files of a case as the gateway writes them now, by name."""
    c = Case(path)
    out = {"upstream_request.json": dump(upstream_request(c))}
    up = c.files.upstream_error
    if up is not None:
        err = c.attempt().decode_error(up["status"], orjson.dumps(up["body"]))
        status, body = c.client.encode_error(err)
        out["client_error.json"] = dump({"status": status, "body": body})
    elif not c.stream:
        reply = c.attempt().reply(c.files.reply(".json").read_bytes(), {})
        out["client_response.json"] = dump(orjson.loads(reply.body))
    else:
        sent, _ = run_stream(c, c.files.reply(".sse").read_bytes())
        name = stream_file(c)
        out[name] = dump(orjson.loads(sent)) if name.endswith(".json") else sent
    return out


@pytest.mark.parametrize("path", cases())
def test_request(path: Path) -> None:
    c = Case(path)
    assert upstream_request(c) == load(path / "upstream_request.json")


@pytest.mark.parametrize("path", cases())
def test_response(path: Path) -> None:
    """Whole replies and errors compare as JSON; streams byte for byte (a JSON-array stream
    as JSON)."""
    for name, data in outputs(path).items():
        if name == "upstream_request.json":
            continue
        golden = (path / name).read_bytes()
        if name.endswith(".json"):
            assert orjson.loads(data) == orjson.loads(golden), name
        else:
            assert data == golden, name


def stream_cases() -> list[Any]:
    return [p for p in cases() if FixtureCase(p.values[0]).has_reply(".sse")]


def decoded_usage(c: Case, raw: bytes) -> Usage | None:
    """The usage of a whole upstream stream as the decoder of its protocol reports it."""
    parser = SSEParser()
    decoder = ADAPTERS[c.files.reply_protocol].stream_decoder(c.ctx())
    usage = None
    for event in parser.feed(raw) + parser.close():
        for chunk in decoder.feed(event):
            usage = chunk.get("usage") or usage
    for chunk in decoder.close():
        usage = chunk.get("usage") or usage
    return usage


@pytest.mark.parametrize("path", stream_cases())
def test_stream_split_at_every_offset(path: Path) -> None:
    """Every stream fixture gives the same client output and usage however the bytes are
    split; a stream that ended properly reports the usage the decoder of its protocol reads
    (the pass-through reads it from the events as they pass, without decoding them). A stream
    in a protocol the gateway only passes through (the Responses API) reports the usage its
    case.json gives (``stream_usage``)."""
    c = Case(path)
    raw = c.files.reply(".sse").read_bytes()
    exchange = c.attempt()
    whole = run_stream(c, raw, exchange=exchange)
    for offset in range(1, len(raw)):
        assert run_stream(c, raw, split=offset, exchange=exchange) == whole, f"split at {offset}"
    if c.files.reply_protocol not in ADAPTERS:
        assert whole[1] == c.files.manifest["stream_usage"]
        return
    try:
        expected = decoded_usage(c, raw)
    except GatewayError:
        return  # cut or failed: billed on what was read so far
    assert whole[1] == expected


# what a case.json may say besides its inputs
MANIFEST_KEYS = {
    "request", "upstream_response", "upstream_error", "path_model", "path_stream", "sse",
    "capability", "channel", "upstream_model", "default_max_tokens", "client_headers",
    "stream_usage", "record", "prompt_cache",
}  # fmt: skip


def test_every_case_is_complete() -> None:
    """Each case names its request and one upstream reply (a stream for a streamed request)
    or one error, each in its protocol's directory, says nothing the runner does not read, and
    holds the golden files of its outputs and nothing else."""
    for path in case_dirs():
        files = FixtureCase(path)
        assert set(files.manifest) <= MANIFEST_KEYS, path
        assert "request" in files.manifest, path
        assert not files.misplaced_inputs(), (path, files.misplaced_inputs())
        if "upstream_error" in files.manifest:
            assert "upstream_response" not in files.manifest, path
        else:
            assert files.has_reply(".sse" if Case(path).stream else ".json"), path
        undecoded = files.has_reply(".sse") and files.reply_protocol not in ADAPTERS
        assert ("stream_usage" in files.manifest) == undecoded, path
        names = {p.name for p in path.iterdir()}
        assert names == {MANIFEST} | set(outputs(path)), path


def test_every_input_is_used() -> None:
    """No request or reply is left in the tree that no case takes."""
    assert shared_inputs(ROOT) - used_inputs(ROOT) == set()


# the request's facts, as each client adapter reads them ------------------------------------
USAGE_ASKED = {"include_usage": True}
MATCHES = [  # (protocol, kind, payload, path model, query, path stream) -> facts
    ("openai", "chat", {"model": "m", "stream": True, "stream_options": USAGE_ASKED}, None, b"",
     None, {"model": "m", "stream": True, "include_usage": True}),
    ("openai", "chat", {"model": "m", "stream_options": USAGE_ASKED}, None, b"",
     None, {"model": "m", "stream": False, "include_usage": False}),
    ("anthropic", "chat", {"model": "m", "stream": True}, None, b"",
     None, {"model": "m", "stream": True}),
    ("anthropic", "count_tokens", {"model": "m", "stream": True}, None, b"",
     None, {"model": "m", "stream": False}),
    ("gemini", "chat", {"model": "ignored"}, "models/m", b"alt=sse",
     True, {"model": "m", "stream": True, "sse": True, "action": "streamGenerateContent"}),
    ("gemini", "chat", {}, "m", b"key=k",
     True, {"model": "m", "stream": True, "sse": False, "action": "streamGenerateContent"}),
    ("gemini", "count_tokens", {}, "m", b"",
     None, {"model": "m", "stream": False, "action": "countTokens"}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("protocol", "kind", "payload", "model", "query", "stream", "facts"), MATCHES
)
def test_match_reads_the_requests_facts(
    protocol: str,
    kind: str,
    payload: Any,
    model: str | None,
    query: bytes,
    stream: bool | None,
    facts: dict[str, Any],
) -> None:
    route = ADAPTERS[protocol].match(kind, payload, model, query, stream)
    assert (route.protocol, route.capability) == (protocol, kind)
    assert {k: getattr(route, k) for k in facts} == facts


@pytest.mark.parametrize(
    ("protocol", "payload", "path_model", "message"),
    [
        ("openai", [], None, "the request body must be a JSON object"),
        ("openai", {"messages": []}, None, "'model' is required and must be a string"),
        ("anthropic", {"model": ""}, None, "'model' is required and must be a string"),
        ("anthropic", {"model": 3, "stream": "yes"}, None, "'model' is required"),
        ("gemini", [], None, "model"),  # the missing model is told first
        ("gemini", [], "", "model"),
        ("gemini", [], "m", "the request body must be a JSON object"),
    ],
)
def test_match_refuses_a_request_without_its_model(
    protocol: str, payload: Any, path_model: str | None, message: str
) -> None:
    with pytest.raises(GatewayError) as info:
        ADAPTERS[protocol].match("chat", payload, path_model, b"", None)
    assert info.value.status == 400 and message in info.value.message
