"""``export_dataframe(progress=...)`` on the session's local[1,2] Spark and broker: the
callback sees rows and bytes as export tasks finish, each partition's rows once (a
failed attempt's delivered rows are not counted), and after the job the report's
totals. (Exactly-once: tests/spark/test_exactly_once_spark.py.)"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from pipeline.spark import ExportProgress, export_dataframe

pytestmark = [pytest.mark.spark, pytest.mark.integration]

ROWS, PARTITIONS, FAULT = 4_000, 4, 300
VALUE_BYTES = 24  # every value the same size: a partition's bytes are its rows' times this


def _slow_last_partition(spark: Any) -> Any:
    """4 partitions of 1,000 rows; the first row of the last partition takes 1.5 s (on
    every attempt), so the driver polls while the other partitions are done."""
    from pyspark.sql import functions as F

    first_of_last = ROWS - ROWS // PARTITIONS

    def value(i: int) -> bytes:  # (runs in Spark's Python workers: self-contained)
        import time

        if i == first_of_last:
            time.sleep(1.5)
        return f"{i:0{VALUE_BYTES}d}".encode()

    udf = F.udf(value, "binary", useArrow=False)
    return spark.range(ROWS, numPartitions=PARTITIONS).select(udf(F.col("id")).alias("value"))


def test_rows_and_bytes_per_finished_task_once_through_retries(
    spark: Any, kafka_bootstrap: str, new_topic: Any,
) -> None:
    topic = new_topic(partitions=2)
    seen: list[ExportProgress] = []
    threads: set[str] = set()

    def progress(p: ExportProgress) -> None:
        seen.append(p)
        threads.add(threading.current_thread().name)

    # every task's first attempt delivers 300 rows, then fails; the retry sends all 1,000
    report = export_dataframe(_slow_last_partition(spark), bootstrap=kafka_bootstrap,
                              topic=topic, progress=progress, progress_interval=0.05,
                              linger=0.002, _fail_first_attempt_after_rows=FAULT)
    assert report.retried_partitions == (0, 1, 2, 3)
    assert report.delivered == ROWS and report.bytes == ROWS * VALUE_BYTES

    last = seen[-1]  # after the job: the report's totals
    assert (last.tasks_done, last.tasks_total, last.rows, last.bytes, last.failed) == (
        PARTITIONS, PARTITIONS, report.delivered, report.bytes, report.failed)
    assert last.share == 1.0 and last.final
    running = seen[:-1]
    assert running, "no report while the job ran"
    assert not any(p.final for p in running)
    # Each report counts whole finished tasks, and never a failed attempt's rows (each
    # delivered 300 before failing: those would show as rows not a multiple of 1,000).
    for p in running:
        assert p.rows == p.tasks_done * (ROWS // PARTITIONS), p
        assert p.bytes == p.rows * VALUE_BYTES and p.failed == 0, p
        assert p.tasks_total in (0, PARTITIONS), p
    # while the last partition slept, the others were counted: progress before the end
    assert any(0 < p.tasks_done < PARTITIONS and p.tasks_total == PARTITIONS
               for p in running), running
    assert [p.rows for p in seen] == sorted(p.rows for p in seen)
    assert [p.elapsed for p in seen] == sorted(p.elapsed for p in seen)
    # called from the poller's thread; the last report from the caller's, after the job
    assert "export-progress" in threads
    assert threads <= {"export-progress", threading.current_thread().name}


def test_a_failing_callback_does_not_fail_the_export(
    spark: Any, kafka_bootstrap: str, new_topic: Any,
) -> None:
    topic = new_topic()
    calls = []

    def broken(p: ExportProgress) -> None:
        calls.append(p)
        raise RuntimeError("a progress bar bug")

    df = spark.range(500, numPartitions=2).selectExpr("cast(id as string) as value")
    report = export_dataframe(df, bootstrap=kafka_bootstrap, topic=topic, progress=broken,
                              progress_interval=0.05)
    assert report.ok and report.delivered == 500
    assert calls and calls[-1].rows == 500


def test_a_bad_interval_is_refused(spark: Any, kafka_bootstrap: str) -> None:
    df = spark.range(1).selectExpr("cast(id as string) as value")
    with pytest.raises(ValueError, match="progress_interval must be > 0 seconds, not 0"):
        export_dataframe(df, bootstrap=kafka_bootstrap, topic="x", progress=print,
                         progress_interval=0)
