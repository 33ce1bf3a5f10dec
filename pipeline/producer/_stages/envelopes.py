"""Typed items that travel between stages.

The control envelope (``Fin``) is a distinct type, never
``ProducerMessage`` instances with a flag: nothing that builds a record batch
or reports to a user accepts them, so they cannot leak to the wire (sarama
#2150, where the fin chaser was produced as an empty record) or to a user.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import trio

from pipeline.producer._message import ProducerMessage

#: Sequence numbers are int32 and wrap from 2**31-1 to 0 (Kafka's DefaultRecordBatch).
SEQUENCE_WRAP = 2**31


class TopicPartition(NamedTuple):
    topic: str
    partition: int


@dataclass(slots=True)
class Fin:
    """The chaser: sent down the *old* path when a partition moves on.

    The old broker producer returns it (at ``level + 1``) once it reaches its
    intake: by then it has bounced (or failed) everything of ``tp`` it had,
    with nothing in flight, so the return proves the old path is drained.
    """

    tp: TopicPartition
    level: int


@dataclass(slots=True)
class Handoff:
    """Partition producer -> broker producer: one partition's items, in order.

    Sealed batches (retries) always come before loose messages: a retried batch
    holds older messages than anything not yet sealed.
    """

    tp: TopicPartition
    messages: list[ProducerMessage | SealedBatch]


class SealedBatch:
    """An encoded record batch: the unit that is in flight, and retried whole.

    Sealed by a broker producer for a live leader, with the producer id, epoch
    and base sequence current at that moment (so a batch never mixes epochs).
    A retry re-sends ``records`` unchanged, also to a new leader; only after an
    epoch bump is it re-stamped (and only if it was definitely not written).
    """

    __slots__ = (
        "_deadline",
        "_level",
        "_retries",
        "base_sequence",
        "error",
        "fate_unknown",
        "messages",
        "nbytes",
        "producer_epoch",
        "producer_id",
        "records",
        "tp",
    )

    def __init__(
        self,
        tp: TopicPartition,
        messages: list[ProducerMessage],
        records: bytes,
        producer_id: int,
        producer_epoch: int,
        base_sequence: int,
        nbytes: int,
    ) -> None:
        self.tp = tp
        self.messages = messages
        self.records = records
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.nbytes = nbytes
        self._level = messages[0]._level
        # Retries this batch spent: the times it was sent, failed and went back (the
        # Java client's attempts - 1), judged against ``retries``. Not ``_level``,
        # which also rises when the batch only waited behind a failed one, or is a
        # KIP-126 half (``split_batch``: the halves start one below their batch's
        # count, so the bounce that sends them back spends nothing, as the Java
        # client treats split halves "as if they are not even tried").
        self._retries = 0
        # Messages of a batch are in acceptance order (retried ones were accepted
        # before any later one), so the first has the earliest deadline.
        self._deadline = messages[0]._deadline
        # True once a send of it ended without an answer (connection lost,
        # request timed out): it may have been written, so it must never be
        # re-stamped with a new epoch, only re-sent identical.
        self.fate_unknown = False
        # What its last send was answered with when that sent it back: the error it
        # fails with once its retries are spent (not a later one of its partition's).
        self.error: BaseException | None = None

    def __repr__(self) -> str:
        return (
            f"<SealedBatch {self.tp.topic}[{self.tp.partition}] n={len(self.messages)} "
            f"pid={self.producer_id} epoch={self.producer_epoch} seq={self.base_sequence}>"
        )


BrokerItem = Handoff | Fin
# What a broker producer sends back to a partition producer (never blocks):
# messages at their new level, in their original order, or a returning chaser.
RetryItem = ProducerMessage | SealedBatch | Fin


class FlushMark:
    """Control item ``flush()`` puts on the intake: once the dispatcher reaches it,
    everything a user put on ``producer.input`` before it is accepted (has an id), so
    flush can wait for those too. Never leaves the dispatcher."""

    __slots__ = ("reached",)

    def __init__(self) -> None:
        self.reached = trio.Event()
