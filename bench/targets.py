"""The things under test and how to start each: direct, nginx relay, bare relay, LiteLLM, gateway.

Every target is a running process (or none, for direct) with a port and, per upstream kind
(json, sse, paced, embeddings), the path a client posts to. Relay targets are pinned to core 0.
"""

from __future__ import annotations

import http.client
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from bench import nginx, payloads, peers, procs

RELAY_CORE = 0
ROOT = Path(__file__).resolve().parent.parent
SERVERS = ("hypercorn", "uvicorn", "granian")
DEFAULT_SERVER = "uvicorn"  # what ``gateway serve`` runs unless told (tests/test_bench_pairing.py)
# the upstream kinds every relay is configured with: one model name and upstream base URL each
KINDS = ("json", "sse", "paced", "embeddings")
CHAT_PATH, EMBED_PATH = "/v1/chat/completions", "/v1/embeddings"


@dataclass
class Target:
    name: str
    group: str  # direct | nginx | bare | litellm | gateway
    server: str  # the ASGI server, or "nginx"
    port: int
    proc: subprocess.Popen[bytes] | None
    paths: dict[str, str]
    pinned: bool = True
    notes: list[str] = field(default_factory=list)
    baseline_rss_kib: int = 0

    def pids(self) -> list[int]:
        return procs.tree(self.proc.pid) if self.proc is not None else []


@dataclass(frozen=True)
class Upstream:
    port: int  # the nginx upstream: /json/v1, /sse/v1 and /embeddings/v1
    proc: subprocess.Popen[bytes]
    paced_port: int
    paced_path: str  # base path of the paced upstream, e.g. /paced/v1 or /v1
    paced_proc: subprocess.Popen[bytes]
    paced_by: str  # "nginx echo module" | "bench.fake_upstream"

    def base_url(self, kind: str) -> str:
        if kind == "paced":
            return f"http://127.0.0.1:{self.paced_port}{self.paced_path}"
        return f"http://127.0.0.1:{self.port}/{kind}/v1"


def post(
    port: int, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        hdrs = {
            "content-type": "application/json",
            "authorization": f"Bearer {payloads.BENCH_KEY}",
            **(headers or {}),
        }
        conn.request("POST", path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def check_kind(target: Target, kind: str) -> str | None:
    """One request of a kind through the target: None when the reply is right, else what was
    wrong (a status, a body without the expected content, a socket error)."""
    try:
        status, raw = post(target.port, target.paths[kind], payloads.request(kind))
    except OSError as exc:
        return f"{kind}: {exc}"
    if status == 200 and all(e.encode() in raw for e in payloads.EXPECT[kind]):
        return None
    return f"{kind} reply {status}: {raw[:200]!r}"


def _ready(target: Target, timeout: float) -> bool:
    """Wait for the port, then for one correct non-streaming reply."""
    if target.proc is not None and not procs.wait_port(target.port, target.proc, timeout):
        return False
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status, raw = post(
                target.port, target.paths["json"], payloads.chat_request("json", False)
            )
            if status == 200 and payloads.EXPECT["json"][0].encode() in raw:
                return True
            target.notes.append(f"warm-up reply {status}: {raw[:200]!r}")
        except OSError as exc:
            target.notes.append(f"warm-up: {exc}")
        if target.proc is not None and target.proc.poll() is not None:
            return False
        time.sleep(0.5)
    return False


def _settle(target: Target, timeout: float) -> Target | None:
    if not _ready(target, timeout):
        print(f"  ! {target.name} did not come up: {' | '.join(target.notes[-2:])}")
        if target.proc is not None:
            procs.stop(target.proc)
        return None
    target.notes.clear()
    time.sleep(0.3)
    target.baseline_rss_kib = procs.rss_kib(target.pids())
    return target


def start_upstream(tmp: Path, first_ms: int, delay_ms: int) -> Upstream:
    echo = nginx.ECHO_MODULE.exists() and os.environ.get("BENCH_PACED", "") != "python"
    port = procs.free_port()
    conf = tmp / "upstream.conf"
    conf.write_text(nginx.upstream_conf(tmp, port, echo, first_ms, delay_ms))
    cmd = procs.pinned(["nginx", "-c", str(conf), "-p", str(tmp), "-e", "stderr"], 1)
    proc = procs.start(cmd, tmp / "upstream.log")
    if not procs.wait_port(port, proc, 10):
        raise RuntimeError(f"nginx upstream did not start: {(tmp / 'upstream.log').read_text()}")
    if echo:
        return Upstream(port, proc, port, "/paced/v1", proc, "nginx echo module")
    paced_port = procs.free_port()
    cmd = procs.pinned(
        [sys.executable, "-m", "bench.fake_upstream", "--host", "127.0.0.1", "--port",
         str(paced_port), "--chunks", "20", "--first-ms", str(first_ms),
         "--delay-ms", str(delay_ms)],
        1,
    )  # fmt: skip
    paced = procs.start(cmd, tmp / "fake_upstream.log", cwd=str(ROOT))
    if not procs.wait_port(paced_port, paced, 20):
        raise RuntimeError("bench.fake_upstream did not start")
    return Upstream(port, proc, paced_port, "/v1", paced, "bench.fake_upstream")


def direct(up: Upstream) -> Target:
    paths = {k: f"/{k}/v1/chat/completions" for k in ("json", "sse")}
    paths["paced"] = up.paced_path + "/chat/completions"
    paths["embeddings"] = "/embeddings/v1/embeddings"
    t = Target("direct", "direct", "nginx", up.port, None, paths)
    t.proc = up.proc  # measured: the upstream itself
    t.baseline_rss_kib = procs.rss_kib(t.pids())
    return t


def nginx_relay(tmp: Path, up: Upstream) -> Target | None:
    port = procs.free_port()
    conf = tmp / "relay.conf"
    conf.write_text(nginx.relay_conf(tmp, port, up.port, (up.paced_port, up.paced_path)))
    cmd = procs.pinned(["nginx", "-c", str(conf), "-p", str(tmp), "-e", "stderr"], RELAY_CORE)
    proc = procs.start(cmd, tmp / "relay.log")
    paths = {k: f"/{k}/v1/chat/completions" for k in ("json", "sse")}
    paths["paced"] = "/pacedrelay/chat/completions"
    paths["embeddings"] = "/embeddings/v1/embeddings"
    return _settle(Target("nginx-relay", "nginx", "nginx", port, proc, paths), 10)


def server_available(server: str) -> bool:
    return importlib.util.find_spec(server) is not None


def asgi_command(server: str, app: str, port: int | str, workers: int = 1) -> list[str]:
    """The server serving ``app`` on 127.0.0.1 (``port`` may be a ``{port}`` placeholder)."""
    py = sys.executable
    if server == "hypercorn":
        return [py, "-m", "hypercorn", "-b", f"127.0.0.1:{port}", "--backlog", "8192",
                "-w", str(workers), app]  # fmt: skip
    if server == "uvicorn":
        return [py, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
                "--backlog", "8192", "--workers", str(workers), "--no-access-log",
                "--log-level", "warning", "--loop", "uvloop", "--http", "httptools"]  # fmt: skip
    return [py, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port",
            str(port), "--workers", str(workers), "--backlog", "8192", "--loop", "uvloop",
            "--log-level", "warning", app]  # fmt: skip


def bare_relay(tmp: Path, up: Upstream, server: str) -> Target | None:
    port = procs.free_port()
    env = {
        "BARE_UPSTREAMS": orjson.dumps({payloads.MODEL[k]: up.base_url(k) for k in KINDS}).decode()
    }
    cmd = procs.pinned(asgi_command(server, "bench.bare_relay:app", port), RELAY_CORE)
    proc = procs.start(cmd, tmp / f"bare-{server}.log", env=env, cwd=str(ROOT))
    return _settle(Target(f"bare-{server}", "bare", server, port, proc, relay_paths()), 30)


def start_litellm(
    tmp: Path, name: str, models: dict[str, str], settings: tuple[str, ...] = ()
) -> tuple[int, subprocess.Popen[bytes]]:
    """LiteLLM's proxy on one pinned core, its config ``<name>.yaml``: each model name served
    by the openai upstream at its base URL (``models``), ``settings`` more lines of its
    ``litellm_settings``; the port and the process."""
    conf = tmp / f"{name}.yaml"
    lines = ["model_list:"]
    for model, base_url in models.items():
        lines += [
            f"  - model_name: {model}",
            "    litellm_params:",
            f"      model: openai/{payloads.UPSTREAM_MODEL}",
            f"      api_base: {base_url}",
            f"      api_key: {payloads.UPSTREAM_KEY}",
        ]
    lines += [
        "general_settings:",
        f"  master_key: {payloads.BENCH_KEY}",
        "litellm_settings:",
        "  drop_params: true",
        "  telemetry: false",
        *settings,
    ]
    conf.write_text("\n".join(lines) + "\n")
    port = procs.free_port()
    cmd = procs.pinned(
        [str(peers.LITELLM_BIN), "--config", str(conf), "--host", "127.0.0.1", "--port",
         str(port), "--num_workers", "1"],
        RELAY_CORE,
    )  # fmt: skip
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    return port, procs.start(cmd, tmp / f"{name}.log", env=env, cwd=str(tmp))


def litellm(tmp: Path, up: Upstream) -> Target | None:
    if not peers.LITELLM_BIN.exists():
        return None
    port, proc = start_litellm(
        tmp, "litellm", {payloads.MODEL[kind]: up.base_url(kind) for kind in KINDS}
    )
    return _settle(Target("litellm", "litellm", "uvicorn", port, proc, relay_paths()), 120)


def relay_paths() -> dict[str, str]:
    """What a client of an OpenAI-compatible relay posts to, per kind."""
    paths = dict.fromkeys(("json", "sse", "paced"), CHAT_PATH)
    paths["embeddings"] = EMBED_PATH
    return paths


def gateway_binary() -> str | None:
    exe = Path(sys.executable).parent / "gateway"
    if exe.exists():
        return str(exe)
    return shutil.which("gateway")


def gateway_help() -> str:
    exe = gateway_binary()
    if exe is None:
        return ""
    done = subprocess.run([exe, "serve", "--help"], capture_output=True, text=True, timeout=60)
    return done.stdout if done.returncode == 0 else ""


NO_METRICS = "-nometrics"  # a gateway target's name suffix: metrics and access log off


def gateway_config(tmp: Path, up: Upstream, name: str = "gateway", metrics: bool = True) -> Path:
    """The gateway's config for the bench, its SQLite file named after the target: each
    gateway target writes its own usage records, so one's WAL checkpoints and growing indexes
    are never another's. The server runs with the gateway's defaults (keep-alive 75 s):
    connections wrk closes at the end of a cell are let go at once. ``metrics=False``: no
    ``/metrics`` (nothing counted) and no access log, the baseline of their cost."""
    lines = [
        f"store: sqlite:///{tmp}/{name}.db",
        "admin_token: bench-admin-token",
        "groups: [default]",
    ]
    if not metrics:
        lines += ["metrics: {enabled: false}", "logging: {access: false}"]
    lines += ["models:"]
    for kind in KINDS:
        embeddings = kind == "embeddings"
        lines += [
            f"  - name: {payloads.MODEL[kind]}",
            f"    capabilities: [{'embeddings' if embeddings else 'chat'}]",
            "    price: " + ("{input: 0.02}" if embeddings else "{input: 0.5, output: 1.5}"),
        ]
    lines.append("channels:")
    for kind in KINDS:
        model = payloads.MODEL[kind]
        lines += [
            f"  - name: up-{kind}",
            "    type: openai",
            f"    base_url: {up.base_url(kind)}",
            f"    api_key: {payloads.UPSTREAM_KEY}",
            "    groups: [default]",
            f"    models: [{model}]",
            f"    model_map: {{{model}: {payloads.UPSTREAM_MODEL}}}",
        ]
    lines += [
        "accounts:",
        "  - id: bench",
        "    balance: 1000000000000",
        "keys:",
        "  - id: k-bench",
        f"    key: {payloads.BENCH_KEY}",
        "    account: bench",
        "    group: default",
        "    status: enabled",
    ]
    path = tmp / f"{name}.bench.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def gateway(
    tmp: Path, up: Upstream, workers: int, pinned: bool, server: str | None, metrics: bool = True
) -> Target | None:
    exe = gateway_binary()
    if exe is None:
        return None
    name = f"gateway-{server or DEFAULT_SERVER}-{workers}w" + ("" if pinned else "-unpinned")
    name += "" if metrics else NO_METRICS
    conf = gateway_config(tmp, up, name, metrics)
    port = procs.free_port()
    cmd = [exe, "serve", "--config", str(conf), "--host", "127.0.0.1", "--port", str(port),
           "--workers", str(workers)]  # fmt: skip
    if server is not None:
        cmd += ["--server", server]
    proc = procs.start(
        procs.pinned(cmd, RELAY_CORE if pinned else None), tmp / f"{name}.log", cwd=str(tmp)
    )
    target = Target(
        name, "gateway", server or DEFAULT_SERVER, port, proc, relay_paths(), pinned=pinned
    )
    return _settle(target, 60)
