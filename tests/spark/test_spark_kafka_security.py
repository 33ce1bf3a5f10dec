"""A Spark export to a SASL_SSL Apache Kafka, configured as users of Spark's own Kafka
sink write it (``kafka.security.protocol``, ``kafka.sasl.mechanism``,
``kafka.sasl.jaas.config``): ``export_dataframe`` and the ``pipeline-kafka`` data source,
read back by confluent-kafka; the password is in no plan Spark recorded, no report and
no error."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.cli import main
from pipeline.cluster.errors import AuthenticationError
from pipeline.spark.export import ExportError, export_dataframe
from pipeline.testing.kafka import KafkaCluster

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.integration]

Topic = Callable[..., str]


def _kafka_options(cluster: KafkaCluster, password: str) -> dict[str, str]:
    return {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="bob" password="{password}";',
        "kafka.ssl.truststore.location": cluster.ssl_cafile,
        "kafka.ssl.truststore.type": "PEM",
    }


def read_partitions(bootstrap: str, topic: str, partitions: list[int], expected: int,
                    config: dict[str, Any]) -> list[Any]:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    consumer = confluent_kafka.Consumer({
        **config, "bootstrap.servers": bootstrap, "group.id": f"sec-{time.monotonic_ns()}",
        "enable.auto.commit": False, "enable.partition.eof": False})
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in partitions])
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg)
        return got
    finally:
        consumer.close()


def _recorded_plans(spark: Any) -> str:
    """Every SQL execution Spark recorded in this session (its plan descriptions)."""
    store = spark._jsparkSession.sharedState().statusStore()
    executions = store.executionsList()
    return "\n".join(
        f"{e.description()}\n{e.details()}\n{e.physicalPlanDescription()}"
        for e in (executions.apply(i) for i in range(executions.size())))


def _frame(spark: Any, n: int, tag: str) -> Any:
    return spark.createDataFrame([(f"k{i}", f"{tag}{i}") for i in range(n)],
                                 "key string, value string")


def test_export_and_data_source_to_sasl_ssl(
        spark: Any, kafka_sasl_ssl: KafkaCluster, kafka_topic: Topic) -> None:
    cluster = kafka_sasl_ssl
    password = cluster.security.users["bob"]
    topic = kafka_topic("spark-sec")
    cluster.create_topic(topic, 1)
    options = _kafka_options(cluster, password)

    report = export_dataframe(_frame(spark, 40, "e"), bootstrap=cluster.bootstrap, topic=topic,
                              kafka_options=options, request_timeout=20.0)
    assert report.ok and report.delivered == 40
    from pipeline.spark.datasource import register

    register(spark)
    writer = _frame(spark, 10, "d").write.format("pipeline-kafka").mode("append")
    writer.option("kafka.bootstrap.servers", cluster.bootstrap).option("topic", topic) \
        .options(**options).save()

    got = read_partitions(cluster.bootstrap, topic, [0], 50,
                          config=cluster.librdkafka_config("SCRAM-SHA-512", user="bob"))
    assert sorted(m.value() for m in got) == sorted(
        [b"e%d" % i for i in range(40)] + [b"d%d" % i for i in range(10)])
    plans = _recorded_plans(spark)
    assert plans.strip()  # Spark did record the jobs...
    assert password not in plans  # ...without the password
    assert password not in str(report.to_dict()) and password not in report.format()


def test_export_wrong_password_fails_bounded_without_the_secret(
        spark: Any, kafka_sasl_ssl: KafkaCluster, kafka_topic: Topic) -> None:
    """With the topic check (on the driver) and without it (in the task)."""
    cluster = kafka_sasl_ssl
    options = _kafka_options(cluster, "Wr0ng-Spark-pw")
    topic = kafka_topic("spark-bad")
    cluster.create_topic(topic, 1)
    for check_topic in (True, False):
        started = time.monotonic()
        with pytest.raises(AuthenticationError if check_topic else ExportError) as info:
            export_dataframe(_frame(spark, 5, "x"), bootstrap=cluster.bootstrap, topic=topic,
                             kafka_options=options, check_topic=check_topic,
                             request_timeout=30.0, delivery_timeout=300.0)
        # bounded well below delivery_timeout (generous: Spark on a loaded machine)
        assert time.monotonic() - started < 60.0
        text = str(info.value)
        assert "refused user 'bob' with SASL SCRAM-SHA-512" in text, text
        assert "Wr0ng-Spark-pw" not in text


def test_cli_export_with_config_file(
        spark: Any, kafka_sasl_ssl: KafkaCluster, kafka_topic: Topic, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``pipeline export --config FILE`` (bootstrap.servers and a PlainLoginModule line
    in the file), in-process on the session's Spark; ``-v`` echoes no secret."""
    cluster = kafka_sasl_ssl
    password = cluster.security.users["carol"]
    topic = kafka_topic("cli-export")
    cluster.create_topic(topic, 1)
    data = tmp_path / "rows.json"
    data.write_text("".join(f'{{"id": {i}}}\n' for i in range(25)))
    props = tmp_path / "export.properties"
    props.write_text(
        f"bootstrap.servers={cluster.bootstrap}\nsecurity.protocol=SASL_SSL\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="carol" password="{password}";\n'
        f"ssl.ca.location={cluster.ssl_cafile}\n")
    code = main(["export", "--config", str(props), "-t", topic, str(data), "--json-report",
                 "-v", "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["delivered"] == 25
    assert password not in out + err
    got = read_partitions(cluster.bootstrap, topic, [0], 25,
                          config=cluster.librdkafka_config("PLAIN", user="carol"))
    assert sorted(json.loads(m.value())["id"] for m in got) == list(range(25))
