"""pipeline: a trio-native Kafka producer built like sarama's AsyncProducer, and a
trio group consumer.

Public API (everything else is internal)::

    from pipeline import open_producer, ProducerConfig, ProducerMessage, RecordMetadata, ProducerError
    from pipeline import open_consumer, SyncConsumer, ConsumerConfig, ConsumedRecord

Names are imported lazily, so ``import pipeline.protocol`` (the sans-I/O codec)
does not pull in trio or the producer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "ClusterConfig": "pipeline.cluster.config",
    "BrokerConnectionError": "pipeline.cluster.errors",
    "KafkaError": "pipeline.cluster.errors",
    "RequestTimedOutError": "pipeline.cluster.errors",
    "UnknownTopicError": "pipeline.cluster.errors",
    "BrokerResponseError": "pipeline.producer.errors",
    "BufferFullError": "pipeline.producer.errors",
    "ConfigError": "pipeline.producer.errors",
    "DeliveryTimeoutError": "pipeline.producer.errors",
    "MessageTooLargeError": "pipeline.producer.errors",
    "ProducerClosed": "pipeline.producer.errors",
    "ProducerError": "pipeline.producer.errors",
    "Delivery": "pipeline.producer.message",
    "DeliveryGroup": "pipeline.producer.message",
    "GroupResult": "pipeline.producer.message",
    "wait_all": "pipeline.producer.message",
    "ProducerMessage": "pipeline.producer.message",
    "RecordMetadata": "pipeline.producer.message",
    "ProducerConfig": "pipeline.producer.config",
    "Producer": "pipeline.producer.api",
    "ProducerStatistics": "pipeline.producer.api",
    "open_producer": "pipeline.producer.api",
    "SyncProducer": "pipeline.producer.sync",
    # The consumer (pipeline.consumer re-exports them from its private modules).
    "open_consumer": "pipeline.consumer",
    "Consumer": "pipeline.consumer",
    "ConsumerConfig": "pipeline.consumer",
    "SyncConsumer": "pipeline.consumer",
    "ConsumedRecord": "pipeline.consumer",
    "TopicPartition": "pipeline.consumer",
    "OffsetAndMetadata": "pipeline.consumer",
    "ConsumerGroupMetadata": "pipeline.consumer",
    "ConsumerError": "pipeline.consumer",
    "CommitFailedError": "pipeline.consumer",
    "RebalanceInProgressError": "pipeline.consumer",
    "MaxPollIntervalExceededError": "pipeline.consumer",
    "GroupError": "pipeline.consumer",
    "OffsetOutOfRangeError": "pipeline.consumer",
    "NoOffsetForPartitionError": "pipeline.consumer",
    "ConsumerClosedError": "pipeline.consumer",
}

__all__ = [
    "BrokerConnectionError",
    "BrokerResponseError",
    "BufferFullError",
    "ClusterConfig",
    "CommitFailedError",
    "ConfigError",
    "ConsumedRecord",
    "Consumer",
    "ConsumerClosedError",
    "ConsumerConfig",
    "ConsumerError",
    "ConsumerGroupMetadata",
    "Delivery",
    "DeliveryGroup",
    "DeliveryTimeoutError",
    "GroupError",
    "GroupResult",
    "KafkaError",
    "MaxPollIntervalExceededError",
    "MessageTooLargeError",
    "NoOffsetForPartitionError",
    "OffsetAndMetadata",
    "OffsetOutOfRangeError",
    "Producer",
    "ProducerClosed",
    "ProducerConfig",
    "ProducerError",
    "ProducerMessage",
    "ProducerStatistics",
    "RebalanceInProgressError",
    "RecordMetadata",
    "RequestTimedOutError",
    "SyncConsumer",
    "SyncProducer",
    "TopicPartition",
    "UnknownTopicError",
    "open_consumer",
    "open_producer",
    "wait_all",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:
    from pipeline.cluster.config import ClusterConfig
    from pipeline.cluster.errors import (
        BrokerConnectionError,
        KafkaError,
        RequestTimedOutError,
        UnknownTopicError,
    )
    from pipeline.consumer import (
        CommitFailedError,
        ConsumedRecord,
        Consumer,
        ConsumerClosedError,
        ConsumerConfig,
        ConsumerError,
        ConsumerGroupMetadata,
        GroupError,
        MaxPollIntervalExceededError,
        NoOffsetForPartitionError,
        OffsetAndMetadata,
        OffsetOutOfRangeError,
        RebalanceInProgressError,
        SyncConsumer,
        TopicPartition,
        open_consumer,
    )
    from pipeline.producer.api import Producer, ProducerStatistics, open_producer
    from pipeline.producer.config import ProducerConfig
    from pipeline.producer.errors import (
        BrokerResponseError,
        BufferFullError,
        ConfigError,
        DeliveryTimeoutError,
        MessageTooLargeError,
        ProducerClosed,
        ProducerError,
    )
    from pipeline.producer.message import (
        Delivery,
        DeliveryGroup,
        GroupResult,
        ProducerMessage,
        RecordMetadata,
        wait_all,
    )
    from pipeline.producer.sync import SyncProducer
