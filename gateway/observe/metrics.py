"""``GET /metrics``: what the gateway serves, how fast, what fails and what it costs, in
Prometheus' text format (CONTRACT §5a). Never a prompt, a reply, a key or a client IP: the
labels are the catalogue's model names (a name outside the catalogue counts as ``other``, a
request refused before its model was read has none), channel names, protocol, endpoint kind
(``unknown`` for a path the gateway does not serve, never the path) and status.

Names follow the OpenTelemetry GenAI semantic conventions where one exists, in their
Prometheus form (dots to underscores, the unit as a suffix): ``gen_ai.client.token.usage``
is ``gen_ai_client_token_usage``, attribute ``gen_ai.request.model`` the label
``gen_ai_request_model``. The gateway is a GenAI *server* to its clients and a GenAI *client*
of its upstreams; ``gen_ai_operation_name`` is the endpoint kind (``chat``, ``embeddings``,
...), ``gen_ai_provider_name`` the channel's type (``openai``, ``anthropic``, ``gcp.gemini``),
``gen_ai_request_model`` the catalogue's name, ``error_type`` the HTTP status of a failure
(empty on success). Bucket bounds are the conventions' own, extended past their last bound
where streams run longer (a 10-minute stream would otherwise only count in ``+Inf``).

- ``gen_ai_server_request_duration_seconds`` (histogram): a request's arrival to its last
  byte, every request on the client surface.
- ``gen_ai_server_time_to_first_token_seconds{...,stream}`` (histogram): arrival to the first
  output the client is sent. ``stream="false"``: a reply that is not a stream leaves whole,
  so its first byte goes out with the last and its sample is its duration.
- ``gen_ai_client_operation_duration_seconds`` (histogram): each upstream attempt, sent to
  answered in full (a failed one to its failure, with ``error_type``): the upstream's own
  latency, per channel.
- ``gen_ai_client_operation_time_to_first_chunk_seconds`` (histogram): a streamed attempt,
  sent to the upstream's first chunk (a stream quiet past the keep-alive interval, started
  empty, has no sample).
- ``gen_ai_client_token_usage{...,gen_ai_token_type}`` (histogram, tokens): the tokens billed
  per request, ``input`` and ``output``, and the classes within them: ``cache_read`` and
  ``cache_write`` (parts of ``input``), ``reasoning`` (part of ``output``), so adding up
  ``input`` and ``output`` counts every token once; ``_sum`` is the total (a type the upstream
  reported none of adds no sample).
- No convention: ``gateway_requests_total{model,protocol,endpoint,channel,status}`` (every
  request the app handled, the gateway's own endpoints too, with ``protocol="gateway"``),
  ``gateway_cost_total{model}`` (balance units, exact costs' pico-units included),
  ``gateway_open_streams``,
  ``gateway_usage_writer_backlog`` (records not yet in the store),
  ``gateway_usage_parked_records`` (records the store refused, retried alone),
  ``gateway_journal_writable`` (1 while every worker can write its settlement journal, 0
  when one cannot: its records would not survive a crash),
  ``gateway_channel_state{channel,state}`` (1 for ``healthy``, ``cooling`` or ``disabled``),
  ``gateway_channel_failures_total{channel}``, ``gateway_session_pins{model,channel}`` (the
  sessions pinned to each channel: ``policy/affinity.py``) and
  ``gateway_prompt_cache_hit_ratio{model,channel}`` (the prompt tokens read from the provider's
  cache over all prompt tokens, since the start).

The hot path pays one ``observe()`` per request into one row of plain numbers per label set
(no metric objects, no locks); ``prometheus-client`` builds the exposition at scrape time
through a custom collector, so its format and escaping are the library's.

With several worker processes (``--workers N``) each writes a snapshot of everything it
counted to ``GATEWAY_METRICS_DIR`` (a directory the server makes for the run) every second,
when it answers a scrape and when it stops; a scrape, answered by whichever worker, adds up
every worker's last snapshot, so every counter and histogram is the sum over workers (a
worker that exited keeps its counts, as Prometheus expects of counters) and never goes back
from one scrape to the next, whichever worker answers each (another worker's counts are at
most a second old). Gauges come from live workers only: open streams,
backlog and parked records are summed; a channel's state is the worst any worker sees
(``disabled`` over ``cooling`` over ``healthy``), and so is the journal's (0 when any
worker's cannot be written).
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
# gen_ai.server.request.duration's and gen_ai.client.operation.duration's bounds, then on to
# ten minutes
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92, 163.84, 327.68, 655.36)  # fmt: skip
# gen_ai.server.time_to_first_token's, then 30 s and a minute (thinking models)
FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                       2.5, 5.0, 7.5, 10.0, 30.0, 60.0)  # fmt: skip
# gen_ai.client.token.usage's
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304,
                 16777216, 67108864)  # fmt: skip
OTHER = "other"
OWN_PROTOCOL = "gateway"  # the protocol label of the gateway's own endpoints (admin, probes)
STATES = ("healthy", "cooling", "disabled")  # a worse state last
GENAI = ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "channel"]


def _after(at: int, bounds: tuple[float, ...]) -> tuple[int, int]:
    """A histogram at ``at`` in a row: its buckets (the last one +Inf, not cumulative), then
    its sum; (the sum's index, the next free index)."""
    return at + len(bounds) + 1, at + len(bounds) + 2


# a row of ``Metrics.rows``: requests, cost in micro-units, then the histograms, each its
# buckets and its sum (a histogram's count is its buckets' sum)
COST = 1
DURATION = 2  # gen_ai.server.request.duration
DURATION_SUM, STREAM_FIRST = _after(DURATION, DURATION_BUCKETS)
STREAM_FIRST_SUM, REPLY_FIRST = _after(STREAM_FIRST, FIRST_TOKEN_BUCKETS)
REPLY_FIRST_SUM, UPSTREAM = _after(REPLY_FIRST, FIRST_TOKEN_BUCKETS)
UPSTREAM_SUM, UPSTREAM_FIRST = _after(UPSTREAM, DURATION_BUCKETS)
UPSTREAM_FIRST_SUM, TOKENS_IN = _after(UPSTREAM_FIRST, DURATION_BUCKETS)
TOKENS_IN_SUM, TOKENS_OUT = _after(TOKENS_IN, TOKEN_BUCKETS)
TOKENS_OUT_SUM, TOKENS_READ = _after(TOKENS_OUT, TOKEN_BUCKETS)
TOKENS_READ_SUM, TOKENS_WRITTEN = _after(TOKENS_READ, TOKEN_BUCKETS)
TOKENS_WRITTEN_SUM, TOKENS_REASONING = _after(TOKENS_WRITTEN, TOKEN_BUCKETS)
TOKENS_REASONING_SUM, COST_PICO = _after(TOKENS_REASONING, TOKEN_BUCKETS)
ROW_WIDTH = COST_PICO + 1  # the cost's pico-units below its micro-units, summed
# a row of ``Metrics.failed``: a failed attempt's duration buckets and sum
FAILED_WIDTH = len(DURATION_BUCKETS) + 2

Labels = tuple[str, str, str, str | None, int]  # model, protocol, endpoint, channel, status

# the histogram families made from the rows, in the exposition's order: name, help, the label
# after ``GENAI`` (None: none), bounds, the parts of a row added in (each its buckets' index
# and that label's value, an int for ``error_type``: the status if at least that, else empty),
# and whether the failed attempts (``Metrics.failed``) are added in too
Family = tuple[str, str, str | None, tuple[float, ...], tuple[tuple[int, str | int], ...], bool]
HISTOGRAMS: tuple[Family, ...] = (
    ("gen_ai_server_request_duration_seconds",
     "Seconds from a request's arrival to its last byte.",
     "error_type", DURATION_BUCKETS, ((DURATION, 400),), False),
    ("gen_ai_server_time_to_first_token_seconds",
     "Seconds from a request's arrival to the first output its client is sent (a reply "
     "that is not a stream: with all of it).",
     "stream", FIRST_TOKEN_BUCKETS, ((STREAM_FIRST, "true"), (REPLY_FIRST, "false")), False),
    # the attempt that answered (a 5xx: it broke off), then every attempt that failed
    ("gen_ai_client_operation_duration_seconds",
     "Seconds of each upstream attempt, sent to answered in full or failed.",
     "error_type", DURATION_BUCKETS, ((UPSTREAM, 500),), True),
    ("gen_ai_client_operation_time_to_first_chunk_seconds",
     "Seconds from a streamed upstream attempt's start to the upstream's first chunk.",
     None, DURATION_BUCKETS, ((UPSTREAM_FIRST, ""),), False),
    ("gen_ai_client_token_usage",
     "Tokens billed per request, by type (input, output; cache_read and cache_write are parts "
     "of input, reasoning part of output).",
     "gen_ai_token_type", TOKEN_BUCKETS,
     ((TOKENS_IN, "input"), (TOKENS_OUT, "output"), (TOKENS_READ, "cache_read"),
      (TOKENS_WRITTEN, "cache_write"), (TOKENS_REASONING, "reasoning")), False),
)  # fmt: skip


class Metrics:
    """This process's counters; ``observe()`` is the hot path's only call: one dict lookup
    and a few additions into one row per label set (the exposition's families are made from
    the rows at scrape time, ``snapshot``)."""

    def __init__(self, known_models: Iterable[str] = ()) -> None:
        self.known = frozenset(known_models)
        self.rows: dict[Labels, list[Any]] = {}
        # failed upstream attempts: (model, endpoint, channel, status) -> ``FAILED_WIDTH``
        self.failed: dict[tuple[str, str, str, int], list[Any]] = {}
        self.open_streams = 0
        # read at scrape time, set by the app: writer backlog and parked; channel states and
        # failed attempts as channel health counts them; each channel's provider name
        self.gauges: Callable[[], dict[str, float]] = dict
        self.channels: Callable[[], tuple[dict[str, str], dict[str, int]]] = lambda: ({}, {})
        self.providers: Callable[[], dict[str, str]] = dict
        # the session pins by (model, channel), read at scrape time (``Affinity.counts``)
        self.sessions: Callable[[], dict[tuple[str, str], int]] = dict

    def _row(self, labels: Labels) -> list[Any]:
        row = self.rows.get(labels)
        if row is None:
            row = self.rows[labels] = [0] * ROW_WIDTH
        return row

    def observe(
        self,
        rec: UsageRecord,
        seconds: float,
        first_chunk: float | None,
        upstream: float | None = None,
        upstream_first: float | None = None,
    ) -> None:
        """A request on the client surface that ended (its usage record) after ``seconds``:
        ``first_chunk``, a stream's seconds to its first output; ``upstream``, the seconds of
        the attempt that answered (None: none did); ``upstream_first``, a stream's seconds
        from that attempt's start to the upstream's first chunk."""
        model = rec.model
        if model not in self.known:
            model = OTHER if model else ""
        labels = (model, rec.protocol, rec.endpoint, rec.channel, rec.status)
        row = self.rows.get(labels)
        if row is None:
            row = self._row(labels)
        row[0] += 1
        row[COST] += rec.cost
        if rec.cost_pico:
            row[COST_PICO] += rec.cost_pico
        row[DURATION + bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1  # le
        row[DURATION_SUM] += seconds
        if first_chunk is not None:
            row[STREAM_FIRST + bisect.bisect_left(FIRST_TOKEN_BUCKETS, first_chunk)] += 1
            row[STREAM_FIRST_SUM] += first_chunk
        elif rec.status == 200:  # a whole reply: its first byte left with its last
            row[REPLY_FIRST + bisect.bisect_left(FIRST_TOKEN_BUCKETS, seconds)] += 1
            row[REPLY_FIRST_SUM] += seconds
        if upstream is None:
            return
        row[UPSTREAM + bisect.bisect_left(DURATION_BUCKETS, upstream)] += 1
        row[UPSTREAM_SUM] += upstream
        if upstream_first is not None:
            row[UPSTREAM_FIRST + bisect.bisect_left(DURATION_BUCKETS, upstream_first)] += 1
            row[UPSTREAM_FIRST_SUM] += upstream_first
        tokens = rec.prompt_tokens
        if tokens:
            row[TOKENS_IN + bisect.bisect_left(TOKEN_BUCKETS, tokens)] += 1
            row[TOKENS_IN_SUM] += tokens
        tokens = rec.completion_tokens
        if tokens:
            row[TOKENS_OUT + bisect.bisect_left(TOKEN_BUCKETS, tokens)] += 1
            row[TOKENS_OUT_SUM] += tokens
        tokens = rec.cache_read_tokens
        if tokens:
            row[TOKENS_READ + bisect.bisect_left(TOKEN_BUCKETS, tokens)] += 1
            row[TOKENS_READ_SUM] += tokens
        tokens = rec.cache_write_tokens
        if tokens:
            row[TOKENS_WRITTEN + bisect.bisect_left(TOKEN_BUCKETS, tokens)] += 1
            row[TOKENS_WRITTEN_SUM] += tokens
        tokens = rec.reasoning_tokens
        if tokens:
            row[TOKENS_REASONING + bisect.bisect_left(TOKEN_BUCKETS, tokens)] += 1
            row[TOKENS_REASONING_SUM] += tokens

    def observe_other(self, protocol: str, endpoint: str, status: int) -> None:
        """A request the relay did not serve (the model lists, the admin API, the probes, an
        unknown path): counted, not timed as a GenAI operation."""
        self._row(("", protocol, endpoint, None, status))[0] += 1

    def attempt_failed(
        self, model: str, endpoint: str, channel: str, status: int, seconds: float
    ) -> None:
        """An upstream attempt that failed after ``seconds`` (the next channel may be tried)."""
        if model not in self.known:
            model = OTHER if model else ""
        key = (model, endpoint, channel, status)
        row = self.failed.get(key)
        if row is None:
            row = self.failed[key] = [0] * FAILED_WIDTH
        row[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
        row[-1] += seconds

    # -- snapshots across worker processes --------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything this process counted, as JSON-ready tables."""
        states, failures = self.channels()
        return {
            "pid": os.getpid(),
            "rows": [
                [model, protocol, endpoint, channel or "", status, *row]
                for (model, protocol, endpoint, channel, status), row in self.rows.items()
            ],
            "failed": [[*key, *row] for key, row in self.failed.items()],
            "failures": failures,
            "providers": self.providers(),
            "channels": states,
            "gauges": {"open_streams": self.open_streams, **self.gauges()},
            "pins": [[model, channel, n] for (model, channel), n in self.sessions().items()],
        }

    def cache_use(self) -> list[dict[str, Any]]:
        """Per model and channel, every worker's: sessions pinned, prompt tokens, those read
        from the provider's cache and their share (the console's overview)."""
        snaps = _snapshots(self.snapshot(), os.environ.get(DIR_ENV))
        return [
            {"model": model, "channel": channel, "pins": pins, "prompt_tokens": prompt,
             "cache_read_tokens": read, "cache_hit_rate": round(read / prompt, 4) if prompt else 0}
            for (model, channel), (pins, prompt, read) in sorted(_cache_use(snaps).items())
        ]  # fmt: skip

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
        _write(path, self.snapshot())


def _write(path: Path, snapshot: dict[str, Any]) -> None:
    """A snapshot to ``path``, replaced atomically."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(orjson.dumps(snapshot))
    tmp.replace(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _snapshots(own: dict[str, Any], directory: str | None) -> list[dict[str, Any]]:
    """This process's live snapshot and every other worker's last one (a worker that is gone
    keeps its counts, not its gauges or channel states)."""
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
            snap["gauges"], snap["channels"] = {}, {}
        out.append(snap)
    return out


def _summed(
    snaps: list[dict[str, Any]], table: str, width: int, labels: int
) -> dict[tuple[Any, ...], list[Any]]:
    """A table's rows over every snapshot, added up by their first ``labels`` values."""
    out: dict[tuple[Any, ...], list[Any]] = {}
    for snap in snaps:
        for row in snap.get(table, ()):
            into = out.get(key := tuple(row[:labels]))
            if into is None:
                into = out[key] = [0] * width
            for i, n in enumerate(row[labels:]):
                into[i] += n
    return out


class Exposition(Collector):
    """The metric families, from every worker's snapshot, at scrape time."""

    def __init__(self, metrics: Metrics, directory: str | None) -> None:
        self.metrics = metrics
        self.directory = directory

    def collect(self) -> Iterator[Metric]:
        own = self.metrics.snapshot()
        if self.directory:
            # this worker's counts go to its file first: a later scrape answered by another
            # worker reads them, so no counter ever goes back between two scrapes
            with contextlib.suppress(OSError):
                _write(Path(self.directory) / f"{own['pid']}.json", own)
        snaps = _snapshots(own, self.directory)
        rows = _summed(snaps, "rows", ROW_WIDTH, 5)
        providers: dict[str, str] = {}
        for snap in snaps:
            providers.update(snap.get("providers", {}))

        total = CounterMetricFamily(
            "gateway_requests",
            "Requests the gateway handled, by model, client protocol, endpoint, channel and "
            "status.",
            labels=["model", "protocol", "endpoint", "channel", "status"],
        )
        costs: dict[str, int] = {}  # in pico-units (Python's integers do not overflow)
        for (model, protocol, endpoint, channel, status), row in sorted(rows.items()):
            total.add_metric([model, protocol, endpoint, channel, str(status)], row[0])
            if model or row[COST] or row[COST_PICO]:
                costs[model] = costs.get(model, 0) + row[COST] * MICRO + row[COST_PICO]
        yield total
        cost = CounterMetricFamily(
            "gateway_cost", "Balance units billed, by model.", labels=["model"]
        )
        for model, pico in sorted(costs.items()):
            cost.add_metric([model], pico / (MICRO * MICRO))
        yield cost

        yield from self._histograms(snaps, rows, providers)
        yield from self._gauges(snaps)
        yield from _session_gauges(snaps)

    @staticmethod
    def _histograms(
        snaps: list[dict[str, Any]],
        rows: dict[tuple[Any, ...], list[Any]],
        providers: dict[str, str],
    ) -> Iterator[Metric]:
        """``HISTOGRAMS``, each from the rows' parts it names, by the GenAI labels."""
        for name, text, label, bounds, parts, with_failed in HISTOGRAMS:
            series: dict[tuple[str, ...], list[Any]] = {}
            for (model, _, endpoint, channel, status), row in rows.items():
                head = (endpoint, providers.get(channel, ""), model, channel)
                for at, value in parts:
                    if isinstance(value, int):  # error_type: the status, if at least that
                        value = str(status) if status >= value else ""
                    _add(series, (*head, value) if label else head, row, at, _after(at, bounds)[0])
            if with_failed:  # every failed attempt, by its status
                for (model, endpoint, channel, status), row in _summed(
                    snaps, "failed", FAILED_WIDTH, 4
                ).items():
                    head = (endpoint, providers.get(channel, ""), model, channel)
                    _add(series, (*head, str(status)), row, 0, FAILED_WIDTH - 1)
            yield _histogram(name, text, [*GENAI, label] if label else GENAI, bounds, series)

    @staticmethod
    def _gauges(snaps: list[dict[str, Any]]) -> Iterator[Metric]:
        gauges: dict[str, float] = {}
        worst: dict[str, int] = {}
        failures: dict[str, int] = {}
        writable = 1.0
        for snap in snaps:
            for name, value in snap["gauges"].items():
                gauges[name] = gauges.get(name, 0) + value
            writable = min(writable, snap["gauges"].get("journal_writable", 1))
            for channel, now in snap.get("channels", {}).items():
                worst[channel] = max(worst.get(channel, 0), STATES.index(now))
            for channel, n in snap.get("failures", {}).items():
                failures[channel] = failures.get(channel, 0) + n
        for name, text in (
            ("open_streams", "Streams being relayed now."),
            ("usage_writer_backlog", "Usage records not yet in the store."),
            ("usage_parked_records", "Usage records the store refused, retried alone."),
        ):
            yield GaugeMetricFamily(f"gateway_{name}", text, value=gauges.get(name, 0))
        yield GaugeMetricFamily(
            "gateway_journal_writable",
            "1 while every worker can write its settlement journal; 0 when one cannot (a full "
            "or read-only disk: its usage records would not survive a crash).",
            value=writable,
        )
        state = GaugeMetricFamily(
            "gateway_channel_state",
            "1 for each channel's state: healthy, cooling or disabled (the worst any worker sees).",
            labels=["channel", "state"],
        )
        for channel, now in sorted(worst.items()):
            for i, name in enumerate(STATES):
                state.add_metric([channel, name], 1 if i == now else 0)
        yield state
        failed = CounterMetricFamily(
            "gateway_channel_failures",
            "Failed upstream attempts that count toward a channel's cooldown, by channel.",
            labels=["channel"],
        )
        for channel in sorted(set(worst) | set(failures)):
            failed.add_metric([channel], failures.get(channel, 0))
        yield failed


def _cache_use(snaps: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(pins, prompt tokens, cache reads) by (model, channel) over the snapshots: pins of live
    workers only (a gone worker's snapshot has its gauges emptied: ``_snapshots``)."""
    out: dict[tuple[str, str], tuple[int, int, int]] = {}
    for snap in snaps:
        live = bool(snap.get("gauges"))
        for model, channel, n in snap.get("pins", ()) if live else ():
            pins, prompt, read = out.get((model, channel), (0, 0, 0))
            out[(model, channel)] = (pins + n, prompt, read)
        for row in snap.get("rows", ()):
            model, channel, values = row[0], row[3], row[5:]
            if not channel or not values[TOKENS_IN_SUM]:
                continue
            pins, prompt, read = out.get((model, channel), (0, 0, 0))
            out[(model, channel)] = (pins, prompt + values[TOKENS_IN_SUM],
                                     read + values[TOKENS_READ_SUM])  # fmt: skip
    return out


def _session_gauges(snaps: list[dict[str, Any]]) -> Iterator[Metric]:
    use = _cache_use(snaps)
    pins = GaugeMetricFamily(
        "gateway_session_pins",
        "Sessions pinned to each channel, by model (session affinity; every live worker's).",
        labels=["model", "channel"],
    )
    ratio = GaugeMetricFamily(
        "gateway_prompt_cache_hit_ratio",
        "Prompt tokens read from the provider's prompt cache over all prompt tokens, by model "
        "and channel, since the start.",
        labels=["model", "channel"],
    )
    for (model, channel), (n, prompt, read) in sorted(use.items()):
        pins.add_metric([model, channel], n)
        if prompt:
            ratio.add_metric([model, channel], read / prompt)
    yield pins
    yield ratio


def _add(
    into: dict[tuple[str, ...], list[Any]],
    labels: tuple[str, ...],
    row: list[Any],
    at: int,
    end: int,
) -> None:
    """The histogram at ``row[at:end]`` (buckets) and ``row[end]`` (sum) added into its series
    by ``labels``, unless it counted nothing."""
    buckets = row[at:end]
    if not any(buckets):
        return
    into_row = into.get(labels)
    if into_row is None:
        into_row = into[labels] = [0] * (end - at + 1)
    for i, n in enumerate(buckets):
        into_row[i] += n
    into_row[-1] += row[end]


def _histogram(
    name: str,
    text: str,
    labels: list[str],
    bounds: tuple[float, ...],
    series: dict[tuple[str, ...], list[Any]],
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, text, labels=labels)
    for values, row in sorted(series.items()):
        cumulative, buckets = 0.0, []
        for bound, count in zip((*bounds, float("inf")), row[:-1], strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        family.add_metric(list(values), buckets, sum_value=row[-1])
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
