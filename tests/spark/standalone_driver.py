"""The Spark driver of tests/spark/test_exactly_once_standalone.py, in a process of its own.

A Python process holds one SparkContext, and the test session's is ``local[1,2]`` (the
``spark`` fixture); a driver on a standalone cluster therefore runs here:

    python tests/spark/standalone_driver.py '<session settings as JSON>'

It starts its SparkSession with those settings, waits for the cluster's executors, and
answers one JSON request per line on stdin with one JSON line on stdout:

* ``{"op": "export", "frame": {...}, "options": {...}}``: ``export_dataframe`` of
  :func:`frame` (its arguments) with ``options``; answers ``{"report": to_dict(),
  "format": format()}`` or ``{"error": ...}``;
* ``{"op": "stop"}``: stops the session (which completes Spark's event log) and exits.

Its first line is ``{"executors": [...], "application": ...}`` once the executors are
there. Spark's JVM inherits this process's stdout, so the answers go to a duplicate of it
and fd 1 is pointed at stderr first. Run as a script, its UDF is pickled by value: the
executors need ``pipeline`` only, not this file.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any


def frame(spark: Any, *, rows: int, partitions: int, fail_at: int | None,
          slow_partition: int | None = None, slow_from: int = 0,
          slow_seconds: float = 0.0) -> Any:
    """``rows`` rows (``spark.range``, deterministic) in ``partitions`` partitions of
    (key, value); the value comes from a Python UDF that, on a task's first attempt
    (attempt 0):

    * in ``slow_partition``, runs at full speed up to its row ``slow_from`` and then
      crawls, reaching ``fail_at`` only after ``slow_seconds`` (a straggler: Spark
      speculates it, a copy finishes first and Spark kills it);
    * raises when it reaches row ``fail_at`` of its partition (every partition).

    Later attempts (retries, speculative copies) run at full speed and succeed. Values
    are the row id in 10 digits, padded to 200 bytes (as in test_exactly_once_spark.py)."""
    from pyspark.sql import functions as F

    per = rows // partitions
    pause = slow_seconds / max(1, (fail_at or per) - slow_from)

    def make_value(i: int) -> bytes:  # (runs in Spark's Python workers: self-contained)
        import time

        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.attemptNumber() == 0:
            if ctx.partitionId() == slow_partition and i % per >= slow_from:
                time.sleep(pause)
            if fail_at is not None and i % per == fail_at:
                raise RuntimeError(f"UDF fails on purpose at row {i} (attempt 0)")
        return f"{i:010d}".encode().ljust(200, b".")

    value = F.udf(make_value, "binary", useArrow=False)
    return spark.range(rows, numPartitions=partitions).select(
        F.concat(F.lit("k"), (F.col("id") % 97).cast("string")).alias("key"),
        value(F.col("id")).alias("value"))


def main() -> None:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    settings: dict[str, str] = json.loads(sys.argv[1])
    # PySpark starts its Python workers with PYSPARK_PYTHON as it is when the context starts
    os.environ["PYSPARK_PYTHON"] = settings["spark.pyspark.python"]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from pyspark.sql import SparkSession

    from pipeline.spark import export_dataframe
    from pipeline.testing.spark_standalone import wait_for_executors

    builder = SparkSession.builder.appName("pipeline-standalone-export")
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    executors = wait_for_executors(spark, int(settings["spark.cores.max"]) //
                                   int(settings["spark.executor.cores"]))

    def answer(message: dict[str, Any]) -> None:
        answers.write(json.dumps(message) + "\n")

    answer({"executors": executors, "application": spark.sparkContext.applicationId})
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "stop":
            spark.stop()
            answer({"stopped": True})
            return
        try:
            report = export_dataframe(frame(spark, **request["frame"]), **request["options"])
            answer({"report": report.to_dict(), "format": report.format()})
        except Exception as exc:
            answer({"error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()})


if __name__ == "__main__":
    main()
