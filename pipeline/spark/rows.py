"""The rows of one Spark partition on their way to the producer: Arrow batches cut into
slices (:class:`_Converter`, with the message-id header and, for an exactly-once export,
the running fingerprint of the rows), slices sent with ``send_batch`` (:func:`_send_rows`),
and their outcomes counted (:class:`_Outcomes`). Shared by the at-least-once export
(:mod:`pipeline.spark.partition`) and the exactly-once one
(:mod:`pipeline.spark.exactly_once`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pipeline.spark.fingerprint import Fingerprint
from pipeline.spark.status import (
    ExportConfig,
    ExportTaskError,
)

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

    from pipeline.producer._outcomes.delivery import DeliveryGroup

# --------------------------------------------------------------------------- conversion


def _byte_count(column: pa.Array) -> int:
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    total = pc.sum(pc.binary_length(column)).as_py()
    return int(total or 0)


def _with_message_ids(headers: pa.Array | None, n: int, name: str, prefix: str,
                      first: int) -> pa.Array:
    """``headers`` (``list<struct<key, value>>`` or None) with one more header per row,
    ``name = f"{prefix}{first + i}"``, built with Arrow/numpy kernels (no row objects)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    ids = pc.binary_join_element_wise(
        pa.scalar(prefix.encode(), pa.binary()),
        pa.array(np.arange(first, first + n, dtype=np.int64)).cast(pa.string()).cast(pa.binary()),
        pa.scalar(b"", pa.binary()),
    )
    id_keys = pa.array(np.full(n, name, dtype=object), pa.string())
    header_type = pa.struct([("key", pa.string()), ("value", pa.binary())])
    id_items = pa.StructArray.from_arrays([id_keys, ids], fields=list(header_type))
    if headers is None:
        return pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)), id_items)
    if isinstance(headers, pa.ChunkedArray):
        headers = headers.combine_chunks()
    offsets = np.asarray(headers.offsets, dtype=np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    items = headers.values.slice(lo, hi - lo)
    old_keys = items.field("key").cast(pa.string())
    old_values = items.field("value").cast(pa.binary())
    rel = offsets - lo
    new_offsets = rel + np.arange(n + 1, dtype=np.int64)  # each row one entry longer
    total = (hi - lo) + n
    is_id = np.zeros(total, dtype=bool)
    is_id[new_offsets[1:] - 1] = True  # the id goes last in its row
    take = np.empty(total, dtype=np.int64)
    take[~is_id] = np.arange(hi - lo, dtype=np.int64)
    take[is_id] = (hi - lo) + np.arange(n, dtype=np.int64)
    keys = pa.concat_arrays([old_keys, id_keys]).take(pa.array(take))
    values = pa.concat_arrays([old_values, ids]).take(pa.array(take))
    merged = pa.StructArray.from_arrays([keys, values], fields=list(header_type))
    return pa.ListArray.from_arrays(pa.array(new_offsets.astype(np.int32)), merged)


class _Rows:
    """One slice of an Arrow batch, as the columns ``send_batch`` takes (no row objects).

    ``end`` is the partition's row index after the slice; ``digest`` (exactly-once only)
    the fingerprint of the partition's rows up to ``end``."""

    __slots__ = ("digest", "end", "headers", "keys", "partitions", "topics", "values")

    def __init__(self, values: Any, keys: Any, headers: Any, partitions: Any,
                 topics: Any, end: int = 0, digest: str = "") -> None:
        self.values, self.keys, self.headers = values, keys, headers
        self.partitions, self.topics = partitions, topics
        self.end, self.digest = end, digest

    def __len__(self) -> int:
        return len(self.values)

    def slice(self, start: int, length: int) -> _Rows:
        def cut(col: Any) -> Any:
            return None if col is None else col.slice(start, length)
        return _Rows(cut(self.values), cut(self.keys), cut(self.headers),
                     cut(self.partitions), cut(self.topics))


class _Converter:
    """Pulls Arrow batches off Spark and cuts them into slices of about
    ``chunk_rows`` rows for ``send_batch`` (runs in a worker thread).

    In exactly-once mode it also keeps the partition's running :class:`Fingerprint`
    (each slice carries the digest at its end) and never lets a slice cross a
    multiple of ``commit_rows``, so a transaction can end on exactly such a row."""

    def __init__(
        self, batches: Iterable[pa.RecordBatch], cfg: ExportConfig, partition: int
    ) -> None:
        self._batches = iter(batches)
        self._cfg = cfg
        self._partition = partition
        self._pending: pa.RecordBatch | None = None  # rest of a batch larger than a chunk
        self.rows = 0  # rows converted so far (also the next message-id row index)
        self.bytes = 0
        self.exhausted = False
        eo = cfg.exactly_once
        self.fingerprint: Fingerprint | None = Fingerprint() if eo is not None else None
        self._commit_rows = eo.commit_rows if eo is not None else None

    def _next_slice(self, budget: int) -> pa.RecordBatch | None:
        if self._commit_rows is not None:
            budget = min(budget, self._commit_rows - self.rows % self._commit_rows)
        batch = self._pending
        self._pending = None
        while batch is None or batch.num_rows == 0:
            try:
                batch = next(self._batches)
            except StopIteration:
                self.exhausted = True
                return None
        if batch.num_rows > budget:
            self._pending = batch.slice(budget)
            batch = batch.slice(0, budget)
        return batch

    def next_chunk(self) -> list[_Rows] | None:
        """Slices of about ``chunk_rows`` rows in all, or None at the end of the partition."""
        out: list[_Rows] = []
        budget = self._cfg.chunk_rows
        while budget > 0:
            batch = self._next_slice(budget)
            if batch is None:
                break
            out.append(self._convert(batch))
            budget -= batch.num_rows
        return out or None

    def skip(self, rows: int) -> int:
        """Read (and fingerprint) the partition's next ``rows`` rows without sending them:
        what earlier attempts committed. Returns how many there were."""
        skipped = 0
        while skipped < rows:
            batch = self._next_slice(rows - skipped)
            if batch is None:
                break
            columns = self._columns(batch)
            if self.fingerprint is not None:
                self.fingerprint.update(batch.num_rows, *columns)
            self.rows += batch.num_rows
            skipped += batch.num_rows
        return skipped

    def _columns(self, batch: pa.RecordBatch) -> tuple[Any, Any, Any, Any, Any]:
        """(values, keys, headers, topics, partitions) of a batch; None for a column it
        lacks (and for ``topic`` when the config names the topic)."""
        names = batch.schema.names

        def column(name: str) -> Any:
            return batch.column(names.index(name)) if name in names else None

        topics = column("topic") if self._cfg.topic is None else None
        return (column("value"), column("key"), column("headers"), topics,
                column("partition"))

    def _convert(self, batch: pa.RecordBatch) -> _Rows:
        cfg = self._cfg
        n = batch.num_rows
        values, keys, headers, topics, partitions = self._columns(batch)
        nbytes = _byte_count(values) + (0 if keys is None else _byte_count(keys))
        if topics is not None and topics.null_count:
            import pyarrow.compute as pc

            row = self.rows + int(pc.index(pc.is_null(topics), True).as_py())
            raise ExportTaskError(
                f"row {row} of Spark partition {self._partition} has a null topic and no "
                "topic option was given: set the topic argument or fill the column"
            )
        digest = ""
        if self.fingerprint is not None:
            self.fingerprint.update(n, values, keys, headers, topics, partitions)
            digest = self.fingerprint.digest()
        if cfg.message_id_header is not None:
            headers = _with_message_ids(headers, n, cfg.message_id_header,
                                        f"{cfg.message_id_prefix}{self._partition}-", self.rows)
        self.rows += n
        self.bytes += nbytes
        return _Rows(values, keys, headers, partitions, topics, self.rows, digest)


# --------------------------------------------------------------------------- the export


class _Outcomes:
    """Counts from the ``DeliveryGroup`` of each chunk (done ones are folded in)."""

    def __init__(self) -> None:
        self.open: list[DeliveryGroup] = []
        self.delivered = 0
        self.failed = 0
        self.first_error: str | None = None

    def add(self, group: DeliveryGroup) -> None:
        self.open.append(group)

    def fail_rows(self, count: int, error: BaseException) -> None:
        self.failed += count
        if self.first_error is None:
            self.first_error = _describe(error)

    def fold(self) -> None:
        still = []
        for group in self.open:
            if group.done():
                self._take(group)
            else:
                still.append(group)
        self.open = still

    def _take(self, group: DeliveryGroup) -> None:
        self.delivered += group.delivered
        self.failed += group.failed
        if group.errors and self.first_error is None:
            self.first_error = _describe(group.errors[0])

    async def wait_all(self) -> None:
        for group in self.open:
            await group.wait()
            self._take(group)
        self.open = []


def _describe(error: BaseException) -> str:
    cause = getattr(error, "cause", None)
    if cause is not None:  # ProducerError: the cause is what the user needs
        return f"{type(cause).__name__}: {cause}"
    return f"{type(error).__name__}: {error}"


async def _send_rows(producer: Any, rows: _Rows, topic: str | None,
                     outcomes: _Outcomes) -> None:
    """``send_batch`` per topic; if validation refuses the rows, send them one at a
    time to count the bad ones (the rest still go)."""
    if rows.topics is not None:
        import pyarrow.compute as pc

        for name in pc.unique(rows.topics).to_pylist():
            mask = pc.equal(rows.topics, name)
            def pick(col: Any, mask: Any = mask) -> Any:
                return None if col is None else col.filter(mask)
            picked = _Rows(pick(rows.values), pick(rows.keys), pick(rows.headers),
                           pick(rows.partitions), None)
            await _send_rows(producer, picked, name, outcomes)
        return
    assert topic is not None
    try:
        outcomes.add(await producer.send_batch(
            topic, rows.values, keys=rows.keys, headers=rows.headers,
            partitions=rows.partitions))
        return
    except (TypeError, ValueError):
        if len(rows) == 1:
            raise
    for i in range(len(rows)):  # rare path: at least one row is invalid (too large, ...)
        try:
            await _send_rows(producer, rows.slice(i, 1), topic, outcomes)
        except (TypeError, ValueError) as exc:
            outcomes.fail_rows(1, exc)
