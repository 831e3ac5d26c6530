#!/usr/bin/env bash
# Make sure a Redis answers for the tests: use the one at the URL's host:port if it answers,
# else start a local redis-server there (installing Debian's redis-server if it is missing).
set -euo pipefail
url=${1:-redis://127.0.0.1:6379/10}
hostport=${url#redis://}; hostport=${hostport%%/*}
host=${hostport%%:*}; port=${hostport##*:}
[ "$port" = "$host" ] && port=6379

ping() {
  if command -v redis-cli >/dev/null 2>&1; then
    redis-cli -h "$host" -p "$port" ping 2>/dev/null | grep -q PONG
  else
    # no client: speak RESP by hand
    exec 3<>"/dev/tcp/$host/$port" 2>/dev/null || return 1
    printf 'PING\r\n' >&3; read -r -t 2 reply <&3 || true; exec 3>&-
    [[ "${reply:-}" == +PONG* ]]
  fi
}

ping && exit 0
if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server not found: installing Debian's redis-server" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi
echo "starting redis-server on $host:$port" >&2
mkdir -p .redis-test
redis-server --daemonize yes --bind "$host" --port "$port" --save "" --appendonly no \
  --dir "$PWD/.redis-test" --logfile "$PWD/.redis-test/redis.log"
for _ in $(seq 50); do ping && exit 0; sleep 0.1; done
echo "redis-server did not answer on $host:$port" >&2
exit 1
