"""The consumer's value types: what it hands out and takes back."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from pipeline.protocol.columnar import BinaryColumn, HeaderColumn, build_columns

__all__ = [
    "ConsumedColumns",
    "ConsumedRecord",
    "ConsumerGroupMetadata",
    "ConsumerState",
    "OffsetAndMetadata",
    "TopicPartition",
]


class TopicPartition(NamedTuple):
    """A partition of a topic; any ``(topic, partition)`` tuple is accepted in its place."""

    topic: str
    partition: int


class ConsumedRecord(NamedTuple):
    """One record as read from a partition. A named tuple: the fetcher's decoder builds
    one per record directly (no other object per record), and it is immutable."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # milliseconds since the epoch (CreateTime or LogAppendTime)
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    # The partition leader's epoch when the record was written (-1 if unknown):
    # committed with the offset, so a later leader can detect log truncation.
    leader_epoch: int = -1

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


def _null_count(validity: memoryview | None, offset: int, n: int) -> int:
    """Rows among bits ``[offset, offset + n)`` of an Arrow validity bitmap that are 0."""
    if validity is None or n == 0:
        return 0
    bits = int.from_bytes(validity[offset >> 3:(offset + n + 7) >> 3], "little") >> (offset & 7)
    return n - (bits & ((1 << n) - 1)).bit_count()


def _binary_slice(col: BinaryColumn, start: int, stop: int) -> BinaryColumn:
    """Rows ``[start, stop)`` of ``col``, sharing its buffers (Arrow's slicing)."""
    voff = col.validity_offset + start
    return BinaryColumn(col.offsets[start:stop + 1], col.data, col.validity, voff,
                        _null_count(col.validity, voff, stop - start))


def _int64(view: memoryview) -> memoryview:
    """``view`` as int64 items (shared when it is already)."""
    return view if view.format == "q" else memoryview(array("q", view.tolist())).cast("B").cast("q")


def _bitmap(validity: memoryview | None, bit: int, rows: int) -> bytes | None:
    """Bits ``[bit, bit + rows)`` of an LSB-first bitmap, realigned to start at bit 0."""
    if validity is None:
        return None
    bits = (int.from_bytes(validity, "little") >> bit) & ((1 << rows) - 1)
    return bits.to_bytes(max(1, (rows + 7) // 8), "little")


def _arrow_binary(pa: Any, col: BinaryColumn, rows: int, kind: Any) -> Any:
    """The first ``rows`` rows of ``col`` as an Arrow array of ``kind`` (a large binary
    or string type): its offsets and data shared, its validity realigned."""
    validity = _bitmap(col.validity, col.validity_offset, rows)
    return pa.Array.from_buffers(kind, rows, [
        None if validity is None else pa.py_buffer(validity),
        pa.py_buffer(_int64(col.offsets[:rows + 1])), pa.py_buffer(col.data)])


@dataclass(frozen=True, slots=True, eq=False)
class ConsumedColumns:
    """One partition's run of records as columns: row ``i`` of every column is the
    ``i``-th record, in offset order, the same fields as :class:`ConsumedRecord`.

    What ``consumer.batches(columns=True)`` hands out. Decoded from the fetched record
    batches straight into flat buffers in Arrow's layout (the producer's ``send_batch``
    columns: :class:`~pipeline.protocol.columnar.BinaryColumn`,
    :class:`~pipeline.protocol.columnar.HeaderColumn`), so no Python object exists per
    record until one is asked for: ``values[i]`` or ``values.to_pylist()`` (one pass,
    every value as ``bytes``), ``row(i)`` / ``records()`` for :class:`ConsumedRecord` rows.
    ``offsets`` and ``timestamps`` are int64 and ``leader_epochs`` int32 read-only
    memoryviews (``.tolist()``, ``numpy.asarray``, ``pyarrow.py_buffer`` take them as
    they are). The buffers may be shared with other batches of the same fetch."""

    topic: str
    partition: int
    offsets: memoryview
    timestamps: memoryview  # milliseconds since the epoch (CreateTime or LogAppendTime)
    keys: BinaryColumn  # nullable
    values: BinaryColumn  # nullable
    headers: HeaderColumn  # per row a tuple of (str, bytes | None); () without headers
    leader_epochs: memoryview  # as ConsumedRecord.leader_epoch (-1 if unknown)

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def num_rows(self) -> int:
        return len(self.offsets)

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def row(self, i: int) -> ConsumedRecord:
        """Record ``i`` (``IndexError`` outside ``0 <= i < len(self)``)."""
        if not 0 <= i < len(self.offsets):
            raise IndexError(f"row {i} out of range (a batch of {len(self.offsets)} records)")
        return ConsumedRecord(self.topic, self.partition, self.offsets[i], self.timestamps[i],
                              self.keys[i], self.values[i], self.headers[i],
                              self.leader_epochs[i])

    def records(self) -> list[ConsumedRecord]:
        """Every row as a :class:`ConsumedRecord`: what ``batches()`` would have handed
        out for the same records."""
        n = len(self.offsets)
        headers = self.headers
        first, last = headers.offsets[0], headers.offsets[n]
        rows: list[tuple[tuple[str, bytes | None], ...]]
        if headers.validity is not None:  # packed from records (of_records): row by row
            rows = [headers[i] for i in range(n)]
        elif first == last:
            rows = [()] * n
        else:
            ends = headers.offsets.tolist()
            hkeys = [(k or b"").decode("utf-8") for k in headers.keys.to_pylist()[first:last]]
            hvalues = headers.values.to_pylist()[first:last]
            pairs = list(zip(hkeys, hvalues, strict=True))
            rows = [tuple(pairs[ends[i] - first:ends[i + 1] - first]) for i in range(n)]
        topic, partition = self.topic, self.partition
        return [ConsumedRecord(topic, partition, offset, ts, key, value, h, epoch)
                for offset, ts, key, value, h, epoch in zip(
                    self.offsets.tolist(), self.timestamps.tolist(), self.keys.to_pylist(),
                    self.values.to_pylist(), rows, self.leader_epochs.tolist(), strict=True)]

    def to_arrow(self) -> Any:
        """The rows as a ``pyarrow.RecordBatch`` (pyarrow must be installed), its
        columns as Spark's Kafka source names them: ``key``, ``value`` (large_binary),
        ``topic`` (string), ``partition`` (int32), ``offset`` (int64), ``timestamp``
        (timestamp[ms]), ``headers`` (large_list<struct<key: large_string, value:
        large_binary>>), ``leader_epoch`` (int32). The decoded buffers are shared, not
        copied; only the validity bitmaps are (realigned to the first row)."""
        try:
            import pyarrow as pa  # type: ignore[import-untyped]
        except ImportError:
            raise ImportError("ConsumedColumns.to_arrow() needs pyarrow: pip install pyarrow"
                              ) from None
        n = len(self.offsets)
        h = self.headers
        entries = h.offsets[n] if n else 0  # header entries up to the last row's end
        pairs = pa.StructArray.from_arrays(
            [_arrow_binary(pa, h.keys, entries, pa.large_string()),
             _arrow_binary(pa, h.values, entries, pa.large_binary())], names=["key", "value"])
        starts = pa.Array.from_buffers(pa.int64(), n + 1,
                                       [None, pa.py_buffer(_int64(h.offsets[:n + 1]))])
        nulls = _bitmap(h.validity, h.validity_offset, n)
        mask = None if nulls is None else pa.Array.from_buffers(
            pa.bool_(), n, [None, pa.py_buffer(nulls)]).invert() if n else None
        headers = pa.LargeListArray.from_arrays(starts, pairs, mask=mask)
        offsets, timestamps, epochs = (
            pa.Array.from_buffers(kind, n, [None, pa.py_buffer(view)]) for view, kind in (
                (self.offsets, pa.int64()), (self.timestamps, pa.timestamp("ms")),
                (self.leader_epochs, pa.int32())))
        return pa.RecordBatch.from_arrays(
            [_arrow_binary(pa, self.keys, n, pa.large_binary()),
             _arrow_binary(pa, self.values, n, pa.large_binary()),
             pa.array([self.topic] * n, pa.string()), pa.array([self.partition] * n, pa.int32()),
             offsets, timestamps, headers, epochs],
            names=["key", "value", "topic", "partition", "offset", "timestamp", "headers",
                   "leader_epoch"])

    def slice(self, start: int, stop: int) -> ConsumedColumns:
        """Rows ``[start, stop)`` (``0 <= start <= stop <= len(self)``), sharing the
        buffers."""
        if not 0 <= start <= stop <= len(self.offsets):
            raise IndexError(f"slice [{start}, {stop}) outside a batch of {len(self)} records")
        h = self.headers
        headers = HeaderColumn(h.offsets[start:stop + 1], h.keys, h.values)
        return ConsumedColumns(self.topic, self.partition, self.offsets[start:stop],
                               self.timestamps[start:stop],
                               _binary_slice(self.keys, start, stop),
                               _binary_slice(self.values, start, stop), headers,
                               self.leader_epochs[start:stop])

    @classmethod
    def of_records(cls, topic: str, partition: int,
                   records: list[ConsumedRecord]) -> ConsumedColumns:
        """The columns of records already decoded one by one (packed once)."""
        from array import array

        columns = build_columns([r.value for r in records], keys=[r.key for r in records],
                                headers=[r.headers for r in records],
                                timestamps=[r.timestamp for r in records], default_timestamp=0)
        n = len(records)

        def ints(code: str, values: list[int]) -> memoryview:
            return memoryview(array(code, values)).toreadonly()

        empty = BinaryColumn(ints("q", [0]), memoryview(b""))
        keys = columns.keys  # None: no record has a key
        if keys is None:
            keys = BinaryColumn(ints("q", [0] * (n + 1)), memoryview(b""),
                                memoryview(bytes((n + 7) // 8)), 0, n)
        headers = columns.headers  # None: no record has headers
        if headers is None:
            headers = HeaderColumn(ints("q", [0] * (n + 1)), empty, empty)
        return cls(topic, partition, ints("q", [r.offset for r in records]),
                   ints("q", [r.timestamp for r in records]), keys, columns.values, headers,
                   ints("i", [r.leader_epoch for r in records]))


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A committed position: the offset of the *next* record to read."""

    offset: int
    metadata: str = ""
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadata:
    """Who the member is in which generation: what ``send_offsets_to_transaction``
    needs so the coordinator fences a member that is no longer in the group (KIP-447)."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


#: ``consumer.state``: "unjoined" (no assignment yet, or none since the group was
#: left), "rebalancing" (a join is under way), "stable" (member of the current
#: generation), "assigned" (no group: partitions assigned by the application),
#: "closed", "failed" (a fatal error; the next iteration raises it).
ConsumerState = Literal["unjoined", "rebalancing", "stable", "assigned", "closed", "failed"]
