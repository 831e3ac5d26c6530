"""wrk runs: a generated Lua script posts the chat body with a Bearer key and checks every reply.

A reply whose status is not 200 or whose body lacks the expected strings counts as an error;
done() prints one JSON line with the counts and the latency percentiles.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench import procs

LUA = r"""
wrk.method = "POST"
wrk.path = "%(path)s"
wrk.body = %(body)s
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %(key)s"
%(extra_headers)s
local expect = {%(expect)s}
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  bad = 0
end

function response(status, headers, body)
  if status ~= 200 then
    bad = bad + 1
    return
  end
  for _, e in ipairs(expect) do
    if not string.find(body, e, 1, true) then
      bad = bad + 1
      return
    end
  end
end

function done(summary, latency, requests)
  local nbad = 0
  for _, t in ipairs(threads) do
    nbad = nbad + (t:get("bad") or 0)
  end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%%d,"duration_us":%%d,"connect":%%d,"read":%%d,"write":%%d,' ..
    '"status":%%d,"timeout":%%d,"bad_body":%%d,"p50_us":%%d,"p99_us":%%d,"mean_us":%%.1f}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    nbad, latency:percentile(50), latency:percentile(99), latency.mean))
end
"""


def _lua_string(raw: bytes) -> str:
    text = raw.decode()
    assert "]==]" not in text
    return "[==[" + text + "]==]"


def script(
    tmp: Path,
    name: str,
    path: str,
    body: bytes,
    key: str,
    expect: list[str],
    headers: dict[str, str] | None = None,
) -> Path:
    extra = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in (headers or {}).items())
    lua = LUA % {
        "path": path,
        "body": _lua_string(body),
        "key": key,
        "expect": ", ".join(_lua_string(e.encode()) for e in expect),
        "extra_headers": extra,
    }
    out = tmp / f"{name}.lua"
    out.write_text(lua)
    return out


@dataclass(frozen=True, slots=True)
class WrkResult:
    requests: int
    seconds: float
    errors: int
    p50_ms: float
    p99_ms: float

    @property
    def rps(self) -> float:
        good = max(0, self.requests - self.errors)
        return good / self.seconds if self.seconds else 0.0


def run(port: int, lua: Path, connections: int, seconds: float, core: int | None = 1) -> WrkResult:
    """Run wrk against 127.0.0.1:port (pinned to core, one thread)."""
    cmd = procs.pinned(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{max(1, round(seconds))}s",
            "--timeout",
            "10s",
            "-s",
            str(lua),
            f"http://127.0.0.1:{port}/",
        ],
        core,
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    for line in proc.stdout.splitlines():
        if line.startswith("WRKJSON "):
            data = json.loads(line[len("WRKJSON ") :])
            errors = (
                data["connect"] + data["read"] + data["write"] + data["timeout"] + data["bad_body"]
            )
            return WrkResult(
                requests=data["requests"],
                seconds=data["duration_us"] / 1e6,
                errors=errors,
                p50_ms=data["p50_us"] / 1000,
                p99_ms=data["p99_us"] / 1000,
            )
    raise RuntimeError(f"wrk gave no result: {proc.stdout[-500:]} {proc.stderr[-500:]}")
