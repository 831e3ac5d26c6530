"""The agent workloads' benchmark (`make bench-agents`): its bodies, the upstream's replies in
the providers' wire formats, the nginx and gateway configurations that serve them, and the
report's section of bench/RESULTS.md with its verdicts against Portkey."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from bench import agent_payloads as ap
from bench import agent_report, nginx
from bench import agent_targets as at
from gateway.config import load_settings

WORKS = {w.key: w for w in ap.workloads()}


def test_the_bodies_are_what_a_coding_agent_sends() -> None:
    tools = orjson.loads(WORKS["tools"].body)
    assert len(WORKS["tools"].body) >= ap.PROMPT_BYTES
    assert tools["stream"] is True
    names = [t["function"]["name"] for t in tools["tools"]]
    assert len(names) == len(set(names)) == 40
    roles = [m["role"] for m in tools["messages"]]
    assert roles[:2] == ["system", "user"] and "tool" in roles and roles[-1] == "user"
    responses = orjson.loads(WORKS["responses"].body)
    assert responses["stream"] is True and responses["store"] is False
    assert all(t["type"] == "function" and "name" in t for t in responses["tools"])
    embeddings = orjson.loads(WORKS["embeddings"].body)
    assert len(embeddings["input"]) == ap.EMBED_BATCH
    messages = orjson.loads(WORKS["messages"].body)
    assert messages["stream"] is True and WORKS["messages"].path == "/v1/messages"
    # generated, not random: every run posts the same bytes
    assert [w.body for w in ap.workloads()] == [w.body for w in WORKS.values()]


def _events(raw: bytes) -> list[tuple[str, dict[str, object]]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block:
            name, data = block.split("\n")
            out.append((name.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    return out


def test_the_upstream_answers_the_responses_stream_in_openais_format() -> None:
    events = _events(ap.responses_stream())
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    assert events[0][0] == "response.created" and events[-1][0] == "response.completed"
    deltas = [data["delta"] for name, data in events if name == "response.output_text.delta"]
    assert len(deltas) == ap.RESPONSES_CHUNKS
    assert WORKS["responses"].expect == ["response.completed"]


def test_the_paced_stream_and_the_embeddings_batch() -> None:
    events = ap.long_events()
    assert len(events) == ap.LONG_CHUNKS + 2 and events[-1] == b"data: [DONE]\n\n"
    assert agent_report.PACE_MS == 200 + (ap.LONG_CHUNKS + 1) * 25
    reply = orjson.loads(ap.embeddings_reply())
    assert [len(d["embedding"]) for d in reply["data"]] == [ap.EMBED_DIMS] * ap.EMBED_BATCH
    [mark] = WORKS["embeddings"].expect
    assert ap.embeddings_reply().count(mark.encode()) == 1


def test_the_gateway_config_routes_each_workload(tmp_path: Path) -> None:
    settings = load_settings(at.gateway_config(tmp_path, 9000, ap.workloads(), "gw"))
    channels = {c.models[0]: c for c in settings.channels}
    assert channels["bench-responses"].base_url == "http://127.0.0.1:9000/responses/v1"
    assert "responses" in channels["bench-responses"].speaks  # passed through, not converted
    assert "responses" not in channels["bench-sse"].speaks
    assert channels["bench-long"].base_url == "http://127.0.0.1:9000/long/v1"
    models = {m.name: m for m in settings.models}
    assert "embeddings" in models["bench-embatch"].capabilities


def test_the_upstream_serves_every_workloads_path(tmp_path: Path) -> None:
    conf = at.upstream_conf(tmp_path, 9000)
    for work in WORKS.values():
        assert f"location = /{work.prefix}/v1{work.upstream_path} " in conf
    assert (tmp_path / "responses.sse").read_bytes() == ap.responses_stream()
    assert conf.count("echo_flush;") == len(ap.long_events())


@pytest.mark.skipif(
    shutil.which("nginx") is None or not nginx.ECHO_MODULE.exists(),
    reason="nginx with its echo module not installed",
)
@pytest.mark.parametrize("which", ["upstream", "relay"])
def test_the_nginx_configs_are_valid(tmp_path: Path, which: str) -> None:
    conf = tmp_path / f"{which}.conf"
    text = at.upstream_conf(tmp_path, 9000) if which == "upstream" else at.relay_conf(
        tmp_path, 9001, 9000
    )  # fmt: skip
    conf.write_text(text)
    done = subprocess.run(
        ["nginx", "-t", "-c", str(conf), "-p", str(tmp_path), "-e", "stderr"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def _cell(rps: float, cpu: float = 100.0) -> dict[str, object]:
    return {"rps": rps, "p50": 1.0, "p99": 2.0, "errors": 0, "cpu_us": cpu,
            "peak_rss_kib": 1024}  # fmt: skip


def _stream(cpu: float) -> dict[str, object]:
    return {"n": 64, "completed": 64, "ttfb_p50": 201.0, "ttfb_p99": 210.0, "total_p50": 5230.0,
            "total_p99": 5300.0, "cpu_us": cpu, "peak_rss_kib": 2048, "errors": 0}  # fmt: skip


RESULTS = {
    "chat": {"portkey": _cell(100), "litellm": _cell(10), "gateway-granian": _cell(450)},
    "chat-stream": {"portkey": _cell(100), "litellm": _cell(20), "gateway-granian": _cell(420)},
    "responses": {"portkey": _cell(100), "gateway-granian": _cell(350)},
    "messages": {
        "portkey": {"cannot": "fails: 500: messages is not supported by openai"},
        "gateway-granian": _cell(300),
    },
    "tools": {"portkey": _cell(100), "gateway-granian": _cell(250)},
    "embeddings": {"portkey": _cell(100), "gateway-granian": _cell(300)},
    "long": {"portkey": _stream(30000), "gateway-granian": _stream(9000)},
}


@pytest.mark.parametrize(
    ("workload", "row"),
    [
        ("non-stream", "| ≥ 4× Portkey, ≥ 40× LiteLLM | 4.50× | 1.00× | 45.00× | **PASS** |"),
        # past Portkey's target, short of LiteLLM's
        ("stream of 20", "| ≥ 4× Portkey, ≥ 40× LiteLLM | 4.20× | 1.00× | 21.00× | **FAIL** |"),
        ("responses", "| ≥ 3× Portkey | 3.50× | 1.00× | – | **PASS** |"),
        ("200 KB", "| ≥ 3× Portkey | 2.50× | 1.00× | – | **FAIL** |"),
        ("embeddings", "| ≥ 3× Portkey | 3.00× | 1.00× | – | **PASS** |"),
        (
            "Messages",
            "| – | – | – | n/a (Portkey: fails: 500: messages is not supported by openai) |",
        ),
        ("paced", "(CPU per stream) | ≥ 3× Portkey | 3.33× | (the same) | – | **PASS** |"),
    ],
)
def test_the_verdicts_against_portkey(workload: str, row: str) -> None:
    rows = agent_report.verdicts(RESULTS, ap.workloads())
    [line] = [r for r in rows if workload.lower() in r.lower()]
    assert line.endswith(row)


def test_the_section_replaces_its_last_run_and_survives_make_bench() -> None:
    info = {"started": "now", "commit": "abc1234", "load": "8.00, 7.00, 6.00"}
    section = agent_report.render(RESULTS, ap.workloads(), info)
    assert "abc1234" in section and "8.00, 7.00, 6.00" in section
    assert "| portkey | fails: 500: messages is not supported by openai |" in section
    old = "# Benchmark results\n\nold tables\n\n" + section.replace("abc1234", "0000000")
    new = agent_report.splice(old, section)
    assert new.count(agent_report.BEGIN) == 1 and "abc1234" in new and "old tables" in new
    # `make bench` writes the whole file again: the agents section is kept
    rewritten = agent_report.carry(new, "# Benchmark results\n\nnew tables\n")
    assert "new tables" in rewritten and "old tables" not in rewritten and "abc1234" in rewritten
