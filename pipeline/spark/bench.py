"""Export throughput: ``export_dataframe`` vs a hand-written ``foreachPartition`` exporter.

The baseline is what people write without this package: ``df.foreachPartition`` with a
confluent-kafka ``Producer`` per partition, ``produce()`` per ``Row`` and a final
``flush()``. Both run on the same cached DataFrame, in the same Spark session, against
the same broker, each into its own topic; both counts are checked on the broker (sum
of high watermarks) so a fast-but-lossy run cannot win.

Used by ``python -m pipeline bench --spark`` and ``bench/export_bench.py`` (``make bench``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any

#: ``create_topics({name: partitions})``: how the caller makes topics on its broker
#: (the CLI and ``bench/export_bench.py`` pass ``pipeline.testing.broker.create_topics``;
#: the spark layer does not import the testing kit).
CreateTopics = Callable[[Mapping[str, int]], object]

__all__ = ["CreateTopics", "compare_export", "confluent_partition_exporter", "format_comparison"]


def confluent_partition_exporter(rows: Iterator[Any], bootstrap: str, topic: str) -> None:
    """The baseline: one confluent-kafka Producer per partition, produce() per Row."""
    from confluent_kafka import KafkaException, Producer

    producer = Producer({
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "linger.ms": 5,
        "enable.idempotence": False,
    })
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None and len(errors) < 5:
            errors.append(str(err))

    for row in rows:
        while True:
            try:
                producer.produce(topic, value=row.value, key=row.key, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    remaining = producer.flush(120)
    if remaining or errors:
        raise KafkaException(f"{remaining} undelivered; errors: {errors}")


def _high_watermark_sum(bootstrap: str, topic: str) -> int:
    import trio

    from pipeline.consumer import topic_offsets

    offsets = trio.run(topic_offsets, bootstrap, topic)
    return sum(hi - lo for lo, hi in offsets.values())


def compare_export(
    spark: Any,
    bootstrap: str,
    *,
    create_topics: CreateTopics,
    rows: int = 1_000_000,
    value_bytes: int = 100,
    partitions: int = 2,
    topic_partitions: int = 6,
    keys: int = 10_000,
    **producer_options: Any,
) -> dict[str, Any]:
    """Run both exporters once on the same DataFrame; return the measurements.

    ``create_topics({name: partitions})`` creates the two topics on the broker.
    """
    import functools

    from pyspark.sql import functions as F

    from pipeline.spark.export import export_dataframe

    tag = uuid.uuid4().hex[:6]
    ours_topic, base_topic = f"bench-export-{tag}", f"bench-foreach-{tag}"
    create_topics({ours_topic: topic_partitions, base_topic: topic_partitions})
    df = (
        spark.range(rows, numPartitions=partitions)
        .select(
            F.concat(F.lit("k-"), (F.col("id") % keys).cast("string")).cast("binary").alias("key"),
            F.expr(f"repeat('x', {value_bytes})").cast("binary").alias("value"),
        )
        .cache()
    )
    df.count()  # materialize the cache: neither exporter pays for generating rows

    started = time.perf_counter()
    df.foreachPartition(
        functools.partial(confluent_partition_exporter, bootstrap=bootstrap, topic=base_topic)
    )
    base_seconds = time.perf_counter() - started

    report = export_dataframe(df, bootstrap=bootstrap, topic=ours_topic, **producer_options)
    df.unpersist()

    base_count = _high_watermark_sum(bootstrap, base_topic)
    ours_count = _high_watermark_sum(bootstrap, ours_topic)
    base_rate = rows / base_seconds
    return {
        "rows": rows,
        "value_bytes": value_bytes,
        "spark_partitions": partitions,
        "topic_partitions": topic_partitions,
        "pipeline_seconds": round(report.seconds, 3),
        "pipeline_rows_per_s": round(report.rows_per_second, 1),
        "pipeline_mb_per_s": round(report.mb_per_second, 2),
        "pipeline_rows_on_broker": ours_count,
        "foreach_confluent_seconds": round(base_seconds, 3),
        "foreach_confluent_rows_per_s": round(base_rate, 1),
        "foreach_confluent_rows_on_broker": base_count,
        "ratio": round(report.rows_per_second / base_rate, 3) if base_rate else None,
        "producer_options": {k: repr(v) for k, v in producer_options.items()},
    }


def format_comparison(result: dict[str, Any]) -> str:
    return "\n".join([
        f"export of {result['rows']:,} rows x {result['value_bytes']} B values, "
        f"{result['spark_partitions']} Spark partitions -> {result['topic_partitions']} "
        "topic partitions (same cached DataFrame, same session)",
        f"  pipeline export_dataframe (mapInArrow + trio): "
        f"{result['pipeline_rows_per_s']:>12,.0f} rows/s  ({result['pipeline_seconds']} s, "
        f"{result['pipeline_rows_on_broker']:,} on broker)",
        f"  foreachPartition + confluent-kafka Producer:   "
        f"{result['foreach_confluent_rows_per_s']:>12,.0f} rows/s  "
        f"({result['foreach_confluent_seconds']} s, "
        f"{result['foreach_confluent_rows_on_broker']:,} on broker)",
        f"  ratio (pipeline / baseline): {result['ratio']}x  (target >= 1.0x)",
    ])
