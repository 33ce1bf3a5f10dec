"""Statistics snapshots as Prometheus text (exposition format 0.0.4).

``prometheus_text(producer.statistics(), consumer.statistics())`` is what a ``/metrics``
endpoint serves (with :data:`CONTENT_TYPE`); serving it is the application's (any HTTP
server, or ``prometheus_client``'s custom collectors). Every metric of a snapshot is
written, read off the fields' own descriptions (``pipeline.util.stats``):

* the name is ``<namespace>_<path>_<field>``: ``pipeline_producer_topic_partition_
  delivered_bytes``; a field in seconds or bytes whose name does not say so gets the
  unit (``pipeline_producer_broker_rtt_seconds``); a counter ends in ``_total``;
* every sample is labelled ``client_id`` and with the keys on its path (``broker``,
  ``topic``, ``partition``) and, for a per-value count, the value (``api``, ``code``);
* a summary (a round trip, a batch's size) is ``name{quantile="0.5"|"0.9"|"0.99"}``
  over the recent window, plus ``name_sum`` and ``name_count`` since the start;
* a gauge not known yet (a position before the first fetch) is left out.

Several snapshots go in one text: samples of the same metric (two producers, told apart
by ``client_id``) share one ``# HELP`` / ``# TYPE`` header.
"""

from __future__ import annotations

import math

from pipeline.util.stats import MetricSpec, Statistics, Summary, samples

__all__ = ["CONTENT_TYPE", "metric_name", "prometheus_text"]

#: The Content-Type of the text this module writes.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: Units a metric name carries (Prometheus' base units); others only in its help.
_NAMED_UNITS = ("seconds", "bytes")


def metric_name(spec: MetricSpec, namespace: str = "pipeline") -> str:
    """The Prometheus name of a metric (``_sum`` / ``_count`` / quantiles aside)."""
    name = f"{namespace}_{spec.name}" if namespace else spec.name
    if spec.unit in _NAMED_UNITS and not name.endswith("_" + spec.unit):
        name = f"{name}_{spec.unit}"
    if spec.kind == "counter":
        name += "_total"
    return name


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float | int | bool) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape_label(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def prometheus_text(*snapshots: Statistics, namespace: str = "pipeline") -> str:
    """The metrics of ``snapshots`` (``producer.statistics()``, ``consumer.statistics()``)
    in Prometheus' text format, ending with a newline ("" for none).

    Raises:
        ValueError: ``namespace`` is not a valid metric name prefix.
    """
    if namespace and not (namespace.replace("_", "a").isalnum() and namespace.isascii()
                          and not namespace[0].isdigit()):
        raise ValueError(f"invalid namespace {namespace!r}: letters, digits and _ only, "
                         "not starting with a digit")
    families: dict[str, tuple[MetricSpec, list[str]]] = {}
    for stats in snapshots:
        client_id = str(getattr(stats, "client_id", "") or "")
        for spec, values, value in samples(stats):
            name = metric_name(spec, namespace)
            lines = families.setdefault(name, (spec, []))[1]
            names = ("client_id", *spec.labels)
            label_values = (client_id, *values)
            if isinstance(value, Summary):
                for field, q in Summary.QUANTILES:
                    at = getattr(value, field)
                    if at is not None:
                        labels = _labels(names, label_values, f'quantile="{q}"')
                        lines.append(f"{name}{labels} {_number(at)}")
                labels = _labels(names, label_values)
                lines.append(f"{name}_sum{labels} {_number(value.sum)}")
                lines.append(f"{name}_count{labels} {_number(value.count)}")
            else:
                lines.append(f"{name}{_labels(names, label_values)} {_number(value)}")
    out: list[str] = []
    for name, (spec, lines) in families.items():
        unit = f" ({spec.unit})" if spec.unit and spec.unit not in _NAMED_UNITS else ""
        out.append(f"# HELP {name} {_escape_help(spec.help + unit)}")
        out.append(f"# TYPE {name} {spec.kind}")
        out.extend(lines)
    return "\n".join(out) + "\n" if out else ""
