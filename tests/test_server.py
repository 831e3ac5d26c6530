"""What a server does to its process (it tunes its garbage collector), to its replies, to
idle connections (``server.keep_alive_seconds``) and to streams in flight on SIGTERM
(``server.graceful_seconds``)."""

from __future__ import annotations

import asyncio
import http.client
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from bench import procs
from bench.fake_upstream import FakeUpstream
from gateway.config import ConfigError, load_settings
from tests.plugins.embedded import each_server
from tests.plugins.processes import (
    CLOSE_WAIT,
    Gateway,
    alive,
    free_port,
    sockets_in_state,
    write_config,
)
from tests.plugins.servers import ADMIN_TOKEN, KEYS

ROOT = Path(__file__).resolve().parent.parent

WORKER = """
import asyncio, gc
from gateway.server import gc_tuning
from gateway.app import create_app
before = gc.get_threshold()[0]
create_app()  # as a server's worker builds it, from GATEWAY_CONFIG
done = {1: 0, 2: 0}
def count(phase, info):
    if phase == "stop" and info["generation"] in done:
        done[info["generation"]] += 1
gc.callbacks.append(count)
gc_tuning.COLLECT_EVERY = 0.05
gc_tuning.FULL_EVERY = 0.25
async def main():
    stop = gc_tuning.collect_periodically(asyncio.get_running_loop())
    await asyncio.sleep(0.6)
    stop()
    seen = dict(done)
    await asyncio.sleep(0.2)
    return seen, done == seen
seen, stopped = asyncio.run(main())
print(before, gc.get_threshold()[0] == gc_tuning.GEN0_THRESHOLD, gc.get_freeze_count() > 10_000,
      seen[1] >= 5, 1 <= seen[2] <= 3, stopped)
"""


def test_a_worker_freezes_start_up_collects_young_rarely_and_older_periodically() -> None:
    env = {**os.environ, "GATEWAY_CONFIG": str(ROOT / "config" / "gateway.yaml")}
    done = subprocess.run(
        [sys.executable, "-c", WORKER], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["700", "True", "True", "True", "True", "True"]


SERVERS = [
    pytest.param(name, marks=pytest.mark.skipif(
        importlib.util.find_spec(name) is None, reason=f"{name} is not installed"))
    for name in ("hypercorn", "uvicorn")  # granian always names itself: no setting for it
]  # fmt: skip


def minimal_config(tmp_path: Path, extra: str = "") -> Path:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"store: sqlite:///{tmp_path}/gateway.db\n"
        "admin_token: test-admin-token\ngroups: [default]\n"
        "models: []\nchannels: []\n" + extra
    )
    return config


def start(
    tmp_path: Path, config: Path, server: str, *extra: str
) -> tuple[subprocess.Popen[bytes], int]:
    port = procs.free_port()
    with (tmp_path / "log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port",
             str(port), "--server", server, *extra],
            stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path),
        )  # fmt: skip
    assert procs.wait_port(port, proc, 60), (tmp_path / "log").read_text()
    return proc, port


@pytest.mark.parametrize("server", SERVERS)
def test_replies_do_not_name_the_server_software(tmp_path: Path, server: str) -> None:
    proc, port = start(tmp_path, minimal_config(tmp_path), server)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b'{"status":"ok"}'
        assert resp.getheader("server") is None
        assert resp.getheader("date")  # HTTP requires it of an origin server with a clock
        conn.close()
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize("server", each_server())
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_ends_the_server_with_status_0(
    tmp_path: Path, server: str, sig: signal.Signals
) -> None:
    """A supervisor reads any other status as a failure: uvicorn raised SIGTERM again once it
    had shut down, and the process ended with -15."""
    proc, port = start(tmp_path, minimal_config(tmp_path), server)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
        proc.send_signal(sig)
        assert proc.wait(60) == 0, (tmp_path / "log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("server", each_server())
def test_workers_end_when_their_server_is_killed(tmp_path: Path, server: str) -> None:
    """SIGKILL of the server process (the OOM killer, a supervisor's last resort): no worker
    goes on serving the port as an orphan (granian's did)."""
    # a worker whose SIGTERM is lost is killed graceful_seconds + 5 s after the server
    config = minimal_config(tmp_path, "logging: {level: info}\nserver: {graceful_seconds: 1}\n")
    proc, port = start(tmp_path, config, server, "--workers", "2")
    log = tmp_path / "log"
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(STARTED.findall(log.read_text())) < 2:  # both serving
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        workers = [pid for pid in procs.tree(proc.pid) if pid != proc.pid]
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in workers if alive(pid)], (tmp_path / "log").read_text()[-3000:]
    finally:
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("server", each_server())
def test_an_idle_connection_is_closed_after_the_keep_alive(tmp_path: Path, server: str) -> None:
    """With the default (75 s) the connection would still be open when the read gives up."""
    proc, port = start(
        tmp_path, minimal_config(tmp_path, "server: {keep_alive_seconds: 1}\n"), server
    )
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
            reply = b""
            while b'{"status":"ok"}' not in reply:
                chunk = sock.recv(4096)
                assert chunk, reply
                reply += chunk
            assert b"connection: close" not in reply.lower()  # kept alive, then idle
            sock.settimeout(20)
            assert sock.recv(1) == b""  # the server closed it
    finally:
        proc.terminate()
        proc.wait(30)


STARTED = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO (\d+) gateway\.started store=sqlite$",
    re.MULTILINE,
)


@pytest.mark.parametrize("server", SERVERS)
def test_each_worker_logs_as_the_config_says(tmp_path: Path, server: str) -> None:
    """With ``--workers 2`` each worker (a process of its own, spawned without the server's
    logging) logs at the configured level, every line with its time, level and process."""
    config = minimal_config(tmp_path, "logging: {level: debug}\n")
    proc, port = start(tmp_path, config, server, "--workers", "2")
    log = tmp_path / "log"
    try:
        deadline = time.monotonic() + 60
        while len(STARTED.findall(log.read_text())) < 2:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/nowhere")
        assert conn.getresponse().status == 404
        conn.close()
        # the access line of the request, from one of them (written within a fifth of a second)
        while '"endpoint":"unknown","status":404' not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text()
    workers = {m.group(1) for m in STARTED.finditer(text)}
    # (an INFO line at all says the level holds there: the default, WARNING, drops it)
    assert len(workers) == 2 and str(proc.pid) not in workers, text[-3000:]


async def test_sigterm_lets_every_workers_streams_finish(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    """Streams of different lengths on both of two workers, then SIGTERM: every stream ends
    complete (the worker whose streams end first exits first; the other must not be killed
    then) and the server exits 0."""
    gw = Gateway(write_config(tmp_path, fake.url, f"sqlite:///{tmp_path}/gw.db"), free_port(),
                 tmp_path / "gw.log", workers=2)  # fmt: skip
    await gw.start()
    headers = {"authorization": f"Bearer {KEYS['alice']}"}
    seen: list[bytes] = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:

            async def stream(pause_ms: int, started: asyncio.Event) -> None:
                text = f"[[fake chunks=4 delay_ms={pause_ms}]] a b c d"
                body = {"model": "chat-small", "stream": True,
                        "messages": [{"role": "user", "content": text}]}  # fmt: skip
                async with s.post(gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
                    assert r.status == 200
                    await r.content.readline()
                    started.set()
                    seen.append(await r.read())

            events = [asyncio.Event() for _ in range(8)]
            tasks = [asyncio.create_task(stream(300 + 200 * i, e)) for i, e in enumerate(events)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 30)
            gw.kill(signal.SIGTERM)
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
        assert len(seen) == 8 and all(b"data: [DONE]" in x for x in seen)
        assert await gw.exit_code() == 0
    finally:
        if gw.proc is not None and gw.proc.poll() is None:
            gw.proc.kill()


@pytest.mark.parametrize("server", [
    pytest.param(name, marks=pytest.mark.skipif(
        importlib.util.find_spec(name) is None, reason=f"{name} is not installed"))
    for name in ("hypercorn", "uvicorn", "granian")
])  # fmt: skip
async def test_on_sigterm_streams_get_the_grace_then_are_cut(
    fake: FakeUpstream, tmp_path: Path, server: str
) -> None:
    """With ``graceful_seconds: 1``, SIGTERM lets a stream that ends within it finish, and
    cuts one that would run 30 s more, long before it would have ended; the server exits."""
    config = write_config(tmp_path, fake.url, f"sqlite:///{tmp_path}/gw.db")
    config.write_text(config.read_text() + "server: {graceful_seconds: 1}\n")
    gw = Gateway(config, free_port(), tmp_path / "gw.log", server=server)
    await gw.start()
    headers = {"authorization": f"Bearer {KEYS['alice']}"}
    try:
        async with aiohttp.ClientSession() as s:

            async def stream(chunks: int, pause_ms: int, started: asyncio.Event) -> bytes:
                text = f"[[fake chunks={chunks} delay_ms={pause_ms}]] " + "a " * chunks
                body = {"model": "chat-small", "stream": True,
                        "messages": [{"role": "user", "content": text}]}  # fmt: skip
                async with s.post(gw.url + "/v1/chat/completions", json=body, headers=headers) as r:
                    assert r.status == 200
                    got = await r.content.readline()
                    started.set()
                    try:
                        return got + await r.read()
                    except aiohttp.ClientPayloadError:  # cut: what arrived is what counts
                        return got

            events = [asyncio.Event(), asyncio.Event()]
            short = asyncio.create_task(stream(4, 100, events[0]))
            long = asyncio.create_task(stream(60, 500, events[1]))
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 30)
            gw.kill(signal.SIGTERM)
            termed = time.monotonic()
            finished, cut = await asyncio.wait_for(asyncio.gather(short, long), 60)
            assert time.monotonic() - termed < 20, "the grace was not applied"
        assert b"data: [DONE]" in finished
        assert b"data: [DONE]" not in cut
        await asyncio.wait_for(gw.exit_code(), 30)
        log = (tmp_path / "gw.log").read_text()
        assert "Traceback" not in log, log[-3000:]  # the cut is expected: a line, if any
    finally:
        if gw.proc is not None and gw.proc.poll() is None:
            gw.proc.kill()


def close_wait_sockets(port: int) -> int:
    """The server's sockets on ``port`` whose client has closed and that it still holds."""
    return sockets_in_state(port, CLOSE_WAIT)


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's socket table")
@pytest.mark.parametrize("workers", [1, 2])
def test_hypercorn_lets_go_of_a_connection_its_client_closed(tmp_path: Path, workers: int) -> None:
    """With the default keep-alive (75 s), unmended hypercorn holds each of these sockets (and
    the connection's tasks) in CLOSE_WAIT until the keep-alive ends."""
    proc, port = start(tmp_path, minimal_config(tmp_path), "hypercorn", "--workers", str(workers))
    try:
        for _ in range(8):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            for _ in range(2):  # kept alive between the two
                conn.request("GET", "/healthz")
                assert conn.getresponse().read() == b'{"status":"ok"}'
            conn.close()
        deadline = time.monotonic() + 10
        while close_wait_sockets(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert close_wait_sockets(port) == 0
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("", 75.0),
        ("server: {}\n", 75.0),
        ("server: {keep_alive_seconds: 5}\n", 5.0),
        ("server: {keep_alive_seconds: 2.5}\n", 2.5),
        ("server: {keep_alive_seconds: 0.5}\n", "server.keep_alive_seconds: must be at least 1"),
        ("server: {keep_alive_seconds: soon}\n", "server.keep_alive_seconds: must be a number"),
        ("server: {keepalive: 5}\n", "server.keepalive: unknown field"),
    ],
)
def test_server_section(tmp_path: Path, section: str, expected: float | str) -> None:
    config = minimal_config(tmp_path, section)
    if isinstance(expected, float):
        assert load_settings(config).server.keep_alive_seconds == expected
    else:
        with pytest.raises(ConfigError, match=expected):
            load_settings(config)


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("", 30.0),
        ("server: {graceful_seconds: 90}\n", 90.0),
        ("server: {graceful_seconds: 0}\n", 0.0),
        ("server: {graceful_seconds: -1}\n", "server.graceful_seconds: must be at least 0"),
    ],
)
def test_the_grace_period_is_a_setting(tmp_path: Path, section: str, expected: float | str) -> None:
    """How long streams in flight get on SIGTERM; hypercorn is given it (uvicorn too)."""
    config = minimal_config(tmp_path, section)
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=expected):
            load_settings(config)
        return
    settings = load_settings(config)
    assert settings.server.graceful_seconds == expected
    seen = {}

    def run(cfg: object) -> None:
        seen["graceful"] = cfg.graceful_timeout  # type: ignore[attr-defined]

    import hypercorn.run

    from gateway import server

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hypercorn.run, "run", run)
        server._hypercorn(settings, "127.0.0.1", 0, 2)
    assert seen == {"graceful": expected}


@pytest.mark.parametrize("server", [
    pytest.param(name, marks=pytest.mark.skipif(
        importlib.util.find_spec(name) is None, reason=f"{name} is not installed"))
    for name in ("hypercorn", "uvicorn", "granian")
])  # fmt: skip
async def test_no_server_believes_x_forwarded_for_on_its_own(
    fake: FakeUpstream, tmp_path: Path, server: str
) -> None:
    """With ``trusted_proxies: []`` the client is the socket's peer (127.0.0.1), whatever
    X-Forwarded-For says: uvicorn believed it from 127.0.0.1 by itself (its proxy headers),
    and the usage record said the forged range."""
    config = write_config(tmp_path, fake.url, f"sqlite:///{tmp_path}/gw.db")
    config.write_text(config.read_text() + "trusted_proxies: []\n")
    gw = Gateway(config, free_port(), tmp_path / "gw.log", server=server)
    await gw.start()
    try:
        headers = {"authorization": f"Bearer {KEYS['alice']}", "x-forwarded-for": "203.0.113.9"}
        chat = {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}]}
        admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        async with aiohttp.ClientSession() as s:
            async with s.post(gw.url + "/v1/chat/completions", json=chat, headers=headers) as r:
                assert r.status == 200, await r.text()
            async with s.get(gw.url + "/admin/usage?limit=1", headers=admin) as r:
                [record] = (await r.json())["data"]
        assert record["ip_range"] == "127.0.0.0/24"
    finally:
        gw.kill(signal.SIGTERM)
        await gw.exit_code()


@pytest.mark.parametrize("server", each_server())
async def test_a_paced_stream_arrives_whole_on_every_server(
    fake: FakeUpstream, tmp_path: Path, server: str
) -> None:
    """Read from its second wait on inside the upstream socket's callback
    (``upstream.direct_reads``), a paced stream is sent through each server's own ``send``
    driven by hand (granian's is no coroutine): every word arrives, in order, then [DONE]."""
    gw = Gateway(write_config(tmp_path, fake.url, f"sqlite:///{tmp_path}/gw.db"), free_port(),
                 tmp_path / "gw.log", server=server)  # fmt: skip
    await gw.start()
    words = [f"w{i}" for i in range(40)]
    text = f"[[fake text='{' '.join(words)}' chunks=40 delay_ms=10]]"
    body = {"model": "chat-small", "stream": True, "messages": [{"role": "user", "content": text}]}
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(
                gw.url + "/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {KEYS['alice']}"},
            ) as r:
                assert r.status == 200
                raw = await r.read()
        said = "".join(
            part.split(b'"content":"', 1)[1].split(b'"', 1)[0].decode()
            for part in raw.split(b"\n\n")
            if b'"content":"' in part
        ).split()
        assert said == words and raw.endswith(b"data: [DONE]\n\n"), gw.log.read_text()[-2000:]
    finally:
        gw.kill(signal.SIGTERM)
        await gw.exit_code()
