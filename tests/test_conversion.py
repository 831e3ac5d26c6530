"""One parametrized runner over the conversion fixture tree (pure, no event loop).

tests/fixtures/conversion/<client>__<upstream>/<case>/ holds request.json, upstream_request.json,
upstream_response.{json,sse}, client_response.{json,sse} (or upstream_error.json and
client_error.json), and an optional meta.json. Same client and upstream: the passthrough path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.errors import GatewayError
from gateway.protocols import ADAPTERS
from gateway.protocols.base import Ctx, RouteMatch, UpstreamTarget
from gateway.sse import SSEParser

ROOT = Path(__file__).parent / "fixtures" / "conversion"
BASE_URLS = {
    "openai": "http://upstream.test/v1",
    "anthropic": "http://upstream.test",
    "gemini": "http://upstream.test",
}


def cases() -> list[Any]:
    out = []
    for pair in sorted(p for p in ROOT.iterdir() if p.is_dir()) if ROOT.exists() else ():
        for case in sorted(p for p in pair.iterdir() if p.is_dir()):
            out.append(pytest.param(case, id=f"{pair.name}/{case.name}"))
    return out


def load(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


def sse_events(raw: bytes) -> list[tuple[str | None, Any]]:
    parser = SSEParser()
    events = parser.feed(raw) + parser.close()
    out: list[tuple[str | None, Any]] = []
    for e in events:
        try:
            data: Any = orjson.loads(e.data)
        except orjson.JSONDecodeError:
            data = e.data.decode()
        out.append((e.event, data))
    return out


class Case:
    def __init__(self, path: Path) -> None:
        self.path = path
        client, upstream = path.parent.name.split("__")
        self.client = ADAPTERS[client]
        self.upstream = ADAPTERS[upstream]
        self.passthrough = client == upstream
        meta = load(path / "meta.json") if (path / "meta.json").exists() else {}
        self.meta = meta
        self.request = load(path / "request.json")
        self.route = RouteMatch(
            protocol=client,
            capability=meta.get("capability", "chat"),
            model=meta.get("path_model"),
            stream=meta.get("path_stream"),
            sse=meta.get("sse", True),
        )
        stream = meta.get("path_stream")
        if stream is None:
            stream = self.request.get("stream", False) is True
        self.stream = stream
        opts = self.request.get("stream_options")
        self.ctx = Ctx(
            request_id="req-test",
            model=meta.get("path_model") or self.request.get("model", ""),
            created=1700000000,
            include_usage=isinstance(opts, dict) and opts.get("include_usage") is True,
            prompt_tokens_estimate=meta.get("prompt_tokens_estimate", 0),
        )
        self.target = UpstreamTarget(
            channel="test",
            base_url=BASE_URLS[upstream],
            api_key="up-key",
            model=meta.get("upstream_model", "upstream-model"),
            default_max_tokens=meta.get("default_max_tokens", 4096),
            stream=stream,
            client_headers=meta.get("client_headers", {}),
        )


@pytest.mark.parametrize("path", cases())
def test_request(path: Path) -> None:
    c = Case(path)
    expected_file = path / "upstream_request.json"
    if not expected_file.exists():
        pytest.skip("error-only case")
    if c.passthrough:
        call = c.upstream.passthrough_request(
            orjson.loads(orjson.dumps(c.request)), c.route, c.target
        )
    else:
        req = c.client.decode_request(c.request, c.route)
        call = c.upstream.encode_request(req, c.target)
    expected = load(expected_file)
    assert call.url == expected["url"]
    assert orjson.loads(call.body) == expected["body"]


@pytest.mark.parametrize("path", cases())
def test_response(path: Path) -> None:
    c = Case(path)
    if (path / "upstream_error.json").exists():
        up = load(path / "upstream_error.json")
        err = c.upstream.decode_error(up["status"], orjson.dumps(up["body"]))
        status, body = c.client.encode_error(err)
        expected = load(path / "client_error.json")
        assert (status, body) == (expected["status"], expected["body"])
        return
    if not c.stream:
        up_payload = load(path / "upstream_response.json")
        if c.passthrough:
            out, _usage = c.client.passthrough_response(up_payload, c.ctx)
        else:
            out = c.client.encode_response(c.upstream.decode_response(up_payload), c.ctx)
        assert orjson.loads(orjson.dumps(out)) == load(path / "client_response.json")
        return
    out = run_stream(c, (path / "upstream_response.sse").read_bytes())
    if (path / "client_response.sse").exists():
        assert sse_events(out) == sse_events((path / "client_response.sse").read_bytes())
    else:  # a generate-content client without SSE: one JSON array
        assert orjson.loads(out) == load(path / "client_response.json")


def run_stream(c: Case, raw: bytes, split: int | None = None) -> bytes:
    """Feed the upstream bytes (in two pieces when ``split`` is given) through the pair."""
    pieces = [raw] if split is None else [raw[:split], raw[split:]]
    parser = SSEParser()
    out = b""
    usage = None
    if c.passthrough:
        ps = c.client.passthrough_stream(c.ctx, c.route, c.target)
        try:
            for piece in pieces:
                out += ps.feed(piece)
            out += ps.finish()
        except GatewayError as err:
            out += ps.error(err)
        return out
    dec = c.upstream.stream_decoder(c.ctx)
    enc = c.client.stream_encoder(c.ctx, c.route)
    try:
        for piece in pieces:
            for event in parser.feed(piece):
                for chunk in dec.feed(event):
                    usage = chunk.get("usage") or usage
                    out += enc.encode(chunk)
        for event in parser.close():
            for chunk in dec.feed(event):
                usage = chunk.get("usage") or usage
                out += enc.encode(chunk)
        for chunk in dec.close():
            usage = chunk.get("usage") or usage
            out += enc.encode(chunk)
        out += enc.finish(usage)
    except GatewayError as err:
        out += enc.error(err)
    return out


def stream_cases() -> list[Any]:
    return [p for p in cases() if (p.values[0] / "upstream_response.sse").exists()]


@pytest.mark.parametrize("path", stream_cases())
def test_stream_split_at_every_offset(path: Path) -> None:
    """Every stream fixture gives the same client output however the bytes are split."""
    c = Case(path)
    raw = (path / "upstream_response.sse").read_bytes()
    whole = run_stream(Case(path), raw)
    for offset in range(1, len(raw)):
        assert run_stream(Case(path), raw, split=offset) == whole, f"split at {offset}"
    del c
