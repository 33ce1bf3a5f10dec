"""export_dataframe on the session-scoped local[1,2] Spark session, read back with
confluent-kafka (assign mode). The two end-to-end writes (every column; the data source)
run on ``[tansu]`` and ``[kafka]`` (Apache Kafka, ``any_broker``); the rest on the
session broker only (their broker is incidental)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from pipeline.spark import (
    DEFAULT_MESSAGE_ID_HEADER,
    ExportError,
    ExportProgress,
    ExportSchemaError,
    export_dataframe,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration]

HEADERS_T = "array<struct<key:string,value:binary>>"


def _frame(spark: Any, rows: list[tuple[Any, ...]], schema: str, partitions: int = 1) -> Any:
    return spark.createDataFrame(rows, schema).repartition(partitions)


def test_every_column_arrives(
    spark: Any, any_broker: Any, any_new_topic: Any, kafka_records: Any
) -> None:
    kafka_bootstrap, new_topic = any_broker.bootstrap, any_new_topic
    t1, t2 = new_topic(partitions=3), new_topic(partitions=2)
    rows = []
    for i in range(60):
        topic = t1 if i % 3 else t2
        partition = (i % 2) if i % 5 == 0 else None
        headers = [("n", str(i).encode()), ("empty", None)] if i % 4 else None
        key = f"k{i % 7}" if i % 6 else None
        rows.append((key, json.dumps({"i": i}).encode(), headers, topic, partition))
    df = _frame(
        spark, rows,
        f"key string, value binary, headers {HEADERS_T}, topic string, partition int",
        partitions=2,
    )
    report = export_dataframe(df, bootstrap=kafka_bootstrap)

    assert report.ok
    assert report.delivered == report.rows == 60
    assert report.topic is None
    assert len(report.partitions) == 2
    assert sum(report.rows_by_partition.values()) == 60
    assert report.retried_partitions == ()
    got = kafka_records(kafka_bootstrap, t1, 40) + kafka_records(kafka_bootstrap, t2, 20)
    assert len(got) == 60
    by_i = {json.loads(m.value())["i"]: m for m in got}
    assert sorted(by_i) == list(range(60))
    for key, value, headers, topic, partition in rows:
        msg = by_i[json.loads(value)["i"]]
        assert msg.topic() == topic
        assert msg.key() == (key.encode() if key is not None else None)
        assert (msg.headers() or None) == (headers or None)
        if partition is not None:
            assert msg.partition() == partition


def test_topic_argument_overrides_column_and_message_ids(
    spark: Any, kafka_bootstrap: str, new_topic: Any, kafka_records: Any
) -> None:
    topic = new_topic(partitions=2)
    df = spark.range(500, numPartitions=2).selectExpr(
        "cast(id as string) as value", "concat('k', cast(id % 10 as string)) as key",
        "'no-such-topic' as topic",
    )
    report = export_dataframe(
        df, bootstrap=kafka_bootstrap, topic=topic, add_message_id_header=True,
        message_id_prefix="job1-", chunk_rows=64, linger=0.001,
    )
    assert report.topic == topic
    assert report.delivered == 500
    assert report.bytes > 0
    assert report.rows_per_second > 0
    assert report.mb_per_second > 0
    got = kafka_records(kafka_bootstrap, topic, 500)
    assert len(got) == 500
    ids = {dict(m.headers())[DEFAULT_MESSAGE_ID_HEADER].decode() for m in got}
    assert len(ids) == 500
    assert all(i.startswith("job1-") for i in ids)
    # per-key order inside one Spark partition is kept (one task per key here: value order)
    text = report.format()
    assert "500 of 500 rows" in text
    assert "retried partitions: none" in text


@pytest.mark.parametrize(
    ("schema", "rows", "topic", "needle"),
    [
        ("key string", [("a",)], "t", "required column 'value'"),
        ("value int", [(1,)], "t", "column 'value' is int"),
        ("value string, key int", [("v", 1)], "t", "column 'key' is int"),
        ("value string, headers array<string>", [("v", ["x"])], "t", "column 'headers'"),
        ("value string, partition string", [("v", "0")], "t", "column 'partition' is string"),
        ("value string", [("v",)], None, "no topic"),
    ],
)
def test_schema_errors_before_any_task(
    spark: Any, kafka_bootstrap: str, schema: str, rows: list[Any], topic: str | None, needle: str
) -> None:
    tracker = spark.sparkContext.statusTracker()
    df = spark.createDataFrame(rows, schema)
    jobs_before = len(tracker.getJobIdsForGroup(None))
    with pytest.raises(ExportSchemaError, match=needle):
        export_dataframe(df, bootstrap=kafka_bootstrap, topic=topic)
    assert len(tracker.getJobIdsForGroup(None)) == jobs_before  # no job ran


def test_unknown_topic_fails_the_job(spark: Any, kafka_bootstrap: str) -> None:
    from pipeline.cluster.errors import UnknownTopicError

    df = spark.range(10).selectExpr("cast(id as string) as value")
    # with topic=: the driver checks the topic before any task starts
    with pytest.raises(UnknownTopicError, match="does-not-exist-1"):
        export_dataframe(df, bootstrap=kafka_bootstrap, topic="does-not-exist-1")
    # from a topic column: the task fails (twice under local[1,2]) and so the job
    df2 = df.selectExpr("value", "'does-not-exist-2' as topic")
    with pytest.raises(ExportError) as info:
        export_dataframe(df2, bootstrap=kafka_bootstrap, linger=0.001)
    text = str(info.value)
    assert "UnknownTopicError" in text
    assert "does-not-exist-2" in text
    assert "not delivered" in text
    assert "\n" not in text


def test_failed_rows_within_tolerance_are_reported(
    spark: Any, kafka_bootstrap: str, new_topic: Any
) -> None:
    topic = new_topic()
    df = spark.range(100, numPartitions=1).selectExpr(
        "cast(id as string) as value",
        f"if(id % 10 = 0, 'missing-topic-x', '{topic}') as topic",
    )
    report = export_dataframe(df, bootstrap=kafka_bootstrap, max_failed_rows=50, chunk_rows=25)
    assert report.failed == 10
    assert report.delivered == 90
    assert not report.ok
    assert report.first_error is not None
    assert "UnknownTopicError" in report.first_error


def test_task_retry_is_flagged_and_at_least_once(
    spark: Any, kafka_bootstrap: str, new_topic: Any, kafka_records: Any
) -> None:
    topic = new_topic(partitions=2)
    df = spark.range(1000, numPartitions=2).selectExpr(
        "cast(id as string) as value", "concat('k', cast(id % 13 as string)) as key"
    )
    report = export_dataframe(
        df, bootstrap=kafka_bootstrap, topic=topic, add_message_id_header=True,
        chunk_rows=100, _fail_first_attempt_after_rows=150, linger=0.001,
    )
    assert report.retried_partitions == (0, 1)
    assert all(p.attempt == 1 for p in report.partitions)
    assert report.delivered == 1000  # the successful attempts
    assert "RETRY" in report.format()
    got = kafka_records(kafka_bootstrap, topic, 1300)
    assert len(got) == 1300  # 150 rows per partition were written twice: at-least-once
    ids = Counter(dict(m.headers())[DEFAULT_MESSAGE_ID_HEADER] for m in got)
    assert len(ids) == 1000  # deduplicating on the message id gives every row exactly once
    assert sorted(Counter(ids.values()).items()) == [(1, 700), (2, 300)]
    assert {int(m.value()) for m in got} == set(range(1000))


def test_bad_producer_option_fails_before_any_task(spark: Any, kafka_bootstrap: str) -> None:
    from pipeline.producer._errors import ConfigError

    df = spark.range(1).selectExpr("cast(id as string) as value")
    with pytest.raises(ConfigError, match="lingr"):
        export_dataframe(df, bootstrap=kafka_bootstrap, topic="x", lingr=0.1)


def test_progress_callback_and_empty_partitions(
    spark: Any, kafka_bootstrap: str, new_topic: Any
) -> None:
    topic = new_topic()
    seen: list[ExportProgress] = []
    df = spark.range(3, numPartitions=1).selectExpr("cast(id as string) as value").repartition(4)
    report = export_dataframe(df, bootstrap=kafka_bootstrap, topic=topic, progress=seen.append)
    assert report.delivered == 3
    assert len(report.partitions) == 4
    assert sorted(p.rows for p in report.partitions)[0] == 0  # an empty partition reports too
    # the last report, after the job: every task (the empty ones too) and every row
    last = seen[-1]
    assert (last.tasks_done, last.tasks_total, last.rows, last.bytes, last.failed) == (
        4, 4, 3, report.bytes, 0)


def test_datasource_write(
    spark: Any, any_broker: Any, any_new_topic: Any, kafka_records: Any
) -> None:
    from pipeline.spark.datasource import register

    kafka_bootstrap, new_topic = any_broker.bootstrap, any_new_topic
    register(spark)
    topic = new_topic(partitions=2)
    df = spark.range(200, numPartitions=2).selectExpr(
        "cast(id as string) as value", "cast(id % 5 as string) as key"
    )
    (
        df.write.format("pipeline-kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("topic", topic)
        .option("kafka.linger.ms", "1")
        .option("messageIdHeader", "true")
        .mode("append")
        .save()
    )
    got = kafka_records(kafka_bootstrap, topic, 200)
    assert sorted(int(m.value()) for m in got) == list(range(200))
    assert all(DEFAULT_MESSAGE_ID_HEADER in dict(m.headers()) for m in got)


@pytest.mark.parametrize("request_timeout", [30.0, 1.0])
def test_an_unreachable_bootstrap_fails_before_any_task_naming_the_cause(
    spark: Any, request_timeout: float
) -> None:
    """The topic check on the driver fails within connect_timeout (or the shorter
    request_timeout), with the cause of each bootstrap address."""
    import socket
    import time

    from pipeline import BootstrapError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: refused
    df = spark.range(3).selectExpr("cast(id as string) as value")
    started = time.monotonic()
    with pytest.raises(BootstrapError) as info:
        export_dataframe(df, bootstrap=f"127.0.0.1:{port}", topic="t",
                         request_timeout=request_timeout, connect_timeout=2.0)
    assert time.monotonic() - started < 2.0 + 1.0
    assert info.value.causes == {f"127.0.0.1:{port}": "connection refused"}
