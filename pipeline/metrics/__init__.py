"""Exporters of the clients' statistics snapshots (``producer.statistics()``,
``consumer.statistics()``): :mod:`pipeline.metrics.prometheus` writes Prometheus text;
``pipeline.otel`` publishes them as OpenTelemetry metrics."""

from __future__ import annotations

from pipeline.metrics.prometheus import CONTENT_TYPE, prometheus_text

__all__ = ["CONTENT_TYPE", "prometheus_text"]
