"""The clients' statistics as OpenTelemetry metrics (opentelemetry-api only).

:class:`StatisticsMetrics` is an ``on_statistics`` callback: every
``statistics_interval`` the client hands it a snapshot, which it keeps (the latest per
client); its observable instruments report the kept snapshots whenever the SDK's
metric reader collects. Snapshots are frozen: the reader's thread never touches a
client, and a client without ``statistics_interval`` pays nothing.

One instrument per metric of the statistics classes (``pipeline.util.stats``), made
when the first snapshot of a class arrives, named ``<namespace>.<metric>``
(``pipeline.producer_topic_partition_delivered_bytes``: an exporter to Prometheus
writes the same names as ``pipeline.metrics.prometheus``, less its unit suffixes):

* a counter is an observable counter, a gauge an observable gauge (left out while
  None); units in UCUM (``s``, ``By``, ``{messages}``);
* a summary is an observable counter ``<name>.count`` and ``<name>.sum`` (since the
  start) and an observable gauge ``<name>`` per quantile (attribute ``quantile``:
  ``"0.5"``, ``"0.9"``, ``"0.99"``, over the recent window);
* attributes: ``client_id``, and the keys on the metric's path (``broker``,
  ``topic``, ``partition``; ``api`` or ``code`` for a per-value count).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from pipeline.util.stats import MetricSpec, Statistics, Summary, metric_specs, samples

__all__ = ["StatisticsMetrics"]

_Samples = list[tuple[tuple[str, ...], Any]]  # (label values, value)
_Index = dict[str, _Samples]

_UCUM = {"seconds": "s", "bytes": "By"}


def _unit(unit: str) -> str:
    return _UCUM.get(unit, "{" + unit + "}" if unit else "")


class StatisticsMetrics:
    """Keeps the latest statistics of each client and reports them as metrics.

    Pass it as ``on_statistics`` (with ``statistics_interval``) to one client or
    several; a snapshot is kept per client kind and ``client_id`` (give clients
    distinct ids). Call it yourself with any snapshot otherwise.

    Args:
        meter_provider: where the instruments are made (default: the global one).
        namespace: the first part of every instrument's name.
    """

    def __init__(self, meter_provider: metrics.MeterProvider | None = None, *,
                 namespace: str = "pipeline") -> None:
        self._meter = metrics.get_meter("pipeline.otel", meter_provider=meter_provider)
        self._namespace = namespace
        self._lock = threading.Lock()  # the client's thread stores, the reader's reads
        # (class, client_id) -> the latest snapshot, and its samples by metric name
        # (made by the first reader of that snapshot, in the reader's thread)
        self._latest: dict[tuple[type[Statistics], str], tuple[Statistics, _Index | None]] = {}
        self._classes: set[type[Statistics]] = set()
        #: instruments made: their names
        self.instruments: list[str] = []

    def __call__(self, stats: Statistics) -> None:
        cls = type(stats)
        with self._lock:
            self._latest[(cls, str(getattr(stats, "client_id", "") or ""))] = (stats, None)
            new = cls not in self._classes
            self._classes.add(cls)
        if new:
            for spec in metric_specs(cls):
                self._instrument(cls, spec)

    def _samples(self, cls: type[Statistics], name: str) -> list[tuple[str, _Samples]]:
        """Per client of kind ``cls``: the samples of metric ``name`` in its snapshot."""
        out = []
        with self._lock:
            for key, (stats, index) in self._latest.items():
                if key[0] is not cls:
                    continue
                if index is None:
                    index = {}
                    for spec, values, value in samples(stats):
                        index.setdefault(spec.name, []).append((values, value))
                    self._latest[key] = (stats, index)
                out.append((key[1], index.get(name, [])))
        return out

    def _observe(self, cls: type[Statistics], spec: MetricSpec,
                 pick: Callable[[Any], Iterable[tuple[float, dict[str, str]]]],
                 ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            out = []
            for client, found in self._samples(cls, spec.name):
                for values, value in found:
                    attrs = {"client_id": client, **dict(zip(spec.labels, values, strict=True))}
                    for number, extra in pick(value):
                        out.append(Observation(number, {**attrs, **extra}))
            return out

        return callback

    def _instrument(self, cls: type[Statistics], spec: MetricSpec) -> None:
        name = f"{self._namespace}.{spec.name}" if self._namespace else spec.name
        unit = _unit(spec.unit)
        meter = self._meter
        if spec.kind == "summary":
            def count(s: Summary) -> list[tuple[float, dict[str, str]]]:
                return [(s.count, {})]

            def total(s: Summary) -> list[tuple[float, dict[str, str]]]:
                return [(s.sum, {})]

            def quantiles(s: Summary) -> list[tuple[float, dict[str, str]]]:
                return [(getattr(s, f), {"quantile": str(q)}) for f, q in Summary.QUANTILES
                        if getattr(s, f) is not None]

            meter.create_observable_counter(f"{name}.count", [self._observe(cls, spec, count)],
                                            "{samples}", f"{spec.help}: samples")
            meter.create_observable_counter(f"{name}.sum", [self._observe(cls, spec, total)],
                                            unit, f"{spec.help}: sum of the samples")
            meter.create_observable_gauge(name, [self._observe(cls, spec, quantiles)], unit,
                                          f"{spec.help}: quantiles of the recent samples")
            self.instruments += [f"{name}.count", f"{name}.sum", name]
            return

        def plain(value: float) -> list[tuple[float, dict[str, str]]]:
            return [(value, {})]

        make = meter.create_observable_counter if spec.kind == "counter" else \
            meter.create_observable_gauge
        make(name, [self._observe(cls, spec, plain)], unit, spec.help)
        self.instruments.append(name)
