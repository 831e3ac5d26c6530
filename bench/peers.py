"""`make bench-peers`: install the peer gateways the benchmark compares against, each in its own
virtualenv under bench/.peers/ so their dependencies never touch the project's.

Now: LiteLLM proxy (bench/.peers/litellm). `make bench` skips a peer that is not installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PEERS = Path(__file__).resolve().parent / ".peers"
LITELLM = PEERS / "litellm"
LITELLM_BIN = LITELLM / "bin" / "litellm"


def install_litellm() -> bool:
    if LITELLM_BIN.exists():
        print(f"litellm: already installed in {LITELLM}")
        return True
    PEERS.mkdir(parents=True, exist_ok=True)
    print(f"litellm: creating {LITELLM} and installing litellm[proxy] (a few minutes)")
    subprocess.run([sys.executable, "-m", "venv", str(LITELLM)], check=True)
    pip = [str(LITELLM / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=False)
    done = subprocess.run([*pip, "litellm[proxy]"], check=False)
    if done.returncode != 0 or not LITELLM_BIN.exists():
        print("litellm: install failed; `make bench` will skip it", file=sys.stderr)
        return False
    return True


def main() -> int:
    ok = install_litellm()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
