"""The per-partition export: Arrow record batches in, one status row out.

This is everything that runs *inside* a Spark task, written so it can be run and
tested without Spark: :func:`export_partition` takes any iterator of
``pyarrow.RecordBatch`` (the columns of Spark's Kafka sink: ``value`` and optionally
``key``, ``headers``, ``topic``, ``partition``) and an :class:`ExportConfig` (plain,
picklable data), runs ``trio.run`` with a producer built *inside* the call, and
returns a :class:`PartitionStatus`.

How the rows move:

* Batches are pulled off the event loop with ``trio.to_thread.run_sync``, one chunk
  (about ``chunk_rows`` rows) per call, and cut into Arrow slices in that worker
  thread: no Python object per row (the message-id header is added with Arrow and
  numpy kernels). A slow upstream (Spark computing the partition) then never blocks
  the producer's I/O, timers or retries.
* Each slice goes to ``Producer.send_batch`` as its columns (borrowed, zero-copy):
  the rows move through the producer's stages as columnar runs and are encoded by
  the columnar codec, with no Python object per row. A ``topic`` column is split per topic with Arrow's
  ``filter``. Backpressure is the producer's ``buffer_memory``.
* Outcomes are counted through the ``DeliveryGroup`` of each slice; failures are
  checked after every chunk so an unrecoverable error (unknown topic, message too
  large) stops the task early instead of after the whole partition. A slice that
  ``send_batch`` refuses as invalid (a row over ``max_message_bytes``) is sent row
  by row, so only the bad rows fail.

Failure semantics: retriable broker errors are retried inside the producer (up to
``delivery_timeout``). Rows that still fail are counted; more than
``max_failed_rows`` raises :class:`ExportTaskError` (which fails the Spark task, and
so the job, with the cause in the message).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from pipeline.spark.fingerprint import Fingerprint
from pipeline.spark.status import (
    DEFAULT_MESSAGE_ID_HEADER,
    STATUS_COLUMNS,
    ExportConfig,
    ExportTaskError,
    PartitionStatus,
    status_batch,
    status_schema_ddl,
)

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]

    from pipeline.producer._outcomes.delivery import DeliveryGroup

__all__ = [
    "DEFAULT_MESSAGE_ID_HEADER",
    "STATUS_COLUMNS",
    "ExportConfig",
    "ExportTaskError",
    "PartitionStatus",
    "export_partition",
    "spark_task",
    "status_batch",
    "status_schema_ddl",
]

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


async def _export_async(
    batches: Iterable[pa.RecordBatch], cfg: ExportConfig, status: PartitionStatus
) -> None:
    import trio

    from pipeline.producer._api import open_producer

    converter = _Converter(batches, cfg, status.partition)
    outcomes = _Outcomes()
    fault_at = cfg.fail_first_attempt_after_rows if status.attempt == 0 else None

    def check() -> None:
        outcomes.fold()
        if outcomes.failed > cfg.max_failed_rows:
            raise ExportTaskError(_failure_message(status, outcomes, cfg))

    first = await trio.to_thread.run_sync(converter.next_chunk)
    try:
        if first is not None:
            async with open_producer(cfg.bootstrap, **cfg.open_options()) as producer:
                chunk: list[_Rows] | None = first
                sent = 0
                while chunk is not None:
                    for rows in chunk:
                        if fault_at is not None and sent + len(rows) >= fault_at:
                            await _send_rows(producer, rows.slice(0, fault_at - sent), cfg.topic,
                                             outcomes)
                            await outcomes.wait_all()
                            raise ExportTaskError(
                                f"injected fault: Spark partition {status.partition} attempt 0 "
                                f"failed on purpose after {fault_at} rows"
                            )
                        await _send_rows(producer, rows, cfg.topic, outcomes)
                        sent += len(rows)
                    check()
                    chunk = await trio.to_thread.run_sync(converter.next_chunk)
                await outcomes.wait_all()
            check()
    finally:
        status.rows = converter.rows
        status.bytes = converter.bytes
        status.delivered = outcomes.delivered
        status.failed = outcomes.failed
        status.first_error = outcomes.first_error


def _failure_message(status: PartitionStatus, outcomes: _Outcomes, cfg: ExportConfig) -> str:
    tolerance = (
        "no failed rows are tolerated" if cfg.max_failed_rows == 0
        else f"more than max_failed_rows={cfg.max_failed_rows}"
    )
    return (
        f"export of Spark partition {status.partition} (attempt {status.attempt}) failed: "
        f"{outcomes.failed} row(s) not delivered ({tolerance}); first error: {outcomes.first_error}"
    )


def export_partition(
    batches: Iterable[pa.RecordBatch],
    cfg: ExportConfig,
    *,
    partition: int = 0,
    attempt: int = 0,
) -> PartitionStatus:
    """Export one partition's batches; return its status or raise :class:`ExportTaskError`.

    Runs its own ``trio.run`` (so it must not be called from inside a trio loop; use
    ``trio.to_thread.run_sync`` there). Errors that are not row failures (no broker
    answering, an invalid producer option) are raised as :class:`ExportTaskError` too,
    with the original as ``__cause__``.
    """
    import trio

    status = PartitionStatus(partition=partition, attempt=attempt, pid=os.getpid())
    status.started_at = time.time()
    started = time.perf_counter()
    if cfg.exactly_once is not None:
        from pipeline.spark.exactly_once import export_exactly_once

        run = export_exactly_once
    else:
        run = _export_async
    try:
        trio.run(run, batches, cfg, status)
    except ExportTaskError:
        raise
    except BaseExceptionGroup as group:
        raise _from_group(group, status) from group
    except Exception as exc:
        raise ExportTaskError(
            f"export of Spark partition {partition} (attempt {attempt}) failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    finally:
        status.seconds = time.perf_counter() - started
    return status


def _from_group(group: BaseExceptionGroup[Any], status: PartitionStatus) -> BaseException:
    """The one exception a task raises for ``group``, keeping every error in it.

    A lone ``ExportTaskError`` is raised as itself; anything else that is an
    ``Exception`` becomes one ``ExportTaskError`` naming each error (the driver
    only sees the text); a ``BaseException`` such as ``KeyboardInterrupt`` goes
    up by the library's group rule (``pipeline.util.groups``).
    """
    from pipeline.util.groups import collapse, real_errors

    errors = real_errors(group)
    if not all(isinstance(e, Exception) for e in errors):
        return collapse(group)
    tasks = [e for e in errors if isinstance(e, ExportTaskError)]
    others = "; ".join(f"{type(e).__name__}: {e}" for e in errors if e not in tasks)
    if tasks:
        if len(errors) == 1:
            return tasks[0]
        text = "; ".join(str(e) for e in tasks)
        return ExportTaskError(f"{text}; also {others}" if others else text)
    return ExportTaskError(
        f"export of Spark partition {status.partition} (attempt {status.attempt}) failed: "
        f"{others}"
    )


# --------------------------------------------------------------------------- Spark glue


def spark_task(
    batches: Iterator[pa.RecordBatch], cfg: ExportConfig
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function (bind ``cfg`` with ``functools.partial``).

    Module-level on purpose: cloudpickle ships it by reference, so executors import
    this module (the package must be installed there) instead of a pickled copy.
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    status = export_partition(batches, cfg, partition=partition, attempt=attempt)
    yield status_batch([status])

