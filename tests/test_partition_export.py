"""The per-partition export without Spark: Arrow batches in, a status out, against the
session broker; plus the report builder and the driver's schema/option checks."""

from __future__ import annotations

import time
import warnings
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")

from pipeline.consumer import consume  # noqa: E402
from pipeline.spark.export import build_report  # noqa: E402
from pipeline.spark.partition import (  # noqa: E402
    DEFAULT_MESSAGE_ID_HEADER,
    STATUS_COLUMNS,
    ExportConfig,
    ExportTaskError,
    PartitionStatus,
    export_partition,
    status_batch,
)

integration = pytest.mark.integration  # the tests that need the session broker

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def _batch(start: int, n: int, *, headers: bool = True, partition: bool = False) -> Any:
    cols: dict[str, Any] = {
        "key": pa.array([f"k{i % 5}" for i in range(start, start + n)]),
        "value": pa.array([f"v{i}".encode() for i in range(start, start + n)], pa.binary()),
    }
    if headers:
        cols["headers"] = pa.array(
            [
                None if i % 7 == 0 else [{"key": "i", "value": str(i).encode()}] * (1 + i % 3)
                for i in range(start, start + n)
            ],
            HEADERS,
        )
    if partition:
        cols["partition"] = pa.array([i % 2 for i in range(start, start + n)], pa.int32())
    return pa.RecordBatch.from_pydict(cols)


@integration
def test_rows_arrive_with_key_value_headers_partition(kafka_bootstrap: str, new_topic: Any) -> None:
    topic = new_topic(partitions=2)
    batches = [_batch(0, 250, partition=True), _batch(250, 250, partition=True)]
    cfg = ExportConfig(bootstrap=kafka_bootstrap, topic=topic, chunk_rows=100,
                       producer_options={"linger": 0.001})
    status = export_partition(iter(batches), cfg, partition=4, attempt=0)
    assert (status.partition, status.rows, status.delivered, status.failed) == (4, 500, 500, 0)
    assert status.bytes == sum(len(f"k{i % 5}") + len(f"v{i}") for i in range(500))
    assert status.first_error is None
    assert status.seconds > 0
    got = consume(kafka_bootstrap, topic, timeout=20)
    assert len(got) == 500
    for rec in got:
        i = int(rec.value[1:])  # type: ignore[index]
        assert rec.key == f"k{i % 5}".encode()
        assert rec.partition == i % 2
        want = () if i % 7 == 0 else (("i", str(i).encode()),) * (1 + i % 3)
        assert rec.headers == want
    # per-partition order is the input order
    for p in (0, 1):
        values = [int(r.value[1:]) for r in got if r.partition == p]  # type: ignore[index]
        assert values == sorted(values)


@integration
def test_string_columns_topic_column_and_message_ids(kafka_bootstrap: str, new_topic: Any) -> None:
    t1, t2 = new_topic(), new_topic()
    batch = pa.RecordBatch.from_pydict({
        "value": pa.array([f"s{i}" for i in range(40)]),  # string, not binary
        "topic": pa.array([t1 if i % 2 else t2 for i in range(40)]),
    })
    cfg = ExportConfig(bootstrap=kafka_bootstrap, message_id_header=DEFAULT_MESSAGE_ID_HEADER,
                       message_id_prefix="run7-", chunk_rows=16)
    status = export_partition([batch], cfg, partition=3)
    assert status.delivered == 40
    got = consume(kafka_bootstrap, t1, timeout=20) + consume(kafka_bootstrap, t2, timeout=20)
    ids = sorted(dict(r.headers)[DEFAULT_MESSAGE_ID_HEADER] for r in got)  # type: ignore[type-var]
    assert ids == sorted(f"run7-3-{i}".encode() for i in range(40))
    assert {r.value for r in got if r.topic == t1} == {f"s{i}".encode() for i in range(1, 40, 2)}


def test_empty_partition_needs_no_broker() -> None:
    cfg = ExportConfig(bootstrap="127.0.0.1:1", topic="t")
    status = export_partition(iter([]), cfg, partition=9, attempt=2)
    assert (status.rows, status.delivered, status.failed, status.attempt) == (0, 0, 0, 2)


@integration
def test_unknown_topic_fails_with_the_cause(kafka_bootstrap: str) -> None:
    cfg = ExportConfig(bootstrap=kafka_bootstrap, topic="no-such-topic-pure")
    with pytest.raises(ExportTaskError) as info:
        export_partition([_batch(0, 30)], cfg, partition=1, attempt=0)
    text = str(info.value)
    assert "partition 1 (attempt 0)" in text
    assert "UnknownTopicError" in text
    assert "no-such-topic-pure" in text


@integration
def test_failures_within_tolerance_are_counted(kafka_bootstrap: str, new_topic: Any) -> None:
    topic = new_topic()
    # one oversized row (refused by the producer before sending) and nine good ones
    values = [b"x" * 20_000 if i == 3 else b"ok" for i in range(10)]
    batch = pa.RecordBatch.from_pydict({"value": pa.array(values, pa.binary())})
    cfg = ExportConfig(bootstrap=kafka_bootstrap, topic=topic, max_failed_rows=1,
                       producer_options={"max_message_bytes": 10_000})
    status = export_partition([batch], cfg)
    assert (status.delivered, status.failed) == (9, 1)
    assert status.first_error is not None
    assert "MessageTooLargeError" in status.first_error
    strict = ExportConfig(bootstrap=kafka_bootstrap, topic=topic,
                          producer_options={"max_message_bytes": 10_000})
    with pytest.raises(ExportTaskError, match="1 row"):
        export_partition([batch], strict)


@integration
def test_injected_fault_only_on_first_attempt(kafka_bootstrap: str, new_topic: Any) -> None:
    topic = new_topic()
    cfg = ExportConfig(bootstrap=kafka_bootstrap, topic=topic, chunk_rows=40,
                       fail_first_attempt_after_rows=100, message_id_header="id")
    batches = [_batch(0, 300, headers=False)]
    with pytest.raises(ExportTaskError, match="injected fault"):
        export_partition(batches, cfg, partition=0, attempt=0)
    status = export_partition(batches, cfg, partition=0, attempt=1)  # the "retry"
    assert status.delivered == 300
    got = consume(kafka_bootstrap, topic, timeout=20)
    assert len(got) == 400  # exactly 100 delivered twice: at-least-once
    ids = [dict(r.headers)["id"] for r in got]
    assert len(set(ids)) == 300  # the stable id identifies the duplicates


def test_unreachable_bootstrap_fails_the_task() -> None:
    cfg = ExportConfig(bootstrap="127.0.0.1:1", topic="t",
                       producer_options={"request_timeout": 1.0})
    started = time.monotonic()
    with pytest.raises(ExportTaskError, match=r"127\.0\.0\.1:1"):
        export_partition([_batch(0, 5)], cfg)
    assert time.monotonic() - started < 15


def test_status_batch_types_and_report() -> None:
    statuses = [
        PartitionStatus(partition=1, attempt=1, rows=10, delivered=10, bytes=100, seconds=1.0),
        PartitionStatus(partition=0, attempt=0, rows=20, delivered=19, failed=1,
                        first_error="BrokerResponseError: boom", bytes=200, seconds=2.0),
    ]
    batch = status_batch(statuses)
    assert batch.schema.names == [n for n, _ in STATUS_COLUMNS]
    assert str(batch.schema.field("partition").type) == "int64"
    assert str(batch.schema.field("seconds").type) == "double"
    report = build_report(batch.to_pylist(), topic="t", seconds=2.0, warnings=["w"])
    assert [p.partition for p in report.partitions] == [0, 1]
    assert (report.rows, report.delivered, report.failed, report.bytes) == (30, 29, 1, 300)
    assert report.retried_partitions == (1,)
    assert report.rows_per_second == pytest.approx(14.5)
    assert report.mb_per_second == pytest.approx(300 / 1e6 / 2)
    assert report.first_error == "BrokerResponseError: boom"
    assert not report.ok
    text = report.format()
    assert "RETRY" in text
    assert "retried partitions: [1]" in text
    assert "warning: w" in text
    assert report.to_dict()["retried_partitions"] == [1]


def test_speculation_warning_and_schema_check_without_a_cluster(monkeypatch: Any) -> None:
    pytest.importorskip("pyspark")
    from pyspark.sql import types as T

    from pipeline.spark import export as export_mod

    class FakeConf:
        def get(self, key: str, default: str | None = None) -> str | None:
            return "true" if key == "spark.speculation" else default

    class FakeFrame:
        schema = T.StructType([T.StructField("value", T.StringType())])
        sparkSession = type("S", (), {"conf": FakeConf()})()

        def select(self, *cols: str) -> FakeFrame:
            assert cols == ("value",)
            return self

        def mapInArrow(self, fn: Any, schema: str) -> FakeFrame:
            assert schema.startswith("`partition` long")
            return self

        def collect(self) -> list[Any]:
            return []

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = export_mod.export_dataframe(
            FakeFrame(), bootstrap="h:1", topic="t", check_topic=False
        )
    assert any(issubclass(w.category, export_mod.SpeculationWarning) for w in caught)
    assert report.warnings
    assert "speculation" in report.warnings[0]


def test_message_ids_join_existing_headers_without_row_objects() -> None:
    from pipeline.spark.rows import _with_message_ids

    batch = _batch(10, 30).slice(3, 20)  # a sliced batch: offsets do not start at 0
    merged = _with_message_ids(batch.column(batch.schema.names.index("headers")), 20, "mid",
                               "p7-", 100)
    for j, row in enumerate(merged.to_pylist()):
        i = 13 + j
        before = [] if i % 7 == 0 else [{"key": "i", "value": str(i).encode()}] * (1 + i % 3)
        assert row == [*before, {"key": "mid", "value": f"p7-{100 + j}".encode()}]
    alone = _with_message_ids(None, 3, "mid", "x", 0).to_pylist()
    assert alone == [[{"key": "mid", "value": f"x{i}".encode()}] for i in range(3)]


@integration
def test_export_builds_no_producer_message_per_row(
    kafka_bootstrap: str, new_topic: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15 goal 4: the export goes through send_batch (columns), not ProducerMessage."""
    from pipeline.producer import _message as message

    built = []
    original = message.ProducerMessage.__init__

    def counting(self: Any, *args: Any, **kw: Any) -> None:
        built.append(1)
        original(self, *args, **kw)

    monkeypatch.setattr(message.ProducerMessage, "__init__", counting)
    topic = new_topic(partitions=2)
    cfg = ExportConfig(bootstrap=kafka_bootstrap, topic=topic, chunk_rows=300,
                       message_id_header=DEFAULT_MESSAGE_ID_HEADER,
                       producer_options={"linger": 0.001})
    status = export_partition([_batch(0, 1000)], cfg, partition=1)
    assert (status.rows, status.delivered) == (1000, 1000)
    assert not built
    got = consume(kafka_bootstrap, topic, timeout=20)
    assert len(got) == 1000
    assert {dict(r.headers)[DEFAULT_MESSAGE_ID_HEADER] for r in got} == {  # type: ignore[arg-type]
        f"1-{i}".encode() for i in range(1000)}
