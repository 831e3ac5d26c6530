"""The observers of every request: metrics, the access log and tracing, built once from the
configuration and handed to whoever records a request (the relay, and the app for the
requests it serves itself)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import ConfigError, Settings
from gateway.observe.access_log import AccessLog
from gateway.observe.metrics import Metrics
from gateway.observe.tracing import Tracing


@dataclass(slots=True)
class Observers:
    metrics: Metrics  # always kept (the open-streams gauge, channel states)
    observed: Metrics | None  # what records are counted in: None when /metrics is off
    access: AccessLog | None  # None when the access log is off
    tracing: Tracing | None  # None when tracing is not configured

    @classmethod
    def configured(cls, settings: Settings) -> Observers:
        metrics = Metrics(m.name for m in settings.models)
        logs = settings.logging
        try:
            tracing = Tracing.configured(settings.tracing)
        except ImportError:
            raise ConfigError(
                "tracing: OpenTelemetry is not installed (pip install 'model-gateway[otel]')"
            ) from None
        return cls(
            metrics,
            metrics if settings.metrics.enabled else None,
            AccessLog(logs.format) if logs.access else None,
            tracing,
        )
