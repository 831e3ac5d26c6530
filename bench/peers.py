"""Install the peer gateways the benchmark compares against, pinned, under bench/.peers/ so their
dependencies never touch the project's: LiteLLM's proxy from PyPI in its own virtualenv
(bench/.peers/litellm), Portkey's gateway from the npm registry (bench/.peers/portkey, run with
the machine's Node, 20 or later). All installing happens here, before any load: `make bench`
installs LiteLLM, `make bench-agents` both, when missing, and each skips a peer whose install
failed.

    python -m bench.peers          # install what is missing or of another version
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

LITELLM_VERSION = "1.106.2"
PORTKEY_VERSION = "1.15.2"
# Portkey 1.15.2 asks for @hono/node-server ^1.3.3; from 1.14 on, that server's Response keeps
# a fetch reply's immutable headers, and Portkey's updateHeaders then fails every proxied reply
# with "TypeError: immutable" (Portkey-AI/gateway issues 1389 and 1550): 1.13.8 is the last
# release without it
HONO_NODE_SERVER = "1.13.8"
NODE_MAJOR = 20

PEERS = Path(__file__).resolve().parent / ".peers"
LITELLM = PEERS / "litellm"
LITELLM_BIN = LITELLM / "bin" / "litellm"
PORTKEY = PEERS / "portkey"
PORTKEY_PACKAGE = PORTKEY / "node_modules" / "@portkey-ai" / "gateway"
PORTKEY_JS = PORTKEY_PACKAGE / "build" / "start-server.js"


def litellm_version() -> str | None:
    """The LiteLLM installed in bench/.peers/litellm, or None."""
    python = LITELLM / "bin" / "python"
    if not LITELLM_BIN.exists() or not python.exists():
        return None
    done = subprocess.run(
        [str(python), "-c", "from importlib import metadata; print(metadata.version('litellm'))"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or None


def portkey_version() -> str | None:
    """The Portkey gateway installed in bench/.peers/portkey, or None."""
    try:
        meta = json.loads((PORTKEY_PACKAGE / "package.json").read_text())
    except (OSError, ValueError):
        return None
    return str(meta.get("version")) if PORTKEY_JS.exists() else None


def _hono_version() -> str | None:
    try:
        meta = json.loads((PORTKEY / "node_modules/@hono/node-server/package.json").read_text())
    except (OSError, ValueError):
        return None
    return str(meta.get("version"))


def node_version() -> str | None:
    node = shutil.which("node")
    if node is None:
        return None
    done = subprocess.run([node, "--version"], capture_output=True, text=True)
    return done.stdout.strip().lstrip("v") or None


def install_litellm() -> bool:
    if litellm_version() == LITELLM_VERSION:
        print(f"litellm {LITELLM_VERSION}: installed in {LITELLM}")
        return True
    PEERS.mkdir(parents=True, exist_ok=True)
    print(f"litellm: installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM} (minutes)")
    if not (LITELLM / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM)], check=True)
    pip = [str(LITELLM / "bin" / "python"), "-m", "pip", "install", "-q"]
    done = subprocess.run([*pip, f"litellm[proxy]=={LITELLM_VERSION}"], check=False)
    if done.returncode != 0 or litellm_version() != LITELLM_VERSION:
        print("litellm: install failed; the benchmarks will skip it", file=sys.stderr)
        return False
    return True


def install_portkey() -> bool:
    if portkey_version() == PORTKEY_VERSION and _hono_version() == HONO_NODE_SERVER:
        print(f"portkey {PORTKEY_VERSION}: installed in {PORTKEY}")
        return True
    node = node_version()
    if node is None or int(node.split(".")[0]) < NODE_MAJOR or shutil.which("npm") is None:
        print(f"portkey: needs Node {NODE_MAJOR}+ and npm (found {node}); skipped", file=sys.stderr)
        return False
    print(f"portkey: installing @portkey-ai/gateway@{PORTKEY_VERSION} into {PORTKEY}")
    shutil.rmtree(PORTKEY, ignore_errors=True)
    PORTKEY.mkdir(parents=True)
    manifest = {
        "private": True,
        "dependencies": {"@portkey-ai/gateway": PORTKEY_VERSION},
        "overrides": {"@hono/node-server": HONO_NODE_SERVER},
    }
    (PORTKEY / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    done = subprocess.run(
        ["npm", "install", "--prefix", str(PORTKEY), "--no-audit", "--no-fund"], check=False
    )
    if done.returncode != 0 or portkey_version() != PORTKEY_VERSION:
        print("portkey: install failed; the benchmarks will skip it", file=sys.stderr)
        return False
    return True


def main() -> int:
    ok = install_litellm()
    ok = install_portkey() and ok
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
