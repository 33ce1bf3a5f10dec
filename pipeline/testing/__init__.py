"""Test infrastructure: the embedded tansu broker (``broker``), Apache Kafka clusters
(``kafka``: ``from pipeline.testing.kafka import KafkaCluster``), the scripted in-memory
``fake_cluster`` and the TCP ``proxy`` for fault injection.

Only the broker helpers are re-exported here; they import nothing async at import time.
Import ``pipeline.testing.fake_cluster`` / ``pipeline.testing.proxy`` directly (they need trio).
"""

from __future__ import annotations

from pipeline.testing.broker import (
    TOPIC_ALREADY_EXISTS,
    BrokerStartError,
    EmbeddedBroker,
    TopicCreationError,
    create_topic,
    create_topic_sync,
    create_topics,
    tansu_binary,
)
from pipeline.testing.choose_broker import BrokerEndpoint

__all__ = [
    "TOPIC_ALREADY_EXISTS",
    "BrokerEndpoint",
    "BrokerStartError",
    "EmbeddedBroker",
    "TopicCreationError",
    "create_topic",
    "create_topic_sync",
    "create_topics",
    "tansu_binary",
]
