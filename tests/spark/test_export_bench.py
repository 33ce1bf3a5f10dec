"""Spark's own Kafka sink from ``kafka_sink_jars()``, and the export bench on a tiny frame.

The session fixture starts Spark with ``spark.jars = kafka_sink_jars()`` (PySpark's own
jars left out), so a working ``format("kafka")`` here proves that set is complete and
conflict-free. The bench's numbers are not checked, only that every writer ran, was read
back and judged, and that the judging can fail. The exactly-once writer needs a broker
that isolates transactions: on the session broker (tansu) the bench reports it n/a, and
the probe that decides so is run on tansu and on Apache Kafka; on Apache Kafka it runs,
is read back at read_committed and gets its targets' verdicts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pipeline.spark.bench import TARGETS, compare_export, format_comparison
from pipeline.spark.bench_writers import (
    WRITERS,
    bench_frame,
    read_back,
    sample_rows,
    transactions_reason,
)
from pipeline.testing.broker import create_topics

if TYPE_CHECKING:
    from pipeline.testing.kafka import KafkaCluster

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
        spark: Any, sink_jars: Any, kafka_bootstrap: str, broker_kind: str,
        tmp_path: Path) -> None:
    """Every writer on the session broker; on tansu, which does not isolate transactions,
    the exactly-once writer is n/a with that reason (and so are its targets)."""
    sink_jars.require()
    isolates = broker_kind != "tansu"
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
            if writer == "pipeline_eos" and not isolates:
                assert row["status"] == "n/a", row
                assert "does not isolate transactions" in row["reason"]
                assert "aborted transaction" in row["reason"]
                assert "--broker kafka" in row["reason"]
                continue
            assert row["status"] == "ok", (shape, writer, row)
            assert row["rows_per_s"] > 0 and row["min"] <= row["rows_per_s"] <= row["max"]
        others = {"vs_foreach", "vs_spark_kafka", "vs_noop_arrow"}
        if isolates:
            others |= {"vs_pipeline_eos"} | {f"pipeline_eos_vs_{w}" for w in WRITERS
                                             if w != "pipeline_eos"}
        assert set(report["ratios"][shape]) == others
    assert {r["writer"] for r in report["runs"]} == set(WRITERS) - (
        set() if isolates else {"pipeline_eos"})
    for run in report["runs"]:
        verify = run["verify"]
        if run["writer"] == "noop_arrow":
            assert verify["rows_seen"] == 400
        else:  # read back by confluent-kafka: every row once, the sample exact
            assert verify["records"] == verify["distinct_ids"] == 400
            assert verify["sample_checked"] > 0 and verify["sample_bad"] == []
            assert verify["isolation"] == "read_committed"
    assert len(report["targets"]) == 2 * len(TARGETS)
    for t in report["targets"]:
        if t["numerator"] == "pipeline_eos" and not isolates:
            assert (t["verdict"], t["reason"]) == ("n/a", "pipeline_eos: n/a")
        else:
            assert t["verdict"] in ("PASS", "MISS"), t
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


def test_the_probe_tells_a_broker_that_isolates_transactions_from_one_that_does_not(
        any_broker: Any, any_new_topic: Any) -> None:
    """tansu takes every transaction request but shows a read_committed reader the
    aborted record: the exactly-once writer cannot be judged there. Apache Kafka shows
    the committed record alone."""
    reason = transactions_reason(any_broker.bootstrap, any_new_topic(1), timeout=30)
    if any_broker.kind == "kafka":
        assert reason is None
    elif any_broker.kind == "tansu":
        assert reason is not None
        assert reason.startswith("the broker does not isolate transactions: a read_committed "
                                 "reader saw a record of an aborted transaction")
    else:
        pytest.skip(f"an external broker ({any_broker.kind}): either answer may be right")


@pytest.mark.kafka
def test_read_back_at_read_committed_counts_each_committed_row_once(
        kafka_single: KafkaCluster, kafka_topic: Any) -> None:
    """A transactional topic: rows 0-49 committed, rows 10-19 again in an aborted
    transaction. At read_committed the judge counts each row once (records, not offsets:
    the markers take offsets too); at read_uncommitted it sees the aborted copies and
    fails the run, so the isolation the exactly-once writer is judged at matters."""
    from confluent_kafka import Producer

    bootstrap, topic = kafka_single.bootstrap, kafka_topic("readback-eos")
    kafka_single.create_topic(topic, 3, replication_factor=1)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(50):
        producer.produce(topic, f"{i:012d}-v".encode(), partition=i % 3)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(10, 20):
        producer.produce(topic, f"{i:012d}-v".encode(), partition=i % 3)
    producer.flush(30)
    producer.abort_transaction(30)
    del producer
    committed = read_back(bootstrap, topic, rows=50, partitions=3, sample={}, keyed=False,
                          isolation="read_committed", timeout=30)
    assert committed["ok"] is True, committed
    assert (committed["records"], committed["duplicates"], committed["complete"]) == (
        50, 0, True)
    everything = read_back(bootstrap, topic, rows=50, partitions=3, sample={}, keyed=False,
                           isolation="read_uncommitted", timeout=30)
    assert everything["ok"] is False
    assert (everything["records"], everything["duplicates"], everything["missing"]) == (
        60, 10, 0)


@pytest.mark.kafka
def test_the_exactly_once_writer_runs_on_apache_kafka_and_gets_its_verdicts(
        spark: Any, sink_jars: Any, kafka_single: KafkaCluster) -> None:
    """On a broker that isolates transactions the exactly-once writer runs (a transaction
    per Spark partition at least), its topic is read back at read_committed with every
    row once, and both its targets get a verdict with per-round ratios."""
    sink_jars.require()

    def create(topics: Any) -> None:
        for name, partitions in topics.items():
            kafka_single.create_topic(name, partitions, replication_factor=1)

    report = compare_export(
        spark, kafka_single.bootstrap, rows=400, rounds=1, warmup_rows=50,
        topic_partitions=3, shapes=["keyed_headers"],
        writers=["pipeline", "pipeline_eos", "spark_kafka"], create_topics=create)
    row = report["results"]["keyed_headers"]["pipeline_eos"]
    assert row["status"] == "ok", row
    (run,) = [r for r in report["runs"] if r["writer"] == "pipeline_eos"]
    assert run["delivered"] == run["committed_rows"] == 400
    assert run["transactions"] >= 2  # one per Spark partition at least
    verify = run["verify"]
    assert verify["isolation"] == "read_committed" and verify["ok"], verify
    assert verify["records"] == verify["distinct_ids"] == 400 and verify["sample_bad"] == []
    eos = {t["denominator"]: t for t in report["targets"] if t["numerator"] == "pipeline_eos"}
    assert set(eos) == {"pipeline", "spark_kafka"}
    for t in eos.values():
        assert t["verdict"] in ("PASS", "MISS") and len(t["rounds"]) == 1, t
    ratios = report["ratios"]["keyed_headers"]
    assert ratios["pipeline_eos_vs_pipeline"]["median"] == eos["pipeline"]["ratio"]
    table = format_comparison(report)
    assert "pipeline export_dataframe, exactly once" in table
    assert "pipeline_eos >= 0.8x pipeline" in table
