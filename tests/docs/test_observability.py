"""docs/observability.md documents every statistics field, as the code describes it.

Each statistics class has a table under the paragraph naming it: its rows must be the
class's fields, in order, with the kind and unit their declarations give (so a field
added, renamed or re-described without the docs fails here)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from pipeline.cluster.stats import BrokerStatistics
from pipeline.consumer._statistics import (
    ConsumerPartitionStatistics,
    ConsumerStatistics,
    ConsumerTopicStatistics,
)
from pipeline.producer._statistics import (
    PartitionStatistics,
    ProducerStatistics,
    TopicStatistics,
)
from pipeline.util.stats import Statistics
from tests.docs.markdown import ROOT

DOC = (ROOT / "docs" / "observability.md").read_text(encoding="utf-8")
CLASSES = [ProducerStatistics, TopicStatistics, PartitionStatistics, ConsumerStatistics,
           ConsumerTopicStatistics, ConsumerPartitionStatistics, BrokerStatistics]


def table_after(name: str) -> list[list[str]]:
    """The rows of the first table after the paragraph introducing class `name` (it
    starts with the class's name, or with where it sits: ``topics[name]`: `name``)."""
    lines = DOC.splitlines()
    intro = re.compile(rf"^(`[a-z_\[\]. ]+`: )?`{name}`")
    start = next(i for i, line in enumerate(lines) if intro.match(line))
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # header and rule


def expected(cls: type[Statistics]) -> list[list[str]]:
    out = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        meta = f.metadata["pipeline.stat"]
        kind = meta["kind"]
        if kind == "children":
            kind = f"per {meta['label']}: {meta['of'].__name__}"
        elif "label" in meta:
            kind = f"{kind} per {meta['label']}"
        out.append([f"`{f.name}`", kind, meta["unit"], meta["help"]])
    return out


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_field_is_documented(cls: type[Statistics]) -> None:
    assert table_after(cls.__name__) == expected(cls)


def test_the_naming_examples_are_real_metric_names() -> None:
    from pipeline.metrics.prometheus import metric_name
    from pipeline.util.stats import metric_specs

    names = {metric_name(s) for c in (ProducerStatistics, ConsumerStatistics)
             for s in metric_specs(c)}
    quoted = set(re.findall(r"`(pipeline_[a-z_]+)`", DOC))
    assert quoted
    # every full name quoted exists (with or without its suffixes)
    bare = {re.sub(r"_(total|seconds)$", "", n) for n in names} | names
    assert quoted <= bare, sorted(quoted - bare)
