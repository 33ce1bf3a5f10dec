"""The offset resolver: gives every assigned partition without a position one.

The Java consumer's ``updateFetchPositions``, as a task: a partition assigned by the
group starts at its committed offset (OffsetFetch, through ``committed``); one with
no committed offset, one whose position fell out of the log, and one the application
sent to the beginning or end, are reset by a ListOffsets to their leader: earliest,
or latest (the high watermark; the last stable offset under read_committed), per
``auto_offset_reset`` or the seek. With ``auto_offset_reset="none"`` a partition that
needs a reset fails the consumer with :class:`NoOffsetForPartitionError` instead.

Lookups are retried (with backoff) while their errors are retriable; a result is
applied only if the partition still waits for it under the same ``token``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping

import trio

from pipeline.cluster.brokers import CONNECT_ERRORS, cluster_backoff
from pipeline.cluster.errors import KafkaError
from pipeline.cluster.pool import Cluster
from pipeline.consumer._config import ConsumerConfig
from pipeline.consumer._errors import ConsumerError, NoOffsetForPartitionError
from pipeline.consumer._state import Assignment, PartitionState
from pipeline.consumer._types import OffsetAndMetadata, TopicPartition
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode, error_code
from pipeline.protocol.messages.list_offsets import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)

__all__ = ["EARLIEST", "LATEST", "CommittedLookup", "OffsetResolver", "list_offsets"]

logger = logging.getLogger("pipeline.consumer")

EARLIEST, LATEST = -2, -1
_TIMESTAMPS = {"earliest": EARLIEST, "latest": LATEST}

#: ``committed(partitions)``: the group's committed offsets (None: nothing committed).
CommittedLookup = Callable[
    [frozenset[TopicPartition]], Awaitable[Mapping[TopicPartition, OffsetAndMetadata | None]]
]


class _Retry(Exception):
    """A lookup failed in a way a later attempt may not."""


async def list_offsets(
    cluster: Cluster, requests: Mapping[TopicPartition, int], isolation: int
) -> dict[TopicPartition, tuple[int, int]]:
    """``{tp: (offset, leader_epoch)}`` for ``{tp: timestamp}`` (-2 earliest, -1 latest),
    one ListOffsets per leader. Partitions whose answer is a retriable error are left
    out (metadata is refreshed for them); a non-retriable error raises ConsumerError."""
    by_leader: dict[int, list[TopicPartition]] = {}
    for tp in requests:
        leader = await cluster.leader_for(tp.topic, tp.partition)
        by_leader.setdefault(leader, []).append(tp)
    out: dict[TopicPartition, tuple[int, int]] = {}
    for leader, tps in by_leader.items():
        topics: dict[str, list[ListOffsetsPartition]] = {}
        for tp in tps:
            info = cluster.metadata.topics.get(tp.topic)
            part = info.partitions.get(tp.partition) if info is not None else None
            topics.setdefault(tp.topic, []).append(ListOffsetsPartition(
                partition_index=tp.partition,
                current_leader_epoch=part.leader_epoch if part is not None else -1,
                timestamp=requests[tp],
            ))
        conn = await cluster.connection(leader)
        response = await conn.request(
            ListOffsetsRequest(
                replica_id=-1,
                isolation_level=isolation,
                topics=tuple(ListOffsetsTopic(name=t, partitions=tuple(ps)) for t, ps in topics.items()),
            ),
            version=conn.version_for(ApiKey.LIST_OFFSETS),
        )
        for t in response.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, p.partition_index)
                code = error_code(p.error_code)
                if code == ErrorCode.NONE:
                    offset = p.offset
                    if offset < 0 and p.old_style_offsets:
                        offset = p.old_style_offsets[0]
                    out[tp] = (offset, p.leader_epoch)
                elif code.retriable or code in (ErrorCode.FENCED_LEADER_EPOCH,
                                                ErrorCode.UNKNOWN_LEADER_EPOCH):
                    cluster.request_refresh([tp.topic])
                else:
                    raise ConsumerError(
                        f"ListOffsets for {tp.topic}[{tp.partition}] failed: {code.name} "
                        f"({code.description})"
                    )
    return out


class OffsetResolver:
    """Runs until cancelled; see the module doc."""

    def __init__(
        self,
        cluster: Cluster,
        config: ConsumerConfig,
        assignment: Assignment,
        fail: Callable[[ConsumerError], None],
        committed: CommittedLookup | None,
    ) -> None:
        self._cluster = cluster
        self._config = config
        self._assignment = assignment
        self._fail = fail
        self._committed = committed
        self._backoff = cluster_backoff(config.cluster, config.cluster.rng or random.Random())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        attempt = 0
        while True:
            need = self._assignment.needing_position()
            if not need:
                attempt = 0
                await self._assignment.wait_changed()
                continue
            try:
                await self._resolve(need)
                attempt = 0
            except ConsumerError as exc:
                self._fail(exc)
                await self._assignment.wait_changed()
            except (_Retry, *CONNECT_ERRORS, KafkaError) as exc:
                attempt += 1
                delay = self._backoff.delay(attempt)
                logger.info("offset lookup failed (retry in %.3fs): %s", delay, exc)
                await trio.sleep(delay)

    async def _resolve(self, need: list[PartitionState]) -> None:
        tokens = {s.tp: s.token for s in need}

        def still(tp: TopicPartition) -> PartitionState | None:
            state = self._assignment.partitions.get(tp)
            if state is None or state.token != tokens[tp] or state.position is not None:
                return None
            return state

        unset = frozenset(s.tp for s in need if s.reset is None)
        if unset and self._committed is not None:
            committed = await self._committed(unset)
            for tp in unset:
                state = still(tp)
                if state is None:
                    continue
                found = committed.get(tp)
                if found is not None and found.offset >= 0:
                    self._assignment.seek(tp, found.offset, found.leader_epoch)
                    tokens[tp] = self._assignment.partitions[tp].token
                else:
                    state.reset = self._config.auto_offset_reset
        elif unset:
            for tp in unset:
                self._assignment.partitions[tp].reset = self._config.auto_offset_reset
        resets = {tp: s.reset for tp in tokens if (s := still(tp)) is not None and s.reset}
        if not resets:
            return
        none = frozenset(tp for tp, how in resets.items() if how == "none")
        if none:
            names = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(none))
            raise NoOffsetForPartitionError(
                f"no committed offset for {names} and auto_offset_reset=\"none\"; "
                "seek() to a position, or set auto_offset_reset to \"earliest\" or \"latest\"",
                none,
            )
        offsets = await list_offsets(
            self._cluster, {tp: _TIMESTAMPS[how] for tp, how in resets.items()},
            self._config.isolation,
        )
        for tp, (offset, epoch) in offsets.items():
            if still(tp) is not None:
                self._assignment.seek(tp, offset, epoch)
        if len(offsets) < len(resets):
            raise _Retry(f"no offset yet for {sorted(set(resets) - set(offsets))}")
