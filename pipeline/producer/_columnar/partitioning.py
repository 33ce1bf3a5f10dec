"""Partitioning a columnar unit (``protocol.columnar.Columns``) in bulk. Pure.

The vectorized counterpart of ``partitioner.py`` for bulk sends:

* :func:`murmur2_column` is ``partitioner.murmur2`` of every key (Java's
  ``Utils.murmur2``, signed), one C loop over the key buffer;
* :func:`key_partitions` assigns what needs no state: a pinned row keeps its
  partition, a keyed row gets ``java_positive(murmur2(key)) % num_partitions``
  (Java's default partitioner and librdkafka's ``murmur2``/``murmur2_random``
  for keyed records), and a null-key row is left at -1 for the caller's
  null-key policy (sticky, random, round robin: state the caller owns);
* :func:`group_by_partition` groups rows by partition with a stable counting
  sort: each group lists its rows in their original order, which is the order
  they must keep on the wire.

The C kernel (``pipeline.protocol._kernel``) does the loops when it was built;
otherwise the Python fallbacks here do, with identical results (tests run both).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any, Protocol

from pipeline.producer._stages.partitioner import murmur2
from pipeline.protocol import columnar
from pipeline.protocol.columnar import BinaryColumn, Columns

__all__ = ["RowGroups", "group_by_partition", "key_partitions", "murmur2_column"]

_MAX_PARTITIONS = 1 << 24  # bucket array bound of the counting sort


class _PartitionKernel(Protocol):
    def murmur2_hashes(self, keys: Any, out: Any, /) -> None: ...
    def murmur2_partitions(self, keys: Any, num_partitions: int, out: Any, /) -> None: ...
    def group_rows(self, partitions: Any, num_partitions: int, out: Any, /) -> list[int]: ...


class _PurePython:
    """The fallback loops (same contract as the C functions of the same names)."""

    @staticmethod
    def _keys(spec: Any) -> BinaryColumn:
        off, _wide, data, valid, voff, _n = spec
        return BinaryColumn(off, data, valid, voff)

    @staticmethod
    def _cells(keys: BinaryColumn) -> Any:
        off, data, valid, voff = keys.offsets, keys.data, keys.validity, keys.validity_offset
        size = len(data)
        for i in range(len(keys)):
            if valid is not None and not (valid[(voff + i) >> 3] >> ((voff + i) & 7)) & 1:
                yield i, None
                continue
            a, b = off[i], off[i + 1]
            if a < 0 or b < a or b > size:
                raise ValueError(
                    f"keys: row {i}: offsets are not ascending or run past the data buffer"
                )
            yield i, data[a:b]

    def murmur2_hashes(self, keys: Any, out: Any, /) -> None:
        dst = memoryview(out).cast("B").cast("i")
        for i, key in self._cells(self._keys(keys)):
            dst[i] = 0 if key is None else murmur2(key)

    def murmur2_partitions(self, keys: Any, num_partitions: int, out: Any, /) -> None:
        if not 1 <= num_partitions <= 0x7FFFFFFF:
            raise ValueError(f"num_partitions must be 1..2**31-1, got {num_partitions}")
        dst = memoryview(out).cast("B").cast("i")
        col = self._keys(keys)
        for i, key in self._cells(col):
            if dst[i] == -1 and key is not None:
                dst[i] = (murmur2(key) & 0x7FFFFFFF) % num_partitions

    def group_rows(self, partitions: Any, num_partitions: int, out: Any, /) -> list[int]:
        if not 1 <= num_partitions <= _MAX_PARTITIONS:
            raise ValueError(
                f"num_partitions must be 1..{_MAX_PARTITIONS}, got {num_partitions}"
            )
        parts = memoryview(partitions).cast("B").cast("i")
        buckets = [array("q") for _ in range(num_partitions + 1)]
        for i, p in enumerate(parts):
            if p < 0:
                raise ValueError(
                    f"partitions: row {i} has no partition ({p}): assign null-key rows first"
                )
            buckets[p if p < num_partitions else num_partitions].append(i)
        order = memoryview(out).cast("B").cast("q")
        starts = [0]
        for bucket in buckets:
            start = starts[-1]
            order[start:start + len(bucket)] = memoryview(bucket)
            starts.append(start + len(bucket))
        return starts


_PURE = _PurePython()


def _kernel() -> _PartitionKernel:
    """The C loops when the codec uses the C kernel, else the fallbacks
    (tests switch both with ``_columns._impl``)."""
    impl = columnar.kernel()
    return impl if hasattr(impl, "murmur2_hashes") else _PURE  # type: ignore[return-value]


def murmur2_column(keys: BinaryColumn) -> memoryview:
    """``partitioner.murmur2(key)`` (signed int32) of every row; 0 for a null key."""
    out = bytearray(4 * len(keys))
    _kernel().murmur2_hashes(keys.spec(), out)
    return memoryview(out).cast("i")


def key_partitions(columns: Columns, num_partitions: int) -> memoryview:
    """Per row (int32): its pinned partition, else the murmur2 partition of its
    key, else -1 (a null key, for the caller's null-key policy).

    Pinned partitions are copied as given, even if >= ``num_partitions``
    (:func:`group_by_partition` sets those apart, for the caller to fail)."""
    if not isinstance(num_partitions, int) or not 1 <= num_partitions <= 0x7FFFFFFF:
        raise ValueError(f"num_partitions must be an int in 1..2**31-1, got {num_partitions!r}")
    n = len(columns)
    if columns.partitions is None:
        out = bytearray(b"\xff" * (4 * n))  # -1 everywhere
    else:
        out = bytearray(columns.partitions.cast("B"))
    if columns.keys is not None:
        _kernel().murmur2_partitions(columns.keys.spec(), num_partitions, out)
    return memoryview(out).cast("i")


@dataclass(frozen=True, slots=True, eq=False)
class RowGroups:
    """Rows grouped by partition, each group in row order."""

    #: (partition, rows as int64 indices) for each partition that has rows, ascending
    by_partition: tuple[tuple[int, memoryview], ...]
    #: rows pinned to a partition >= num_partitions, in row order
    out_of_range: memoryview


def group_by_partition(partitions: memoryview | array[int], num_partitions: int) -> RowGroups:
    """Group row indices by their partition (int32 per row, as from
    :func:`key_partitions` once null-key rows are assigned): a stable counting
    sort, O(rows + partitions). A row still at -1 raises ``ValueError``."""
    view = memoryview(partitions)
    if view.itemsize != 4 or view.format not in ("i", "l", "=i", "<i"):
        view = memoryview(array("i", view.tolist()))
    n = len(view)
    order = bytearray(8 * n)
    starts = _kernel().group_rows(view, num_partitions, order)
    rows = memoryview(order).cast("q")
    groups = tuple(
        (p, rows[starts[p]:starts[p + 1]])
        for p in range(num_partitions)
        if starts[p + 1] > starts[p]
    )
    return RowGroups(groups, rows[starts[num_partitions]:starts[num_partitions + 1]])
