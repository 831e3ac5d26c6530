"""Scenario (e), the noise-free half: instructions per relayed request, counted by callgrind.

Wall-clock cells on a shared machine move 20-30% from run to run; instruction counts do not
(the bare relay's to ~0.1% twice in a row here). Each target runs under
``valgrind --tool=callgrind`` (children followed: hypercorn's worker process is counted),
a warm-up is sent, the counters are zeroed, N requests are sent 8 at a time, the counters
are dumped, and the instructions of every process of the target are summed and divided by N.
The ratio bare/gateway estimates the throughput share without the machine's noise (both
spend about the same instructions per nanosecond).

``run_converted``: the same count for chat-completions streams converted from the other
upstream protocols, each from the bundled fake upstream (the same 20 pieces of text and a
usage report): an anthropic channel's SSE, and Bedrock's event streams (Claude through
``invoke-with-response-stream``, Nova through ``converse-stream``; SigV4 signing included), so
a Bedrock stream's cost per request is seen beside an Anthropic one's.

    python -m bench.instructions converted

callgrind slows a process ~40×, and the gateway's periodic work (usage batches, disconnect
watchlist, key cache reloads, periodic collections) follows the clock: counted as it is, each
request would carry ~40× its real share of that work. So the gateway runs through
``bench.clock_scaled``, its intervals stretched by ``SLOWDOWN`` (see there). The bare relay
has no such work.
"""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

from bench import payloads, procs, targets
from bench.fake import aws_auth
from bench.targets import Upstream

REQUESTS = 400
WARM_UP = 100
CONNS = 8
KINDS = ("json", "sse")
SLOWDOWN = 40  # callgrind's, roughly: the gateway's intervals are stretched by it
UPSTREAM_CORE = 1
# the converted streams: kind -> (channel type, upstream model) at the fake upstream
CONVERTED = {
    "anthropic-sse": ("anthropic", "claude-bench-1"),
    "bedrock-invoke-sse": ("bedrock", "anthropic.claude-bench-v1:0"),
    "bedrock-converse-sse": ("bedrock", "amazon.nova-bench-v1:0"),
}
FAKE_CHUNKS = 20  # the fake's pieces of text per reply: payloads.SSE_CHUNKS's count
Cell = tuple[bytes, list[str]]  # a request body and what each reply must hold


def available() -> bool:
    return shutil.which("valgrind") is not None and shutil.which("callgrind_control") is not None


def relay_cells() -> dict[str, Cell]:
    return {k: (payloads.chat_request(k, k == "sse"), payloads.EXPECT[k][:1]) for k in KINDS}


async def _drive(port: int, cell: Cell, n: int) -> None:
    body, expect = cell
    headers = {"Authorization": f"Bearer {payloads.BENCH_KEY}", "Content-Type": "application/json"}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    todo = iter(range(n))
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            for _ in todo:
                async with session.post(url, data=body, headers=headers) as resp:
                    data = await resp.read()
                    if resp.status != 200 or any(e.encode() not in data for e in expect):
                        raise RuntimeError(f"bad reply {resp.status}: {data[:200]!r}")

        await asyncio.gather(*(worker() for _ in range(CONNS)))


def _served(port: int, cell: Cell, patience: float = 300.0) -> bool:
    """Whether one request of ``cell`` is answered right within ``patience``: the port opens
    before the gateway, slowed ~40x, has read its keys (a 401 until then)."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        try:
            asyncio.run(_drive(port, cell, 1))
            return True
        except (RuntimeError, OSError, aiohttp.ClientError):
            time.sleep(1.0)
    return False


def _total(path: Path) -> int:
    return _summary(path) or 0


def _summary(path: Path) -> int | None:
    """The instructions a dump counted; None while it is being written (a process that ran
    nothing in the window, granian's parent, counts 0)."""
    for line in path.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    return None


def _dumps(out: Path, patience: float = 60.0) -> list[str]:
    """The dump files of the last ``callgrind_control -d``, once each is whole (its summary
    written) and no new one came for a second: on a busy machine a dump takes a while."""
    deadline = time.monotonic() + patience
    seen: list[str] = []
    while time.monotonic() < deadline:
        time.sleep(1)
        dumps = sorted(glob.glob(f"{out}/cg.*.*"))
        if dumps and dumps == seen and all(_summary(Path(d)) is not None for d in dumps):
            return dumps
        seen = dumps
    raise RuntimeError(f"callgrind's dumps in {out} did not complete")


def _callgrind(command: str, pid: int) -> None:
    """``callgrind_control`` for the target's processes only: without a pid it would zero or
    dump every process callgrind runs on the machine, another bench's among them."""
    for each in procs.tree(pid):
        subprocess.run(["callgrind_control", command, str(each)], capture_output=True, timeout=60)


def measure(
    tmp: Path, name: str, cmd: list[str], env: dict[str, str], cells: dict[str, Cell] | None = None
) -> dict[str, float]:
    """Instructions per request of one target for each cell (the relay kinds unless given);
    {} when it did not come up."""
    cells = cells if cells is not None else relay_cells()
    port = procs.free_port()
    cmd = [c.replace("{port}", str(port)) for c in cmd]
    out = tmp / f"callgrind-{name}"
    out.mkdir(exist_ok=True)
    valgrind = ["valgrind", "--tool=callgrind", "--trace-children=yes",
                f"--callgrind-out-file={out}/cg.%p", "--dump-instr=no"]  # fmt: skip
    proc = subprocess.Popen(
        procs.pinned(valgrind + cmd, targets.RELAY_CORE),
        env={**os.environ, **env},
        cwd=str(tmp),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    results: dict[str, float] = {}
    try:
        if not procs.wait_port(port, proc, 300) or not _served(port, next(iter(cells.values()))):
            return results
        for kind, cell in cells.items():
            asyncio.run(_drive(port, cell, WARM_UP))
            _callgrind("-z", proc.pid)
            began = time.monotonic()
            asyncio.run(_drive(port, cell, REQUESTS))
            rate = REQUESTS / (time.monotonic() - began)
            _callgrind("-d", proc.pid)
            print(f"  (e) {name} {kind}: {rate:.1f} req/s under callgrind", flush=True)
            dumps = _dumps(out)
            results[kind] = sum(_total(Path(d)) for d in dumps) / REQUESTS
            for d in dumps:
                os.unlink(d)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return results


def run(tmp: Path, up: Upstream) -> dict[str, dict[str, float]]:
    """bare relay and gateway (with metrics and access log, and without) under the default
    server with one worker, and the bare relay and gateway under hypercorn beside them."""
    py = sys.executable
    bare_env = {
        "BARE_UPSTREAMS": orjson.dumps(
            {payloads.MODEL[k]: up.base_url(k) for k in ("json", "sse")}
        ).decode(),
        "PYTHONPATH": str(targets.ROOT),
    }
    conf = targets.gateway_config(tmp, up)
    off_conf = targets.gateway_config(tmp, up, "gateway-nometrics", metrics=False)

    def gateway(config: Path, server: str) -> list[str]:
        return [py, "-m", "bench.clock_scaled", str(SLOWDOWN), "serve", "--config", str(config),
                "--host", "127.0.0.1", "--port", "{port}", "--server", server]  # fmt: skip

    def bare(server: str) -> list[str]:
        return targets.asgi_command(server, "bench.bare_relay:app", "{port}")

    env = {"PYTHONPATH": str(targets.ROOT)}
    default = targets.DEFAULT_SERVER
    plan = {
        f"bare-{default}": (bare(default), bare_env),
        f"gateway-{default}-1w": (gateway(conf, default), env),
        # metrics and access log off: their cost, free of the machine's noise
        f"gateway-{default}-1w" + targets.NO_METRICS: (gateway(off_conf, default), env),
    }
    if default != "hypercorn":  # the server whose own cost the gateway's hid before
        plan["bare-hypercorn"] = (bare("hypercorn"), bare_env)
        plan["gateway-hypercorn-1w"] = (gateway(conf, "hypercorn"), env)
    out: dict[str, dict[str, float]] = {}
    for name, (cmd, env) in plan.items():
        print(f"  (e) {name}: counting instructions under callgrind", flush=True)
        out[name] = measure(tmp, name, cmd, env)
        print(f"  (e) {name}: {out[name]}", flush=True)
    return out


def converted_config(tmp: Path, upstream: str) -> Path:
    """A gateway with one model per converted kind, each on its channel at the fake."""
    models = [
        {"name": kind, "capabilities": ["chat"], "price": {"input": 0.5, "output": 1.5}}
        for kind in CONVERTED
    ]
    channels = []
    for kind, (ctype, upstream_model) in CONVERTED.items():
        channel = {"name": kind, "type": ctype, "base_url": upstream, "models": [kind],
                   "model_map": {kind: upstream_model}}  # fmt: skip
        if ctype == "bedrock":
            channel.update(region="us-east-1", aws_access_key_id=aws_auth.ACCESS_KEY,
                           aws_secret_access_key=aws_auth.SECRET_KEY)  # fmt: skip
        else:
            channel["api_key"] = payloads.UPSTREAM_KEY
        channels.append(channel)
    config = {
        "store": f"sqlite:///{tmp}/gateway-converted.db",
        "admin_token": "bench-admin-token",
        "groups": ["default"],
        "models": models,
        "channels": channels,
        "accounts": [{"id": "bench", "balance": 1_000_000_000_000}],
        "keys": [
            {"id": "k-bench", "key": payloads.BENCH_KEY, "account": "bench", "group": "default"}
        ],
    }
    path = tmp / "gateway-converted.bench.yaml"
    path.write_bytes(orjson.dumps(config))  # JSON is YAML
    return path


def converted_cells() -> dict[str, Cell]:
    """A streamed chat-completions request per converted kind, its usage asked for."""
    cells = {}
    for kind in CONVERTED:
        body = orjson.loads(payloads.chat_request("sse", True))
        body["model"] = kind
        cells[kind] = (orjson.dumps(body), ["[DONE]", '"usage"'])
    return cells


def run_converted(tmp: Path) -> dict[str, float]:
    """Instructions per converted stream (module docstring), the gateway under callgrind (one
    hypercorn worker), the fake upstream on its own core, not counted."""
    port = procs.free_port()
    fake = procs.start(
        procs.pinned(
            [
                sys.executable,
                "-m",
                "bench.fake_upstream",
                "--port",
                str(port),
                "--chunks",
                str(FAKE_CHUNKS),
            ],
            UPSTREAM_CORE,
        ),  # fmt: skip
        tmp / "fake-converted.log",
        cwd=str(targets.ROOT),
    )
    try:
        if not procs.wait_port(port, fake, 20):
            raise RuntimeError("bench.fake_upstream did not start")
        config = converted_config(tmp, f"http://127.0.0.1:{port}")
        cmd = [sys.executable, "-m", "bench.clock_scaled", str(SLOWDOWN), "serve", "--config",
               str(config), "--host", "127.0.0.1", "--port", "{port}"]  # fmt: skip
        env = {"PYTHONPATH": str(targets.ROOT)}
        return measure(tmp, "gateway-converted", cmd, env, converted_cells())
    finally:
        procs.stop(fake)


def main(argv: list[str]) -> int:
    if argv[:1] != ["converted"] or not available():
        print("usage: python -m bench.instructions converted (needs valgrind)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-converted-") as tmp:
        counted = run_converted(Path(tmp))
    print(orjson.dumps(counted, option=orjson.OPT_INDENT_2).decode())
    anthropic = counted.get("anthropic-sse")
    for kind, count in counted.items():
        if anthropic and kind != "anthropic-sse":
            print(f"{kind}: {count / anthropic:.3f} of an anthropic stream's instructions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
