"""The statistics building blocks: windows and their percentiles, and the self-describing
fields the exporters walk."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.util.stats import (
    MetricSpec,
    Statistics,
    Summary,
    Window,
    children,
    counter,
    gauge,
    info,
    labelled,
    metric_specs,
    samples,
    summary,
)


def test_nearest_rank_percentiles() -> None:
    window = Window()
    for value in range(1, 101):  # 1..100
        window.add(value)
    assert window.summary() == Summary(100, 5050, 100, 1, 100, 50, 90, 99)
    small = Window()
    small.add(7.5)
    assert small.summary() == Summary(1, 7.5, 1, 7.5, 7.5, 7.5, 7.5, 7.5)


def test_the_window_keeps_the_last_samples_and_counts_all() -> None:
    window = Window(4)
    for value in (100, 1, 2, 3, 4):  # 100 has left the window
        window.add(value)
    assert window.summary() == Summary(5, 110, 4, 1, 4, 2, 4, 4)
    for value in (5, 6, 7, 8, 9):
        window.add(value)
    assert window.summary() == Summary(10, 145, 4, 6, 9, 7, 9, 9)
    assert len(window._ring) == 4
    with pytest.raises(ValueError, match="at least one sample"):
        Window(0)


@given(st.lists(st.integers(-1000, 1000), min_size=1, max_size=60), st.integers(1, 20))
def test_percentiles_are_samples_of_the_window(values: list[int], size: int) -> None:
    window = Window(size)
    for v in values:
        window.add(v)
    recent = sorted(values[-size:])
    got = window.summary()
    assert (got.count, got.sum, got.window) == (len(values), sum(values), len(recent))
    for name, q in Summary.QUANTILES:
        value = getattr(got, name)
        # nearest rank: the smallest sample with at least q of the window at or below it
        assert value in recent
        assert sum(v <= value for v in recent) >= q * len(recent)
        assert sum(v < value for v in recent) < q * len(recent)


@dataclass(frozen=True, slots=True)
class Leaf(Statistics):
    METRIC_PREFIX: ClassVar[str] = "leaf"
    name: str = info("a name", default="")
    hits: int = counter("hits", "requests")
    sizes: Summary = summary("sizes", "bytes")


@dataclass(frozen=True, slots=True)
class Root(Statistics):
    METRIC_PREFIX: ClassVar[str] = "root"
    level: float | None = gauge("a level", "bytes", default=None)
    errors: dict[str, int] = labelled("counter", "code", "errors by code", "errors")
    leaves: dict[int, Leaf] = children("leaf", Leaf, "the leaves")


def test_specs_and_samples_walk_the_fields() -> None:
    specs = list(metric_specs(Root))
    assert specs == [
        MetricSpec("root_level", "gauge", "bytes", "a level", ()),
        MetricSpec("root_errors", "counter", "errors", "errors by code", ("code",)),
        MetricSpec("root_leaf_hits", "counter", "requests", "hits", ("leaf",)),
        MetricSpec("root_leaf_sizes", "summary", "bytes", "sizes", ("leaf",)),
    ]
    root = Root(level=None, errors={"X": 2},
                leaves={1: Leaf("a", 3), 2: Leaf("b", 4, Summary(1, 5))})
    got = [(spec.name, labels, value) for spec, labels, value in samples(root)]
    assert got == [  # the gauge is unknown (None): left out
        ("root_errors", ("X",), 2),
        ("root_leaf_hits", ("1",), 3), ("root_leaf_sizes", ("1",), Summary()),
        ("root_leaf_hits", ("2",), 4), ("root_leaf_sizes", ("2",), Summary(1, 5)),
    ]
    assert {spec for spec, _, _ in samples(root)} <= set(specs)


def test_plain_and_json_forms() -> None:
    root = Root(level=1.5, leaves={7: Leaf("a", 1)})
    plain = root.to_dict()
    assert plain["leaves"][7]["sizes"]["p50"] is None
    assert plain == {"level": 1.5, "errors": {}, "leaves": {7: {
        "name": "a", "hits": 1, "sizes": {"count": 0, "sum": 0, "window": 0, "min": None,
                                          "max": None, "p50": None, "p90": None,
                                          "p99": None}}}}
    assert json.loads(root.to_json()) == json.loads(json.dumps(plain))
    assert '"7"' in root.to_json()
