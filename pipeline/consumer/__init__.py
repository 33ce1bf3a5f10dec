"""The consumer: reading records back from Kafka.

Public names (also re-exported from :mod:`pipeline` where noted there)::

    from pipeline.consumer import read_topic, consume, topic_offsets, offsets_for_times
    from pipeline.consumer import ConsumedRecord, ConsumerError

Implementation modules are private (``_reader.py``: the assign-mode reader).
"""

from __future__ import annotations

from pipeline.consumer._reader import (
    ConsumedRecord,
    ConsumerError,
    Isolation,
    Start,
    consume,
    offsets_for_times,
    read_topic,
    topic_offsets,
)

__all__ = [
    "ConsumedRecord",
    "ConsumerError",
    "Isolation",
    "Start",
    "consume",
    "offsets_for_times",
    "read_topic",
    "topic_offsets",
]
