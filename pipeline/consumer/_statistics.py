"""``consumer.statistics()``: the consumer as numbers, per client, broker, topic and partition.

Taken on demand (and every ``statistics_interval`` for ``on_statistics``); taking one
changes nothing. Counts are kept per fetch response and per chunk of records handed out
(``_state.py``), per request by the cluster's connections (``cluster/stats.py``), per
commit by the group member; positions, offsets and buffers are read off the assignment
when the snapshot is taken. Partitions are those assigned now; the client's totals
include partitions assigned before. docs/observability.md lists every field.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import trio

from pipeline.cluster.stats import BrokerStatistics
from pipeline.util.stats import Statistics, children, counter, gauge, info

if TYPE_CHECKING:
    from pipeline.cluster.pool import Cluster
    from pipeline.consumer._config import ConsumerConfig
    from pipeline.consumer._member import GroupMember
    from pipeline.consumer._member848 import GroupMember848
    from pipeline.consumer._state import Assignment, PartitionState

__all__ = ["ConsumerPartitionStatistics", "ConsumerStatistics", "ConsumerTopicStatistics",
           "snapshot"]


@dataclass(frozen=True, slots=True)
class ConsumerPartitionStatistics(Statistics):
    """One assigned partition. Offsets are None while unknown."""

    METRIC_PREFIX: ClassVar[str] = "partition"

    fetch_state: str = info(
        '"offset_lookup" (no position yet), "paused", "awaiting_metadata", "fetching" (a '
        'Fetch is out), "buffer_full" (waits for the application), "ready"', default="ready")
    leader: int = info("the leader's node id in the consumer's metadata (-1: unknown)",
                       default=-1)
    position: int | None = gauge("the offset of the next record the application gets",
                                 "offset", default=None)
    fetch_offset: int | None = gauge("where the next Fetch starts", "offset", default=None)
    committed: int | None = gauge("the last offset this member committed for it",
                                  "offset", default=None)
    high_watermark: int | None = gauge("the end of the log, from the latest fetch", "offset",
                                       default=None)
    last_stable_offset: int | None = gauge(
        "the end of the log for read_committed, from the latest fetch", "offset", default=None)
    log_start_offset: int | None = gauge("the first offset still in the log", "offset",
                                         default=None)
    lag: int | None = gauge(
        "records between the position and the end of the log (the last stable offset "
        "under read_committed)", "messages", default=None)
    buffered_bytes: int = gauge("fetched bytes not handed out yet", "bytes")
    buffered_offsets: int = gauge(
        "offsets between the position and fetch_offset: the records buffered, with any "
        "control records and gaps among them", "messages")
    fetches: int = counter("Fetch responses that brought data for it", "responses")
    fetched_bytes: int = counter("record bytes fetched for it", "bytes")
    consumed_records: int = counter("records handed to the application", "messages")


@dataclass(frozen=True, slots=True)
class ConsumerTopicStatistics(Statistics):
    """One topic's assigned partitions: their sums."""

    METRIC_PREFIX: ClassVar[str] = "topic"

    lag: int = gauge("the partitions' lag (those known)", "messages")
    buffered_bytes: int = gauge("fetched bytes not handed out yet", "bytes")
    fetched_bytes: int = counter("record bytes fetched (partitions assigned now)", "bytes")
    consumed_records: int = counter("records handed to the application (partitions "
                                    "assigned now)", "messages")
    partitions: dict[int, ConsumerPartitionStatistics] = children(
        "partition", ConsumerPartitionStatistics, "per assigned partition")


@dataclass(frozen=True, slots=True)
class ConsumerStatistics(Statistics):
    """A consumer's statistics (docs/observability.md)."""

    METRIC_PREFIX: ClassVar[str] = "consumer"

    client_id: str = info("the client_id option (labels every metric)", default="")
    group_id: str | None = info("the group (None: no group)")
    state: str = info("the consumer's state (consumer.state)", default="")
    timestamp: float = info("when the snapshot was taken: seconds since the epoch",
                            default=0.0)
    age: float = gauge("seconds since the consumer opened", "seconds", default=0.0)
    member_id: str = info("this member's id in the group", default="")
    generation: int = gauge("the group generation (member epoch with KIP-848) it is in",
                            "generation", default=-1)
    leader: bool = info("this member leads the group (classic protocol)", default=False)
    coordinator: int | None = info("the group coordinator's node id")
    coordinator_moves: int = counter("times the group coordinator moved", "moves")
    rebalances: int = counter("rebalances this member went through", "rebalances")
    since_last_heartbeat: float | None = gauge(
        "seconds since the coordinator last answered a heartbeat", "seconds", default=None)
    commits: int = counter("offset commits this member made", "commits")
    interceptor_errors: int = counter(
        "interceptor calls (on_consume, on_commit) that raised or returned no list", "calls")
    assigned_partitions: int = gauge("partitions assigned now", "partitions")
    fetches: int = counter("Fetch requests sent", "requests")
    fetched_bytes: int = counter("record bytes fetched", "bytes")
    consumed_records: int = counter("records handed to the application", "messages")
    buffered_bytes: int = gauge("fetched bytes not handed out yet", "bytes")
    lag: int = gauge("the assigned partitions' lag (those known)", "messages")
    brokers: dict[int, BrokerStatistics] = children(
        "broker", BrokerStatistics, "per broker the consumer connected to, by node id")
    topics: dict[str, ConsumerTopicStatistics] = children(
        "topic", ConsumerTopicStatistics, "per topic with assigned partitions")


def _fetch_state(state: PartitionState, buffer_limit: int) -> str:
    if state.position is None:
        return "offset_lookup"
    if state.paused:
        return "paused"
    if state.awaiting_metadata:
        return "awaiting_metadata"
    if state.fetching:
        return "fetching"
    return "buffer_full" if state.buffered_bytes >= buffer_limit else "ready"


def _known(offset: int) -> int | None:
    return None if offset < 0 else offset


def snapshot(*, config: ConsumerConfig, state: str, cluster: Cluster, assignment: Assignment,
             group: GroupMember | GroupMember848 | None, fetches: int,
             started_at: float) -> ConsumerStatistics:
    """A consumer's statistics now, from its parts (``fetches``: Fetch requests sent so
    far; ``started_at``: trio time it opened)."""
    group_stats: dict[str, Any] = {} if group is None else group.statistics()
    committed = {} if group is None else group.committed_offsets
    metadata = cluster.metadata
    topics: dict[str, dict[int, ConsumerPartitionStatistics]] = {}
    in_hand = 0  # records handed out of chunks not finished yet
    for tp, part in sorted(assignment.partitions.items()):
        head = part.chunks[0].index if part.chunks else 0
        in_hand += head
        position = part.position
        fetch_offset = part.fetch_offset if position is not None else -1
        leader = metadata.leader_for(tp.topic, tp.partition)
        topics.setdefault(tp.topic, {})[tp.partition] = ConsumerPartitionStatistics(
            fetch_state=_fetch_state(part, assignment.buffer_limit),
            leader=-1 if leader is None else leader,
            position=position, fetch_offset=_known(fetch_offset),
            committed=committed.get(tp),
            high_watermark=_known(part.high_watermark),
            last_stable_offset=_known(part.last_stable_offset),
            log_start_offset=_known(part.log_start_offset),
            lag=part.lag(bool(config.isolation)), buffered_bytes=part.buffered_bytes,
            buffered_offsets=max(0, fetch_offset - position) if position is not None else 0,
            fetches=part.fetches, fetched_bytes=part.fetched_bytes,
            consumed_records=part.consumed + head)
    by_topic = {
        name: ConsumerTopicStatistics(
            lag=sum(p.lag or 0 for p in parts.values()),
            buffered_bytes=sum(p.buffered_bytes for p in parts.values()),
            fetched_bytes=sum(p.fetched_bytes for p in parts.values()),
            consumed_records=sum(p.consumed_records for p in parts.values()),
            partitions=parts)
        for name, parts in topics.items()}
    try:
        age = trio.current_time() - started_at
    except RuntimeError:  # (read outside trio)
        age = 0.0
    return ConsumerStatistics(
        client_id=config.cluster.client_id or "",
        group_id=config.group_id,
        state=state,
        timestamp=time.time(),
        age=age,
        member_id=group_stats.get("member_id", ""),
        generation=group_stats.get("generation", -1),
        leader=bool(group_stats.get("leader", False)),
        coordinator=group_stats.get("coordinator"),
        coordinator_moves=group_stats.get("coordinator_moves", 0),
        rebalances=group_stats.get("rebalances", 0),
        since_last_heartbeat=group_stats.get("since_last_heartbeat"),
        commits=0 if group is None else group.commits,
        assigned_partitions=len(assignment.partitions),
        fetches=fetches,
        fetched_bytes=assignment.fetched_bytes,
        consumed_records=assignment.consumed + in_hand,
        buffered_bytes=sum(t.buffered_bytes for t in by_topic.values()),
        lag=sum(t.lag for t in by_topic.values()),
        brokers=cluster.broker_statistics(),
        topics=by_topic,
    )
