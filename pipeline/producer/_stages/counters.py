"""The stages' running counts per topic and partition, for ``producer.statistics()``.

Counted per batch, never per record: a batch sealed (its bytes and records into the
topic's and the partition's windows), a batch acknowledged (its records and bytes
delivered), a batch sent back for a retry. Failures are counted by the ledger, where
every failure passes (``Ledger.failed_by_partition``). What waits where right now is
not counted at all: ``producer/_statistics.py`` reads it off the stages' queues when
a snapshot is taken.
"""

from __future__ import annotations

from pipeline.producer._stages.envelopes import TopicPartition
from pipeline.util.stats import WINDOW, Window

__all__ = ["PARTITION_WINDOW", "Counters", "PartitionCounters", "TopicCounters"]

#: Batches a partition's windows keep (a topic's keep ``WINDOW``): a producer may write
#: to thousands of partitions, and each window holds its samples.
PARTITION_WINDOW = WINDOW // 8


class PartitionCounters:
    __slots__ = ("batch_bytes", "batch_messages", "batches", "delivered", "delivered_bytes",
                 "retried_messages", "retries")

    def __init__(self) -> None:
        self.batches = 0  # sealed (a retry re-sends a sealed batch: not counted again)
        self.delivered = 0  # records acknowledged
        self.delivered_bytes = 0  # their bytes (the size bound buffer_memory counts)
        self.retries = 0  # batches sent back to be sent again after an error
        self.retried_messages = 0  # the records in them
        self.batch_bytes = Window(PARTITION_WINDOW)
        self.batch_messages = Window(PARTITION_WINDOW)


class TopicCounters:
    __slots__ = ("batch_bytes", "batch_messages")

    def __init__(self) -> None:
        self.batch_bytes = Window()
        self.batch_messages = Window()


class Counters:
    """Every partition's and topic's counts, made on first use (shared by the stages)."""

    __slots__ = ("partitions", "topics")

    def __init__(self) -> None:
        self.partitions: dict[TopicPartition, PartitionCounters] = {}
        self.topics: dict[str, TopicCounters] = {}

    def partition(self, tp: TopicPartition) -> PartitionCounters:
        counters = self.partitions.get(tp)
        if counters is None:
            counters = self.partitions[tp] = PartitionCounters()
        return counters

    def sealed(self, tp: TopicPartition, records: int, nbytes: int) -> None:
        """A batch of ``records`` records, ``nbytes`` bytes, was sealed for ``tp``."""
        topic = self.topics.get(tp.topic)
        if topic is None:
            topic = self.topics[tp.topic] = TopicCounters()
        topic.batch_bytes.add(nbytes)
        topic.batch_messages.add(records)
        part = self.partition(tp)
        part.batches += 1
        part.batch_bytes.add(nbytes)
        part.batch_messages.add(records)
