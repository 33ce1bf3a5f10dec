"""The exactly-once export's content fingerprint: the same rows give the same digest
however they are cut into Arrow batches; any change of a row, of their order, of null
against empty, gives another. No Spark, no broker."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")

from pipeline.spark.fingerprint import Fingerprint  # noqa: E402

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _rows(n: int = 50) -> dict[str, Any]:
    return {
        "value": pa.array([None if i % 11 == 0 else f"v{i}".encode() for i in range(n)],
                          pa.binary()),
        "key": pa.array([None if i % 7 == 0 else f"k{i % 5}" for i in range(n)]),
        "headers": pa.array([None if i % 9 == 0 else
                             [{"key": "h", "value": None if i % 4 == 0 else str(i).encode()}]
                             * (i % 3) for i in range(n)], HEADERS),
        "partition": pa.array([None if i % 6 == 0 else i % 3 for i in range(n)], pa.int32()),
        "topic": pa.array([f"t{i % 2}" for i in range(n)]),
    }


def _digest(columns: dict[str, Any], cuts: list[int]) -> str:
    """The digest of the columns fed as slices [0, c1), [c1, c2), ... [ck, n)."""
    fp = Fingerprint()
    n = len(columns["value"])
    bounds = [0, *cuts, n]
    for lo, hi in itertools.pairwise(bounds):
        fp.update(hi - lo, columns["value"].slice(lo, hi - lo),
                  keys=columns["key"].slice(lo, hi - lo),
                  headers=columns["headers"].slice(lo, hi - lo),
                  topics=columns["topic"].slice(lo, hi - lo),
                  partitions=columns["partition"].slice(lo, hi - lo))
    assert fp.rows == n
    return fp.digest()


def test_the_digest_does_not_depend_on_how_rows_are_batched() -> None:
    columns = _rows()
    whole = _digest(columns, [])
    assert _digest(columns, [1]) == whole
    assert _digest(columns, [13, 14, 40]) == whole
    assert _digest(columns, list(range(1, 50))) == whole
    # the same rows built anew (other buffers) give the same digest
    assert _digest(_rows(), [25]) == whole


@pytest.mark.parametrize("change", ["value", "key", "header", "partition", "topic", "order",
                                    "null_vs_empty", "fewer_rows"])
def test_every_kind_of_change_changes_the_digest(change: str) -> None:
    columns = _rows()
    whole = _digest(columns, [20])
    other = dict(columns)
    if change == "value":
        values = columns["value"].to_pylist()
        values[3] = b"v3!"
        other["value"] = pa.array(values, pa.binary())
    elif change == "key":
        keys = columns["key"].to_pylist()
        keys[1] = "k9"
        other["key"] = pa.array(keys)
    elif change == "header":
        headers = columns["headers"].to_pylist()
        headers[5] = [{"key": "h", "value": b"x"}] * 2
        other["headers"] = pa.array(headers, HEADERS)
    elif change == "partition":
        parts = columns["partition"].to_pylist()
        parts[4] = 7
        other["partition"] = pa.array(parts, pa.int32())
    elif change == "topic":
        topics = columns["topic"].to_pylist()
        topics[8] = "t9"
        other["topic"] = pa.array(topics)
    elif change == "order":
        order = pa.array([1, 0, *range(2, 50)])
        other = {name: col.take(order) for name, col in columns.items()}
    elif change == "null_vs_empty":
        values = columns["value"].to_pylist()
        assert values[0] is None
        values[0] = b""
        other["value"] = pa.array(values, pa.binary())
    elif change == "fewer_rows":
        other = {name: col.slice(0, 49) for name, col in columns.items()}
    assert _digest(other, [20]) != whole


def test_string_and_binary_values_of_the_same_bytes_agree_and_copy_is_independent() -> None:
    a, b = Fingerprint(), Fingerprint()
    a.update(2, pa.array(["x", "yz"]))
    b.update(2, pa.array([b"x", b"yz"], pa.binary()))
    assert a.digest() == b.digest()
    c = a.copy()
    c.update(1, pa.array(["more"]))
    assert c.digest() != a.digest()
    assert a.rows == 2 and c.rows == 3
