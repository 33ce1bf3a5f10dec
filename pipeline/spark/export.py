"""Driver side of the Spark export: ``export_dataframe(df, ...) -> ExportReport``.

The DataFrame's columns follow Spark's built-in Kafka sink:

===========  =========================================  ==========================
column       type                                       notes
===========  =========================================  ==========================
value        string or binary                           required (null: a tombstone)
key          string or binary                           optional
headers      array<struct<key:string,value:binary>>     optional (value may be string)
topic        string                                     required unless ``topic=``
partition    int or long                                optional; null: partitioner
===========  =========================================  ==========================

Other columns are ignored (dropped before the tasks run). The job is one
``df.mapInArrow(spark_task, status_schema)`` action; each task exports its partition
with its own producer (see :mod:`pipeline.spark.partition`) and returns one status row.

Before the job, :mod:`pipeline.spark.workers` checks that Spark's Python workers can
import pipeline (a local session that chose no worker Python gets the driver's): a
worker that cannot fails the export at once with one line saying what to set.

Delivery is **at least once**, like Spark's own Kafka sink: a task that fails after
some rows were acknowledged is retried from the start of its partition (up to
``spark.task.maxFailures``), so those rows are written again. The report flags
partitions whose successful attempt was a retry (``attempt > 0``), and
``add_message_id_header`` stamps every record with a stable id
(``"{prefix}{spark partition}-{row index}"``) for downstream deduplication. With
``spark.speculation`` on, two attempts of a task may run at once: both write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import re
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.spark.exactly_once_job import (
    after_failure,
    check_options,
    finish,
    job_partitions,
    prepare,
    skipped_statuses,
    succeeded_tasks,
    wait_for_tasks,
)
from pipeline.spark.ledger import DEFAULT_LEDGER_TOPIC
from pipeline.spark.partition import spark_task
from pipeline.spark.progress import ExportProgress, ProgressPoller
from pipeline.spark.status import (
    DEFAULT_MESSAGE_ID_HEADER,
    ExactlyOnce,
    ExportConfig,
    PartitionStatus,
    status_schema_ddl,
)
from pipeline.spark.workers import worker_python_advice, worker_python_problem

__all__ = [
    "ExportError",
    "ExportProgress",
    "ExportReport",
    "ExportSchemaError",
    "SpeculationWarning",
    "build_report",
    "export_dataframe",
    "validate_schema",
]

log = logging.getLogger("pipeline.spark")

SINK_COLUMNS = ("key", "value", "headers", "topic", "partition")


class ExportError(RuntimeError):
    """The export job failed; the message carries the task's cause.

    ``report``: for an exactly-once export whose job failed, what is committed per
    partition (read from the ledger after the driver fenced the job's leftovers);
    None otherwise."""

    def __init__(self, message: str, *, report: ExportReport | None = None) -> None:
        super().__init__(message)
        self.report = report


class ExportSchemaError(ExportError, ValueError):
    """The DataFrame does not have the columns (or types) of a Kafka sink."""


class SpeculationWarning(UserWarning):
    """``spark.speculation`` is on: duplicate task attempts may write the same rows."""


# --------------------------------------------------------------------------- report


@dataclass(frozen=True, slots=True)
class ExportReport:
    """What an export did. ``partitions`` holds one status per Spark partition."""

    topic: str | None  # None when the rows chose their topic (topic column)
    rows: int
    delivered: int
    failed: int
    bytes: int
    seconds: float  # wall time of the Spark job, on the driver
    partitions: tuple[PartitionStatus, ...]
    first_error: str | None = None
    warnings: tuple[str, ...] = ()
    task_seconds: float = field(default=0.0)  # sum of per-task wall times
    #: exactly-once exports: the export id (rerun with it to finish a failed export) and
    #: the ledger topic; None for at-least-once
    export_id: str | None = None
    ledger_topic: str | None = None

    @property
    def exactly_once(self) -> bool:
        return self.export_id is not None

    @property
    def committed_partitions(self) -> tuple[int, ...]:
        """Exactly-once: partitions this run committed (all their rows are visible)."""
        return self._with_outcome("committed")

    @property
    def skipped_partitions(self) -> tuple[int, ...]:
        """Exactly-once: partitions an earlier run of the export id had committed whole;
        this run wrote none of their rows."""
        return self._with_outcome("skipped")

    @property
    def failed_partitions(self) -> tuple[int, ...]:
        """Exactly-once, failed job: partitions not committed whole (``committed_rows``
        of each, committed in earlier chunks, are visible; the rest is not)."""
        return self._with_outcome("failed")

    @property
    def complete(self) -> bool:
        """Every partition's rows are committed (by this run or an earlier one)."""
        return bool(self.partitions) and not self.failed_partitions and self.ok

    @property
    def committed_rows(self) -> int:
        """Exactly-once: rows of the export visible to read_committed readers."""
        return sum(p.committed_rows for p in self.partitions)

    def _with_outcome(self, outcome: str) -> tuple[int, ...]:
        return tuple(p.partition for p in self.partitions if p.outcome == outcome)

    @property
    def rows_per_second(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_second(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0

    @property
    def retried_partitions(self) -> tuple[int, ...]:
        """Spark partitions whose successful attempt was a retry (or a speculative copy):
        at-least-once, they may have duplicates; exactly-once, they have none."""
        return tuple(p.partition for p in self.partitions if p.attempt > 0)

    @property
    def rows_by_partition(self) -> dict[int, int]:
        return {p.partition: p.delivered for p in self.partitions}

    @property
    def ok(self) -> bool:
        return self.failed == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "rows": self.rows,
            "delivered": self.delivered,
            "failed": self.failed,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "rows_per_second": round(self.rows_per_second, 1),
            "mb_per_second": round(self.mb_per_second, 3),
            "spark_partitions": len(self.partitions),
            "retried_partitions": list(self.retried_partitions),
            "first_error": self.first_error,
            "warnings": list(self.warnings),
            "partitions": [p.as_row() for p in self.partitions],
            **({} if self.export_id is None else {
                "export_id": self.export_id,
                "ledger_topic": self.ledger_topic,
                "committed_rows": self.committed_rows,
                "committed_partitions": list(self.committed_partitions),
                "skipped_partitions": list(self.skipped_partitions),
                "failed_partitions": list(self.failed_partitions),
                "complete": self.complete,
            }),
        }

    def format(self, *, per_partition: bool = True) -> str:
        """A human-readable summary (what the CLI and the demo print)."""
        if self.exactly_once:
            return self._format_exactly_once(per_partition)
        lines = [
            f"exported {self.delivered:,} of {self.rows:,} rows to "
            f"{self.topic or '(topic column)'} in {self.seconds:.2f} s: "
            f"{self.rows_per_second:,.0f} rows/s, {self.mb_per_second:.1f} MB/s "
            f"({self.bytes / 1e6:.1f} MB key+value)",
            f"spark partitions: {len(self.partitions)}, failed rows: {self.failed:,}, "
            f"retried partitions: {list(self.retried_partitions) or 'none'}",
        ]
        if self.retried_partitions:
            lines.append(
                "  note: retried partitions were re-sent from their start (at-least-once); "
                "deduplicate on the message-id header if you need exactly-once"
            )
        if self.first_error:
            lines.append(f"first error: {self.first_error}")
        for text in self.warnings:
            lines.append(f"warning: {text}")
        if per_partition:
            for p in self.partitions:
                rate = p.delivered / p.seconds if p.seconds > 0 else 0.0
                flag = "  RETRY" if p.attempt > 0 else ""
                lines.append(
                    f"  partition {p.partition:>4}  attempt {p.attempt}  rows {p.delivered:>10,}"
                    f"  failed {p.failed:>6,}  {p.seconds:7.2f} s  {rate:>10,.0f} rows/s{flag}"
                )
        return "\n".join(lines)

    def _format_exactly_once(self, per_partition: bool) -> str:
        committed, skipped = self.committed_partitions, self.skipped_partitions
        failed = self.failed_partitions
        lines = [
            f"exactly-once export {self.export_id!r} to {self.topic or '(topic column)'} "
            f"(ledger {self.ledger_topic}): {len(committed)} partition(s) committed, "
            f"{len(skipped)} skipped (an earlier run had committed them), {len(failed)} failed",
            f"rows written by this run: {self.delivered:,} in {self.seconds:.2f} s "
            f"({self.rows_per_second:,.0f} rows/s, {self.mb_per_second:.1f} MB/s); rows "
            f"committed in all: {self.committed_rows:,}",
        ]
        if failed:
            partial = [p for p in self.partitions if p.outcome == "failed" and p.committed_rows]
            lines.append(
                "the export is NOT complete: partitions commit independently (no released "
                "Kafka can commit a whole job at once: KIP-939's two-phase commit is not "
                "usable yet), so the committed partitions"
                + (f" and {len(partial)} failed partition(s)' first chunks" if partial else "")
                + f" are visible to read_committed readers; rerun with export_id="
                f"{self.export_id!r} to write only what is missing"
            )
        elif self.retried_partitions:
            lines.append(f"retried partitions (no duplicates): {list(self.retried_partitions)}")
        if self.first_error:
            lines.append(f"first error: {self.first_error}")
        for text in self.warnings:
            lines.append(f"warning: {text}")
        if per_partition:
            for p in self.partitions:
                extra = f"  resumed after {p.resumed_rows:,}" if p.resumed_rows and (
                    p.outcome != "skipped") else ""
                who = (f"  attempt {p.attempt}" if p.attempt >= 0 else "")
                lines.append(
                    f"  partition {p.partition:>4}  {p.outcome:<9}  committed rows "
                    f"{p.committed_rows:>10,}  written now {p.delivered:>10,}"
                    f"  transactions {p.transactions:>3}{who}{extra}"
                )
        return "\n".join(lines)


def build_report(
    statuses: Iterable[PartitionStatus | Mapping[str, Any]],
    *,
    topic: str | None,
    seconds: float,
    warnings: Iterable[str] = (),
    export_id: str | None = None,
    ledger_topic: str | None = None,
) -> ExportReport:
    """Fold status rows (``PartitionStatus`` or ``Row.asDict()`` mappings) into a report."""
    parts = []
    for s in statuses:
        if not isinstance(s, PartitionStatus):
            s = PartitionStatus(**{k: s[k] for k in PartitionStatus.__slots__ if k in s})
        parts.append(s)
    parts.sort(key=lambda p: p.partition)
    first_error = next((p.first_error for p in parts if p.first_error), None)
    return ExportReport(
        topic=topic,
        rows=sum(p.rows for p in parts),
        delivered=sum(p.delivered for p in parts),
        failed=sum(p.failed for p in parts),
        bytes=sum(p.bytes for p in parts),
        seconds=seconds,
        partitions=tuple(parts),
        first_error=first_error,
        warnings=tuple(warnings),
        task_seconds=sum(p.seconds for p in parts),
        export_id=export_id,
        ledger_topic=ledger_topic,
    )


# --------------------------------------------------------------------------- schema


def _type_name(data_type: Any) -> str:
    return str(data_type.simpleString())


def validate_schema(schema: Any, *, topic: str | None) -> list[str]:
    """Check a Spark ``StructType`` against the Kafka sink columns.

    Returns the columns to keep (in sink order); raises :class:`ExportSchemaError`
    naming every problem at once.
    """
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in schema.fields}
    problems: list[str] = []
    text_types = (T.StringType, T.BinaryType)

    def check(name: str, ok: bool, expected: str) -> None:
        if name in fields and not ok:
            problems.append(f"column {name!r} is {_type_name(fields[name])}, expected {expected}")

    if "value" not in fields:
        problems.append("required column 'value' (string or binary) is missing")
    check("value", isinstance(fields.get("value"), text_types), "string or binary")
    check("key", isinstance(fields.get("key"), text_types), "string or binary")
    check("topic", isinstance(fields.get("topic"), T.StringType), "string")
    check(
        "partition",
        isinstance(fields.get("partition"), T.IntegerType | T.LongType | T.ShortType),
        "int or long",
    )
    headers = fields.get("headers")
    headers_ok = (
        isinstance(headers, T.ArrayType)
        and isinstance(headers.elementType, T.StructType)
        and [f.name for f in headers.elementType.fields] == ["key", "value"]
        and isinstance(headers.elementType.fields[0].dataType, T.StringType)
        and isinstance(headers.elementType.fields[1].dataType, text_types)
    )
    check("headers", headers_ok, "array<struct<key:string,value:binary>>")
    if topic is None and "topic" not in fields:
        problems.append("no topic: pass topic=... or add a string column 'topic'")
    if problems:
        raise ExportSchemaError(
            "the DataFrame cannot be exported to Kafka: " + "; ".join(problems)
            + f" (schema: {schema.simpleString()})"
        )
    keep = [c for c in SINK_COLUMNS if c in fields]
    if topic is not None and "topic" in keep:
        keep.remove("topic")  # the argument overrides the column
    return keep


# --------------------------------------------------------------------------- export


def export_dataframe(
    df: Any,
    *,
    bootstrap: str,
    topic: str | None = None,
    chunk_rows: int = 10_000,
    max_failed_rows: int = 0,
    add_message_id_header: bool | str = False,
    message_id_prefix: str = "",
    check_topic: bool = True,
    progress: Callable[[ExportProgress], None] | None = None,
    progress_interval: float = 0.5,
    kafka_options: Mapping[str, str] | None = None,
    exactly_once: bool = False,
    export_id: str | None = None,
    ledger_topic: str = DEFAULT_LEDGER_TOPIC,
    commit_interval: float | None = None,
    commit_rows: int | None = None,
    transactional_id_prefix: str = "pipeline-export-",
    verify_skipped: bool = False,
    _fail_first_attempt_after_rows: int | None = None,
    **producer_options: Any,
) -> ExportReport:
    """Export a DataFrame to Kafka through the pipeline producer; one Spark job.

    Args:
        df: a DataFrame with the Kafka sink columns (see the module docstring).
        bootstrap: ``"host:port[,host:port]"``, reachable *from the executors*.
        topic: the topic for every row (overrides a ``topic`` column).
        chunk_rows: rows handed to the producer per ``send_many`` call.
        max_failed_rows: rows per partition that may fail (counted and reported)
            before the task, and so the job, fails. Default 0: any failure fails.
        add_message_id_header: True (header ``pipeline-message-id``) or a header
            name: stamp every record with ``"{message_id_prefix}{partition}-{row}"``.
        check_topic: with ``topic=``, ask the cluster for it on the driver first, so
            a missing topic or a bad bootstrap fails before any task starts.
        progress: called from a driver thread as ``progress(ExportProgress(tasks_done,
            tasks_total, rows, bytes, failed, elapsed, final))`` every
            ``progress_interval`` seconds while the job runs, and once after it with
            ``final=True`` (when it succeeded: every task done, and the report's
            ``delivered``, ``bytes`` and ``failed``). Rows and bytes
            move once per finished task, each row counted once through retries
            (:mod:`pipeline.spark.progress`). An error in the callback is logged (debug)
            and ignored; a slow callback delays only the next report.
        progress_interval: seconds between ``progress`` calls.
        kafka_options: options as written for Spark's own Kafka sink
            (``{"kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.jaas.config": "...PlainLoginModule required username=... ;"}``,
            ``kafka.linger.ms``...; see :mod:`pipeline.spark.options`); keyword
            ``producer_options`` win over them.
        exactly_once: write every row exactly once for ``read_committed`` readers,
            through task retries, speculative tasks and reruns of the export id
            (:mod:`pipeline.spark.exactly_once`; docs/spark-export.md). Each partition
            commits independently: a failed job leaves its committed partitions visible.
        export_id: names the export (letters, digits, ``. _ : -``): its transactional
            ids and ledger markers derive from it, so rerunning a failed export with the
            same id writes only the partitions not yet committed. Default: a fresh id
            per call (retries and speculation inside the job are still exactly-once).
        ledger_topic: the compacted topic of per-partition markers (created if missing,
            replicated as ``topic``).
        commit_interval: seconds a transaction may stay open before it commits what it
            has (default: a third of ``transaction_timeout``, itself 60 s by default).
        commit_rows: also commit every this many rows of a partition (default: by time).
        transactional_id_prefix: transactional ids are
            ``f"{prefix}{export_id}.{spark partition}"`` (for prefixed ACLs).
        verify_skipped: when a job of ``export_id`` finished before, run the job anyway
            to re-read every partition and compare it with what was committed (a
            changed DataFrame or partitioning is then refused); by default such a rerun
            reads and writes nothing and reports every partition skipped.
        producer_options: ``ProducerConfig`` fields (``linger=0.01``, ``compression=
            "zstd"``, ``acks=1``, ``security_protocol="SASL_SSL"``, ``sasl_password=``...,
            ``transaction_timeout=`` for exactly-once), validated here before any task
            starts. Secrets reach the tasks masked and never appear in the report, the
            plan or a task's error.

    Returns the :class:`ExportReport`. Raises :class:`ExportSchemaError` for a bad
    DataFrame, ``ConfigError``/``ValueError`` for a bad option, ``KafkaError`` subclasses
    from the topic check, and :class:`ExportError` when Spark's Python workers cannot
    import pipeline (before the job: one line saying what to set, see
    :mod:`pipeline.spark.workers`) or the job fails (the message is the failing task's
    cause; exactly-once, ``.report`` says what is committed per partition).
    """
    from pipeline.producer._config import make_config
    from pipeline.spark.options import producer_options_from_kafka

    keep = validate_schema(df.schema, topic=topic)
    if not progress_interval > 0:
        raise ValueError(f"progress_interval must be > 0 seconds, not {progress_interval}")
    if kafka_options:
        producer_options = {**producer_options_from_kafka(kafka_options), **producer_options}
    make_config(None, dict(producer_options))  # ConfigError now, not in every task
    if exactly_once:
        export_id = check_options(export_id, max_failed_rows, producer_options,
                                  transactional_id_prefix)
    if add_message_id_header is True:
        header: str | None = DEFAULT_MESSAGE_ID_HEADER
    elif add_message_id_header:
        header = str(add_message_id_header)
    else:
        header = None
    cfg = ExportConfig(
        bootstrap=bootstrap,
        topic=topic,
        producer_options=dict(producer_options),
        chunk_rows=chunk_rows,
        max_failed_rows=max_failed_rows,
        message_id_header=header,
        message_id_prefix=message_id_prefix,
        fail_first_attempt_after_rows=_fail_first_attempt_after_rows,
    )
    notes: list[str] = []
    spark = df.sparkSession
    if (not exactly_once
            and str(spark.conf.get("spark.speculation", "false")).lower() == "true"):
        text = (
            "spark.speculation is on: a speculative copy of a task writes its rows too, "
            "so expect duplicates (delivery is at-least-once); turn it off for exports, "
            "or export with exactly_once=True"
        )
        warnings.warn(text, SpeculationWarning, stacklevel=2)
        notes.append(text)
    if topic is not None and check_topic:
        _check_topic(bootstrap, topic, producer_options)
    problem = worker_python_problem(spark)
    if problem is not None:
        raise ExportError(problem)
    eo = None
    if exactly_once:
        assert export_id is not None
        eo, done = prepare(bootstrap=bootstrap, topic=topic, export_id=export_id,
                           ledger_topic=ledger_topic, producer_options=producer_options,
                           commit_interval=commit_interval, commit_rows=commit_rows,
                           transactional_id_prefix=transactional_id_prefix,
                           verify_done=verify_skipped)
        if done is not None and not verify_skipped:
            notes.append(f"export {export_id!r} finished before (run {done.run_id}, "
                         f"{done.rows:,} rows): nothing was read or written")
            return build_report(skipped_statuses(eo, done), topic=topic, seconds=0.0,
                                warnings=notes, export_id=export_id,
                                ledger_topic=ledger_topic)
        cfg = dataclasses.replace(cfg, exactly_once=eo)

    # Exactly-once: the driver finds the job's tasks by its group after a failure. The
    # progress poller follows the group's jobs: the caller's group when one is set (so
    # that cancelling it still cancels the export), else one of the export's own.
    group = f"pipeline-export-{eo.run_id}" if eo is not None else None
    poller = None
    if progress is not None:
        watched = group or spark.sparkContext.getLocalProperty("spark.jobGroup.id")
        if watched is None:
            group = watched = f"pipeline-export-{uuid.uuid4().hex[:12]}"
        poller = ProgressPoller(spark, progress, group=watched, interval=progress_interval)
    job = df.select(*keep).mapInArrow(
        functools.partial(spark_task, cfg=cfg,
                          counts=poller.counts if poller is not None else None),
        status_schema_ddl(),
    )
    started = time.perf_counter()
    if poller is not None:
        poller.start()
    rows = None
    try:
        with _job_group(spark, group):
            rows = job.collect()  # the one action: a second one would export everything again
    except Exception as exc:
        text = _task_failure_text(exc)
        if eo is None or group is None:
            raise ExportError(text) from exc
        raise _failed_exactly_once(spark, group, text, eo, bootstrap, topic,
                                   producer_options, time.perf_counter() - started,
                                   notes) from exc
    finally:
        if poller is not None:
            poller.stop(len(rows) if rows is not None else None)
    seconds = time.perf_counter() - started
    report = build_report(
        (r.asDict() for r in rows), topic=topic, seconds=seconds, warnings=notes,
        export_id=eo.export_id if eo is not None else None,
        ledger_topic=eo.ledger_topic if eo is not None else None,
    )
    if eo is not None and not eo.done:
        try:
            finish(bootstrap=bootstrap, eo=eo, partitions=len(report.partitions),
                   rows=report.committed_rows, producer_options=producer_options)
        except Exception as exc:  # every partition is committed: only a rerun's shortcut is lost
            log.warning("export %r: every partition is committed, but recording that the "
                        "job finished failed (%s); a rerun with this export id re-reads the "
                        "input and writes nothing", eo.export_id, exc)
    return report


@contextlib.contextmanager
def _job_group(spark: Any, group: str | None) -> Iterator[None]:
    """Tag the export's job (``spark.jobGroup.id``, this thread only) so that the driver
    can find its tasks after a failure; the caller's own group comes back after."""
    if group is None:
        yield
        return
    sc = spark.sparkContext
    previous = sc.getLocalProperty("spark.jobGroup.id")
    sc.setLocalProperty("spark.jobGroup.id", group)
    try:
        yield
    finally:
        sc.setLocalProperty("spark.jobGroup.id", previous)


def _failed_exactly_once(spark: Any, group: str, text: str, eo: ExactlyOnce, bootstrap: str,
                         topic: str | None, producer_options: Mapping[str, Any],
                         seconds: float, notes: list[str]) -> ExportError:
    """The ExportError of a failed exactly-once job, with what is committed per partition."""
    wait_for_tasks(spark, group, limit=30.0)
    statuses = after_failure(bootstrap=bootstrap, eo=eo,
                             partitions=job_partitions(spark, group),
                             succeeded=succeeded_tasks(spark, group),
                             producer_options=producer_options)
    report = build_report(statuses, topic=topic, seconds=seconds, warnings=notes,
                          export_id=eo.export_id, ledger_topic=eo.ledger_topic)
    if statuses:
        summary = (f"; export {eo.export_id!r}: partitions committed "
                   f"{list(report.committed_partitions) or 'none'}, skipped (committed "
                   f"earlier) {list(report.skipped_partitions) or 'none'}, failed "
                   f"{list(report.failed_partitions) or 'none'}; committed partitions stay "
                   f"visible (they commit independently): rerun with export_id="
                   f"{eo.export_id!r} to write only the rest")
    else:
        summary = (f"; export {eo.export_id!r}: what is committed could not be read from "
                   f"the ledger; rerun with export_id={eo.export_id!r} to write only the "
                   "partitions not yet committed")
    return ExportError(text + summary, report=report)


def _check_topic(bootstrap: str, topic: str, producer_options: Mapping[str, Any]) -> None:
    """Ask the cluster for ``topic`` with the producer's own cluster options."""
    import trio

    from pipeline.cluster.errors import BrokerConnectionError
    from pipeline.cluster.pool import Cluster
    from pipeline.producer._config import make_config
    from pipeline.util.groups import unwrap_single_errors

    # The producers' cluster options (and later their security options), with the
    # metadata wait bounded by their request_timeout.
    cfg = make_config(None, dict(producer_options)).cluster
    timeout = cfg.request_timeout

    async def check() -> None:
        async with Cluster.open(bootstrap, cfg, metadata_timeout=timeout) as cluster:
            with trio.move_on_after(timeout) as scope:
                await cluster.partitions_for(topic)
            if scope.cancelled_caught:
                raise cluster.bootstrap_error() or BrokerConnectionError(
                    f"no broker of {bootstrap!r} answered within {timeout}s; "
                    "check the address and that the broker is running"
                )

    with unwrap_single_errors():
        trio.run(check)


_TASK_ERROR = re.compile(r"(?:ExportTaskError|pipeline\.spark\.partition\.ExportTaskError): (.+)")
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def _task_failure_text(exc: BaseException) -> str:
    """The failing task's own message out of Spark's wrapped worker traceback."""
    text = str(exc)
    found: list[str] = _TASK_ERROR.findall(text)
    if found:
        return found[-1].strip()
    missing = _MISSING_MODULE.search(text)
    if missing is not None:
        # A worker (another executor than the probe's, say) lacks pipeline or one of
        # its dependencies.
        return (f"Spark's Python workers cannot import {missing.group(1)}: "
                + worker_python_advice("the workers' Python"))
    # Not ours (an OOM, a lost executor, a Python error in upstream code): keep the
    # last meaningful line, which is the worker exception.
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    interesting = [ln for ln in lines if re.match(r"^[A-Za-z_.]+(Error|Exception): ", ln)]
    detail = interesting[-1] if interesting else (lines[0] if lines else type(exc).__name__)
    return f"the Spark export job failed: {detail}"
