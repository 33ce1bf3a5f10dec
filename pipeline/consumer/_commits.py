"""OffsetCommit and OffsetFetch: the requests and how their answers are read (pure).

OffsetFetch is always sent with ``require_stable`` (v7+), as the Java consumer does
(KIP-447): an offset a transaction has committed but not yet completed is answered
UNSTABLE_OFFSET_COMMIT, and asked again, rather than read early.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pipeline.consumer._types import OffsetAndMetadata, TopicPartition
from pipeline.protocol.errors import ErrorCode, error_code
from pipeline.protocol.messages.offset_commit import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetCommitResponse,
)
from pipeline.protocol.messages.offset_fetch import (
    OffsetFetchRequest,
    OffsetFetchRequestGroup,
    OffsetFetchRequestTopic,
    OffsetFetchRequestTopics,
    OffsetFetchResponse,
)

__all__ = [
    "Committed",
    "commit_errors",
    "commit_request",
    "fetch_request",
    "fetch_result",
]

#: ``{tp: (offset or None, error)}`` from an OffsetFetch answer.
Committed = dict[TopicPartition, tuple[OffsetAndMetadata | None, ErrorCode]]


def _by_topic(tps: Iterable[TopicPartition]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for tp in sorted(tps):
        out.setdefault(tp.topic, []).append(tp.partition)
    return out


def commit_request(
    version: int,
    group_id: str,
    generation: int,
    member_id: str,
    group_instance_id: str | None,
    offsets: Mapping[TopicPartition, OffsetAndMetadata],
) -> OffsetCommitRequest:
    """A member's commit (generation and member id let the coordinator refuse a
    member that is not in the current generation)."""
    topics = []
    for topic, partitions in _by_topic(offsets).items():
        topics.append(OffsetCommitRequestTopic(name=topic, partitions=tuple(
            OffsetCommitRequestPartition(
                partition_index=p,
                committed_offset=offsets[TopicPartition(topic, p)].offset,
                committed_leader_epoch=offsets[TopicPartition(topic, p)].leader_epoch
                if version >= 6 else -1,
                committed_metadata=offsets[TopicPartition(topic, p)].metadata,
            )
            for p in partitions
        )))
    return OffsetCommitRequest(
        group_id=group_id,
        generation_id_or_member_epoch=generation,
        member_id=member_id,
        group_instance_id=group_instance_id if version >= 7 else None,
        topics=tuple(topics),
    )


def commit_errors(response: OffsetCommitResponse) -> dict[TopicPartition, ErrorCode]:
    return {
        TopicPartition(t.name, p.partition_index): error_code(p.error_code)
        for t in response.topics
        for p in t.partitions
    }


def fetch_request(version: int, group_id: str, tps: Iterable[TopicPartition]) -> OffsetFetchRequest:
    by_topic = _by_topic(tps)
    if version >= 8:
        return OffsetFetchRequest(
            groups=(OffsetFetchRequestGroup(group_id=group_id, topics=tuple(
                OffsetFetchRequestTopics(name=t, partition_indexes=tuple(ps))
                for t, ps in by_topic.items()
            )),),
            require_stable=True,
        )
    return OffsetFetchRequest(
        group_id=group_id,
        topics=tuple(
            OffsetFetchRequestTopic(name=t, partition_indexes=tuple(ps)) for t, ps in by_topic.items()
        ),
        require_stable=version >= 7,
    )


def fetch_result(response: OffsetFetchResponse) -> tuple[ErrorCode, Committed]:
    """The group-level error and each partition's committed offset (None: nothing
    committed, the answer's offset -1) with its error. v8+ answers per group: ours is
    the one group asked for."""
    out: Committed = {}
    if response.groups:
        group = response.groups[0]
        top = error_code(group.error_code)
        rows = [(t.name, p.partition_index, p.committed_offset, p.committed_leader_epoch,
                 p.metadata, p.error_code) for t in group.topics for p in t.partitions]
    else:
        top = error_code(response.error_code)
        rows = [(t.name, p.partition_index, p.committed_offset, p.committed_leader_epoch,
                 p.metadata, p.error_code) for t in response.topics for p in t.partitions]
    for topic, partition, offset, epoch, metadata, code in rows:
        committed = OffsetAndMetadata(offset, metadata or "", epoch) if offset >= 0 else None
        out[TopicPartition(topic, partition)] = (committed, error_code(code))
    return top, out
