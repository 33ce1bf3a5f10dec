"""KafkaCluster(features=...): the storage's finalized feature levels, read back as every
client reads them, from ApiVersions (KIP-584). ``transaction.version`` decides which
transactions protocol a client speaks (KIP-890)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pipeline.cluster import Cluster
from pipeline.consumer import consume
from pipeline.testing.kafka import KafkaCluster, KafkaStartError

from .conftest import confluent_kafka

pytestmark = pytest.mark.kafka


async def _features(kafka: KafkaCluster) -> dict[int, dict[str, int]]:
    """{node: finalized features} as each node's ApiVersions lists them."""
    async with Cluster.open(kafka.bootstrap) as cluster:
        await cluster.refresh()
        out = {}
        for node in kafka.nodes:
            conn = await cluster.connection(node)
            out[node] = dict(conn.handshake.finalized_features)
        return out


async def test_a_fresh_cluster_is_on_transaction_version_2(kafka_cluster: KafkaCluster) -> None:
    features = await _features(kafka_cluster)
    assert sorted(features) == [1, 2, 3]
    for node_features in features.values():
        assert node_features["transaction.version"] == 2
        assert node_features["metadata.version"] >= 27  # 4.1-IV1


async def test_transaction_version_1_is_read_back(kafka_txn_v1: KafkaCluster) -> None:
    assert kafka_txn_v1.features == {"transaction.version": 1}
    features = await _features(kafka_txn_v1)
    assert features[1]["transaction.version"] == 1
    assert features[1]["group.version"] == 1  # the rest stays the release's default


def test_transaction_version_0_is_not_listed() -> None:
    """Level 0 is "off": the broker lists no such finalized feature."""
    import trio

    with KafkaCluster(1, features={"transaction.version": 0}) as cluster:
        features = trio.run(_features, cluster)
    assert "transaction.version" not in features[1]
    assert "group.version" in features[1]


def test_an_unknown_feature_fails_the_format_with_kafkas_words() -> None:
    cluster = KafkaCluster(1, features={"no.such.feature": 1}, startup_timeout=60)
    with pytest.raises(KafkaStartError) as info:
        cluster.start()
    assert "formatting node 1's storage failed" in str(info.value)
    assert "no.such.feature" in str(info.value)
    assert cluster.pids() == []


@pytest.mark.parametrize("features", [{"transaction.version": -1}, {"transaction.version": "1"},
                                      {"": 1}, {"a=b": 1}, {"transaction.version": True}])
def test_bad_features_are_refused(features: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="features maps a feature name to a level"):
        KafkaCluster(1, features=features)  # type: ignore[arg-type]


@pytest.mark.parametrize("fixture", ["kafka_single", "kafka_cluster", "kafka_txn_v1"])
def test_transactions_run_on_the_test_clusters(fixture: str, request: pytest.FixtureRequest,
                                               kafka_topic: Callable[[str], str]) -> None:
    """The internal transaction state topic fits the cluster (replication factor and
    min.insync.replicas of test_kit_config): a transaction commits on 1 and 3 nodes, and on
    transaction.version 1. Written by confluent-kafka, read by our read_committed reader."""
    kafka: KafkaCluster = request.getfixturevalue(fixture)
    topic = kafka_topic("txn")
    kafka.create_topic(topic, 1, replication_factor=len(kafka.nodes))
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka.bootstrap,
                                         "transactional.id": topic, "linger.ms": 0})
    producer.init_transactions(60)
    for value, commit in ((b"kept", True), (b"dropped", False), (b"kept too", True)):
        producer.begin_transaction()
        producer.produce(topic, value)
        assert producer.flush(30) == 0
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    got = consume(kafka.bootstrap, topic, isolation_level="read_committed", max_messages=2,
                  stop_at_end=False, timeout=30)
    assert [r.value for r in got] == [b"kept", b"kept too"]
