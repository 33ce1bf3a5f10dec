"""pipeline.producer._columnar.partitioning: vectorized murmur2 partitioning and grouping.

Checked against the Kafka vectors (fixtures/murmur2-vectors.json, from the Java
client's UtilsTest) and, by hypothesis, against the scalar ``partitioner.murmur2``
and ``DefaultPartitioner`` for arbitrary keys, on both kernels.
"""

from __future__ import annotations

import json
import random
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.producer._columnar.partitioning import (
    group_by_partition,
    key_partitions,
    murmur2_column,
)
from pipeline.producer._stages.partitioner import DefaultPartitioner, murmur2
from pipeline.protocol.columnar import build_columns
from tests.protocol.columnar_support import KERNELS, use_kernel

FIXTURE = Path(__file__).parent / "fixtures" / "murmur2-vectors.json"
VECTORS = [(v["key_utf8"].encode(), v["murmur2"])
           for v in json.loads(FIXTURE.read_text(encoding="utf-8"))["vectors"]]
CHECK = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(params=KERNELS)
def kernel(request: pytest.FixtureRequest) -> Iterator[str]:
    with use_kernel(request.param):
        yield request.param


def test_kafka_vectors(kernel: str) -> None:
    cols = build_columns([b""] * len(VECTORS), [k for k, _ in VECTORS], default_timestamp=0)
    assert cols.keys is not None
    assert list(murmur2_column(cols.keys)) == [h for _, h in VECTORS]


def test_murmur2_column_matches_the_scalar_hash(kernel: str) -> None:
    @CHECK
    @given(st.lists(st.none() | st.binary(max_size=70), min_size=1, max_size=30),
           st.integers(0, 5))
    def check(keys: list[bytes | None], offset: int) -> None:
        pa = pytest.importorskip("pyarrow")
        arrow = pa.array([b"pad"] * offset + keys, pa.binary()).slice(offset)
        for source in (keys, arrow):
            cols = build_columns([b""] * len(keys), source, default_timestamp=0)
            want = [0 if k is None else murmur2(k) for k in keys]
            if cols.keys is None:  # all keys null
                assert want == [0] * len(keys)
                continue
            assert list(murmur2_column(cols.keys)) == want

    check()


def test_key_partitions_match_the_default_partitioner(kernel: str) -> None:
    @CHECK
    @given(st.lists(st.tuples(st.none() | st.binary(max_size=40),
                              st.none() | st.integers(0, 50)), min_size=1, max_size=40),
           st.integers(1, 64))
    def check(rows: list[tuple[bytes | None, int | None]], num_partitions: int) -> None:
        keys = [k for k, _ in rows]
        pinned = [p for _, p in rows]
        cols = build_columns([b"v"] * len(rows), keys, partitions=pinned, default_timestamp=0)
        scalar = DefaultPartitioner(random.Random(0), key_hash_cache_size=0)
        want = [p if p is not None else
                (scalar.partition("t", k, b"v", num_partitions) if k is not None else -1)
                for k, p in rows]
        assert list(key_partitions(cols, num_partitions)) == want

    check()


def test_key_partitions_without_keys_or_pins(kernel: str) -> None:
    cols = build_columns([b"a", b"b"], default_timestamp=0)
    assert list(key_partitions(cols, 3)) == [-1, -1]
    with pytest.raises(ValueError, match="num_partitions must be an int in 1"):
        key_partitions(cols, 0)


def test_group_by_partition_is_a_stable_grouping(kernel: str) -> None:
    @CHECK
    @given(st.lists(st.integers(0, 12), max_size=200), st.integers(1, 10))
    def check(parts: list[int], num_partitions: int) -> None:
        groups = group_by_partition(array("i", parts), num_partitions)
        want = {p: [i for i, q in enumerate(parts) if q == p]
                for p in sorted(set(parts)) if p < num_partitions}
        assert [(p, list(rows)) for p, rows in groups.by_partition] == list(want.items())
        assert list(groups.out_of_range) == [i for i, q in enumerate(parts)
                                             if q >= num_partitions]

    check()


def test_group_by_partition_refuses_unassigned_rows(kernel: str) -> None:
    with pytest.raises(ValueError, match="partitions: row 2 has no partition"):
        group_by_partition(array("i", [0, 1, -1, 0]), 2)
    with pytest.raises(ValueError, match="num_partitions must be"):
        group_by_partition(array("i", [0]), 0)
    # other integer buffers are converted
    groups = group_by_partition(array("q", [1, 0, 1]), 2)
    assert [(p, list(r)) for p, r in groups.by_partition] == [(0, [1]), (1, [0, 2])]


def test_partitions_then_groups_then_batches(kernel: str) -> None:
    """The producer's columnar flow on one unit: assign, group, encode per partition."""
    from pipeline.protocol.columnar import encode_batch
    from pipeline.protocol.records import decode_record_batches

    keys = [b"k%d" % (i % 7) for i in range(100)]
    cols = build_columns([b"v%d" % i for i in range(100)], keys, default_timestamp=5)
    parts = key_partitions(cols, 4)
    seen = []
    for p, rows in group_by_partition(parts, 4).by_partition:
        (batch,) = decode_record_batches(encode_batch(cols, rows))
        for r in batch.records:
            assert r.key is not None
            assert (murmur2(r.key) & 0x7FFFFFFF) % 4 == p
            seen.append(int(r.value[1:]))  # type: ignore[index]
        assert seen[-len(rows):] == sorted(seen[-len(rows):])  # row order kept
    assert sorted(seen) == list(range(100))
