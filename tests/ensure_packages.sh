#!/usr/bin/env bash
# Install Debian's packages for the real parts the tests start (given as command:package),
# when a command is missing: e.g. `tests/ensure_packages.sh nginx:nginx-light`.
set -euo pipefail
missing=()
for pair in "$@"; do
  cmd=${pair%%:*}; pkg=${pair#*:}
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian's ${missing[*]} for the tests" >&2
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null \
  || { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null; }
