"""pipeline: a trio-native Kafka producer built like sarama's AsyncProducer, and a
trio group consumer.

Public API (everything else is internal)::

    from pipeline import open_producer, ProducerConfig, ProducerMessage, RecordMetadata, ProducerError
    from pipeline import Admin, NewTopic          # topics and configs (pipeline.cluster.admin)
    from pipeline import open_consumer, SyncConsumer, ConsumerConfig, ConsumedRecord

Names are imported lazily, so ``import pipeline.protocol`` (the sans-I/O codec)
does not pull in trio or the producer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "Admin": "pipeline.cluster.admin",
    "AdminError": "pipeline.cluster.admin_types",
    "NewTopic": "pipeline.cluster.admin_types",
    "ClusterConfig": "pipeline.cluster.config",
    "BrokerStatistics": "pipeline.cluster.stats",
    "BootstrapError": "pipeline.cluster.errors",
    "BrokerConnectionError": "pipeline.cluster.errors",
    "KafkaError": "pipeline.cluster.errors",
    "RequestTimedOutError": "pipeline.cluster.errors",
    "UnknownTopicError": "pipeline.cluster.errors",
    "BrokerResponseError": "pipeline.producer._errors",
    "BufferFullError": "pipeline.producer._errors",
    "ConfigError": "pipeline.producer._errors",
    "DeliveryTimeoutError": "pipeline.producer._errors",
    "MessageTooLargeError": "pipeline.producer._errors",
    "ProducerClosed": "pipeline.producer._errors",
    "ProducerError": "pipeline.producer._errors",
    "Delivery": "pipeline.producer._outcomes.delivery",
    "DeliveryGroup": "pipeline.producer._outcomes.delivery",
    "GroupResult": "pipeline.producer._outcomes.delivery",
    "wait_all": "pipeline.producer._outcomes.delivery",
    "ProducerMessage": "pipeline.producer._message",
    "RecordMetadata": "pipeline.producer._message",
    "ProducerConfig": "pipeline.producer._config",
    "Producer": "pipeline.producer._api",
    "ProducerStatistics": "pipeline.producer._statistics",
    "open_producer": "pipeline.producer._api",
    "SyncProducer": "pipeline.producer._sync",
    "TransactionError": "pipeline.producer._errors",
    "TransactionStateError": "pipeline.producer._errors",
    "TransactionAbortableError": "pipeline.producer._errors",
    "ProducerFencedError": "pipeline.producer._errors",
    "TransactionFatalError": "pipeline.producer._errors",
    "TransactionTimedOutError": "pipeline.producer._errors",
    "TransactionAbortedError": "pipeline.producer._errors",
    # The consumer (pipeline.consumer re-exports them from its private modules).
    "open_consumer": "pipeline.consumer",
    "Consumer": "pipeline.consumer",
    "ConsumerConfig": "pipeline.consumer",
    "SyncConsumer": "pipeline.consumer",
    "ConsumedRecord": "pipeline.consumer",
    "ConsumedColumns": "pipeline.consumer",
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
    "ConsumerStatistics": "pipeline.consumer",
}

__all__ = [
    "Admin",
    "AdminError",
    "BootstrapError",
    "BrokerConnectionError",
    "BrokerResponseError",
    "BrokerStatistics",
    "BufferFullError",
    "ClusterConfig",
    "CommitFailedError",
    "ConfigError",
    "ConsumedColumns",
    "ConsumedRecord",
    "Consumer",
    "ConsumerClosedError",
    "ConsumerConfig",
    "ConsumerError",
    "ConsumerGroupMetadata",
    "ConsumerStatistics",
    "Delivery",
    "DeliveryGroup",
    "DeliveryTimeoutError",
    "GroupError",
    "GroupResult",
    "KafkaError",
    "MaxPollIntervalExceededError",
    "MessageTooLargeError",
    "NewTopic",
    "NoOffsetForPartitionError",
    "OffsetAndMetadata",
    "OffsetOutOfRangeError",
    "Producer",
    "ProducerClosed",
    "ProducerConfig",
    "ProducerError",
    "ProducerFencedError",
    "ProducerMessage",
    "ProducerStatistics",
    "RebalanceInProgressError",
    "RecordMetadata",
    "RequestTimedOutError",
    "SyncConsumer",
    "SyncProducer",
    "TopicPartition",
    "TransactionAbortableError",
    "TransactionAbortedError",
    "TransactionError",
    "TransactionFatalError",
    "TransactionStateError",
    "TransactionTimedOutError",
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
    from pipeline.cluster.admin import Admin
    from pipeline.cluster.admin_types import AdminError, NewTopic
    from pipeline.cluster.config import ClusterConfig
    from pipeline.cluster.errors import (
        BootstrapError,
        BrokerConnectionError,
        KafkaError,
        RequestTimedOutError,
        UnknownTopicError,
    )
    from pipeline.cluster.stats import BrokerStatistics
    from pipeline.consumer import (
        CommitFailedError,
        ConsumedColumns,
        ConsumedRecord,
        Consumer,
        ConsumerClosedError,
        ConsumerConfig,
        ConsumerError,
        ConsumerGroupMetadata,
        ConsumerStatistics,
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
    from pipeline.producer._api import Producer, open_producer
    from pipeline.producer._config import ProducerConfig
    from pipeline.producer._errors import (
        BrokerResponseError,
        BufferFullError,
        ConfigError,
        DeliveryTimeoutError,
        MessageTooLargeError,
        ProducerClosed,
        ProducerError,
        ProducerFencedError,
        TransactionAbortableError,
        TransactionAbortedError,
        TransactionError,
        TransactionFatalError,
        TransactionStateError,
        TransactionTimedOutError,
    )
    from pipeline.producer._message import ProducerMessage, RecordMetadata
    from pipeline.producer._outcomes.delivery import Delivery, DeliveryGroup, GroupResult, wait_all
    from pipeline.producer._statistics import ProducerStatistics
    from pipeline.producer._sync import SyncProducer
