"""The conversion fixtures of bedrock channels' protocols (pure, no event loop), in the layout
of tests/fixtures/conversion: tests/fixtures/bedrock/<client>__<upstream>/<case>/ holds
request.json, upstream_request.json (``url``, ``headers``, ``body``), and either
upstream_response.json (a whole reply) or upstream_response.events.json (a stream) with
client_response.{json,sse}, or upstream_error.json (``status``, ``headers``, ``body``) with
client_error.json; meta.json as there (``upstream_model``, ``client_headers``, ...).

Upstreams: ``converse`` (Bedrock's Converse API) and ``anthropic-invoke`` (Claude's Messages
body through ``invoke``; an anthropic client takes its pass-through). A stream is stored as
the events boto3 shows (``{"<event type>": payload}`` per event; an exception's type ends in
``Exception``; an invoke ``chunk``'s ``bytes`` is stored as the Messages event's JSON, not
its base64) and sent through AWS event-stream framing, byte for byte as Bedrock frames it.

They live beside the conversion tree, not in it, until ``bedrock`` is a channel type of the
relay (``gateway.protocols.ADAPTERS``); ``make fixtures`` regenerates them with the rest.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, cast

import orjson
import pytest

from gateway.errors import GatewayError
from gateway.protocols import CLIENTS
from gateway.protocols.anthropic.bedrock import InvokeAdapter
from gateway.protocols.base import ConvertedStream, Ctx, Passthrough, RelayStream, UpstreamTarget
from gateway.protocols.converse import ConverseAdapter
from gateway.types import Usage
from gateway.upstream.eventstream import EventStreamParser, encode_event, encode_exception
from tests.test_conversion import dump, load

ROOT = Path(__file__).parent / "fixtures" / "bedrock"
BASE_URL = "https://bedrock-runtime.us-east-1.amazonaws.com"
UPSTREAMS: dict[str, Any] = {
    "converse": ConverseAdapter(),
    "anthropic-invoke": InvokeAdapter(EventStreamParser),
}
PASSTHROUGH = {("anthropic", "anthropic-invoke")}  # the client pairs that pass through
ERROR_TYPE = "x-amzn-errortype"


def case_dirs() -> list[Path]:
    return [
        case
        for pair in sorted(p for p in ROOT.iterdir() if p.is_dir())
        for case in sorted(p for p in pair.iterdir() if p.is_dir())
    ]


def cases() -> list[Any]:
    return [pytest.param(case, id=f"{case.parent.name}/{case.name}") for case in case_dirs()]


def event_stream(events: list[dict[str, Any]]) -> bytes:
    """The stored events in AWS event-stream framing."""
    out = []
    for event in events:
        ((name, payload),) = event.items()
        if name.endswith("Exception"):
            out.append(encode_exception(name, orjson.dumps(payload)))
            continue
        if name == "chunk" and isinstance(payload.get("bytes"), dict):
            inner = base64.b64encode(orjson.dumps(payload["bytes"])).decode()
            payload = {**payload, "bytes": inner}
        out.append(encode_event(name, orjson.dumps(payload)))
    return b"".join(out)


class Case:
    """One fixture directory, read as the relay would see its request."""

    def __init__(self, path: Path) -> None:
        self.path = path
        client, upstream = path.parent.name.split("__")
        self.client = CLIENTS[client]
        self.upstream = UPSTREAMS[upstream]
        self.passthrough = (client, upstream) in PASSTHROUGH
        meta = load(path / "meta.json") if (path / "meta.json").exists() else {}
        self.request = load(path / "request.json")
        self.route = self.client.match("chat", self.request, None, b"", None)
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
            base_url=BASE_URL,
            api_key="",
            model=meta.get("upstream_model", "anthropic.claude-3-5-sonnet-20240620-v1:0"),
            default_max_tokens=meta.get("default_max_tokens", 4096),
            stream=self.stream,
            client_headers=meta.get("client_headers", {}),
        )

    def relay_stream(self) -> RelayStream:
        if self.passthrough:
            return cast(Passthrough, self.upstream).passthrough_stream(
                self.ctx, self.route, self.target
            )
        return ConvertedStream(
            self.upstream.stream_decoder(self.ctx),
            self.client.stream_encoder(self.ctx, self.route),
            EventStreamParser(),
        )

    def upstream_stream(self) -> bytes:
        return event_stream(load(self.path / "upstream_response.events.json"))


def upstream_request(c: Case) -> dict[str, Any]:
    request = orjson.loads(orjson.dumps(c.request))  # a copy: adapters may change the payload
    if c.passthrough:
        call = cast(Passthrough, c.upstream).passthrough_request(request, c.route, c.target)
    else:
        call = c.upstream.encode_request(c.client.decode_request(request, c.route), c.target)
    return {"url": call.url, "headers": call.headers, "body": orjson.loads(call.body)}


def run_stream(c: Case, raw: bytes, split: int | None = None) -> tuple[bytes, Usage | None]:
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


def outputs(path: Path) -> dict[str, bytes]:
    """The golden files of a case as the gateway writes them now, by name."""
    c = Case(path)
    out = {"upstream_request.json": dump(upstream_request(c))}
    if (path / "upstream_error.json").exists():
        up = load(path / "upstream_error.json")
        header = {k.lower(): v for k, v in up.get("headers", {}).items()}.get(ERROR_TYPE)
        err = c.upstream.decode_error(up["status"], orjson.dumps(up["body"]), header)
        status, body = c.client.encode_error(err)
        out["client_error.json"] = dump(
            {"status": status, "body": body, "channel_fault": err.channel_fault}
        )
    elif not c.stream:
        payload = load(path / "upstream_response.json")
        if c.passthrough:
            reply, _ = cast(Passthrough, c.upstream).passthrough_response(payload, c.ctx)
        else:
            reply = c.client.encode_response(c.upstream.decode_response(payload), c.ctx)
        out["client_response.json"] = dump(orjson.loads(orjson.dumps(reply)))
    else:
        sent, usage = run_stream(c, c.upstream_stream())
        out["client_response.sse"] = sent
        out["usage.json"] = dump(usage)
    return out


@pytest.mark.parametrize("path", cases())
def test_request(path: Path) -> None:
    assert upstream_request(Case(path)) == load(path / "upstream_request.json")


@pytest.mark.parametrize("path", cases())
def test_response(path: Path) -> None:
    for name, data in outputs(path).items():
        if name == "upstream_request.json":
            continue
        golden = (path / name).read_bytes()
        if name.endswith(".json"):
            assert orjson.loads(data) == orjson.loads(golden), name
        else:
            assert data == golden, name


def stream_cases() -> list[Any]:
    return [p for p in cases() if (p.values[0] / "upstream_response.events.json").exists()]


@pytest.mark.parametrize("path", stream_cases())
def test_stream_split_at_every_offset(path: Path) -> None:
    """The same client output and usage however the event-stream bytes are split."""
    c = Case(path)
    raw = c.upstream_stream()
    whole = run_stream(c, raw)
    for offset in range(1, len(raw)):
        assert run_stream(c, raw, split=offset) == whole, f"split at {offset}"


def test_every_case_is_complete() -> None:
    for path in case_dirs():
        names = {p.name for p in path.iterdir()}
        expected = {"request.json"} | set(outputs(path))
        if (path / "upstream_error.json").exists():
            expected.add("upstream_error.json")
        elif Case(path).stream:
            expected.add("upstream_response.events.json")
        else:
            expected.add("upstream_response.json")
        assert names - {"meta.json"} == expected, path


# no reply or stream of any shape makes a decoder fail with anything but a gateway error -----
ODD = (None, True, -1, 2.5, "x", [], {}, [{}])


def places(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value where a field or an item sits."""
    out: list[tuple[Any, ...]] = []
    if isinstance(value, dict | list):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, inner in items:
            out.append((*prefix, key))
            out.extend(places(inner, (*prefix, key)))
    return out


def replaced(value: Any, place: tuple[Any, ...], new: Any) -> Any:
    copy = orjson.loads(orjson.dumps(value))
    target = copy
    for key in place[:-1]:
        target = target[key]
    target[place[-1]] = new
    return copy


def reply_cases() -> list[Any]:
    return [p for p in cases() if (p.values[0] / "upstream_response.json").exists()]


@pytest.mark.parametrize("path", reply_cases())
def test_a_reply_of_any_shape_is_a_gateway_error_at_worst(path: Path) -> None:
    c = Case(path)
    payload = load(path / "upstream_response.json")
    for place in places(payload):
        for value in ODD:
            odd = replaced(payload, place, value)
            try:
                if c.passthrough:
                    cast(Passthrough, c.upstream).passthrough_response(odd, c.ctx)
                else:
                    c.client.encode_response(c.upstream.decode_response(odd), c.ctx)
            except GatewayError as err:
                assert err.status >= 500, (place, value, err.message)


@pytest.mark.parametrize("path", stream_cases())
def test_a_stream_of_any_shape_is_a_gateway_error_at_worst(path: Path) -> None:
    """Each field of each event replaced by a value of another type: the stream ends in a
    gateway error sent to the client, or completes (``run_stream`` lets nothing else by)."""
    c = Case(path)
    events = load(path / "upstream_response.events.json")
    for place in places(events):
        if len(place) < 3:
            continue  # an event's name is its framing's, not JSON
        for value in ODD:
            run_stream(c, event_stream(replaced(events, place, value)))
