"""Cluster metadata: immutable snapshots and the pure rules for refreshing them.

Nothing here does I/O or reads a clock: :class:`~pipeline.cluster.pool.Cluster`
passes ``now`` in and swaps whole snapshots, so readers never see a
half-applied update.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from pipeline.protocol.errors import ErrorCode, error_code

__all__ = [
    "BrokerAddress",
    "ClusterMetadata",
    "MetadataUpdate",
    "PartitionInfo",
    "TopicInfo",
    "apply_metadata_response",
]


def _empty() -> Mapping[Any, Any]:
    return MappingProxyType({})


# Topic-level errors after which asking again can help: the topic is being
# created, or its partitions have no leader yet.
_RETRIABLE_TOPIC_ERRORS = frozenset(
    {ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.NOT_LEADER_OR_FOLLOWER}
)


class BrokerAddress(NamedTuple):
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    leader: int  # node id, -1 while the partition has no leader
    leader_epoch: int = -1  # -1 when the broker does not report epochs (Metadata < v7)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    partitions: Mapping[int, PartitionInfo]  # {partition index: info}
    topic_id: Any = None  # Metadata v10+; tells a re-created topic from the old one

    @property
    def partition_count(self) -> int:
        return len(self.partitions)

    @property
    def all_leaders_known(self) -> bool:
        return all(p.leader >= 0 for p in self.partitions.values())


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """One consistent view of the cluster, replaced whole on every refresh."""

    brokers: Mapping[int, BrokerAddress] = field(default_factory=_empty)  # {node_id: (host, port)}
    topics: Mapping[str, TopicInfo] = field(default_factory=_empty)  # {name: info}
    controller_id: int = -1
    cluster_id: str | None = None
    fetched_at: float = -float("inf")  # trio time of the response, -inf before the first

    def leader_for(self, topic: str, partition: int) -> int | None:
        """The leader's node id; None if the topic or partition is unknown; -1 if leaderless."""
        info = self.topics.get(topic)
        if info is None:
            return None
        part = info.partitions.get(partition)
        return None if part is None else part.leader


@dataclass(frozen=True, slots=True)
class MetadataUpdate:
    """The result of applying one MetadataResponse."""

    metadata: ClusterMetadata
    # {topic: error} for requested topics the response did not make usable
    topic_errors: Mapping[str, ErrorCode]
    # requested topics still worth asking about again soon (retriable error or a
    # partition without a leader)
    incomplete: frozenset[str]


def apply_metadata_response(
    old: ClusterMetadata,
    response: Any,
    *,
    requested: Collection[str],
    now: float,
    allow_auto_topic_creation: bool = False,
) -> MetadataUpdate:
    """Merge a MetadataResponse into ``old`` and return the new snapshot.

    * The broker list is replaced: it is the whole cluster as the broker sees it.
    * A topic reported without error replaces the cached one, except that a
      partition whose ``leader_epoch`` is older than the cached one keeps the
      cached leader (the answering broker's view is stale).
    * UNKNOWN_TOPIC_OR_PARTITION removes the topic (it was deleted, or never
      existed) and is reported in ``topic_errors``; with auto-creation on it
      is also ``incomplete`` (the broker may be creating it).
    * Other topic errors keep the cached entry and are reported; retriable ones
      and partitions without a leader make the topic ``incomplete``.
    * Cached topics that were not requested are kept.
    """
    brokers = {b.node_id: BrokerAddress(b.host, b.port) for b in response.brokers}
    topics = dict(old.topics)
    errors: dict[str, ErrorCode] = {}
    incomplete: set[str] = set()
    seen: set[str] = set()
    for t in response.topics:
        name = t.name
        if name is None:
            continue
        seen.add(name)
        code = error_code(t.error_code)
        if code == ErrorCode.NONE:
            topic_id = getattr(t, "topic_id", None)
            cached = old.topics.get(name)
            if cached is not None and cached.topic_id != topic_id:
                cached = None  # deleted and re-created: old epochs mean nothing
            partitions: dict[int, PartitionInfo] = {}
            for p in t.partitions:
                info = PartitionInfo(leader=p.leader_id, leader_epoch=p.leader_epoch)
                prev = cached.partitions.get(p.partition_index) if cached else None
                if prev is not None and 0 <= info.leader_epoch < prev.leader_epoch:
                    info = prev  # stale answer: keep the newer leader we know
                partitions[p.partition_index] = info
            topic = TopicInfo(name, MappingProxyType(dict(sorted(partitions.items()))), topic_id)
            topics[name] = topic
            if not topic.all_leaders_known or not partitions:
                incomplete.add(name)
            continue
        errors[name] = code
        if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            topics.pop(name, None)
            if allow_auto_topic_creation:
                incomplete.add(name)
        elif code.retriable or code in _RETRIABLE_TOPIC_ERRORS:
            incomplete.add(name)
    for name in requested:
        if name not in seen and name not in topics:
            # Not mentioned at all: ask again.
            incomplete.add(name)
    metadata = ClusterMetadata(
        brokers=MappingProxyType(brokers),
        topics=MappingProxyType(topics),
        controller_id=getattr(response, "controller_id", -1),
        cluster_id=getattr(response, "cluster_id", None),
        fetched_at=now,
    )
    return MetadataUpdate(metadata, MappingProxyType(errors), frozenset(incomplete))
