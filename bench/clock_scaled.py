"""The gateway with its clock-driven intervals stretched, for counting instructions under
callgrind (scenario (e)): ``python -m bench.clock_scaled FACTOR serve --config ...``.

callgrind runs a process some 40 times slower, but the gateway's periodic work follows the
clock: the usage writer lingers 50 ms for a batch, the disconnect watchlist ticks every 50 ms
and starts a stream's watching task after 0.1 s, the key cache reloads (and shares holds)
every 0.5 s, channel cooldowns are shared every 0.5 s, the journal is synced every second,
the access log is written out five times a second, the collector runs every 5 s (and
with several workers, each writes its metrics every second). Slowed down, a usage batch holds
a fortieth of the records it holds at full speed (one SQLite transaction per record at one
connection), and a stream lasts long enough to start a watching task that it never starts
at full speed: the count would charge the gateway for work that only the slowdown makes.
Stretched by the slowdown, each interval spans as many requests as at full speed. Nothing
else changes: it is the gateway's own app, server and store; the bare relay has no such
intervals.
"""

from __future__ import annotations

import sys

from gateway import cli
from gateway.edge import asgi
from gateway.observe import access_log, metrics
from gateway.policy import health
from gateway.relay import pipeline as relay
from gateway.server import gc_tuning
from gateway.store import cache, writer


def stretch(factor: float) -> None:
    writer.LINGER *= factor
    asgi.WATCH_TICK *= factor
    relay.STREAM_WATCH_DELAY *= factor
    relay.REPLY_WATCH_DELAY *= factor
    gc_tuning.COLLECT_EVERY *= factor
    gc_tuning.FULL_EVERY *= factor
    cache.DEFAULT_INTERVAL *= factor
    health.SHARE_INTERVAL *= factor
    writer.SYNC_INTERVAL *= factor
    access_log.FLUSH_EVERY *= factor
    metrics.SNAPSHOT_EVERY *= factor


def main(argv: list[str]) -> int:
    stretch(float(argv[0]))
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
