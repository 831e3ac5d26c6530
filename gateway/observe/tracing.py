"""Optional OpenTelemetry traces: a span per request and one per upstream attempt, with the
OpenTelemetry GenAI semantic-convention attributes, exported by OTLP (HTTP) when
``tracing: {otlp_endpoint: ...}`` is configured (install the ``otel`` extra). Nothing of the
content: no prompt, reply, key or address, only what a usage record holds.

- The request span (kind SERVER), named ``{operation} {model}``: ``gen_ai.operation.name``
  (``chat``, ``embeddings``, ...), ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``,
  ``gen_ai.usage.output_tokens``, ``http.response.status_code``, ``error.type`` when it
  failed, and the gateway's own ``gateway.request_id``, ``gateway.protocol``,
  ``gateway.channel``, ``gateway.cost`` (balance units).
- Each upstream attempt (kind CLIENT, a child of it): ``gen_ai.provider.name`` (the channel's
  type), ``gen_ai.request.model`` (the upstream's name for it), ``server.address``,
  ``gateway.channel``, and ``error.type`` when it failed.

Without the configuration nothing is imported and the relay pays one ``is None`` per request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from gateway.store import MICRO, UsageRecord

if TYPE_CHECKING:
    from gateway.config import Channel, TracingSettings

PROVIDERS = {"openai": "openai", "anthropic": "anthropic", "gemini": "gcp.gemini"}


class Tracing:
    """A tracer and the spans of requests and attempts."""

    def __init__(self, service_name: str, exporter: Any, batch: bool = True) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("model-gateway")
        self._kinds = SpanKind
        self._error = Status(StatusCode.ERROR)
        self._in = set_span_in_context

    @classmethod
    def configured(cls, settings: TracingSettings) -> Tracing | None:
        if not settings.otlp_endpoint:
            return None
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return cls(settings.service_name, OTLPSpanExporter(endpoint=settings.otlp_endpoint))

    def request(self, endpoint: str) -> Any:
        """The span of a request, begun as it arrives (named once its model is known)."""
        return self.tracer.start_span(endpoint, kind=self._kinds.SERVER)

    def attempt(self, parent: Any, channel: Channel, upstream_model: str) -> Any:
        span = self.tracer.start_span(
            f"{parent.name} {upstream_model}".strip(),
            kind=self._kinds.CLIENT,
            context=self._in(parent),
        )
        span.set_attribute("gen_ai.provider.name", PROVIDERS.get(channel.type, channel.type))
        span.set_attribute("gen_ai.request.model", upstream_model)
        span.set_attribute("gateway.channel", channel.name)
        host = urlsplit(channel.base_url).hostname
        if host:
            span.set_attribute("server.address", host)
        return span

    def failed(self, span: Any, error_type: str) -> None:
        span.set_attribute("error.type", error_type)
        span.set_status(self._error)

    def finish(self, span: Any, rec: UsageRecord) -> None:
        """End a request's span with what its usage record says."""
        span.update_name(f"{rec.endpoint} {rec.model}".strip())
        span.set_attribute("gen_ai.operation.name", rec.endpoint)
        if rec.model:
            span.set_attribute("gen_ai.request.model", rec.model)
        span.set_attribute("gen_ai.usage.input_tokens", rec.prompt_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", rec.completion_tokens)
        span.set_attribute("http.response.status_code", rec.status)
        span.set_attribute("gateway.request_id", rec.request_id)
        span.set_attribute("gateway.protocol", rec.protocol)
        span.set_attribute("gateway.cost", rec.cost / MICRO)
        if rec.channel:
            span.set_attribute("gateway.channel", rec.channel)
        if rec.status >= 400:
            self.failed(span, str(rec.status))
        span.end()

    def shutdown(self) -> None:
        self.provider.shutdown()
