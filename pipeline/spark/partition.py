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

from pipeline.spark.rows import _Converter, _Outcomes, _Rows, _send_rows
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
    batches: Iterator[pa.RecordBatch], cfg: ExportConfig, counts: Any = None
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function (bind ``cfg`` with ``functools.partial``).

    ``counts``: a Spark accumulator of :class:`pipeline.spark.progress.ProgressCounts`
    (None: no progress asked), added to once, when the partition is exported.

    Module-level on purpose: cloudpickle ships it by reference, so executors import
    this module (the package must be installed there) instead of a pickled copy.
    """
    from pyspark import TaskContext

    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    status = export_partition(batches, cfg, partition=partition, attempt=attempt)
    if counts is not None:
        counts.add((status.delivered, status.bytes, status.failed, 1))
    yield status_batch([status])

