"""The relays of the agent workloads and how each is set up to reach the nginx upstream: the
nginx proxy_pass relay (the machine's limit), LiteLLM, Portkey's gateway and this gateway.

Each ``Relay`` has, per workload, the path a client posts to and the headers it adds, or a
reason it cannot serve the workload (``cannot``). Relays are pinned to core 0; the upstream,
wrk and the stream client to core 1.
"""

from __future__ import annotations

import http.client
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import agent_payloads, nginx, payloads, peers, procs, targets
from bench.agent_payloads import Workload

RELAY_CORE = 0
ROOT = Path(__file__).resolve().parent.parent
BODY_BUFFER = "client_body_buffer_size 1m;"  # the 200 KB prompt stays in memory, not a file


@dataclass
class Relay:
    name: str
    group: str  # nginx | litellm | portkey | gateway
    port: int
    proc: object  # subprocess.Popen
    paths: dict[str, str] = field(default_factory=dict)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)
    cannot: dict[str, str] = field(default_factory=dict)

    def pids(self) -> list[int]:
        pid = getattr(self.proc, "pid", None)
        return procs.tree(pid) if pid is not None else []


def _static(prefix: str, path: str, name: str, ctype: str) -> str:
    """A location answering a POST with a static file (an error_page turns it into a GET)."""
    return f"""
        location = /{prefix}/v1{path} {{ error_page 405 =200 /_{name}; return 405; }}
        location = /_{name} {{ internal; default_type {ctype}; alias __TMP__/{name}; }}"""


def upstream_conf(tmp: Path, port: int) -> str:
    """The upstream of every workload: static Responses and chat streams, the embeddings batch
    and, by the echo module, the paced long stream."""
    (tmp / "responses.sse").write_bytes(agent_payloads.responses_stream())
    (tmp / "chat.sse").write_bytes(payloads.sse_reply())
    (tmp / "chat.json").write_bytes(payloads.json_reply())
    (tmp / "embatch.json").write_bytes(agent_payloads.embeddings_reply())
    paced = [f"echo_sleep {agent_payloads.LONG_FIRST_MS / 1000:.3f};"]
    for i, event in enumerate(agent_payloads.long_events()):
        if i:
            paced.append(f"echo_sleep {agent_payloads.LONG_DELAY_MS / 1000:.3f};")
        paced += [f"echo -n {nginx._quote(event)};", "echo_flush;"]
    locations = (
        _static("responses", "/responses", "responses.sse", "text/event-stream")
        + _static("sse", "/chat/completions", "chat.sse", "text/event-stream")
        + _static("json", "/chat/completions", "chat.json", "application/json")
        + _static("embatch", "/embeddings", "embatch.json", "application/json")
    ).replace("__TMP__", str(tmp))
    return f"""load_module {nginx.ECHO_MODULE};
{nginx._common(tmp, "agents-upstream")}
http {{
{nginx._http_common(tmp, "agents-upstream")}
    server {{
        listen 127.0.0.1:{port} backlog=8192;
        {BODY_BUFFER}{locations}
        location = /long/v1/chat/completions {{
            default_type text/event-stream;
            {chr(10).join(paced)}
        }}
        location = /healthz {{ return 200 'ok'; }}
    }}
}}
"""


def relay_conf(tmp: Path, port: int, upstream: int) -> str:
    proxy = 'proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off;'
    return f"""{nginx._common(tmp, "agents-relay")}
http {{
{nginx._http_common(tmp, "agents-relay")}
    upstream up {{ server 127.0.0.1:{upstream}; keepalive 1024; }}
    server {{
        listen 127.0.0.1:{port} backlog=8192;
        {BODY_BUFFER}
        location / {{ proxy_pass http://up; {proxy} }}
    }}
}}
"""


def start_upstream(tmp: Path) -> tuple[int, object]:
    if not nginx.ECHO_MODULE.exists():
        raise RuntimeError("the paced stream needs nginx's echo module (libnginx-mod-http-echo)")
    port = procs.free_port()
    conf = tmp / "agents-upstream.conf"
    conf.write_text(upstream_conf(tmp, port))
    cmd = procs.pinned(["nginx", "-c", str(conf), "-p", str(tmp), "-e", "stderr"], 1)
    proc = procs.start(cmd, tmp / "agents-upstream.log")
    if not procs.wait_port(port, proc, 10):
        raise RuntimeError(f"nginx upstream: {(tmp / 'agents-upstream.log').read_text()[-500:]}")
    return port, proc


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        hdrs = {"content-type": "application/json", **headers}
        hdrs.setdefault("authorization", f"Bearer {payloads.BENCH_KEY}")
        conn.request("POST", path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def check(relay: Relay, work: Workload) -> str | None:
    """One request of a workload through the relay: None when the reply holds what it must,
    else what came back."""
    try:
        status, raw = post(relay.port, relay.paths[work.key], work.body, relay.headers[work.key])
    except OSError as exc:
        return f"{exc}"
    if status == 200 and all(e.encode() in raw for e in work.expect):
        return None
    return f"{status}: {raw[:300].decode(errors='replace')}"


def ready(relay: Relay, work: Workload, timeout: float) -> Relay | None:
    """Wait for the port and one right reply to a workload that every relay serves."""
    proc = relay.proc
    if proc is not None and not procs.wait_port(relay.port, proc, timeout):  # type: ignore[arg-type]
        print(f"  ! {relay.name} did not listen")
        return None
    deadline, problem = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        problem = check(relay, work)
        if problem is None:
            return relay
        time.sleep(0.5)
    print(f"  ! {relay.name} did not come up: {problem}")
    if proc is not None:
        procs.stop(proc)  # type: ignore[arg-type]
    return None


def _standard(relay: Relay, works: list[Workload]) -> Relay:
    """A relay with the providers' own paths; the messages workload's anthropic-version."""
    for work in works:
        relay.paths[work.key] = work.path
        relay.headers[work.key] = dict(work.headers)
    return relay


def nginx_relay(tmp: Path, upstream: int, works: list[Workload]) -> Relay | None:
    port = procs.free_port()
    conf = tmp / "agents-relay.conf"
    conf.write_text(relay_conf(tmp, port, upstream))
    cmd = procs.pinned(["nginx", "-c", str(conf), "-p", str(tmp), "-e", "stderr"], RELAY_CORE)
    relay = Relay("nginx-relay", "nginx", port, procs.start(cmd, tmp / "agents-relay.log"))
    for work in works:  # the upstream's own paths: nginx passes the body through unchanged
        relay.paths[work.key] = f"/{work.prefix}/v1{work.upstream_path}"
        relay.headers[work.key] = {}
    relay.cannot["messages"] = "n/a: nginx cannot convert Messages to chat completions"
    return ready(relay, works[2], 10)


def litellm(tmp: Path, upstream: int, works: list[Workload]) -> Relay | None:
    if not peers.LITELLM_BIN.exists():
        return None
    models = {
        model: f"http://127.0.0.1:{upstream}/{prefix}/v1"
        for model, prefix in sorted({(w.model, w.prefix) for w in works})
    }
    # a Messages request to an openai model goes to the upstream's chat completions, as in
    # the other relays (1.106 sends it to the Responses API by default)
    settings = ("  use_chat_completions_url_for_anthropic_messages: true",)
    port, proc = targets.start_litellm(tmp, "agents-litellm", models, settings)
    return ready(_standard(Relay("litellm", "litellm", port, proc), works), works[2], 180)


def portkey(tmp: Path, upstream: int, works: list[Workload]) -> Relay | None:
    """Portkey's gateway on Node: each request names its provider (openai) and the upstream's
    base URL (``x-portkey-custom-host``); the Authorization header goes to the upstream."""
    if not peers.PORTKEY_JS.exists():
        return None
    port = procs.free_port()
    cmd = procs.pinned(["node", str(peers.PORTKEY_JS), f"--port={port}", "--headless"], RELAY_CORE)
    env = {"NODE_ENV": "production"}
    proc = procs.start(cmd, tmp / "agents-portkey.log", env=env, cwd=str(tmp))
    relay = _standard(Relay("portkey", "portkey", port, proc), works)
    for work in works:
        relay.headers[work.key].update(
            {
                "x-portkey-provider": "openai",
                "x-portkey-custom-host": f"http://127.0.0.1:{upstream}/{work.prefix}/v1",
                "authorization": f"Bearer {payloads.UPSTREAM_KEY}",
            }
        )
    return ready(relay, works[2], 60)


def gateway_config(tmp: Path, upstream: int, works: list[Workload], name: str) -> Path:
    """Every feature at its default; one model and channel per upstream location, the
    Responses one an openai channel that speaks the Responses API (``responses: true``)."""
    lines = [
        f"store: sqlite:///{tmp}/{name}.db",
        "admin_token: bench-admin-token",
        "groups: [default]",
        "models:",
    ]
    models = sorted({(w.model, w.prefix, w.key == "embeddings") for w in works})
    for model, _, embeddings in models:
        lines += [
            f"  - name: {model}",
            f"    capabilities: [{'embeddings' if embeddings else 'chat'}]",
            "    price: " + ("{input: 0.02}" if embeddings else "{input: 0.5, output: 1.5}"),
        ]
    lines.append("channels:")
    for model, prefix, _ in models:
        lines += [
            f"  - name: up-{prefix}",
            "    type: openai",
            f"    base_url: http://127.0.0.1:{upstream}/{prefix}/v1",
            f"    api_key: {payloads.UPSTREAM_KEY}",
            "    groups: [default]",
            f"    models: [{model}]",
            f"    model_map: {{{model}: {payloads.UPSTREAM_MODEL}}}",
        ]
        if prefix == "responses":
            lines.append("    responses: true")
    lines += [
        "accounts: [{id: bench, balance: 1000000000000}]",
        "keys:",
        f"  - {{id: k-bench, key: {payloads.BENCH_KEY}, account: bench, group: default}}",
    ]
    path = tmp / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def gateway(
    tmp: Path, upstream: int, works: list[Workload], server: str | None, name: str
) -> Relay | None:
    """``gateway serve``, one worker; ``server`` None: the default server."""
    exe = Path(sys.executable).parent / "gateway"
    conf = gateway_config(tmp, upstream, works, name)
    port = procs.free_port()
    cmd = [str(exe), "serve", "--config", str(conf), "--host", "127.0.0.1", "--port", str(port)]
    if server is not None:
        cmd += ["--server", server]
    proc = procs.start(procs.pinned(cmd, RELAY_CORE), tmp / f"{name}.log", cwd=str(tmp))
    return ready(_standard(Relay(name, "gateway", port, proc), works), works[2], 60)


def default_server() -> str:
    """The server ``gateway serve`` runs when none is named."""
    from gateway.cli import build_parser

    return str(build_parser().parse_args(["serve"]).server)
