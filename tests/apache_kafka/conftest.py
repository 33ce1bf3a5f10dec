"""Helpers for the Apache Kafka tests (the cluster fixtures live in tests/conftest.py).

Everything under tests/apache_kafka/ is marked ``kafka``. What a test wrote is judged by
confluent-kafka (librdkafka), an independent reader and admin client, never only by ours.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
pytest.importorskip("confluent_kafka.admin")  # a submodule: makes confluent_kafka.admin usable


def read_partitions(bootstrap: str, topic: str, partitions: list[int], expected: int,
                    timeout: float = 30.0, config: dict[str, Any] | None = None) -> list[Any]:
    """The first ``expected`` records of ``partitions`` (from offset 0) as confluent-kafka
    Messages, in per-partition offset order; assign() mode, CRCs checked. ``config``: more
    librdkafka settings (security: ``KafkaCluster.librdkafka_config()``)."""
    consumer = confluent_kafka.Consumer({
        **(config or {}),
        "bootstrap.servers": bootstrap,
        "group.id": f"pipeline-kafka-tests-{time.monotonic_ns()}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
        "check.crcs": True,
    })
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in partitions])
        got: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(got) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                raise AssertionError(f"consumer error: {msg.error()}")
            got.append(msg)
        return sorted(got, key=lambda m: (m.partition(), m.offset()))
    finally:
        consumer.close()


def log_ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """librdkafka's high watermark of each partition of ``topic``."""
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    try:
        return {p: c.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p),
                                           timeout=10)[1] for p in range(partitions)}
    finally:
        c.close()


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The offsets ``group`` committed for each partition of ``topic``, read by librdkafka."""
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "enable.auto.commit": False})
    try:
        parts = [confluent_kafka.TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: tp.offset for tp in c.committed(parts, timeout=20)}
    finally:
        c.close()


def confluent_leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """``{partition: leader}`` as librdkafka's metadata shows it."""
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(topic, timeout=10)
    return {p.id: p.leader for p in meta.topics[topic].partitions.values()}


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_until(predicate: Any, timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(interval)
