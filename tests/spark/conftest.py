"""Spark fixtures: one session-scoped ``local[1]`` SparkSession.

JVM startup costs 5-9 s, so never start Spark per test; budget ~12 s for the first tests
and ~0.2 s for each later one. Skips when pyspark or java is missing.

The master is ``local[1,2]``: one core, but a failed task is retried once (plain
``local[N]`` never retries), so the export's task-retry path can be tested on the same
session. A test that expects a job to fail pays for the second attempt.

``kafka_records`` reads a topic back with confluent-kafka in assign mode (a tansu group
join takes ~23 s).

The session also carries Spark's own Kafka sink (``spark.jars`` =
``pipeline.spark.kafka_sink_jars()``, fetched from Maven Central once per machine), so
tests can run it beside ours; ``sink_jars`` says why it is missing when it is.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


def _java_available() -> bool:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return True
    return shutil.which("java") is not None


@dataclass(frozen=True)
class SinkJars:
    jars: list[str]
    error: str | None  # why there are none

    def require(self) -> None:
        """Skip when only mvn is missing (as the Kafka tests do); any other failure to get
        the jars (Maven Central unreachable, no connector for this PySpark) fails."""
        if self.error is None:
            return
        if "needs mvn" in self.error:
            pytest.skip(self.error)
        pytest.fail(f"Spark's Kafka sink jars could not be had: {self.error}")


@pytest.fixture(scope="session")
def sink_jars() -> SinkJars:
    from pipeline.spark import KafkaSinkJarsError, kafka_sink_jars

    try:
        return SinkJars(kafka_sink_jars(), None)
    except KafkaSinkJarsError as exc:
        return SinkJars([], str(exc))


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory, sink_jars: SinkJars) -> Iterator[Any]:
    pytest.importorskip("pyspark")
    if not _java_available():
        pytest.skip("no java on PATH / JAVA_HOME (Spark needs Java 17+)")
    # Workers must run this interpreter (the venv), not python3 from PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    from pyspark.sql import SparkSession

    work = tmp_path_factory.mktemp("spark")
    jvm_flags = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    builder = SparkSession.builder
    if sink_jars.jars:
        builder = builder.config("spark.jars", ",".join(sink_jars.jars))
    session = (
        builder.master("local[1,2]")
        .appName("pipeline-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.default.parallelism", "1")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.local.dir", str(work / "local"))
        .config("spark.sql.warehouse.dir", str(work / "warehouse"))
        .config("spark.driver.extraJavaOptions", jvm_flags)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def kafka_records() -> Any:
    """``kafka_records(bootstrap, topic, expected, timeout=20.0)``: the first ``expected``
    records of every partition of ``topic`` as confluent_kafka Messages, sorted by
    (partition, offset)."""
    confluent_kafka = pytest.importorskip("confluent_kafka")

    def _read(bootstrap: str, topic: str, expected: int, timeout: float = 20.0) -> list[Any]:
        import time

        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": f"spark-tests-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        })
        try:
            meta = consumer.list_topics(topic, timeout=10)
            parts = sorted(meta.topics[topic].partitions)
            consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in parts])
            out: list[Any] = []
            deadline = time.monotonic() + timeout
            while len(out) < expected and time.monotonic() < deadline:
                for msg in consumer.consume(num_messages=max(expected - len(out), 1), timeout=0.5):
                    if msg.error() is not None:
                        raise AssertionError(f"consumer error: {msg.error()}")
                    out.append(msg)
            # anything beyond `expected` would be a duplicate: give it a moment to show up
            out.extend(m for m in consumer.consume(num_messages=1000, timeout=0.5) if not m.error())
            out.sort(key=lambda m: (m.partition(), m.offset()))
            return out
        finally:
            consumer.close()

    return _read


def read_all(bootstrap: str, topic: str, isolation: str, timeout: float = 30.0) -> list[Any]:
    """Every record of ``topic`` (confluent-kafka, assign mode, from offset 0 to each
    partition's end: the last stable offset for ``read_committed``), sorted by
    (partition, offset)."""
    import time

    confluent_kafka = pytest.importorskip("confluent_kafka")
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"spark-tests-{time.monotonic_ns()}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "isolation.level": isolation,
    })
    try:
        meta = consumer.list_topics(topic, timeout=10)
        parts = sorted(meta.topics[topic].partitions)
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in parts])
        out: list[Any] = []
        ended: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(ended) < len(parts):
            assert time.monotonic() < deadline, f"{topic}: no end of partition(s) {ended}"
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                err = msg.error()
                if err is None:
                    out.append(msg)
                    ended.discard(msg.partition())
                elif err.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    ended.add(msg.partition())
                else:
                    raise AssertionError(f"consumer error: {err}")
        out.sort(key=lambda m: (m.partition(), m.offset()))
        return out
    finally:
        consumer.close()
