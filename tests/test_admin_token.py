"""The admin token's strength, checked at start: shorter than 16 characters, or the public demo
token (``make run``'s ``admin-demo-token``) in a configuration not marked ``demo: true``, and
``gateway serve`` refuses to start with one clear line (status 2, no traceback); an empty token
turns the admin API off, as before; the bundled example (``config/gateway.yaml``, which says
``demo: true``) keeps serving the demo token."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import ConfigError, load_settings

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config" / "gateway.yaml"


def config(tmp_path: Path, text: str = "") -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(f"store: sqlite:///{tmp_path}/gateway.db\ngroups: [default]\n{text}")
    return path


def serve(path: Path, token: str | None) -> subprocess.CompletedProcess[str]:
    """``gateway serve`` as an operator starts it, the token from the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    if token is not None:
        env["GATEWAY_ADMIN_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", "1"],
        capture_output=True, text=True, env=env, cwd=path.parent, timeout=60,
    )  # fmt: skip


# (the file's extra lines, GATEWAY_ADMIN_TOKEN, what the one line says)
REFUSED = [
    pytest.param("", "short", "5 characters, at least 16", id="short-from-the-environment"),
    pytest.param("admin_token: t\n", None, "1 characters, at least 16", id="short-in-the-file"),
    pytest.param("", "admin-demo-token", "public demo token", id="demo-token-outside-the-demo"),
    pytest.param("demo: false\n", "admin-demo-token", "public demo token", id="demo-false"),
    pytest.param("demo: true\n", "fifteen-chars!!", "at least 16", id="short-even-in-a-demo"),
]


@pytest.mark.parametrize(("extra", "token", "says"), REFUSED)
def test_a_weak_admin_token_is_refused_at_start_in_one_line(
    tmp_path: Path, extra: str, token: str | None, says: str
) -> None:
    done = serve(config(tmp_path, extra), token)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # one line: no traceback
    assert lines[0].startswith("gateway: config error: admin_token"), lines[0]
    assert says in lines[0]
    if token and token != "admin-demo-token":
        assert token not in done.stderr  # a secret is not echoed to the log
    assert not (tmp_path / "gateway.db").exists()  # nothing was started


def test_the_example_config_keeps_the_demo_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """``make run``: the bundled example with the demo token."""
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", "admin-demo-token")
    settings = load_settings(EXAMPLE)
    assert settings.demo and settings.admin_token == "admin-demo-token"


@pytest.mark.parametrize(
    ("extra", "token"),
    [
        pytest.param("", "x7Qm2vLr9sKp4wNd", id="sixteen-characters"),
        pytest.param("admin_token: ''\n", None, id="empty-turns-the-admin-api-off"),
        pytest.param("", None, id="none-turns-the-admin-api-off"),
    ],
)
def test_a_strong_or_empty_token_is_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str, token: str | None
) -> None:
    monkeypatch.delenv("GATEWAY_ADMIN_TOKEN", raising=False)
    if token is not None:
        monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", token)
    assert load_settings(config(tmp_path, extra)).admin_token == (token or "")


def test_demo_must_be_a_boolean(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="demo: must be true or false"):
        load_settings(config(tmp_path, "demo: yes please\n"))
