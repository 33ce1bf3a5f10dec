"""The per-partition export: Arrow record batches in, one status row out.

This is everything that runs *inside* a Spark task, written so it can be run and
tested without Spark: :func:`export_partition` takes any iterator of
``pyarrow.RecordBatch`` (the columns of Spark's Kafka sink: ``value`` and optionally
``key``, ``headers``, ``topic``, ``partition``) and an :class:`ExportConfig` (plain,
picklable data), runs ``trio.run`` with a producer built *inside* the call, and
returns a :class:`PartitionStatus`.

How the rows move (spark-notes.md §2):

* Batches are pulled off the event loop with ``trio.to_thread.run_sync``, one chunk
  (about ``chunk_rows`` rows) per call, and converted to ``ProducerMessage`` objects in
  that worker thread, column by column (``to_pylist`` per column, never per-row
  Python objects from Arrow). A slow upstream (Spark computing the partition) then
  never blocks the producer's I/O, timers or retries.
* Each chunk goes to ``Producer.send_many``: one call, no per-row scheduler checkpoint.
  Backpressure is the producer's ``buffer_memory``.
* Outcomes are counted through the ``DeliveryGroup`` of each chunk; failures are
  checked after every chunk so an unrecoverable error (unknown topic, message too
  large) stops the task early instead of after the whole partition.

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

    from pipeline.producer.message import DeliveryGroup, ProducerMessage

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


def _binary_values(column: pa.Array | pa.ChunkedArray) -> list[bytes | None]:
    """A string/binary column as a list of ``bytes`` (strings cast without copying)."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_string(kind):
        column = column.cast(pa.binary())
    elif pa.types.is_large_string(kind):
        column = column.cast(pa.large_binary())
    elif pa.types.is_string_view(kind):
        column = column.cast(pa.binary())
    values: list[bytes | None] = column.to_pylist()
    return values


def _byte_count(column: pa.Array) -> int:
    import pyarrow.compute as pc  # type: ignore[import-untyped]

    total = pc.sum(pc.binary_length(column)).as_py()
    return int(total or 0)


def _header_lists(column: pa.Array) -> list[tuple[tuple[str, bytes | None], ...] | None]:
    """``array<struct<key, value>>`` -> one tuple of (key, value) pairs per row (or None).

    Flattens once and slices by the list offsets, so the per-row cost is a tuple/zip,
    not a dict per header as ``to_pylist`` on the list column would build.
    """
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if isinstance(column, pa.LargeListArray | pa.ListArray):
        offsets = column.offsets.to_pylist()
        items = column.values
    else:  # pragma: no cover - validated on the driver
        raise ExportTaskError(f"headers column has type {column.type}, expected array<struct>")
    n = len(column)
    lo, hi = offsets[0], offsets[n]
    keys = _str_values(items.field("key").slice(lo, hi - lo))
    values = _binary_values(items.field("value").slice(lo, hi - lo))
    pairs = list(zip(keys, values, strict=True))  # every header of the batch, in order
    if column.null_count == 0 and n and (hi - lo) % n == 0:
        width = (hi - lo) // n
        if offsets == list(range(lo, hi + 1, width)):  # every row has `width` headers
            if width == 0:
                return [None] * n
            it = iter(pairs)
            return list(zip(*([it] * width), strict=True))  # row tuples, built in C
    valid = column.is_valid().to_pylist() if column.null_count else None
    out: list[tuple[tuple[str, bytes | None], ...] | None] = []
    append = out.append
    for i in range(n):
        start, end = offsets[i] - lo, offsets[i + 1] - lo
        if start == end or (valid is not None and not valid[i]):
            append(None)
        else:
            append(tuple(pairs[start:end]))
    return out


def _str_values(column: pa.Array) -> list[Any]:
    import pyarrow as pa

    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return [None if v is None else v.decode() for v in column.to_pylist()]
    return list(column.to_pylist())


class _Converter:
    """Pulls Arrow batches and turns them into ``ProducerMessage`` lists (runs in a thread)."""

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

    def _next_slice(self, budget: int) -> pa.RecordBatch | None:
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

    def next_chunk(self) -> list[ProducerMessage] | None:
        """About ``chunk_rows`` messages, or None at the end of the partition."""
        msgs: list[ProducerMessage] = []
        budget = self._cfg.chunk_rows
        while len(msgs) < budget:
            batch = self._next_slice(budget - len(msgs))
            if batch is None:
                break
            msgs.extend(self._convert(batch))
        return msgs or None

    def _convert(self, batch: pa.RecordBatch) -> list[ProducerMessage]:
        from pipeline.producer.message import ProducerMessage

        cfg = self._cfg
        n = batch.num_rows
        names = batch.schema.names
        value_col = batch.column(names.index("value"))
        values = _binary_values(value_col)
        nbytes = _byte_count(value_col)
        keys: list[bytes | None] | None = None
        if "key" in names:
            key_col = batch.column(names.index("key"))
            keys = _binary_values(key_col)
            nbytes += _byte_count(key_col)
        headers = _header_lists(batch.column(names.index("headers"))) if "headers" in names else None
        topics: list[Any] | None = None
        if cfg.topic is None:
            topics = _str_values(batch.column(names.index("topic")))
            if None in topics:
                row = self.rows + topics.index(None)
                raise ExportTaskError(
                    f"row {row} of Spark partition {self._partition} has a null topic and no "
                    "topic option was given: set the topic argument or fill the column"
                )
        partitions = (
            batch.column(names.index("partition")).to_pylist() if "partition" in names else None
        )
        if cfg.message_id_header is not None:
            name = cfg.message_id_header
            prefix = f"{cfg.message_id_prefix}{self._partition}-"
            first = self.rows
            ids = [(name, f"{prefix}{first + i}".encode()) for i in range(n)]
            if headers is None:
                headers = [(h,) for h in ids]
            else:
                headers = [
                    (*(h or ()), mid) for h, mid in zip(headers, ids, strict=True)
                ]
        self.rows += n
        self.bytes += nbytes

        Msg = ProducerMessage
        topic = cfg.topic
        if keys is None and headers is None and topics is None and partitions is None:
            return [Msg(topic, v) for v in values]  # type: ignore[arg-type]
        keys_ = keys if keys is not None else [None] * n
        headers_ = headers if headers is not None else [None] * n
        topics_ = topics if topics is not None else [topic] * n
        parts_ = partitions if partitions is not None else [None] * n
        return [
            Msg(t, v, key=k, headers=h, partition=p)
            for t, v, k, h, p in zip(topics_, values, keys_, headers_, parts_, strict=True)
        ]


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


async def _send_chunk(producer: Any, msgs: list[ProducerMessage], outcomes: _Outcomes) -> None:
    """``send_many``; if validation refuses the chunk, send row by row to count the bad ones."""
    try:
        outcomes.add(await producer.send_many(msgs))
        return
    except (TypeError, ValueError):
        pass

    for msg in msgs:  # rare path: at least one row is invalid (too large, bad header...)
        try:
            group: DeliveryGroup = await producer.send_many([msg])
        except (TypeError, ValueError) as exc:
            outcomes.fail_rows(1, exc)
        else:
            outcomes.add(group)


async def _export_async(
    batches: Iterable[pa.RecordBatch], cfg: ExportConfig, status: PartitionStatus
) -> None:
    import trio

    from pipeline.producer.api import open_producer

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
            async with open_producer(cfg.bootstrap, **cfg.producer_options) as producer:
                chunk: list[ProducerMessage] | None = first
                sent = 0
                while chunk is not None:
                    if fault_at is not None and sent + len(chunk) >= fault_at:
                        await _send_chunk(producer, chunk[: fault_at - sent], outcomes)
                        await outcomes.wait_all()
                        raise ExportTaskError(
                            f"injected fault: Spark partition {status.partition} attempt 0 "
                            f"failed on purpose after {fault_at} rows"
                        )
                    await _send_chunk(producer, chunk, outcomes)
                    sent += len(chunk)
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
    try:
        trio.run(_export_async, batches, cfg, status)
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

