"""OpenTelemetry traces (optional): a span per request with the GenAI semantic-convention
attributes and one per upstream attempt beneath it, failed attempts and failed requests
marked, and nothing of the content (prompt, reply, key) in any attribute."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from bench.fake_upstream import FakeUpstream
from gateway.config import ConfigError, parse_settings
from tests.plugins.servers import KEYS, ServedGateway, make_config

otel = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")

PROMPT = "a prompt no span may carry"
HEADERS = {"Authorization": f"Bearer {KEYS['alice']}"}


@pytest.fixture
def spans(gateway: ServedGateway) -> Any:
    from gateway.observe.tracing import Tracing

    exporter = otel.InMemorySpanExporter()
    gateway.state.observers.tracing = Tracing("test", exporter, batch=False)
    return exporter


async def test_a_request_and_its_attempt(gateway: ServedGateway, spans: Any) -> None:
    body = {"model": "claude-small", "messages": [{"role": "user", "content": PROMPT}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(gateway.v1 + "/chat/completions", json=body, headers=HEADERS) as r:
            assert r.status == 200
            rid = r.headers["x-request-id"]
        body = {"model": "nope", "messages": [{"role": "user", "content": PROMPT}]}
        async with s.post(gateway.v1 + "/chat/completions", json=body, headers=HEADERS) as r:
            assert r.status == 404
    finished = spans.get_finished_spans()
    request = next(x for x in finished if x.attributes.get("gateway.request_id") == rid)
    assert request.name == "chat claude-small"
    assert request.kind.name == "SERVER"
    attrs = dict(request.attributes)
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "claude-small"
    assert attrs["gen_ai.usage.input_tokens"] > 0 and attrs["gen_ai.usage.output_tokens"] > 0
    assert attrs["http.response.status_code"] == 200
    assert attrs["gateway.channel"] == "an"
    (attempt,) = [x for x in finished if x.parent and x.parent.span_id == request.context.span_id]
    assert attempt.kind.name == "CLIENT"
    assert attempt.attributes["gen_ai.provider.name"] == "anthropic"
    assert attempt.attributes["server.address"] == "127.0.0.1"
    failed = next(x for x in finished if x.attributes.get("http.response.status_code") == 404)
    assert failed.status.status_code.name == "ERROR"
    everything = str([dict(x.attributes) for x in finished]) + str([x.name for x in finished])
    assert PROMPT not in everything and KEYS["alice"] not in everything


async def test_a_failed_attempt_is_marked_and_the_next_channel_tried(
    fake: FakeUpstream, store_url: str
) -> None:
    from bench.fake_upstream import Reply
    from gateway.observe.tracing import Tracing
    from tests.plugins.servers import serve_app

    cfg = make_config(fake.url, store_url)
    backup = dict(cfg["channels"][0], name="oa-backup", priority=1)
    cfg["channels"].append(backup)
    async with serve_app(parse_settings(cfg)) as gw, aiohttp.ClientSession() as s:
        exporter = otel.InMemorySpanExporter()
        gw.state.observers.tracing = Tracing("test", exporter, batch=False)
        fake.queue(Reply(status=500))
        body = {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}]}
        async with s.post(gw.v1 + "/chat/completions", json=body, headers=HEADERS) as r:
            assert r.status == 200
    attempts = [x for x in exporter.get_finished_spans() if x.kind.name == "CLIENT"]
    assert [a.attributes["gateway.channel"] for a in attempts] == ["oa", "oa-backup"]
    assert attempts[0].status.status_code.name == "ERROR"
    assert attempts[0].attributes["error.type"]


def test_tracing_config_is_checked() -> None:
    with pytest.raises(ConfigError, match="tracing.otlp_endpoint"):
        parse_settings(make_config("http://x", "sqlite:///x.db", tracing={"otlp_endpoint": "x"}))
    s = parse_settings(
        make_config("http://x", "sqlite:///x.db", tracing={"otlp_endpoint": "http://c:4318"})
    )
    assert s.tracing.otlp_endpoint == "http://c:4318"
