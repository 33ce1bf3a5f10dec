"""The consumer: a trio group consumer, and a small assign-mode reader.

Public names (also re-exported from :mod:`pipeline` where noted there)::

    from pipeline.consumer import open_consumer, SyncConsumer, ConsumerConfig, ConsumedRecord
    from pipeline.consumer import read_topic, consume, topic_offsets, offsets_for_times

Implementation modules are private: ``_api.py`` (the facade), ``_sync.py``
(SyncConsumer), ``_member.py``, ``_liveness.py``, ``_leader.py``, ``_coordinator.py``,
``_commits.py`` (the classic group), ``_member848.py`` (KIP-848), ``_handoff.py``
(assignment changes run by the iteration), ``_fetcher.py``, ``_decode.py``,
``_positions.py``, ``_state.py`` (the fetch stages), ``_assignors.py`` / ``_sticky.py``,
``_config.py``, ``_types.py``, ``_errors.py``, ``_reader.py`` (the assign-mode reader).
``docs/consumer.md`` is the guide.
"""

from __future__ import annotations

from pipeline.consumer._api import Consumer
from pipeline.consumer._config import ConsumerConfig
from pipeline.consumer._errors import (
    CommitFailedError,
    ConsumerClosedError,
    ConsumerError,
    GroupError,
    MaxPollIntervalExceededError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    RebalanceInProgressError,
)
from pipeline.consumer._hooks import DeserializationError
from pipeline.consumer._open import open_consumer
from pipeline.consumer._reader import (
    Isolation,
    Start,
    consume,
    offsets_for_times,
    read_topic,
    topic_offsets,
)
from pipeline.consumer._statistics import ConsumerStatistics
from pipeline.consumer._sync import SyncConsumer
from pipeline.consumer._types import (
    ConsumedColumns,
    ConsumedRecord,
    ConsumerGroupMetadata,
    ConsumerState,
    OffsetAndMetadata,
    TopicPartition,
)

__all__ = [
    "CommitFailedError",
    "ConsumedColumns",
    "ConsumedRecord",
    "Consumer",
    "ConsumerClosedError",
    "ConsumerConfig",
    "ConsumerError",
    "ConsumerGroupMetadata",
    "ConsumerState",
    "ConsumerStatistics",
    "DeserializationError",
    "GroupError",
    "Isolation",
    "MaxPollIntervalExceededError",
    "NoOffsetForPartitionError",
    "OffsetAndMetadata",
    "OffsetOutOfRangeError",
    "RebalanceInProgressError",
    "Start",
    "SyncConsumer",
    "TopicPartition",
    "consume",
    "offsets_for_times",
    "open_consumer",
    "read_topic",
    "topic_offsets",
]
