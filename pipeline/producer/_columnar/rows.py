"""The columnar unit: rows of a ``send_batch`` call moving through the four stages.

``send_batch`` turns its columns into ``protocol.columnar.Columns`` once, then
accepts them in *chunks* (consecutive rows, each within a quarter of
``buffer_memory``), one ``RowChunk`` ledger entry and one ``RowRun`` intake item
per chunk. The stages move a ``RowRun`` where they move a ``ProducerMessage``:

* the topic producer splits a chunk's run (``assign_rows``): keyed rows on the
  Java murmur2 partition (vectorized, ``partitioning.py``), pinned rows on
  theirs, null-key rows one batch's worth at a time on the partitioner's
  null-key choice; then each partition's rows are cut into runs of at most one
  batch (exact encoded sizes, ``columnar.cut_batches``), in row order;
* the partition producer treats a run as one unit (retry level, watermark,
  deadline): a run keeps its place in the partition's order;
* the broker producer seals a run alone into one RecordBatch
  (``columnar.encode_batch``, no Python object per record) taking ``count``
  sequence numbers; retries re-send those bytes, as for any sealed batch;
* the ledger settles a run as ``count`` rows at once (write-once ``_state`` per
  run; the chunk leaves ``outstanding`` when its last run settles), counting
  into the call's ``DeliveryGroup``.

Invariant: every row of an accepted chunk belongs to exactly one run in
``chunk.runs`` at any time (the whole chunk's run until the topic producer
splits it; then the split runs), so a close that fails the chunk's pending runs
fails each row once. Buffer bytes: the chunk reserves the per-row bound
(``columnar.record_size_bounds``, the per-message path's bound); the split
releases the difference to the runs' exact encoded sizes, which the runs then
hold until they settle; the chunk holds its packed copy (``extra``: a list
call's, a ``send()`` burst's) until its last row settles.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from pipeline.producer._columnar.partitioning import group_by_partition, key_partitions
from pipeline.producer._errors import ProducerError
from pipeline.producer._message import PENDING
from pipeline.producer._outcomes.delivery import DeliveryGroup
from pipeline.producer._speedups import fields
from pipeline.producer._speedups.fields import slots
from pipeline.producer._stages.envelopes import SEQUENCE_WRAP, SealedBatch
from pipeline.protocol.columnar import (
    KERNEL,
    BinaryColumn,
    Columns,
    HeaderColumn,
    cut_batches,
    encode_batch,
    kernel,
)

if TYPE_CHECKING:
    from pipeline.producer._message import ProducerMessage

__all__ = [
    "RowChunk",
    "RowRun",
    "RowsError",
    "assign_rows",
    "encode_messages",
    "record_count",
    "slice_columns",
    "split_run_batch",
    "take_until_run",
]


class RowChunk:
    """Ledger entry of one accepted chunk (ids ``_id .. _id + rows - 1``)."""

    __slots__ = ("_id", "burst", "extra", "group", "messages", "outcomes", "pending", "runs")

    def __init__(self, group: DeliveryGroup | None, rows: int) -> None:
        self._id = 0
        self.group = group  # None: a send() burst (its rows' deliveries read outcomes)
        self.pending = rows  # rows not settled yet
        self.runs: list[RowRun] = []
        # Reserved bytes of the copies build_columns made of these rows (lists are
        # packed; Arrow is borrowed), or of a send() burst's packed columns (counted
        # when it is sealed): held until the last row settles, since every run of
        # the chunk shares those buffers.
        self.extra = 0
        # A send() burst (burst.py): its RowBurst until sealed, then the
        # outcomes its rows' deliveries read (written as its runs settle).
        self.burst: Any = None
        self.outcomes: Any = None
        # A send_many chunk (messages.py): its ProducerMessages, row i's message at
        # index i, until the last row settles; each run's outcome is written onto
        # them as it settles. None: rows with no message (send_batch, a send() burst).
        self.messages: list[ProducerMessage] | None = None


class RowRun:
    """Rows of one ``Columns`` for one topic (after the topic producer: one
    partition, at most one batch), in their wire order. Duck-types the
    fields of ``ProducerMessage`` the stages read."""

    __slots__ = slots(fields.DELIVERY_RUN, (
        "_deadline", "_id", "_level", "_outcome", "_sink", "_size", "columns", "count",
        "first_row", "place", "rows"))

    def __init__(self, topic: str, columns: Columns, rows: Any, count: int, size: int,
                 chunk: RowChunk, first_row: int) -> None:
        self.topic = topic
        self.columns = columns
        self.rows = rows  # None: all rows of ``columns``; else int64 row indices
        self.count = count
        self._size = size
        self._sink = chunk
        self._id = chunk._id
        self.first_row = first_row  # the call's index of the first row (for errors)
        # Its first position in the chunk's wire order (row_outcomes.py): each
        # partition's rows in row order, partition after partition; for a range
        # of rows, its first row.
        self.place = first_row
        self.partition: int | None = None
        self._level = 0
        self._deadline = 0.0
        self._state = PENDING
        self._outcome: BaseException | None = None
        self.offset = -1
        self.timestamp = -1

    def __repr__(self) -> str:
        where = self.topic if self.partition is None else f"{self.topic}[{self.partition}]"
        return f"<RowRun {where} rows={self.count} state={self._state}>"

    def split(self, rows: Any, count: int, size: int) -> RowRun:
        first = rows[0] if count else 0
        run = RowRun(self.topic, self.columns, rows, count, size, self._sink,
                     self.first_row + first)
        run._level, run._deadline = self._level, self._deadline
        return run

    def encode(self, **producer_fields: Any) -> bytes:
        return encode_batch(self.columns, self.rows, **producer_fields)


class RowsError(ProducerError):
    """The terminal failure of the rows of one run (``message`` is the run)."""

    def __init__(self, run: ProducerMessage | RowRun, cause: BaseException) -> None:
        super().__init__(run, cause)  # type: ignore[arg-type]
        where = run.topic if run.partition is None or run.partition < 0 else (
            f"{run.topic}[{run.partition}]"
        )
        count = getattr(run, "count", 1)
        first = getattr(run, "first_row", 0)
        self.args = (
            f"{count} row(s) of a send_batch call (the first at row {first}) to "
            f"{where} not delivered: {type(cause).__name__}: {cause}",
        )


def record_count(msgs: Sequence[Any]) -> int:
    """Records in a batch's units: a batch is either messages or one run."""
    first = msgs[0]
    return first.count if type(first) is RowRun else len(msgs)


def take_until_run(msgs: list[Any]) -> list[Any] | None:
    """The front of a broker producer's accumulator when it holds runs: a run
    alone, or the messages before the first run (the caller sizes those), or
    None when no run is left."""
    if type(msgs[0]) is RowRun:
        return msgs[:1]
    for i, msg in enumerate(msgs):
        if type(msg) is RowRun:
            return msgs[:i]
    return None


def split_run_batch(batch: SealedBatch, config: Any) -> tuple[SealedBatch, SealedBatch]:
    """KIP-126 for a sealed run the broker found too large: its rows in two halves,
    in order, each sealed with the batch's producer id and epoch and its part of the
    batch's sequence range (as ``batches.split_batch`` does for messages). The
    halves replace the run in its chunk's ``runs`` (so a close fails them), and
    hold the run's buffer bytes between them (the first its exact size, the
    second the rest), so the ledger releases exactly what was reserved."""
    run: RowRun = batch.messages[0]  # type: ignore[assignment]
    rows = range(run.count) if run.rows is None else run.rows
    k = run.count // 2
    fields: dict[str, Any] = {"compression": config.compression_codec,
                              "compression_level": config.compression_level}
    first_size = len(encode_batch(run.columns, rows[:k]))
    halves = [run.split(rows[:k], k, first_size),
              run.split(rows[k:], run.count - k, run._size - first_size)]
    halves[0].place, halves[1].place = run.place, run.place + k
    for half in halves:  # (a send() row's metadata names its run's partition)
        half.partition = run.partition
    chunk: RowChunk = run._sink
    at = chunk.runs.index(run)
    chunk.runs[at:at + 1] = halves
    out = []
    seq = batch.base_sequence
    for half in halves:
        ids = {}
        if batch.producer_id >= 0:
            ids = {"producer_id": batch.producer_id, "producer_epoch": batch.producer_epoch,
                   "base_sequence": seq}
        sealed = SealedBatch(batch.tp, [half], half.encode(**fields, **ids),  # type: ignore[list-item]
                             batch.producer_id, batch.producer_epoch, seq, half._size)
        sealed._level, sealed._retries = batch._level, batch._retries - 1  # (a split is free)
        out.append(sealed)
        if seq >= 0:
            seq = (seq + half.count) % SEQUENCE_WRAP
    return out[0], out[1]


# ------------------------------------------------------------------ messages


_value_of = attrgetter("value")
_key_of = attrgetter("key")
_timestamp_of = attrgetter("timestamp")
_headers_of = attrgetter("headers")


def encode_messages(msgs: Sequence[ProducerMessage], **fields: Any) -> bytes | None:
    """``send()``'s messages (validated already) as one RecordBatch, encoded by
    the columnar C kernel: three C-level gathers and one kernel call instead of
    a Python loop per record; the same bytes as ``BatchBuilder`` (the codec's
    tests prove the kernels byte-identical to it). None when that would not be
    faster: the pure-Python kernel, or a message with headers (rare: the
    caller's ``BatchBuilder`` handles them)."""
    if KERNEL != "c" or any(map(_headers_of, msgs)):
        return None
    pack = kernel().pack_binary
    offsets, data, validity, nulls = pack(list(map(_value_of, msgs)), "values")
    values = BinaryColumn(memoryview(offsets).cast("q"), memoryview(data),
                          None if validity is None else memoryview(validity), 0, nulls)
    key_list = list(map(_key_of, msgs))
    keys = None
    if key_list.count(None) != len(key_list):
        offsets, data, validity, nulls = pack(key_list, "keys")
        keys = BinaryColumn(memoryview(offsets).cast("q"), memoryview(data),
                            None if validity is None else memoryview(validity), 0, nulls)
    timestamps = memoryview(array("q", map(_timestamp_of, msgs)))
    return encode_batch(Columns(values, keys, None, timestamps), **fields)


# ------------------------------------------------------------------ slicing


def _slice_binary(col: BinaryColumn, start: int, stop: int) -> BinaryColumn:
    return BinaryColumn(col.offsets[start:stop + 1], col.data, col.validity,
                        col.validity_offset + start,
                        col.null_count)  # (an upper bound for the slice)


def slice_columns(columns: Columns, start: int, stop: int) -> Columns:
    """Rows ``start .. stop - 1`` as their own ``Columns``, sharing every buffer."""
    if start == 0 and stop == len(columns):
        return columns
    headers = columns.headers
    if headers is not None:
        headers = HeaderColumn(headers.offsets[start:stop + 1], headers.keys, headers.values,
                               headers.validity, headers.validity_offset + start)
    return Columns(
        _slice_binary(columns.values, start, stop),
        None if columns.keys is None else _slice_binary(columns.keys, start, stop),
        headers,
        None if columns.timestamps is None else columns.timestamps[start:stop],
        None if columns.partitions is None else columns.partitions[start:stop],
        columns.default_timestamp,
    )


# ------------------------------------------------------------------ partitioning


def assign_rows(run: RowRun, n: int, partitioner: Any, *, cap: int,
                max_records: int, parts: Any = None
                ) -> tuple[list[tuple[int, RowRun]], RowRun | None]:
    """Split a chunk's run for a topic of ``n`` partitions: ``([(partition,
    run)], out_of_range)``, runs in row order per partition, each at most one
    batch (``cap`` bytes encoded, ``max_records`` rows). ``out_of_range``: the
    rows pinned to a partition the topic does not have (the caller fails them).

    ``parts``: every row's partition already chosen (int32; ``n`` or more: out
    of range) by the caller, who asked its partitioner per row (any but the
    default one). Otherwise (the default partitioner): keys hash with Java's
    murmur2, null-key rows go to ``partitioner.partition(topic, None, None, n)``
    one batch at a time, with ``on_new_batch`` after each full batch (sticky, as
    KIP-480)."""
    columns, topic = run.columns, run.topic
    out: list[tuple[int, RowRun]] = []
    if parts is None and columns.keys is None and columns.partitions is None:
        for p, rows, nbytes in _null_key_batches(columns, None, n, partitioner, topic, cap,
                                                 max_records):
            out.append((p, run.split(rows, len(rows), nbytes)))
        return out, None
    if parts is None:
        parts = key_partitions(columns, n)
    if -1 in parts:  # null-key rows without a pinned partition
        nulls = array("q", (i for i, p in enumerate(parts) if p < 0))
        for p, rows, _ in _null_key_batches(columns, nulls, n, partitioner, topic, cap,
                                            max_records):
            for i in rows:
                parts[i] = p
    groups = group_by_partition(parts, n)
    place = 0  # (the groups lie in partition order: the wire order, RowRun.place)
    for p, rows in groups.by_partition:
        for start, stop, nbytes in cut_batches(columns, rows, max_bytes=cap,
                                               max_records=max_records):
            part = run.split(rows[start:stop], stop - start, nbytes)
            part.place = place + start
            out.append((p, part))
        place += len(rows)
    bad = None
    if len(groups.out_of_range):
        rows = groups.out_of_range
        bad = run.split(rows, len(rows), 0)
        bad.place = place  # (after every partition's rows in the wire order)
    return out, bad


def _null_key_batches(columns: Columns, rows: Any, n: int, partitioner: Any, topic: str,
                      cap: int, max_records: int) -> list[tuple[int, Any, int]]:
    """Null-key rows, a batch at a time, on the partitioner's null-key choice:
    ``[(partition, rows, nbytes)]``. Every batch but the last is full, so the
    partitioner hears ``on_new_batch`` after each of them (KIP-480's sticky
    switch); the last one's partition stays current for the next rows."""
    cuts = cut_batches(columns, rows, max_bytes=cap, max_records=max_records)
    out = []
    for i, (start, stop, nbytes) in enumerate(cuts):
        p = partitioner.partition(topic, None, None, n)
        picked = range(start, stop) if rows is None else rows[start:stop]
        out.append((p, picked, nbytes))
        if i + 1 < len(cuts):
            partitioner.on_new_batch(topic, n, p)
    return out
