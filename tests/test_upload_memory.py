"""A large transcription upload goes through a gateway process without being held in memory:
the gateway runs as its own process (``gateway serve``), so its resident memory is its own."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from bench import procs
from bench.fake_upstream import FakeUpstream

KEY = "sk-upload-0000000000000001"
BOUNDARY = "upload-test-boundary"
MIB = 1024 * 1024
UPLOAD_MIB = 50
GROWTH_LIMIT = 20 * MIB


def kib_field(pid: int, name: str) -> int:
    """A memory figure of /proc/PID/status, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"{name} not in /proc/{pid}/status")


async def upload(url: str, size: int) -> tuple[int, str]:
    """A multipart upload of ``size`` bytes of audio, sent as it is produced (chunked)."""

    async def body() -> AsyncIterator[bytes]:
        yield (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="model"\r\n\r\n'
            f'whisper-small\r\n--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="big.mp3"\r\nContent-Type: audio/mpeg\r\n\r\n'
        ).encode()
        chunk = bytes(MIB)
        for _ in range(size // MIB):
            yield chunk
        yield f"\r\n--{BOUNDARY}--\r\n".encode()

    headers = {
        "Authorization": f"Bearer {KEY}",
        "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
    }
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/audio/transcriptions", data=body(), headers=headers) as r:
            return r.status, await r.text()


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
async def test_a_50_mb_upload_grows_the_gateway_by_less_than_20_mb(tmp_path: Path) -> None:
    async with FakeUpstream(record=False) as fake:
        config = tmp_path / "gateway.yaml"
        config.write_text(
            f"store: sqlite:///{tmp_path}/gateway.db\n"
            "admin_token: test-admin-token\ngroups: [default]\n"
            "models: [{name: whisper-small, capabilities: [audio],"
            " price: {audio_second: 0.0001}}]\n"
            "channels: [{name: oa, type: openai, base_url: '" + fake.url + "/v1', api_key: k, "
            "groups: [default], models: [whisper-small]}]\n"
            "accounts: [{id: a, balance: 10}]\n"
            f"keys: [{{id: k1, key: {KEY}, account: a, group: default}}]\n"
            f"limits: {{max_upload_bytes: {(UPLOAD_MIB + 5) * MIB}}}\n"
        )
        port = procs.free_port()
        with (tmp_path / "log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve", "--config", str(config),
                 "--host", "127.0.0.1", "--port", str(port)],
                stdout=log, stderr=subprocess.STDOUT, cwd=str(tmp_path),
            )  # fmt: skip
        try:
            assert procs.wait_port(port, proc, 60), (tmp_path / "log").read_text()
            url = f"http://127.0.0.1:{port}"
            status, text = await upload(url, MIB)  # warm up: imports, pools, first record
            assert status == 200, text
            before = kib_field(proc.pid, "VmRSS")
            Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # the peak starts again here
            status, text = await upload(url, UPLOAD_MIB * MIB)
            assert status == 200, text
            peak = kib_field(proc.pid, "VmHWM")
        finally:
            proc.terminate()
            proc.wait(30)
    assert peak - before < GROWTH_LIMIT, f"grew {(peak - before) / MIB:.1f} MiB"
