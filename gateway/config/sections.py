"""The process's own sections: limits, upstream pool, server, metrics, logging, tracing, and
the console's sign-up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.config.values import (
    ConfigError,
    integer,
    mapping,
    no_unknown,
    number,
    string,
)


@dataclass(frozen=True, slots=True)
class Limits:
    max_request_bytes: int = 20 * 1024 * 1024
    max_upload_bytes: int = 100 * 1024 * 1024
    # the largest whole (not streamed) upstream reply read, decompressed: past it the client
    # gets 502. 64 MiB holds any whole reply a model API gives (ten large images in base64,
    # a batch of embeddings in base64, as the SDKs ask for them) with room to spare, and keeps
    # one misbehaving upstream from taking the process's memory (a 300 MB reply: 1 GB)
    max_response_bytes: int = 64 * 1024 * 1024
    # the least a request holds against its balance while it runs (balance units; its
    # estimate when that is more)
    hold_floor: float = 0.0
    # seconds the gateway serves from its cache after the store last answered; past that,
    # model requests get 503 until it answers again (0: no limit)
    store_grace: float = 300.0


@dataclass(frozen=True, slots=True)
class UpstreamSettings:
    """Pool and timeouts of the one client session (optional ``upstream:`` section)."""

    connect_timeout: float = 10.0
    # the longest silence allowed between two upstream bytes (a channel's ``timeouts.idle``
    # in its place): a stream silent longer has stalled, ends with a timeout inside it and
    # counts toward its channel's cooldown, so no live model may ever reach it. A reasoning
    # model may think for minutes before its first token (OpenAI's Responses stream says
    # nothing between ``response.in_progress`` and its output while o3-pro thinks); 600 s is
    # what the providers' own SDKs wait between two bytes (openai-python and anthropic-sdk:
    # 10 minutes), so a model silent longer fails its own provider's clients too
    read_timeout: float = 600.0
    pool_size: int = 0  # upstream connections at once; 0: no limit (each stream holds one)
    pool_size_per_host: int = 0  # 0: no per-host cap beyond pool_size
    retries: int = 2  # further channels tried after the first fails (before any byte is sent)
    cooldown_seconds: float = 30.0
    # the longest wait for a reply's status and, for a stream, its first output, before the
    # next channel is tried; None: only read_timeout applies
    first_byte_timeout: float | None = None
    # a stream quiet this long gets its protocol's keep-alive (SSE comment, messages ping)
    stream_keepalive_seconds: float = 15.0
    # a stream whose upstream has not sent its status line this long after the request began
    # is committed: its response starts (headers and a keep-alive) so that a load balancer's
    # idle timeout (30-60 s) does not cut it, and no other channel can be tried from then on
    # (a later failure of the upstream goes inside the stream). 10 s leaves failures that
    # come quickly (refused connections, 5xx) to fail over first. 0: never
    stream_commit_seconds: float = 10.0


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """The HTTP server's own settings (optional ``server:`` section).

    ``keep_alive_seconds``: an idle client connection is closed after this long (hypercorn and
    uvicorn; granian keeps its own). Long suits clients that pool connections and load
    balancers (longer than their idle timeout: no request sent on a connection being closed);
    an idle connection costs its socket and a few KiB. A connection the client closed is let
    go at once (under hypercorn thanks to ``gateway.server.hypercorn_mend``)."""

    keep_alive_seconds: float = 75.0
    # a request body must arrive within this many seconds, plus one for every 16 KiB it has
    # sent by then (a slow-drip or lying-Content-Length client gets 408); 0: no limit
    body_timeout_seconds: float = 10.0
    # connections one process holds at once; past it a new one gets a short 503 and is
    # closed. 0: about half the open-file limit (each stream also holds an upstream socket)
    max_connections: int = 0
    # on SIGTERM, requests in flight (long streams) get this many seconds to end before they
    # are cut (hypercorn, uvicorn); a supervisor's own timeout (Kubernetes'
    # terminationGracePeriodSeconds, compose's stop_grace_period, systemd's TimeoutStopSec)
    # must be longer
    graceful_seconds: float = 30.0
    # a request's headers must arrive within this many seconds (a new connection's first from
    # its accept, a later one's from its first byte), else 408 and the connection is closed
    # (hypercorn: ``gateway.server.header_timeout``; uvicorn: ``uvicorn_guard``). 0: no limit
    header_timeout_seconds: float = 5.0
    # GET /healthz and /readyz also on this port, a listener of their own that floods of the
    # client port and its connection cap cannot starve (``gateway.server.probes``); for
    # Kubernetes' probes, reachable by the kubelet only. 0: none
    probe_port: int = 0


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """``GET /metrics`` (optional ``metrics:`` section): served unless ``enabled: false``;
    with a ``token``, only to ``Authorization: Bearer <token>``."""

    enabled: bool = True
    token: str = field(default="", repr=False)


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("json", "text")


@dataclass(frozen=True, slots=True)
class LoggingSettings:
    """Optional ``logging:`` section: the level of the gateway's log, and the one line per
    request (``access``) in JSON or text (``format``)."""

    level: str = "info"
    format: str = "json"
    access: bool = True


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """Optional ``tracing:``: OpenTelemetry spans exported by OTLP over HTTP to
    ``otlp_endpoint`` (e.g. http://collector:4318/v1/traces); empty: no tracing."""

    otlp_endpoint: str = ""
    service_name: str = "model-gateway"


REGISTRATION = ("open", "closed")


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    """``console:``: whether people may sign themselves up (``POST /console/users``), and the
    groups a user made that way may make keys in."""

    registration: str = "closed"  # open | closed
    default_groups: tuple[str, ...] = ("default",)


def parse_console(v: Any, groups: tuple[str, ...]) -> ConsoleSettings:
    d = mapping(v, "console")
    no_unknown(d, set(ConsoleSettings.__dataclass_fields__), "console")
    registration = d.get("registration", "closed")
    if registration not in REGISTRATION:
        raise ConfigError("console.registration: must be open or closed")
    default = d.get("default_groups", ["default"])
    if not isinstance(default, list) or not all(isinstance(g, str) for g in default):
        raise ConfigError("console.default_groups: must be a list of group names")
    for i, g in enumerate(default):
        if g not in groups:
            raise ConfigError(f"console.default_groups[{i}]: unknown group {g!r}")
    return ConsoleSettings(registration, tuple(dict.fromkeys(default)))


def parse_limits(v: Any) -> Limits:
    d = mapping(v, "limits")
    no_unknown(d, set(Limits.__dataclass_fields__), "limits")
    out = Limits()
    responses = d.get("max_response_bytes", out.max_response_bytes)
    return Limits(
        max_request_bytes=integer(
            d.get("max_request_bytes", out.max_request_bytes), "limits.max_request_bytes", minimum=1
        ),
        max_upload_bytes=integer(
            d.get("max_upload_bytes", out.max_upload_bytes), "limits.max_upload_bytes", minimum=1
        ),
        max_response_bytes=integer(responses, "limits.max_response_bytes", minimum=1),
        hold_floor=number(d.get("hold_floor", out.hold_floor), "limits.hold_floor", minimum=0.0),
        store_grace=number(
            d.get("store_grace", out.store_grace), "limits.store_grace", minimum=0.0
        ),
    )


def parse_server(v: Any) -> ServerSettings:
    d = mapping(v, "server")
    no_unknown(d, set(ServerSettings.__dataclass_fields__), "server")
    base = ServerSettings()
    keep_alive = d.get("keep_alive_seconds", base.keep_alive_seconds)
    body = d.get("body_timeout_seconds", base.body_timeout_seconds)
    connections = d.get("max_connections", base.max_connections)
    graceful = d.get("graceful_seconds", base.graceful_seconds)
    header = d.get("header_timeout_seconds", base.header_timeout_seconds)
    probe_port = integer(d.get("probe_port", base.probe_port), "server.probe_port", minimum=0)
    if probe_port > 65535:
        raise ConfigError("server.probe_port: must be a port number (1-65535), or 0 for none")
    return ServerSettings(
        keep_alive_seconds=number(keep_alive, "server.keep_alive_seconds", minimum=1.0),
        body_timeout_seconds=number(body, "server.body_timeout_seconds", minimum=0.0),
        max_connections=integer(connections, "server.max_connections", minimum=0),
        graceful_seconds=number(graceful, "server.graceful_seconds", minimum=0.0),
        header_timeout_seconds=number(header, "server.header_timeout_seconds", minimum=0.0),
        probe_port=probe_port,
    )


def parse_metrics(v: Any) -> MetricsSettings:
    d = mapping(v, "metrics")
    no_unknown(d, set(MetricsSettings.__dataclass_fields__), "metrics")
    enabled = d.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError("metrics.enabled: must be true or false")
    token = string(d.get("token", ""), "metrics.token", allow_empty=True)
    return MetricsSettings(enabled=enabled, token=token)


def parse_logging(v: Any) -> LoggingSettings:
    d = mapping(v, "logging")
    no_unknown(d, set(LoggingSettings.__dataclass_fields__), "logging")
    base = LoggingSettings()
    level = d.get("level", base.level)
    if level not in LOG_LEVELS:
        raise ConfigError(f"logging.level: must be one of {', '.join(LOG_LEVELS)}")
    fmt = d.get("format", base.format)
    if fmt not in LOG_FORMATS:
        raise ConfigError(f"logging.format: must be one of {', '.join(LOG_FORMATS)}")
    access = d.get("access", base.access)
    if not isinstance(access, bool):
        raise ConfigError("logging.access: must be true or false")
    return LoggingSettings(level=level, format=fmt, access=access)


def parse_tracing(v: Any) -> TracingSettings:
    d = mapping(v, "tracing")
    no_unknown(d, set(TracingSettings.__dataclass_fields__), "tracing")
    base = TracingSettings()
    endpoint = string(d.get("otlp_endpoint", ""), "tracing.otlp_endpoint", allow_empty=True)
    if endpoint and not endpoint.startswith(("http://", "https://")):
        raise ConfigError("tracing.otlp_endpoint: must be an http(s) URL")
    name = string(d.get("service_name", base.service_name), "tracing.service_name")
    return TracingSettings(otlp_endpoint=endpoint, service_name=name)


def parse_upstream(v: Any) -> UpstreamSettings:
    d = mapping(v, "upstream")
    base = UpstreamSettings()
    no_unknown(d, set(UpstreamSettings.__dataclass_fields__), "upstream")
    return UpstreamSettings(
        connect_timeout=number(
            d.get("connect_timeout", base.connect_timeout), "upstream.connect_timeout"
        ),
        read_timeout=number(d.get("read_timeout", base.read_timeout), "upstream.read_timeout"),
        pool_size=integer(d.get("pool_size", base.pool_size), "upstream.pool_size"),
        pool_size_per_host=integer(
            d.get("pool_size_per_host", base.pool_size_per_host), "upstream.pool_size_per_host"
        ),
        retries=integer(d.get("retries", base.retries), "upstream.retries"),
        cooldown_seconds=number(
            d.get("cooldown_seconds", base.cooldown_seconds), "upstream.cooldown_seconds"
        ),
        first_byte_timeout=None
        if d.get("first_byte_timeout") is None
        else number(d["first_byte_timeout"], "upstream.first_byte_timeout", minimum=0.001),
        stream_keepalive_seconds=number(
            d.get("stream_keepalive_seconds", base.stream_keepalive_seconds),
            "upstream.stream_keepalive_seconds",
            minimum=0.01,
        ),
        stream_commit_seconds=number(
            d.get("stream_commit_seconds", base.stream_commit_seconds),
            "upstream.stream_commit_seconds",
            minimum=0.0,
        ),
    )
