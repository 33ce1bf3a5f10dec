"""Spark export bench (issue 6): ``export_dataframe`` vs a hand-written ``foreachPartition``
exporter with confluent-kafka's Producer, on the same cached DataFrame in the same run.

1M rows of 100-byte values (``quick``: 200k), 2 Spark partitions, 6 topic partitions,
on the embedded tansu broker. Target: ratio >= 1.0. The logic is
:func:`pipeline.spark.bench.compare_export` (also ``python -m pipeline bench --spark``).
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any


def run(quick: bool = False) -> dict[str, Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from pipeline.spark.bench import compare_export
    from pipeline.testing.broker import EmbeddedBroker, create_topics

    rows = int(os.environ.get("BENCH_EXPORT_ROWS", "200000" if quick else "1000000"))
    spark = (
        SparkSession.builder.master("local[2]").appName("export-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with EmbeddedBroker() as broker:
            return compare_export(spark, broker.bootstrap, rows=rows, value_bytes=100,
                                  partitions=2, topic_partitions=6,
                                  create_topics=functools.partial(create_topics, broker.bootstrap))
    finally:
        spark.stop()


def format_table(report: dict[str, Any]) -> str:
    from pipeline.spark.bench import format_comparison

    return format_comparison(report)
