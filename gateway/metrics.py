"""``GET /metrics``: what the gateway serves, how fast, what fails and what it costs, in
Prometheus' text format (CONTRACT §5a). Never a prompt, a reply, a key or a client IP: the
labels are the catalogue's model names (a name outside the catalogue counts as ``other``),
channel names, protocol, endpoint and status.

The hot path pays one ``observe()`` per request, into plain dicts (no metric objects, no
locks); ``prometheus-client`` builds the exposition from them at scrape time through a
custom collector, so its format and escaping are the library's. The metrics:

- ``gateway_requests_total{model,protocol,endpoint,channel,status}`` (counter)
- ``gateway_tokens_total{model,type}``: ``type`` is ``input`` or ``output``, as the OpenTelemetry
  GenAI convention's ``gen_ai.token.type`` (counter)
- ``gateway_cost_total{model}``: balance units debited (counter)
- ``gateway_request_duration_seconds{model,endpoint,channel}``: arrival to last byte, as
  ``gen_ai.server.request.duration`` (histogram)
- ``gateway_time_to_first_chunk_seconds{model,endpoint,channel}``: a stream's arrival to its
  first output, as ``gen_ai.server.time_to_first_token`` (histogram)
- ``gateway_open_streams``, ``gateway_usage_writer_backlog`` (records not yet in the store),
  ``gateway_usage_parked_records`` (records the store refused, retried alone) (gauges)
- ``gateway_channel_state{channel,state}``: 1 for the channel's state, ``healthy``, ``cooling``
  or ``disabled`` (gauge), and ``gateway_channel_failures_total{channel}`` (counter)

With several worker processes (``--workers N``), each one writes a snapshot of its counters
to ``GATEWAY_METRICS_DIR`` (a directory the server makes for the run) every second and when it
stops; a scrape, answered by whichever worker, adds up every worker's snapshot (counters of a
worker that exited stay, as Prometheus expects of counters; gauges only of live workers).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from gateway.store import MICRO, UsageRecord

log = logging.getLogger("gateway.metrics")

DIR_ENV = "GATEWAY_METRICS_DIR"
SNAPSHOT_EVERY = 1.0  # seconds between a worker's snapshots
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
FIRST_CHUNK_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
OTHER = "other"


# a row of ``Metrics.rows``: requests, input and output tokens, cost in micro-units, then the
# duration histogram's buckets (the last one +Inf, not cumulative) and its sum, then the
# first-chunk histogram's buckets and its sum (a histogram's count is its buckets' sum)
DURATION_AT = 4
DURATION_SUM = DURATION_AT + len(DURATION_BUCKETS) + 1
FIRST_CHUNK_AT = DURATION_SUM + 1
FIRST_CHUNK_SUM = FIRST_CHUNK_AT + len(FIRST_CHUNK_BUCKETS) + 1
ROW_WIDTH = FIRST_CHUNK_SUM + 1


class Metrics:
    """This process's counters; ``observe()`` is the hot path's only call: one dict lookup
    and a few additions into one row per label set (the exposition's families are made from
    the rows at scrape time, ``snapshot``)."""

    def __init__(self, known_models: Iterable[str] = ()) -> None:
        self.known = frozenset(known_models)
        # (model, protocol, endpoint, channel or None, status) -> a row (``ROW_WIDTH``)
        self.rows: dict[tuple[str, str, str, str | None, int], list[Any]] = {}
        self.open_streams = 0
        # read at scrape time, set by the app: writer backlog and parked, channel states and
        # failures
        self.gauges: Callable[[], dict[str, float]] = dict
        self.channels: Callable[[], tuple[dict[str, str], dict[str, int]]] = lambda: ({}, {})

    def observe(self, rec: UsageRecord, first_chunk: float | None) -> None:
        """A request that ended (its usage record), and a stream's seconds to first output."""
        model = rec.model
        if model not in self.known:
            model = OTHER
        labels = (model, rec.protocol, rec.endpoint, rec.channel, rec.status)
        row = self.rows.get(labels)
        if row is None:
            row = self.rows[labels] = [0] * ROW_WIDTH
        row[0] += 1
        row[1] += rec.prompt_tokens
        row[2] += rec.completion_tokens
        row[3] += rec.cost
        seconds = rec.latency_ms / 1000
        row[DURATION_AT + bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1  # le
        row[DURATION_SUM] += seconds
        if first_chunk is not None:
            row[FIRST_CHUNK_AT + bisect.bisect_left(FIRST_CHUNK_BUCKETS, first_chunk)] += 1
            row[FIRST_CHUNK_SUM] += first_chunk

    def _series(self) -> tuple[list[list[Any]], list[list[Any]], list[list[Any]]]:
        """The rows as the snapshot's three tables: requests by their five labels; the two
        histograms by (model, endpoint, channel), each row its buckets, count and sum."""
        requests: list[list[Any]] = []
        duration: dict[tuple[str, str, str], list[float]] = {}
        first: dict[tuple[str, str, str], list[float]] = {}
        for (model, protocol, endpoint, channel, status), row in self.rows.items():
            name = channel or ""
            requests.append([model, protocol, endpoint, name, str(status), *row[:4]])
            timing = (model, endpoint, name)
            _add(duration, timing, row[DURATION_AT : DURATION_SUM + 1])
            if any(row[FIRST_CHUNK_AT:FIRST_CHUNK_SUM]):
                _add(first, timing, row[FIRST_CHUNK_AT : FIRST_CHUNK_SUM + 1])
        return (
            requests,
            [[*k, *v] for k, v in duration.items()],
            [[*k, *v] for k, v in first.items()],
        )

    # -- snapshots across worker processes --------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        requests, duration, first_chunk = self._series()
        return {
            "pid": os.getpid(),
            "requests": requests,
            "duration": duration,
            "first_chunk": first_chunk,
            "gauges": {"open_streams": self.open_streams, **self.gauges()},
        }

    async def write_snapshots(self, directory: str) -> None:
        """Every ``SNAPSHOT_EVERY`` seconds (and once more when cancelled), this worker's
        counters to ``directory/<pid>.json``, replaced atomically."""
        path = Path(directory) / f"{os.getpid()}.json"
        try:
            while True:
                await asyncio.sleep(SNAPSHOT_EVERY)
                self._write(path)
        finally:
            with contextlib.suppress(OSError):
                self._write(path)

    def _write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(self.snapshot()))
        tmp.replace(path)


def _add(
    into: dict[tuple[str, str, str], list[float]], labels: tuple[str, str, str], part: list[float]
) -> None:
    """A histogram's buckets and sum (``part``) added into its series as buckets, count,
    sum."""
    row = into.get(labels)
    if row is None:
        row = into[labels] = [0.0] * (len(part) + 1)
    for i, n in enumerate(part[:-1]):
        row[i] += n
    row[-2] += sum(part[:-1])
    row[-1] += part[-1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _snapshots(own: dict[str, Any], directory: str | None) -> list[dict[str, Any]]:
    """This process's live snapshot and every other worker's last one."""
    out = [own]
    if not directory:
        return out
    for path in Path(directory).glob("*.json"):
        if path.stem == str(own["pid"]):
            continue
        try:
            snap = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue  # being replaced; the next scrape reads it
        if not _alive(int(snap.get("pid", 0))):
            snap["gauges"] = {}
        out.append(snap)
    return out


class Exposition(Collector):
    """The metric families, from every worker's snapshot, at scrape time."""

    def __init__(self, metrics: Metrics, directory: str | None) -> None:
        self.metrics = metrics
        self.directory = directory

    def collect(self) -> Iterator[Metric]:
        snaps = _snapshots(self.metrics.snapshot(), self.directory)
        requests: dict[tuple[str, ...], list[int]] = {}
        for snap in snaps:
            for row in snap["requests"]:
                into = requests.setdefault(tuple(row[:5]), [0, 0, 0, 0])
                for i in range(4):
                    into[i] += row[5 + i]
        total = CounterMetricFamily(
            "gateway_requests",
            "Requests that ended, by model, client protocol, endpoint, channel and status.",
            labels=["model", "protocol", "endpoint", "channel", "status"],
        )
        tokens = CounterMetricFamily(
            "gateway_tokens", "Tokens billed, by model and type.", labels=["model", "type"]
        )
        cost = CounterMetricFamily(
            "gateway_cost", "Balance units debited, by model.", labels=["model"]
        )
        by_model: dict[str, list[int]] = {}
        for labels, (n, tin, tout, micro) in sorted(requests.items()):
            total.add_metric(list(labels), n)
            m = by_model.setdefault(labels[0], [0, 0, 0])
            m[0] += tin
            m[1] += tout
            m[2] += micro
        for model, (tin, tout, micro) in sorted(by_model.items()):
            tokens.add_metric([model, "input"], tin)
            tokens.add_metric([model, "output"], tout)
            cost.add_metric([model], micro / MICRO)
        yield total
        yield tokens
        yield cost
        yield self._histogram(
            snaps, "duration", DURATION_BUCKETS, "gateway_request_duration_seconds",
            "Seconds from a request's arrival to its last byte.",
        )  # fmt: skip
        yield self._histogram(
            snaps, "first_chunk", FIRST_CHUNK_BUCKETS, "gateway_time_to_first_chunk_seconds",
            "Seconds from a stream's arrival to its first output.",
        )  # fmt: skip
        gauges: dict[str, float] = {}
        for snap in snaps:
            for name, value in snap["gauges"].items():
                gauges[name] = gauges.get(name, 0) + value
        for name, text in (
            ("open_streams", "Streams being relayed now."),
            ("usage_writer_backlog", "Usage records not yet in the store."),
            ("usage_parked_records", "Usage records the store refused, retried alone."),
        ):
            yield GaugeMetricFamily(f"gateway_{name}", text, value=gauges.get(name, 0))
        states, failures = self.metrics.channels()
        state = GaugeMetricFamily(
            "gateway_channel_state",
            "1 for each channel's state: healthy, cooling or disabled.",
            labels=["channel", "state"],
        )
        for channel, now in sorted(states.items()):
            for name in ("healthy", "cooling", "disabled"):
                state.add_metric([channel, name], 1 if name == now else 0)
        yield state
        failed = CounterMetricFamily(
            "gateway_channel_failures",
            "Failed upstream attempts, by channel (this process).",
            labels=["channel"],
        )
        for channel in sorted(states):
            failed.add_metric([channel], failures.get(channel, 0))
        yield failed

    @staticmethod
    def _histogram(
        snaps: list[dict[str, Any]],
        field: str,
        bounds: tuple[float, ...],
        name: str,
        text: str,
    ) -> HistogramMetricFamily:
        series: dict[tuple[str, ...], list[float]] = {}
        width = len(bounds) + 3
        for snap in snaps:
            for row in snap[field]:
                into = series.setdefault(tuple(row[:3]), [0.0] * width)
                for i in range(width):
                    into[i] += row[3 + i]
        family = HistogramMetricFamily(name, text, labels=["model", "endpoint", "channel"])
        for labels, row in sorted(series.items()):
            cumulative, buckets = 0.0, []
            for bound, count in zip((*bounds, float("inf")), row[: len(bounds) + 1], strict=True):
                cumulative += count
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
            family.add_metric(list(labels), buckets, sum_value=row[-1])
        return family


def registry_for(metrics: Metrics) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Exposition(metrics, os.environ.get(DIR_ENV)))
    return registry


def channel_states(
    names: Iterable[str], cooling: dict[str, float], disabled: Iterable[str] = ()
) -> dict[str, str]:
    """Each channel's state now, from ``ChannelHealth.cooling``."""
    now = time.monotonic()
    off = set(disabled)
    return {
        n: "disabled" if n in off else "cooling" if cooling.get(n, 0.0) > now else "healthy"
        for n in names
    }
