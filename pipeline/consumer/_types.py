"""The consumer's value types: what it hands out and takes back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = [
    "ConsumedRecord",
    "ConsumerGroupMetadata",
    "ConsumerState",
    "OffsetAndMetadata",
    "TopicPartition",
]


class TopicPartition(NamedTuple):
    """A partition of a topic; any ``(topic, partition)`` tuple is accepted in its place."""

    topic: str
    partition: int


class ConsumedRecord(NamedTuple):
    """One record as read from a partition. A named tuple: the fetcher's decoder builds
    one per record directly (no other object per record), and it is immutable."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # milliseconds since the epoch (CreateTime or LogAppendTime)
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    # The partition leader's epoch when the record was written (-1 if unknown):
    # committed with the offset, so a later leader can detect log truncation.
    leader_epoch: int = -1

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A committed position: the offset of the *next* record to read."""

    offset: int
    metadata: str = ""
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadata:
    """Who the member is in which generation: what ``send_offsets_to_transaction``
    needs so the coordinator fences a member that is no longer in the group (KIP-447)."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""
    group_instance_id: str | None = None


#: ``consumer.state``: "unjoined" (no assignment yet, or none since the group was
#: left), "rebalancing" (a join is under way), "stable" (member of the current
#: generation), "assigned" (no group: partitions assigned by the application),
#: "closed", "failed" (a fatal error; the next iteration raises it).
ConsumerState = Literal["unjoined", "rebalancing", "stable", "assigned", "closed", "failed"]
