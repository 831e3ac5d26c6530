"""The benchmark's embeddings cell (f): its bodies, the nginx upstream and relay that serve it,
the bare relay and the gateway config that relay it, the cells run and the report's rows."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from bench import bare_relay, nginx, payloads, report, run, targets
from gateway.config import load_settings


def test_the_upstream_reply_is_two_vectors_of_256_floats_with_usage() -> None:
    reply = orjson.loads(payloads.embeddings_reply())
    assert reply["object"] == "list"
    assert [d["index"] for d in reply["data"]] == list(range(payloads.EMBED_INPUTS))
    for item in reply["data"]:
        assert item["object"] == "embedding"
        assert len(item["embedding"]) == payloads.EMBED_DIMS
        assert all(isinstance(x, float) and abs(x) < 1 for x in item["embedding"])
    assert reply["usage"] == {"prompt_tokens": 23, "total_tokens": 23}
    assert reply["data"][-1]["embedding"][-1] == payloads.EMBED_MARK
    # what wrk checks: found once, as the last value; it survives a re-encoding by a relay
    [mark] = payloads.EXPECT["embeddings"]
    assert payloads.embeddings_reply().count(mark.encode()) == 1
    assert mark.encode() in orjson.dumps(orjson.loads(payloads.embeddings_reply()))
    assert payloads.embeddings_reply() == payloads.embeddings_reply()  # fixed, not random


def test_the_client_bodies() -> None:
    body = orjson.loads(payloads.request("embeddings"))
    assert body["model"] == payloads.MODEL["embeddings"] == "bench-embeddings"
    assert len(body["input"]) == payloads.EMBED_INPUTS
    assert body["encoding_format"] == "float"
    # the chat cells post what they always did
    assert payloads.request("json") == payloads.chat_request("json", False)
    assert payloads.request("sse") == payloads.chat_request("sse", True)


def test_nginx_serves_and_relays_embeddings(tmp_path: Path) -> None:
    conf = nginx.upstream_conf(tmp_path, 8080, False, 200, 25)
    assert "location = /embeddings/v1/embeddings" in conf
    assert (tmp_path / "embeddings-reply.json").read_bytes() == payloads.embeddings_reply()
    relay = nginx.relay_conf(tmp_path, 8081, 8080, (8082, "/v1"))
    assert "location /embeddings/ { proxy_pass http://up;" in relay


@pytest.mark.skipif(
    subprocess.run(["which", "nginx"], capture_output=True).returncode != 0,
    reason="nginx not installed",
)
def test_nginx_config_is_valid(tmp_path: Path) -> None:
    conf = tmp_path / "upstream.conf"
    conf.write_text(nginx.upstream_conf(tmp_path, 8080, False, 200, 25))
    done = subprocess.run(
        ["nginx", "-t", "-c", str(conf), "-p", str(tmp_path), "-e", "stderr"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def _upstream(up_port: int = 9000) -> targets.Upstream:
    return targets.Upstream(up_port, None, up_port + 1, "/v1", None, "test")  # type: ignore[arg-type]


def test_every_relay_target_posts_embeddings_to_v1_embeddings() -> None:
    assert targets.relay_paths()["embeddings"] == "/v1/embeddings"
    assert targets.relay_paths()["json"] == "/v1/chat/completions"
    direct = targets.direct(_upstream())
    assert direct.paths["embeddings"] == "/embeddings/v1/embeddings"
    assert _upstream().base_url("embeddings") == "http://127.0.0.1:9000/embeddings/v1"


def test_the_gateway_config_serves_embeddings_from_an_openai_channel(tmp_path: Path) -> None:
    settings = load_settings(targets.gateway_config(tmp_path, _upstream()))
    models = {m.name: m for m in settings.models}
    assert "embeddings" in models["bench-embeddings"].capabilities
    assert "embeddings" not in models["bench-json"].capabilities
    [channel] = [c for c in settings.channels if "bench-embeddings" in c.models]
    assert channel.type == "openai"
    assert channel.base_url == "http://127.0.0.1:9000/embeddings/v1"


async def _asgi_post(path: str, body: bytes) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return chunks.pop(0)

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    scope = {"type": "http", "method": "POST", "path": path, "headers": []}
    await bare_relay.app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def test_the_bare_relay_relays_embeddings_with_the_model_renamed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append((request.path, await request.json()))
        reply = payloads.embeddings_reply() if request.path.endswith("/embeddings") else b"{}"
        return web.Response(body=reply, content_type="application/json")

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    base = f"http://127.0.0.1:{port}/embeddings/v1"
    monkeypatch.setattr(bare_relay, "UPSTREAMS", {payloads.MODEL["embeddings"]: base})
    monkeypatch.setattr(bare_relay, "session", None)
    try:
        status, raw = await _asgi_post("/v1/embeddings", payloads.request("embeddings"))
        assert status == 200
        assert raw == payloads.embeddings_reply()
        sent = orjson.loads(payloads.request("embeddings"))
        assert seen == [("/embeddings/v1/embeddings", {**sent, "model": "upstream-model"})]
        # chat still goes to chat/completions
        body = orjson.dumps({"model": payloads.MODEL["embeddings"], "messages": []})
        await _asgi_post("/v1/chat/completions", body)
        assert seen[-1][0] == "/embeddings/v1/chat/completions"
    finally:
        session = bare_relay.session
        if isinstance(session, aiohttp.ClientSession):
            await session.close()
        await runner.cleanup()


def test_the_embeddings_cell_runs_on_few_targets_by_default() -> None:
    assert run.embed_wanted("gateway-uvicorn-1w", "")  # the default server's
    assert run.embed_wanted("bare-uvicorn", "")
    assert run.embed_wanted("direct", "")
    assert run.embed_wanted("litellm", "")
    assert not run.embed_wanted("gateway-uvicorn-2w-unpinned", "")
    assert not run.embed_wanted("bare-hypercorn", "")
    assert not run.embed_wanted("gateway-hypercorn-1w", "")
    assert not run.embed_wanted("nginx-relay", "")
    assert run.embed_wanted("nginx-relay", "all")
    assert run.embed_wanted("gateway-hypercorn-1w", "hypercorn,direct")
    assert not run.embed_wanted("gateway-uvicorn-1w", "hypercorn,direct")


def test_the_embeddings_cells_come_after_the_chat_cells() -> None:
    cells = run.wrk_cells()
    kinds = [kind for _, kind, _ in cells]
    if "f" in run.SCENARIOS:
        assert [(s, c) for s, k, c in cells if k == "embeddings"] == [
            ("f", c) for c in run.EMBED_CONNS
        ]
        assert kinds[-len(run.EMBED_CONNS) :] == ["embeddings"] * len(run.EMBED_CONNS)
    if "a" in run.SCENARIOS:
        assert [c for s, _, c in cells if s == "a"] == run.CONNS


def test_the_wrk_script_of_the_embeddings_kind(tmp_path: Path) -> None:
    target = targets.Target("t", "gateway", "hypercorn", 0, None, targets.relay_paths())
    lua = run.wrk_lua(tmp_path, target, "embeddings").read_text()
    assert 'wrk.path = "/v1/embeddings"' in lua
    assert payloads.request("embeddings").decode() in lua
    assert payloads.EXPECT["embeddings"][0] in lua
    chat = run.wrk_lua(tmp_path, target, "json").read_text()
    assert payloads.chat_request("json", False).decode() in chat


def _cell(rps: list[float], p50: float, p99: float) -> dict[str, Any]:
    return {"rps": sorted(rps)[len(rps) // 2], "p50": p50, "p99": p99, "errors": 0,
            "requests": 100, "cpu_us": 500.0, "reps": len(rps), "rps_reps": rps}  # fmt: skip


def _render(results: dict[str, Any]) -> str:
    settings = SimpleNamespace(
        quick=True, duration=2, reps=3, started="now", seconds=60.0, notes=[], versions={},
        commands=[],
    )  # fmt: skip
    return report.render(results, settings, [256], [1, 64], [1, 64], 64, [1, 64])


def test_the_report_shows_the_gateways_share_of_the_bare_relay_for_embeddings() -> None:
    f = {
        "direct": {1: _cell([30000.0] * 3, 0.02, 0.05), 64: _cell([40000.0] * 3, 1.0, 2.0)},
        "bare-uvicorn": {
            1: _cell([1000.0, 1000.0, 800.0], 0.7, 2.0),
            64: _cell([2000.0] * 3, 30.0, 40.0),
        },
        "gateway-uvicorn-1w": {
            1: _cell([900.0, 950.0, 760.0], 0.9, 2.5),
            64: _cell([1600.0] * 3, 36.0, 46.0),
        },
    }
    text = _render({k: {} for k in "abcde"} | {"f": f})
    assert "| throughput ≥ 85% of bare relay (same server) | (f) embeddings, 1 conns | 95.0% " in (
        text
    )
    assert "| (f) embeddings, 64 conns | 80.0% (turns 80%–80%) | **FAIL** |" in text
    assert "| (f) embeddings, 1 conn | +0.88 ms | **PASS** |" in text  # p50 over direct
    assert "## (f) Embeddings, 2 inputs × 256 floats" in text
    assert "| gateway-uvicorn-1w | 64 | 1,600 | 36.00 | 46.00 | 0 | 500 | – | – | 0.800 |" in text


def test_the_report_without_the_embeddings_cell() -> None:
    text = _render({k: {} for k in "abcdef"})
    assert "(f) embeddings" not in text
    assert text.endswith("## (f) Embeddings, 2 inputs × 256 floats\n\nNot run.\n")
