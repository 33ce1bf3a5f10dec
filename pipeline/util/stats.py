"""Statistics building blocks: a bounded window of samples, and self-describing structures.

The clients' ``statistics()`` snapshots (``ProducerStatistics``, ``ConsumerStatistics``
and the ``BrokerStatistics`` they share) are frozen dataclasses built from these parts:

* :class:`Window` keeps the last :data:`WINDOW` samples of one quantity (a request's
  round trip, a batch's size) in a ring, plus the count and sum of every sample ever:
  bounded memory, O(1) per sample. :meth:`Window.summary` gives a :class:`Summary`
  (count and sum since the start; min, max and the nearest-rank percentiles p50, p90,
  p99 of the window), the shape of a Prometheus summary.
* Every field of a statistics dataclass is declared with one of :func:`counter`,
  :func:`gauge`, :func:`summary`, :func:`labelled`, :func:`children` or :func:`info`,
  which record in the field's metadata what it is (a monotonic count, a current value,
  a distribution, a count per label value, nested statistics keyed by a label, or plain
  information), its unit and a one-line help text. Exporters read that, never a list of
  names kept elsewhere: :func:`metric_specs` walks a statistics *class* (the OpenTelemetry
  instruments are made from it), :func:`samples` walks a snapshot (the Prometheus text is
  written from it), and the documentation test checks docs/observability.md against both.

Nothing here reads a clock or imports another ``pipeline`` package.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "WINDOW",
    "MetricSpec",
    "Statistics",
    "Summary",
    "Window",
    "children",
    "counter",
    "gauge",
    "info",
    "labelled",
    "metric_specs",
    "samples",
    "summary",
]

#: Samples a :class:`Window` keeps: the percentiles describe the most recent ones.
WINDOW = 1024

#: The metadata key of a statistics field's description.
_KEY = "pipeline.stat"

#: Kinds that are exported as metrics (``info`` fields and ``children`` are not values).
METRIC_KINDS = ("counter", "gauge", "summary")


class Statistics:
    """Base of the statistics dataclasses: the plain and JSON forms.

    ``to_dict()`` is plain data (dicts, lists, numbers, strings, None): nested
    statistics become dicts, partition and broker ids stay ints (``to_json`` writes
    them as strings, as JSON must)."""

    __slots__ = ()

    #: The root's metric prefix ("producer", "consumer"); a child's is its field's.
    METRIC_PREFIX: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        plain = _plain(self)
        assert isinstance(plain, dict)
        return plain

    def to_json(self, **dumps: Any) -> str:
        """``json.dumps(self.to_dict(), **dumps)``."""
        return json.dumps(self.to_dict(), **dumps)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | frozenset | set):
        return [_plain(v) for v in value]
    return value


# --------------------------------------------------------------------------- windows


@dataclass(frozen=True, slots=True)
class Summary(Statistics):
    """A distribution: ``count`` and ``sum`` of every sample since the start; the rest
    over the window of the last :data:`WINDOW` samples (None while it is empty).
    Percentiles are nearest-rank: ``p50`` is a sample of the window, the smallest one
    that at least half of the window's samples do not exceed."""

    count: int = 0
    sum: float = 0
    window: int = 0  # samples in the window
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None

    #: The quantiles exporters publish, by field.
    QUANTILES: ClassVar[tuple[tuple[str, float], ...]] = (
        ("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


class Window:
    """The last ``size`` samples of one quantity, and the count and sum of all of them.

    ``add`` is O(1) and allocates nothing once the ring is full; ``summary`` sorts a
    copy of the ring (at most ``size`` values), so its cost is the reader's."""

    __slots__ = ("_at", "_ring", "count", "size", "sum")

    def __init__(self, size: int = WINDOW) -> None:
        if size < 1:
            raise ValueError(f"a window holds at least one sample, not {size}")
        self.size = size
        self._ring: list[float] = []
        self._at = 0  # where the next sample goes once the ring is full
        self.count = 0
        self.sum: float = 0

    def add(self, value: float) -> None:
        self.count += 1
        self.sum += value
        ring = self._ring
        if len(ring) < self.size:
            ring.append(value)
        else:
            at = self._at
            ring[at] = value
            self._at = at + 1 if at + 1 < self.size else 0

    def summary(self) -> Summary:
        ring = sorted(self._ring)
        n = len(ring)
        if not n:
            return Summary(self.count, self.sum)

        def rank(q: float) -> float:
            return ring[max(0, math.ceil(q * n) - 1)]

        return Summary(self.count, self.sum, n, ring[0], ring[-1],
                       rank(0.5), rank(0.9), rank(0.99))


# --------------------------------------------------------------------------- fields


def _field(kind: str, help: str, unit: str, default: Any = dataclasses.MISSING,
           factory: Any = dataclasses.MISSING, **extra: Any) -> Any:
    meta = {_KEY: {"kind": kind, "help": help, "unit": unit, **extra}}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def counter(help: str, unit: str = "", *, default: Any = 0) -> Any:
    """A count that only grows while the client runs (requests sent, bytes received)."""
    return _field("counter", help, unit, default)


def gauge(help: str, unit: str = "", *, default: Any = 0) -> Any:
    """A value now (messages queued, requests in flight); None where it is unknown."""
    return _field("gauge", help, unit, default)


def summary(help: str, unit: str = "") -> Any:
    """A :class:`Summary` of a :class:`Window`."""
    return _field("summary", help, unit, factory=Summary)


def labelled(kind: str, label: str, help: str, unit: str = "") -> Any:
    """A ``{label value: number}`` dict: one counter or gauge per value of ``label``
    (errors by error code, requests by API)."""
    assert kind in ("counter", "gauge")
    return _field(kind, help, unit, factory=dict, label=label)


def children(label: str, of: type[Statistics], help: str) -> Any:
    """A ``{key: statistics}`` dict of nested statistics (brokers by node id, topics by
    name, partitions by number); exporters label each child's metrics with ``label``."""
    return _field("children", help, "", factory=dict, label=label, of=of)


def info(help: str, *, default: Any = None) -> Any:
    """Information, not a metric (a state, an id). ``client_id`` labels every metric."""
    return _field("info", help, "", default)


# --------------------------------------------------------------------------- walking


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric a statistics class holds: ``name`` joins the prefixes on its path
    (``producer_broker_requests``); ``labels`` name the keys of the dicts on the way
    (``("broker",)``, ``("topic", "partition")``, and ``"code"`` for a labelled field)."""

    name: str
    kind: str  # counter | gauge | summary
    unit: str
    help: str
    labels: tuple[str, ...]


def _stat_fields(cls: type[Statistics]) -> Iterator[tuple[dataclasses.Field[Any], dict[str, Any]]]:
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        meta = f.metadata.get(_KEY)
        if meta is not None:
            yield f, meta


def metric_specs(cls: type[Statistics], prefix: str | None = None,
                 labels: tuple[str, ...] = ()) -> Iterator[MetricSpec]:
    """Every metric of statistics class ``cls`` (its own fields, then its children's)."""
    base = cls.METRIC_PREFIX if prefix is None else prefix
    for f, meta in _stat_fields(cls):
        kind = meta["kind"]
        if kind == "children":
            yield from metric_specs(meta["of"], f"{base}_{meta['of'].METRIC_PREFIX}",
                                    (*labels, meta["label"]))
        elif kind in METRIC_KINDS:
            extra = (meta["label"],) if "label" in meta else ()
            yield MetricSpec(f"{base}_{f.name}", kind, meta["unit"], meta["help"],
                             (*labels, *extra))


def samples(stats: Statistics, prefix: str | None = None, names: tuple[str, ...] = (),
            values: tuple[str, ...] = ()) -> Iterator[tuple[MetricSpec, tuple[str, ...], Any]]:
    """``(spec, label values, value)`` for every metric value of a snapshot, in the
    order of :func:`metric_specs`; a summary's value is its :class:`Summary`. None
    values (gauges not known yet) are left out."""
    cls = type(stats)
    base = cls.METRIC_PREFIX if prefix is None else prefix
    for f, meta in _stat_fields(cls):
        kind = meta["kind"]
        value = getattr(stats, f.name)
        if kind == "children":
            of = meta["of"]
            for key, child in value.items():
                yield from samples(child, f"{base}_{of.METRIC_PREFIX}", (*names, meta["label"]),
                                   (*values, str(key)))
        elif kind in METRIC_KINDS and "label" in meta:
            spec = MetricSpec(f"{base}_{f.name}", kind, meta["unit"], meta["help"],
                              (*names, meta["label"]))
            for key, number in value.items():
                yield spec, (*values, str(key)), number
        elif kind in METRIC_KINDS and value is not None:
            yield MetricSpec(f"{base}_{f.name}", kind, meta["unit"], meta["help"], names), \
                values, value
