"""Spark's own Kafka sink from ``kafka_sink_jars()``, and the export bench on a tiny frame.

The session fixture starts Spark with ``spark.jars = kafka_sink_jars()`` (PySpark's own
jars left out), so a working ``format("kafka")`` here proves that set is complete and
conflict-free. The bench's numbers are not checked, only that every writer ran, was read
back and judged, and that the judging can fail.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline.spark.bench import compare_export, format_comparison
from pipeline.spark.bench_writers import WRITERS, bench_frame, read_back, sample_rows
from pipeline.testing.broker import create_topics

pytestmark = [pytest.mark.spark, pytest.mark.integration]

_REPO_ROOT = str(Path(__file__).resolve().parents[2])


def test_spark_own_kafka_sink_runs_from_the_fetched_jars(
        spark: Any, sink_jars: Any, kafka_bootstrap: str, new_topic: Any,
        kafka_records: Any) -> None:
    sink_jars.require()
    assert not any("scala-library" in j or "slf4j" in j for j in sink_jars.jars)
    topic = new_topic(partitions=3)
    df = spark.createDataFrame(
        [(f"k{i % 4}", f"v{i}".encode(), [("h", str(i).encode())]) for i in range(30)],
        "key string, value binary, headers array<struct<key:string,value:binary>>")
    (df.write.format("kafka").option("kafka.bootstrap.servers", kafka_bootstrap)
     .option("topic", topic).option("includeHeaders", "true").save())
    got = kafka_records(kafka_bootstrap, topic, 30)
    assert sorted(m.value() for m in got) == sorted(f"v{i}".encode() for i in range(30))
    for m in got:
        i = int(m.value()[1:])
        assert m.key() == f"k{i % 4}".encode()
        assert m.headers() == [("h", str(i).encode())]


def test_export_bench_runs_and_verifies_every_writer(
        spark: Any, sink_jars: Any, kafka_bootstrap: str, tmp_path: Path) -> None:
    sink_jars.require()
    lines: list[str] = []
    seen: list[Any] = []
    report = compare_export(
        spark, kafka_bootstrap, rows=400, rounds=1, warmup_rows=50, topic_partitions=3,
        create_topics=lambda topics: create_topics(kafka_bootstrap, dict(topics)),
        log=lines.append, progress=seen.append)
    json.dumps(report)
    # the progress of the measured pipeline runs (one per shape; not the warm-up's)
    assert [(p.rows, p.tasks_done) for p in seen if p.final] == [(400, 2), (400, 2)]
    for shape in ("plain", "keyed_headers"):
        for writer in WRITERS:
            row = report["results"][shape][writer]
            assert row["status"] == "ok", (shape, writer, row)
            assert row["rows_per_s"] > 0 and row["min"] <= row["rows_per_s"] <= row["max"]
        assert set(report["ratios"][shape]) == {"vs_foreach", "vs_spark_kafka", "vs_noop_arrow"}
    for run in report["runs"]:
        verify = run["verify"]
        if run["writer"] == "noop_arrow":
            assert verify["rows_seen"] == 400
        else:  # read back by confluent-kafka: every row once, the sample exact
            assert verify["records"] == verify["distinct_ids"] == 400
            assert verify["sample_checked"] > 0 and verify["sample_bad"] == []
    assert {t["verdict"] for t in report["targets"]} <= {"PASS", "MISS"}
    assert len(report["targets"]) == 4
    assert report["meta"]["loadavg_before"] and report["meta"]["date"]
    table = format_comparison(report)
    assert "Spark format(\"kafka\") sink" in table and "targets:" in table
    assert any("keyed_headers" in line and "spark_kafka" in line for line in lines)
    if _REPO_ROOT not in sys.path:
        sys.path.insert(0, _REPO_ROOT)
    pytest.importorskip("matplotlib")
    from bench.charts import export_chart

    png = export_chart(report, tmp_path / "export.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_read_back_catches_loss_duplicates_and_changed_rows(
        spark: Any, kafka_bootstrap: str, new_topic: Any) -> None:
    """The bench's judge can fail: one row missing, one written twice, one header changed."""
    from confluent_kafka import Producer

    df = bench_frame(spark, "keyed_headers", 50, partitions=1)
    try:
        rows = [r.asDict() for r in df.collect()]
        sample = sample_rows(df, 50, target=50)  # every row
    finally:
        df.unpersist()
    assert len(sample) == 50
    topic = new_topic(partitions=3)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "partitioner": "murmur2_random"})
    for i, row in enumerate(rows):
        if i == 7:
            continue  # lost
        headers = [(h["key"], bytes(h["value"])) for h in row["headers"]]
        if i == 9:
            headers[0] = (headers[0][0], b"changed")
        produce = {"key": row["key"].encode(), "headers": headers}
        producer.produce(topic, row["value"].encode(), **produce)
        if i == 11:
            producer.produce(topic, row["value"].encode(), **produce)  # duplicate
    assert producer.flush(30) == 0
    verdict = read_back(kafka_bootstrap, topic, rows=50, partitions=3, sample=sample,
                        keyed=True, timeout=30)
    assert verdict["ok"] is False
    assert verdict["records"] == 50 and verdict["distinct_ids"] == 49
    assert verdict["duplicates"] == 1 and verdict["missing"] == 1
    assert sorted(verdict["sample_bad"]) == ["000000000007", "000000000009"]
