"""The narrow interfaces stages reach their neighbours through.

A stage never holds the producer (or a registry of every stage): it is given
exactly the one lookup it needs, as a protocol, so each stage module imports
only these protocols and the envelopes, never another stage. The producer
core (``core.py``) is the one place that builds stages and implements all
three lookups; tests drive a stage with stubs of the one it takes.

Direction of flow (docs/architecture.md, "The stages")::

    topicProducer --PartitionInboxes--> partitionProducer --BrokerInboxes--> brokerProducer
                                              ^                                  |
                                              +------------ RetrySinks ----------+
"""

from __future__ import annotations

from typing import Protocol

import trio

from pipeline.producer._message import ProducerMessage
from pipeline.producer._stages.envelopes import BrokerItem, RetryItem, TopicPartition


class PartitionInboxes(Protocol):
    """What a topic producer needs: the inbox of a partition's producer,
    started (with ``nursery.start``) the first time it is asked for."""

    async def partition_inbox(
        self, tp: TopicPartition
    ) -> trio.MemorySendChannel[list[ProducerMessage]]: ...


class BrokerInbox(Protocol):
    """A broker producer as a partition producer sees it: the send side of its
    inbox (bounded; made by the broker producer, which never closes it)."""

    @property
    def inbox(self) -> trio.MemorySendChannel[BrokerItem]: ...


class BrokerInboxes(Protocol):
    """What a partition producer needs: the broker producer of a node,
    started the first time it is asked for."""

    async def broker_producer(self, node_id: int) -> BrokerInbox: ...


class RetrySink(Protocol):
    """The retry back-edge into one partition producer, as a broker producer
    sees it. Both calls are synchronous and never block: the pipeline is a
    cycle, and a blocking back-edge would deadlock it (sarama's wiki, #2133).
    What is handed over is bounded by ``buffer_memory`` (every item holds an
    accepted message's bytes)."""

    def retry(self, items: list[RetryItem]) -> None:
        """Messages at their new level in their original order, or a returning chaser."""

    def leader_changed(self) -> None:
        """The broker producer gave up on the partition and sent nothing back,
        and the error says the leader may be gone: leave it with a chaser."""


class RetrySinks(Protocol):
    """What a broker producer needs: the retry sink of a partition it was
    sent something of (its partition producer exists by then)."""

    def retry_sink(self, tp: TopicPartition) -> RetrySink: ...
