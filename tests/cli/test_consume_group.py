"""``pipeline consume -G GROUP topic...`` on Apache Kafka: a group member that commits."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from pipeline.__main__ import main
from pipeline.testing.kafka import KafkaCluster


@pytest.mark.kafka
def test_consume_as_a_group_member_commits_and_resumes(
    kafka_single: KafkaCluster, kafka_topic: Callable[[str], str], capsys: pytest.CaptureFixture[str],
) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    bootstrap = kafka_single.bootstrap
    a, b = kafka_topic("cli-g-a"), kafka_topic("cli-g-b")
    kafka_single.create_topic(a, partitions=2, replication_factor=1)
    kafka_single.create_topic(b, partitions=1, replication_factor=1)
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
    for i in range(4):
        producer.produce(a, value=f"a{i}".encode(), partition=i % 2)
    producer.produce(b, value=b"b0")
    producer.flush(30)
    group = f"cli-{a}"
    assert main(["consume", "-b", bootstrap, "-G", group, a, b, "-e", "-J", "-q"]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(r["payload"] for r in got) == ["a0", "a1", "a2", "a3", "b0"]
    producer.produce(a, value=b"a4", partition=0)
    producer.flush(30)
    # the group committed on exit: the next member starts after what was read
    assert main(["consume", "-b", bootstrap, "-G", group, "-t", a, b, "-e", "-J", "-q"]) == 0
    again = [json.loads(line)["payload"] for line in capsys.readouterr().out.splitlines()]
    assert again == ["a4"]


def test_group_mode_refuses_partitions_and_offsets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["consume", "-b", "127.0.0.1:9", "-G", "g", "t", "-p", "0"]) != 0
    assert "-p, -o OFFSET and -o s@/e@ do not apply" in capsys.readouterr().err
    assert main(["consume", "-b", "127.0.0.1:9", "x", "y"]) != 0
    assert "without -G read one topic" in capsys.readouterr().err
