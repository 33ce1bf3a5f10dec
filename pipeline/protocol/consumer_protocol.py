"""The consumer group protocol's member bytes: subscriptions and assignments.

A classic group's JoinGroup carries, per offered assignor, the member's
*subscription* as opaque bytes; SyncGroup carries each member's *assignment*.
The broker never reads them; the members do, so a client shares a group with
Java and librdkafka members only if it writes and reads Kafka's layouts
(``ConsumerProtocolSubscription.json`` / ``ConsumerProtocolAssignment.json``,
versions 0-3, never flexible), each prefixed by its int16 version:

========  ====================================================================
version   subscription fields (assignment: partitions, user data, any version)
========  ====================================================================
0         topics, user data
1         + owned partitions (KIP-429: what the member still holds)
2         + generation id (the generation those owned partitions are from)
3         + rack id (KIP-881: rack-aware assignment)
========  ====================================================================

Kafka's compatibility rule, kept here: a newer version only appends fields, so a
version above 3 is read with the version-3 layout and whatever follows is ignored.
Fields a lower version lacks are dropped on encode (all are "ignorable") and read
back as their defaults.

Sans-I/O: bytes in, dataclasses out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self

from pipeline.protocol.errors import DecodeError
from pipeline.protocol.primitives import Reader, Writer

__all__ = [
    "CONSUMER_PROTOCOL_TYPE",
    "HIGHEST_VERSION",
    "ConsumerProtocolAssignment",
    "ConsumerProtocolSubscription",
    "TopicPartitions",
    "group_partitions",
]

#: The JoinGroup protocol type every consumer (Java, librdkafka, ours) uses.
CONSUMER_PROTOCOL_TYPE = "consumer"
#: The newest layout we write and fully read (Kafka 3.5+ writes it too).
HIGHEST_VERSION = 3

#: ``((topic, (partition, ...)), ...)``: the wire's grouping of partitions by topic.
TopicPartitions = tuple[tuple[str, tuple[int, ...]], ...]


def group_partitions(partitions: Iterable[tuple[str, int]]) -> TopicPartitions:
    """``[(topic, partition), ...]`` grouped by topic, topics and partitions sorted
    (the order the Java client writes owned partitions in)."""
    by_topic: dict[str, set[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, set()).add(partition)
    return tuple((t, tuple(sorted(by_topic[t]))) for t in sorted(by_topic))


def _flatten(groups: TopicPartitions) -> frozenset[tuple[str, int]]:
    return frozenset((t, p) for t, parts in groups for p in parts)


def _check_version(version: int, what: str) -> None:
    if not 0 <= version <= HIGHEST_VERSION:
        raise ValueError(f"{what} version must be 0-{HIGHEST_VERSION}, not {version}")


def _read_version(r: Reader, what: str) -> int:
    version = r.int16()
    if version < 0:
        raise DecodeError(f"invalid {what} version {version}")
    return min(version, HIGHEST_VERSION)


def _write_topic_partitions(w: Writer, groups: TopicPartitions) -> None:
    def one(item: tuple[str, tuple[int, ...]]) -> None:
        w.string(item[0])
        w.array(item[1], w.int32)

    w.array(groups, one)


def _read_topic_partitions(r: Reader) -> TopicPartitions:
    def one() -> tuple[str, tuple[int, ...]]:
        return r.string(), r.array(r.int32)

    return r.array(one)


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerProtocolSubscription:
    """What a member asks for: its topics, and since v1 what it already owns."""

    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: TopicPartitions = ()  # v1+
    generation_id: int = -1  # v2+: the generation owned_partitions were assigned in
    rack_id: str | None = None  # v3+

    @property
    def owned(self) -> frozenset[tuple[str, int]]:
        """The owned partitions as a set of ``(topic, partition)``."""
        return _flatten(self.owned_partitions)

    def encode(self, version: int = HIGHEST_VERSION) -> bytes:
        """The version-prefixed bytes, topics sorted (as the Java client writes them)."""
        _check_version(version, "subscription")
        w = Writer()
        w.int16(version)
        w.array(sorted(self.topics), w.string)
        w.nullable_bytes(self.user_data)
        if version >= 1:
            _write_topic_partitions(w, self.owned_partitions)
        if version >= 2:
            w.int32(self.generation_id)
        if version >= 3:
            w.nullable_string(self.rack_id)
        return w.getvalue()

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Self:
        """Read any version (a newer one with the version-3 layout).

        Raises :class:`DecodeError` on truncated or malformed bytes.
        """
        r = Reader(data)
        version = _read_version(r, "subscription")
        topics = r.array(r.string)
        user_data = r.nullable_bytes()
        owned = _read_topic_partitions(r) if version >= 1 else ()
        generation = r.int32() if version >= 2 else -1
        rack = r.nullable_string() if version >= 3 else None
        return cls(
            topics=topics,
            user_data=user_data,
            owned_partitions=owned,
            generation_id=generation,
            # The Java client reads an empty rack as none.
            rack_id=rack or None,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerProtocolAssignment:
    """What the leader gives a member: its partitions (and assignor user data)."""

    assigned_partitions: TopicPartitions = ()
    user_data: bytes | None = None

    @classmethod
    def of(
        cls, partitions: Iterable[tuple[str, int]], user_data: bytes | None = None
    ) -> Self:
        """An assignment of ``[(topic, partition), ...]`` (grouped and sorted)."""
        return cls(assigned_partitions=group_partitions(partitions), user_data=user_data)

    @property
    def partitions(self) -> frozenset[tuple[str, int]]:
        """The assigned partitions as a set of ``(topic, partition)``."""
        return _flatten(self.assigned_partitions)

    def encode(self, version: int = HIGHEST_VERSION) -> bytes:
        """The version-prefixed bytes (every version has the same fields)."""
        _check_version(version, "assignment")
        w = Writer()
        w.int16(version)
        _write_topic_partitions(w, self.assigned_partitions)
        w.nullable_bytes(self.user_data)
        return w.getvalue()

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> Self:
        """Read any version. Empty bytes are an empty assignment: the coordinator
        gives them to a member the leader's SyncGroup left out.

        Raises :class:`DecodeError` on truncated or malformed bytes.
        """
        if len(data) == 0:
            return cls()
        r = Reader(data)
        _read_version(r, "assignment")
        return cls(assigned_partitions=_read_topic_partitions(r), user_data=r.nullable_bytes())

