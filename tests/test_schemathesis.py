"""A bounded schemathesis run against the live gateway (``gateway serve`` with the bundled fake
upstream, both processes of their own): for inputs generated from the OpenAPI document on
every operation, the gateway never answers 5xx, and no answer contradicts the document
(status codes, content types, bodies of the declared shapes). Derandomized, a few examples
per operation."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from hypothesis import HealthCheck, settings

from gateway.openapi import document
from tests.plugins.processes import GATEWAY, free_port
from tests.plugins.servers import ADMIN_TOKEN, KEYS, make_config

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

KEY = KEYS["alice"]
START_DEADLINE = 30.0
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
schema = schemathesis.openapi.from_dict(document())


def wait_for(url: str) -> None:
    deadline = time.monotonic() + START_DEADLINE
    while True:
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, f"{url} never answered"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The gateway (SQLite store) and the fake upstream, each a process of its own."""
    tmp = tmp_path_factory.mktemp("schemathesis")
    up_port, gw_port = free_port(), free_port()
    upstream = f"http://127.0.0.1:{up_port}"
    cfg = make_config(upstream, f"sqlite:///{tmp / 'gw.db'}")
    cfg["journal"] = str(tmp / "journal")
    config = tmp / "gateway.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = (tmp / "log").open("wb")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.fake_upstream", "--host", "127.0.0.1"]
            + ["--port", str(up_port), "--first-ms", "0", "--delay-ms", "0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=Path(__file__).resolve().parent.parent,
        ),
        subprocess.Popen(
            [GATEWAY, "serve", "--config", str(config), "--host", "127.0.0.1"]
            + ["--port", str(gw_port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        ),
    ]
    try:
        url = f"http://127.0.0.1:{gw_port}"
        wait_for(url + "/healthz")
        yield url
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        log.close()


@schema.parametrize()
@settings(
    max_examples=8,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_5xx_and_nothing_the_document_does_not_say(case: Any, live: str) -> None:
    if case.path.startswith("/admin"):
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    else:
        headers = {"Authorization": f"Bearer {KEY}", "x-api-key": KEY, "x-goog-api-key": KEY}
    case.call_and_validate(base_url=live, headers=headers, checks=CHECKS, timeout=30)
