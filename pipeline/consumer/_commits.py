"""OffsetCommit and OffsetFetch: the requests, how their answers are read, and the
retries of what is retriable (the member decides what the rest means).

OffsetFetch is always sent with ``require_stable`` (v7+), as the Java consumer does
(KIP-447): an offset a transaction has committed but not yet completed is answered
UNSTABLE_OFFSET_COMMIT, and asked again, rather than read early.

Retried (with backoff, until the caller's deadline): a lost connection or timeout, and
COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE (the
coordinator is looked up again), REQUEST_TIMED_OUT, UNKNOWN_TOPIC_OR_PARTITION (for a
commit: metadata still propagating), and any retriable OffsetFetch error.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping

import trio

from pipeline.cluster.brokers import CONNECT_ERRORS
from pipeline.cluster.errors import KafkaError
from pipeline.consumer._coordinator import COORDINATOR_GONE, Coordinator
from pipeline.consumer._errors import ConsumerClosedError, ConsumerError
from pipeline.consumer._types import OffsetAndMetadata, TopicPartition
from pipeline.protocol.api import ApiKey
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
from pipeline.util.backoff import Backoff

__all__ = [
    "Committed",
    "commit_errors",
    "commit_request",
    "fetch_committed",
    "fetch_request",
    "fetch_result",
    "send_commit",
]

logger = logging.getLogger("pipeline.consumer")

_RETRY_COMMIT = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                           ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.REQUEST_TIMED_OUT})

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


async def send_commit(
    coordinator: Coordinator,
    backoff: Backoff,
    group_id: str,
    generation: int,
    member_id: str,
    group_instance_id: str | None,
    offsets: Mapping[TopicPartition, OffsetAndMetadata],
) -> dict[TopicPartition, ErrorCode]:
    """Commit until the answer is not retriable: ``{}`` when committed, else the
    partitions' errors (all the same error in practice: the group's verdict)."""
    make = functools.partial(_commit_request, group_id, generation, member_id,
                             group_instance_id, offsets)
    attempt = 0
    while True:
        try:
            response = await coordinator.request(ApiKey.OFFSET_COMMIT, make)
        except ConsumerClosedError:
            raise
        except (*CONNECT_ERRORS, KafkaError) as exc:
            attempt += 1
            logger.info("group %r: commit failed (%s); retrying", group_id, exc)
            await trio.sleep(backoff.delay(attempt))
            continue
        errors: dict[TopicPartition, ErrorCode] = {
            tp: c for tp, c in commit_errors(response).items() if c != ErrorCode.NONE}
        retry = [c for c in errors.values() if c in COORDINATOR_GONE or c in _RETRY_COMMIT]
        if not retry:
            return errors
        if any(c in COORDINATOR_GONE for c in retry):
            coordinator.forget()
        attempt += 1
        await trio.sleep(backoff.delay(attempt))


def _commit_request(group_id: str, generation: int, member_id: str, instance: str | None,
                    offsets: Mapping[TopicPartition, OffsetAndMetadata],
                    version: int) -> OffsetCommitRequest:
    return commit_request(version, group_id, generation, member_id, instance, offsets)


async def fetch_committed(
    coordinator: Coordinator, backoff: Backoff, group_id: str, tps: frozenset[TopicPartition]
) -> dict[TopicPartition, OffsetAndMetadata | None]:
    """The group's committed offsets for ``tps`` (None: nothing committed), retried
    while the answer is retriable. Raises ConsumerError for the others."""
    make = functools.partial(_fetch_request, group_id, tps)
    attempt = 0
    while True:
        try:
            response = await coordinator.request(ApiKey.OFFSET_FETCH, make)
        except ConsumerClosedError:
            raise
        except (*CONNECT_ERRORS, KafkaError) as exc:
            attempt += 1
            logger.info("group %r: OffsetFetch failed (%s)", group_id, exc)
            await trio.sleep(backoff.delay(attempt))
            continue
        top, rows = fetch_result(response)
        codes = {top} | {code for _, code in rows.values()}
        codes.discard(ErrorCode.NONE)
        if not codes:
            return {tp: rows.get(tp, (None, ErrorCode.NONE))[0] for tp in tps}
        fatal = sorted(c for c in codes if c not in COORDINATOR_GONE and not c.retriable)
        if fatal:
            code = fatal[0]
            raise ConsumerError(f"OffsetFetch for group {group_id!r} failed: {code.name} "
                                f"({code.description})")
        if codes & COORDINATOR_GONE:
            coordinator.forget()
        attempt += 1
        await trio.sleep(backoff.delay(attempt))


def _fetch_request(group_id: str, tps: frozenset[TopicPartition], version: int
                   ) -> OffsetFetchRequest:
    return fetch_request(version, group_id, tps)
