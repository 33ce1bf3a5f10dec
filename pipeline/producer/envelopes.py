"""Typed items that travel between stages.

Control envelopes (``Syn``, ``Fin``) are distinct types, never
``ProducerMessage`` instances with a flag: nothing that builds a record batch
or reports to a user accepts them, so they cannot leak to the wire (sarama
#2150, where the fin chaser was produced as an empty record) or to a user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from pipeline.producer.message import ProducerMessage


class TopicPartition(NamedTuple):
    topic: str
    partition: int


@dataclass(slots=True)
class Syn:
    """Partition producer -> broker producer: "I now send ``tp`` to you".

    Clears any retry state the broker producer still holds for ``tp`` from an
    earlier leadership (leader ping-pong).
    """

    tp: TopicPartition


@dataclass(slots=True)
class Fin:
    """The chaser: sent down the *old* path when a partition moves on.

    The old broker producer bounces it back (at ``level + 1``) only after every
    message of ``tp`` it will ever bounce, and after every in-flight batch of
    ``tp`` has completed, so its return proves the old path is drained.
    """

    tp: TopicPartition
    level: int


@dataclass(slots=True)
class Batch:
    """Partition producer -> broker producer: messages for one partition, in order."""

    tp: TopicPartition
    messages: list[ProducerMessage]


BrokerItem = Batch | Syn | Fin
# What a broker producer sends back to a partition producer (never blocks):
# messages at their new level, in their original order, or a returning chaser.
RetryItem = ProducerMessage | Fin
