"""ListOffsets and Fetch: reading a partition's log, as Kafka answers.

* ListOffsets: -2 earliest, -1 latest (the high watermark; the last stable
  offset with isolation_level 1), -3 max timestamp (v7+), else the first offset
  whose timestamp is >= the one asked for.
* Fetch (v4-v12 by topic name, v13+ by id) returns the stored batches' bytes from
  the batch holding `fetch_offset`, at least one batch even past
  `partition_max_bytes` (KIP-74), and waits up to `max_wait_ms` for
  `min_bytes`. With isolation_level 1 (read_committed) only batches below the
  last stable offset, and the aborted transactions overlapping what is returned
  (an empty list, not null, when there are none); `last_stable_offset` is sent
  at both levels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import fetch as fm
from pipeline.protocol.messages import list_offsets as lo

from .state import FakeState, PartitionState

Inject = Callable[[str | None, int | None], int | None]


# --------------------------------------------------------------------------
# ListOffsets


def _leader_epoch_error(part: PartitionState, requested: int) -> int:
    # As Kafka's Partition.checkCurrentLeaderEpoch: only -1 means "no epoch, no check";
    # any other epoch below the leader's (-2 included) is fenced.
    if requested == -1 or requested == part.leader_epoch:
        return 0
    if requested < part.leader_epoch:
        return int(ErrorCode.FENCED_LEADER_EPOCH)
    return int(ErrorCode.UNKNOWN_LEADER_EPOCH)


def _partition_check(
    state: FakeState, node_id: int, topic: str, index: int, epoch: int
) -> tuple[int, PartitionState | None]:
    part = state.partition(topic, index)
    if part is None:
        return int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), None
    code = _leader_epoch_error(part, epoch)
    if code:
        return code, None
    if part.leader != node_id:
        return int(ErrorCode.NOT_LEADER_OR_FOLLOWER), None
    return 0, part


def handle_list_offsets(
    state: FakeState,
    node_id: int,
    version: int,
    request: lo.ListOffsetsRequest,
    inject: Inject,
    decode_timestamps: Callable[[PartitionState, int], tuple[int, int]],
) -> lo.ListOffsetsResponse:
    topics_out = []
    for t in request.topics:
        parts_out = []
        for p in t.partitions:
            injected = inject(t.name, p.partition_index)
            if injected is not None:
                code, part = injected, None
            else:
                code, part = _partition_check(
                    state, node_id, t.name, p.partition_index, p.current_leader_epoch
                )
            if part is None:
                parts_out.append(
                    lo.ListOffsetsPartitionResponse(
                        partition_index=p.partition_index, error_code=code, timestamp=-1, offset=-1
                    )
                )
                continue
            ts, offset = -1, -1
            if p.timestamp == -2:
                offset = part.log_start_offset
            elif p.timestamp == -1:
                offset = (part.last_stable_offset if version >= 2 and request.isolation_level
                          else part.high_watermark)
            else:
                ts, offset = decode_timestamps(part, p.timestamp)
            parts_out.append(
                lo.ListOffsetsPartitionResponse(
                    partition_index=p.partition_index,
                    error_code=0,
                    timestamp=ts,
                    offset=offset,
                    leader_epoch=part.leader_epoch,
                )
            )
        topics_out.append(lo.ListOffsetsTopicResponse(name=t.name, partitions=tuple(parts_out)))
    return lo.ListOffsetsResponse(topics=tuple(topics_out))


# --------------------------------------------------------------------------
# Fetch


async def handle_fetch(
    state: FakeState,
    node_id: int,
    version: int,
    request: fm.FetchRequest,
    inject: Inject,
    wait_for_data: Callable[[float], Any],
) -> fm.FetchResponse:
    deadline = trio.current_time() + max(0, request.max_wait_ms) / 1000
    while True:
        response, total = _fetch_once(state, node_id, version, request, inject)
        if total >= max(1, request.min_bytes) or trio.current_time() >= deadline:
            return response
        await wait_for_data(deadline)


def _fetch_once(
    state: FakeState, node_id: int, version: int, request: fm.FetchRequest, inject: Inject
) -> tuple[fm.FetchResponse, int]:
    total = 0
    budget = request.max_bytes if version >= 3 else 2**31 - 1
    topics_out = []
    errors = False
    by_id = {tp.topic_id: tp.name for tp in state.topics.values()} if version >= 13 else {}
    for t in request.topics:
        parts_out = []
        name = by_id.get(t.topic_id) if version >= 13 else t.topic
        for p in t.partitions:
            injected = inject(name, p.partition)
            if injected is not None:
                code, part = injected, None
            elif name is None:
                code, part = int(ErrorCode.UNKNOWN_TOPIC_ID), None
            else:
                code, part = _partition_check(
                    state, node_id, name, p.partition, p.current_leader_epoch
                )
            if part is None:
                errors = True
                parts_out.append(
                    fm.PartitionData(
                        partition_index=p.partition,
                        error_code=code,
                        high_watermark=-1,
                        records=None,
                    )
                )
                continue
            hw = part.high_watermark
            lso = part.last_stable_offset
            committed = request.isolation_level == 1
            if p.fetch_offset < part.log_start_offset or p.fetch_offset > hw:
                errors = True
                parts_out.append(
                    fm.PartitionData(
                        partition_index=p.partition,
                        error_code=ErrorCode.OFFSET_OUT_OF_RANGE,
                        high_watermark=hw,
                        last_stable_offset=lso,
                        log_start_offset=part.log_start_offset,
                        records=None,
                    )
                )
                continue
            chunks: list[bytes] = []
            size = 0
            limit = min(p.partition_max_bytes, budget)
            upper = lso if committed else hw  # the first offset not returned
            for stored in part.batches[part.index_of_offset(p.fetch_offset) :]:
                if committed and stored.base_offset >= lso:
                    break
                if chunks and size + len(stored.data) > limit:
                    upper = stored.base_offset
                    break
                if not chunks and total > 0 and len(stored.data) > budget:
                    upper = stored.base_offset
                    break  # KIP-74: only the first partition may exceed the budget
                chunks.append(stored.data)
                size += len(stored.data)
            budget -= size
            total += size
            aborted = None
            if committed:
                aborted = tuple(
                    fm.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                    for a in part.aborted_between(p.fetch_offset, upper)
                )
            parts_out.append(
                fm.PartitionData(
                    partition_index=p.partition,
                    error_code=0,
                    high_watermark=hw,
                    last_stable_offset=lso,
                    log_start_offset=part.log_start_offset,
                    aborted_transactions=aborted,
                    records=b"".join(chunks),
                )
            )
        topics_out.append(
            fm.FetchableTopicResponse(
                topic=t.topic, topic_id=t.topic_id, partitions=tuple(parts_out)
            )
        )
    if errors:
        total = max(total, 1)  # an error answers at once, as Kafka does
    return fm.FetchResponse(error_code=0, session_id=0, responses=tuple(topics_out)), total
