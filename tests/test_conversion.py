"""One parametrized runner over the conversion fixture tree (pure, no event loop).

tests/fixtures/conversion/<client>__<upstream>/<case>/ holds request.json, upstream_request.json,
and either upstream_response.{json,sse} with client_response.{json,sse} or upstream_error.json
with client_error.json; an optional meta.json gives what the path says (``path_model``,
``path_stream``, ``sse``, ``capability``) and the channel (``upstream_model``,
``default_max_tokens``, ``client_headers``, ``prompt_tokens_estimate``). Same client and
upstream: the passthrough path.

The runner drives the objects the relay drives: the client adapter's ``match`` reads the
request's facts, and a stream is one ``RelayStream`` (a ``ConvertedStream`` of the channel's
decoder and the client's encoder, or the client protocol's pass-through) fed the upstream's
bytes. ``python -m tests.regenerate_fixtures`` (``make fixtures``) rewrites the golden files
from what :func:`outputs` gives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import orjson
import pytest

from gateway.errors import GatewayError
from gateway.protocols import ADAPTERS, CLIENTS
from gateway.protocols.base import (
    ConvertedStream,
    Ctx,
    Passthrough,
    RelayStream,
    UpstreamTarget,
)
from gateway.protocols.sse import SSEParser
from gateway.types import Usage

ROOT = Path(__file__).parent / "fixtures" / "conversion"
BASE_URLS = {
    "openai": "http://upstream.test/v1",
    "anthropic": "http://upstream.test",
    "gemini": "http://upstream.test",
}
JSON_ARRAY = "application/json"  # the content type of a generate-content stream without SSE


def case_dirs() -> list[Path]:
    return [
        case
        for pair in sorted(p for p in ROOT.iterdir() if p.is_dir())
        for case in sorted(p for p in pair.iterdir() if p.is_dir())
    ]


def cases() -> list[Any]:
    return [pytest.param(case, id=f"{case.parent.name}/{case.name}") for case in case_dirs()]


def load(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def dump(value: Any) -> bytes:
    """A golden JSON file's bytes: sorted keys, two-space indents, ASCII, a final newline."""
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


class Case:
    """One fixture directory, read as the relay would see its request."""

    def __init__(self, path: Path) -> None:
        self.path = path
        client, upstream = path.parent.name.split("__")
        self.client = CLIENTS[client]
        self.upstream = ADAPTERS[upstream]
        self.passthrough = client == upstream
        meta = load(path / "meta.json") if (path / "meta.json").exists() else {}
        self.request = load(path / "request.json")
        self.route = self.client.match(
            meta.get("capability", "chat"),
            self.request,
            meta.get("path_model"),
            b"alt=sse" if meta.get("sse", True) else b"",
            meta.get("path_stream"),
        )
        self.stream = bool(self.route.stream)
        self.ctx = Ctx(
            request_id="req-test",
            model=self.route.model or "",
            created=1700000000,
            include_usage=self.route.include_usage,
            prompt_tokens_estimate=meta.get("prompt_tokens_estimate", 0),
        )
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

    def relay_stream(self) -> RelayStream:
        """The stream object the relay drives for this pair."""
        if self.passthrough:
            client = cast(Passthrough, self.client)
            return client.passthrough_stream(self.ctx, self.route, self.target)
        return ConvertedStream(
            self.upstream.stream_decoder(self.ctx), self.client.stream_encoder(self.ctx, self.route)
        )


def upstream_request(c: Case) -> dict[str, Any]:
    """What goes to the channel: its URL and its body."""
    request = orjson.loads(orjson.dumps(c.request))  # a copy: adapters may change the payload
    if c.passthrough:
        call = cast(Passthrough, c.upstream).passthrough_request(request, c.route, c.target)
    else:
        call = c.upstream.encode_request(c.client.decode_request(request, c.route), c.target)
    return {"url": call.url, "body": orjson.loads(call.body)}


def run_stream(c: Case, raw: bytes, split: int | None = None) -> tuple[bytes, Usage | None]:
    """The upstream's bytes (in two pieces when ``split`` is given) through the pair's
    ``RelayStream``, as the relay's loop feeds it: what the client gets, and the usage read."""
    pieces = [raw] if split is None else [raw[:split], raw[split:]]
    stream = c.relay_stream()
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
    array = c.relay_stream().content_type == JSON_ARRAY
    return "client_response.json" if array else "client_response.sse"


def outputs(path: Path) -> dict[str, bytes]:
    """The golden files of a case as the gateway writes them now, by name."""
    c = Case(path)
    out = {"upstream_request.json": dump(upstream_request(c))}
    if (path / "upstream_error.json").exists():
        up = load(path / "upstream_error.json")
        status, body = c.client.encode_error(
            c.upstream.decode_error(up["status"], orjson.dumps(up["body"]))
        )
        out["client_error.json"] = dump({"status": status, "body": body})
    elif not c.stream:
        payload = load(path / "upstream_response.json")
        if c.passthrough:
            reply, _ = cast(Passthrough, c.client).passthrough_response(payload, c.ctx)
        else:
            reply = c.client.encode_response(c.upstream.decode_response(payload), c.ctx)
        out["client_response.json"] = dump(orjson.loads(orjson.dumps(reply)))
    else:
        sent, _ = run_stream(c, (path / "upstream_response.sse").read_bytes())
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
    return [p for p in cases() if (p.values[0] / "upstream_response.sse").exists()]


def decoded_usage(c: Case, raw: bytes) -> Usage | None:
    """The usage of a whole upstream stream as the channel's decoder reports it."""
    parser = SSEParser()
    decoder = c.upstream.stream_decoder(c.ctx)
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
    split; a stream that ended properly reports the usage its channel's decoder reads (the
    pass-through reads it from the events as they pass, without decoding them)."""
    c = Case(path)
    raw = (path / "upstream_response.sse").read_bytes()
    whole = run_stream(c, raw)
    for offset in range(1, len(raw)):
        assert run_stream(c, raw, split=offset) == whole, f"split at {offset}"
    try:
        expected = decoded_usage(c, raw)
    except GatewayError:
        return  # cut or failed: billed on what was read so far
    assert whole[1] == expected


def test_every_case_is_complete() -> None:
    """Each case has its request, its upstream request, and one reply or one error, both
    sides; no file is left over from another shape."""
    for path in case_dirs():
        names = {p.name for p in path.iterdir()}
        expected = {"request.json", "upstream_request.json"} | set(outputs(path))
        if (path / "upstream_error.json").exists():
            expected.add("upstream_error.json")
        else:
            expected.add("upstream_response.sse" if Case(path).stream else "upstream_response.json")
        assert names - {"meta.json"} == expected, path


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
