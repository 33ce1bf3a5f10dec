"""The async producer: sarama's four stages on trio channels.

Public names (also re-exported from :mod:`pipeline`)::

    from pipeline.producer import open_producer, Producer, SyncProducer, ProducerConfig
    from pipeline.producer import ProducerMessage, RecordMetadata, Delivery, wait_all

Everything else is private. The house, by concept (``docs/architecture.md`` tells
the journey of one record through it):

* ``_api.py``, ``_sync.py``, ``_config.py``, ``_errors.py``, ``_message.py``: what
  users hold (the facade, its options, its errors, the message).
* ``_intake/``: what runs in the caller's task (``send``, ``send_many``,
  ``send_batch``, ``producer.input``): validation and acceptance.
* ``_stages/``: the four stages in flow order (dispatcher, topic, partition and
  broker producers) and what only they use; its ``__init__`` has the stage table.
* ``_outcomes/``: the ledger that settles each accepted message once, the deliveries
  callers await.
* ``_columnar/``: records as rows of columns (``send_batch``, ``send()`` bursts).
* ``_speedups/``: the C extensions, their one loader, the fields they may touch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Producer": "pipeline.producer._api",
    "ProducerStatistics": "pipeline.producer._statistics",
    "open_producer": "pipeline.producer._api",
    "SyncProducer": "pipeline.producer._sync",
    "ProducerConfig": "pipeline.producer._config",
    "BufferFullError": "pipeline.producer._errors",
    "BrokerResponseError": "pipeline.producer._errors",
    "ConfigError": "pipeline.producer._errors",
    "DeliveryTimeoutError": "pipeline.producer._errors",
    "MessageTooLargeError": "pipeline.producer._errors",
    "ProducerClosed": "pipeline.producer._errors",
    "ProducerError": "pipeline.producer._errors",
    "ProducerMessage": "pipeline.producer._message",
    "RecordMetadata": "pipeline.producer._message",
    "Delivery": "pipeline.producer._outcomes.delivery",
    "DeliveryGroup": "pipeline.producer._outcomes.delivery",
    "GroupResult": "pipeline.producer._outcomes.delivery",
    "wait_all": "pipeline.producer._outcomes.delivery",
    "Partitioner": "pipeline.producer._stages.partitioner",
    "DefaultPartitioner": "pipeline.producer._stages.partitioner",
    "Murmur2Partitioner": "pipeline.producer._stages.partitioner",
    "RoundRobinPartitioner": "pipeline.producer._stages.partitioner",
    "RandomPartitioner": "pipeline.producer._stages.partitioner",
    "murmur2": "pipeline.producer._stages.partitioner",
}

__all__ = [
    "BrokerResponseError",
    "BufferFullError",
    "ConfigError",
    "DefaultPartitioner",
    "Delivery",
    "DeliveryGroup",
    "DeliveryTimeoutError",
    "GroupResult",
    "MessageTooLargeError",
    "Murmur2Partitioner",
    "Partitioner",
    "Producer",
    "ProducerClosed",
    "ProducerConfig",
    "ProducerError",
    "ProducerMessage",
    "ProducerStatistics",
    "RandomPartitioner",
    "RecordMetadata",
    "RoundRobinPartitioner",
    "SyncProducer",
    "murmur2",
    "open_producer",
    "wait_all",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline.producer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:
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
    )
    from pipeline.producer._message import ProducerMessage, RecordMetadata
    from pipeline.producer._outcomes.delivery import Delivery, DeliveryGroup, GroupResult, wait_all
    from pipeline.producer._stages.partitioner import (
        DefaultPartitioner,
        Murmur2Partitioner,
        Partitioner,
        RandomPartitioner,
        RoundRobinPartitioner,
        murmur2,
    )
    from pipeline.producer._statistics import ProducerStatistics
    from pipeline.producer._sync import SyncProducer
