"""Apache Kafka itself for tests: ``KafkaCluster`` runs 1..n KRaft nodes from Maven Central jars.

    from pipeline.testing.kafka import KafkaCluster
    with KafkaCluster(nodes=3, broker_config={"min.insync.replicas": "2"}) as cluster:
        cluster.create_topic("t", partitions=6, replication_factor=3)
        cluster.leader("t", 0); cluster.kill(2); cluster.start(2); cluster.move_leader("t", 0, to_node=3)

Secured CLIENT listeners: ``KafkaCluster(1, security_protocol="SASL_SSL",
scram_users={"alice": "secret"})`` (``cluster.ssl_cafile``, ``cluster.client_options()``;
see :mod:`pipeline.testing.kafka.security`).

Needs Java 17+ (and Maven for the first fetch: ``make kafka`` or
``python -m pipeline.testing.kafka``). See :mod:`pipeline.testing.kafka.cluster`.
"""

from __future__ import annotations

from pipeline.testing.kafka.cluster import KafkaCluster
from pipeline.testing.kafka.dist import (
    CACHE_ENV,
    KAFKA_VERSION,
    KafkaClusterError,
    KafkaSetupError,
    KafkaStartError,
    cache_dir,
    ensure_kafka,
)
from pipeline.testing.kafka.security import unsecured_token, unsecured_token_provider
from pipeline.testing.kafka.settings import test_kit_config

__all__ = [
    "CACHE_ENV",
    "KAFKA_VERSION",
    "KafkaCluster",
    "KafkaClusterError",
    "KafkaSetupError",
    "KafkaStartError",
    "cache_dir",
    "ensure_kafka",
    "test_kit_config",
    "unsecured_token",
    "unsecured_token_provider",
]
