"""The fetch stage: one task per leader broker, each keeping one Fetch in flight.

Structure (the mirror of the producer's per-broker stage): :meth:`Fetcher.run` starts
a task for every broker that leads a fetchable partition. A broker's task loops:
take the fetchable partitions it leads (``Assignment.fetchable``: positioned, not
paused, no fetch in flight, buffer under its limit), send one Fetch for them, and
buffer what comes back; then go again at once. So while the application works
through the records of one response, the next one is already on its way
(pipelining), and a partition whose buffer is full is left out until the
application catches up (backpressure).

A fetch would only long-poll (``fetch_max_wait``) when every partition it names is
caught up (its fetch offset at the end of the log, as of its last fetch). While another
partition of the same broker is left out only because its buffer is full, such a fetch
is not sent: it would hold the broker's one fetch slot for up to ``fetch_max_wait``
while the application drains that buffer, and the partition that has records waiting
could not be fetched until it returned. The broker's task waits instead until the
buffer frees up, then sends one fetch for all of them (the broker answers at once for
the partition with records).

Errors are handled as the Java consumer's ``Fetcher`` does:

* leadership errors (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH: our metadata is
  older than the broker's; UNKNOWN_LEADER_EPOCH: the broker's is older; the leader
  or replica not available; a storage error; an unknown partition that metadata may
  still be propagating): the partition waits for fresh metadata (``awaiting_metadata``)
  and is fetched again from the same position, from whoever leads it then;
* OFFSET_OUT_OF_RANGE: the position is reset by ``auto_offset_reset`` (the offset
  resolver looks it up), or with ``"none"`` the application gets
  :class:`OffsetOutOfRangeError`;
* a lost connection or a timeout: every partition of that request waits for fresh
  metadata (the broker may be gone) and the task backs off;
* anything else (authorization, a corrupt batch) fails the consumer with a
  :class:`ConsumerError` naming the partition.

A response is applied to a partition only if its ``token`` and ``fetch_offset`` are
what they were when the request was sent: a seek, reset or revocation meanwhile makes
it stale (``_state.py``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable

import trio

from pipeline.cluster.brokers import CONNECT_ERRORS, cluster_backoff
from pipeline.cluster.errors import KafkaError, MetadataTimeoutError
from pipeline.cluster.pool import Cluster
from pipeline.consumer._config import ConsumerConfig
from pipeline.consumer._decode import lazy_chunk
from pipeline.consumer._errors import ConsumerError, OffsetOutOfRangeError
from pipeline.consumer._state import Assignment, PartitionState
from pipeline.protocol.api import ApiKey
from pipeline.protocol.batch_format import CorruptRecordError
from pipeline.protocol.errors import ErrorCode, error_code
from pipeline.protocol.messages.fetch import (
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    PartitionData,
)

__all__ = ["Fetcher"]

logger = logging.getLogger("pipeline.consumer")

#: Fetch v13+ names topics by id; the name-based versions carry everything we use.
MAX_FETCH_VERSION = 12

_WAIT_FOR_METADATA = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.REPLICA_NOT_AVAILABLE,
    ErrorCode.KAFKA_STORAGE_ERROR,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.OFFSET_NOT_AVAILABLE,
    ErrorCode.NOT_COORDINATOR,
})

Fail = Callable[[ConsumerError], None]


class Fetcher:
    """Runs the per-broker fetch tasks and the metadata waits of an :class:`Assignment`."""

    def __init__(
        self, cluster: Cluster, config: ConsumerConfig, assignment: Assignment, fail: Fail
    ) -> None:
        self._cluster = cluster
        self._config = config
        self._assignment = assignment
        self._fail = fail  # reports an error the application must see (it stops fetching)
        rng = config.cluster.rng or random.Random()
        self._backoff = cluster_backoff(config.cluster, rng)
        self._nodes: set[int] = set()  # brokers with a fetch task
        self._rotation = 0  # which partition goes first in the next request
        self.fetches = 0  # Fetch requests sent (statistics, tests)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled: start a task for each leader, refresh metadata when asked."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._metadata_waits)
            task_status.started()
            while True:
                for state in self._assignment.fetchable():
                    node = self._leader(state)
                    if node is not None and node not in self._nodes:
                        self._nodes.add(node)
                        nursery.start_soon(self._fetch_from, node)
                await self._assignment.wait_changed()

    # ------------------------------------------------------------------ leaders

    def _leader(self, state: PartitionState) -> int | None:
        """The partition's leader from cached metadata, or None (then it waits for a
        refresh); also takes the leader epoch the next fetch names."""
        info = self._cluster.metadata.topics.get(state.tp.topic)
        part = info.partitions.get(state.tp.partition) if info is not None else None
        if part is None or part.leader < 0:
            state.awaiting_metadata = True
            self._assignment.changed()
            return None
        state.leader_epoch = part.leader_epoch
        return part.leader

    async def _metadata_waits(self) -> None:
        """Refresh metadata for partitions that wait for it, then let them be fetched."""
        attempt = 0
        while True:
            waiting = [s for s in self._assignment.partitions.values() if s.awaiting_metadata]
            if not waiting:
                attempt = 0
                await self._assignment.wait_changed()
                continue
            attempt += 1
            await trio.sleep(self._backoff.delay(attempt))
            topics = sorted({s.tp.topic for s in waiting})
            try:
                await self._cluster.refresh(topics, force=True)
            except MetadataTimeoutError as exc:
                logger.warning("metadata for %s: %s", topics, exc)
                continue
            for state in waiting:
                state.awaiting_metadata = False
            self._assignment.changed()

    # ------------------------------------------------------------------ fetching

    def _caught_up(self, state: PartitionState) -> bool:
        """Whether the partition's last fetch found nothing past its fetch offset (the
        high watermark, or the last stable offset under read_committed)."""
        end = state.high_watermark
        if self._config.isolation and state.last_stable_offset >= 0:
            end = min(end, state.last_stable_offset)
        return end >= 0 and state.fetch_offset >= end

    def _held_back(self, node: int) -> bool:
        """Whether a partition ``node`` leads is left out of fetches only because its
        buffer is full (it is fetched again once the application drains it)."""
        limit = self._assignment.buffer_limit
        topics = self._cluster.metadata.topics
        for s in self._assignment.partitions.values():
            if (s.buffered_bytes >= limit and s.position is not None and not s.paused
                    and not s.fetching and not s.awaiting_metadata):
                info = topics.get(s.tp.topic)
                part = info.partitions.get(s.tp.partition) if info is not None else None
                if part is not None and part.leader == node:
                    return True
        return False

    def _mine(self, node: int) -> list[PartitionState]:
        mine = [s for s in self._assignment.fetchable() if self._leader(s) == node]
        if mine and all(self._caught_up(s) for s in mine) and self._held_back(node):
            return []  # a long poll now would hold up a partition with records (module doc)
        if len(mine) > 1:
            # Rotate which partition comes first: Kafka returns at least one batch only
            # for the first partition of a response, however large (KIP-74).
            k = self._rotation % len(mine)
            self._rotation += 1
            mine = mine[k:] + mine[:k]
        return mine

    async def _fetch_from(self, node: int) -> None:
        failures = 0
        while True:
            states = self._mine(node)
            if not states:
                await self._assignment.wait_changed()
                continue
            sent = [(s, s.token, s.fetch_offset) for s in states]
            for s in states:
                s.fetching = True
            try:
                response = await self._fetch(node, sent)
            except (*CONNECT_ERRORS, KafkaError) as exc:
                failures += 1
                logger.info("fetch from broker %d failed: %s", node, exc)
                for s in states:
                    s.awaiting_metadata = True  # the metadata waits refresh their topics
                await trio.sleep(self._backoff.delay(failures))
                continue
            finally:
                for s in states:
                    s.fetching = False
                self._assignment.changed()
            failures = 0
            self._apply(node, response, sent)

    async def _fetch(
        self, node: int, sent: list[tuple[PartitionState, int, int]]
    ) -> FetchResponse:
        cfg = self._config
        by_topic: dict[str, list[FetchPartition]] = {}
        for state, _, offset in sent:
            by_topic.setdefault(state.tp.topic, []).append(FetchPartition(
                partition=state.tp.partition,
                current_leader_epoch=state.leader_epoch,
                fetch_offset=offset,
                partition_max_bytes=cfg.max_partition_fetch_bytes,
            ))
        request = FetchRequest(
            replica_id=-1,
            max_wait_ms=int(cfg.fetch_max_wait * 1000),
            min_bytes=cfg.fetch_min_bytes,
            max_bytes=cfg.fetch_max_bytes,
            isolation_level=cfg.isolation,
            session_id=0,
            session_epoch=-1,
            topics=tuple(FetchTopic(topic=t, partitions=tuple(ps)) for t, ps in by_topic.items()),
            rack_id=cfg.client_rack or "",
        )
        conn = await self._cluster.connection(node)
        version = min(conn.version_for(ApiKey.FETCH), MAX_FETCH_VERSION)
        self.fetches += 1
        return await conn.request(request, version=version)

    def _apply(
        self, node: int, response: FetchResponse, sent: list[tuple[PartitionState, int, int]]
    ) -> None:
        if response.error_code:
            code = error_code(response.error_code)
            self._fail(ConsumerError(f"Fetch from broker {node} failed: {code.name} "
                                     f"({code.description})"))
            return
        asked = {(s.tp.topic, s.tp.partition): (s, token, offset) for s, token, offset in sent}
        for topic in response.responses:
            for data in topic.partitions:
                entry = asked.get((topic.topic, data.partition_index))
                if entry is None:
                    continue
                state, token, offset = entry
                current = self._assignment.partitions.get(state.tp)
                if current is not state or state.token != token or state.fetch_offset != offset:
                    continue  # revoked, or its position was set meanwhile: stale
                self._apply_partition(node, state, offset, data)

    def _apply_partition(self, node: int, state: PartitionState, offset: int,
                         data: PartitionData) -> None:
        code = error_code(data.error_code)
        tp = state.tp
        if code != ErrorCode.NONE:
            self._cluster.broker_stats(node).error(code)
        if code == ErrorCode.NONE:
            nbytes = len(data.records or b"")
            state.fetches += 1
            state.fetched_bytes += nbytes
            self._assignment.fetched_bytes += nbytes
            state.high_watermark = data.high_watermark
            state.last_stable_offset = data.last_stable_offset
            state.log_start_offset = data.log_start_offset
            try:
                chunk = lazy_chunk(
                    data.records, tp.topic, tp.partition, offset,
                    check_crcs=self._config.check_crcs,
                    aborted=(data.aborted_transactions or ()) if self._config.isolation else None)
            except CorruptRecordError as exc:
                self._fail(ConsumerError(
                    f"{tp.topic}[{tp.partition}] at offset {offset}: corrupt record batch "
                    f"({exc}); seek past it to skip it"))
                return
            self._assignment.append(state, chunk)
        elif code in _WAIT_FOR_METADATA:
            logger.info("fetch %s[%d]: %s; waiting for metadata", tp.topic, tp.partition, code.name)
            state.awaiting_metadata = True
            self._cluster.request_refresh([tp.topic])
            self._assignment.changed()
        elif code == ErrorCode.OFFSET_OUT_OF_RANGE:
            reset = self._config.auto_offset_reset
            if reset == "none":
                self._fail(OffsetOutOfRangeError(
                    f"{tp.topic}[{tp.partition}]: offset {offset} is out of range (log "
                    f"{data.log_start_offset}..{data.high_watermark}) and "
                    'auto_offset_reset="none"; seek to a valid offset', {tp: offset}))
                return
            logger.info("fetch %s[%d]: offset %d out of range; resetting to %s",
                        tp.topic, tp.partition, offset, reset)
            self._assignment.request_reset(tp, reset)
        else:
            self._fail(ConsumerError(
                f"Fetch {tp.topic}[{tp.partition}] at offset {offset} failed: {code.name} "
                f"({code.description})"))
