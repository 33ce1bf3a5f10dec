"""OpenTelemetry for the clients (the ``otel`` extra: opentelemetry-api, and the SDK to
export): :class:`TracingInterceptor` carries trace context through Kafka in record
headers; :class:`StatisticsMetrics` publishes the clients' statistics as metrics.
docs/observability.md shows both."""

from __future__ import annotations

try:
    import opentelemetry.metrics
    import opentelemetry.trace  # noqa: F401
except ImportError:
    raise ImportError("pipeline.otel needs OpenTelemetry: "
                      "pip install 'trio-kafka-pipeline[otel]'") from None

from pipeline.otel._metrics import StatisticsMetrics
from pipeline.otel._tracing import TracingInterceptor, context_of

__all__ = ["StatisticsMetrics", "TracingInterceptor", "context_of"]
