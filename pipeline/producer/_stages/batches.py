"""What a broker producer does with sealed batches: the request that carries them
(``produce_request``), and after a broker's answer, besides re-sending one: what an
error code says about the batch and its leader (the code sets below), split one that
was too large, read a duplicate's answer right.

Pure functions on ``SealedBatch`` (no I/O, no trio): the broker producer calls them from
its response handling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.producer._stages.envelopes import SEQUENCE_WRAP, SealedBatch, TopicPartition
from pipeline.protocol.batch_format import ATTRIBUTES_OFFSET, TAIL
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.produce import (
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
)
from pipeline.protocol.records import BatchBuilder

if TYPE_CHECKING:
    from pipeline.producer._config import ProducerConfig

__all__ = [
    "EPOCH_CODES", "MAYBE_WRITTEN", "REFRESH_CODES", "TOO_LARGE", "produce_request",
    "split_batch", "unless_duplicate_echo",
]

# Errors after which the partition's leader may have moved.
REFRESH_CODES = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.KAFKA_STORAGE_ERROR,
})
EPOCH_CODES = frozenset({ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED})
# The broker found the batch too large: over max.message.bytes (MESSAGE_TOO_LARGE) or
# over segment.bytes (RECORD_LIST_TOO_LARGE). Nothing was written; a batch of several
# records is split in two and retried (KIP-126), a single record fails with that cause.
TOO_LARGE = frozenset({ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE})
# Errors Kafka also answers *after* appending the batch to the leader's log (an
# acks=all produce waiting in purgatory completes with them: it timed out, the
# ISR shrank, the leadership or the log dir went away), so the batch may be
# written. Such a batch must never be re-stamped with a new epoch (a copy under
# new sequences would be a duplicate), only re-sent identical (regression
# after-append-error-then-bump-duplicate: a bump between a REQUEST_TIMED_OUT and its retry).
MAYBE_WRITTEN = frozenset({
    ErrorCode.REQUEST_TIMED_OUT,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.KAFKA_STORAGE_ERROR,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
})


def split_batch(batch: SealedBatch, n: int, first_bytes: int, config: ProducerConfig
                ) -> tuple[SealedBatch, SealedBatch]:
    """KIP-126: a batch of two or more records that the broker found too large, as two
    batches of its messages in order (the first ``n`` of them, ``first_bytes`` bytes, then
    the rest), with its producer id and epoch and its sequence range cut at the same point.
    So the halves take exactly the sequences the whole batch had, and the batches sealed
    after it stay in sequence. They keep its retry level (the caller sends them back over
    the retry path); that bounce spends no retry."""
    msgs = batch.messages
    assert 0 < n < len(msgs)
    halves = []
    seq = batch.base_sequence
    for part, nbytes in ((msgs[:n], first_bytes), (msgs[n:], batch.nbytes - first_bytes)):
        builder = BatchBuilder(
            compression=config.compression_codec, compression_level=config.compression_level
        )
        builder.extend(part)
        if batch.producer_id >= 0:
            records = builder.build(producer_id=batch.producer_id,
                                    producer_epoch=batch.producer_epoch, base_sequence=seq)
        else:
            records = builder.build()
        half = SealedBatch(batch.tp, part, records, batch.producer_id, batch.producer_epoch,
                           seq, nbytes)
        half._level, half._retries = batch._level, batch._retries - 1  # (a split is free)
        halves.append(half)
        if seq >= 0:
            seq = (seq + len(part)) % SEQUENCE_WRAP
    return halves[0], halves[1]


def unless_duplicate_echo(batch: SealedBatch, append_time: int) -> int:
    """The LogAppendTime to report for a re-sent idempotent batch answered NONE.

    Kafka answers a duplicate with the cached batch's max timestamp in
    ``log_append_time_ms`` (``UnifiedLog.append``: ``setLogAppendTime(duplicate.timestamp)``),
    also on a CreateTime topic, where a fresh append answers -1; the Java client then
    reports that one timestamp for every record. An answer equal to this batch's own max
    timestamp is taken for that echo: the records keep their own timestamps (-1). On a
    LogAppendTime topic the two coincide only when the original append happened in the
    batch's last millisecond; the records' timestamps are then off by at most the batch's
    spread of CreateTimes."""
    max_timestamp = TAIL.unpack_from(batch.records, ATTRIBUTES_OFFSET)[3]
    return -1 if append_time == max_timestamp else append_time


def produce_request(taken: dict[TopicPartition, SealedBatch], acks: int,
                    timeout_ms: int, transactional_id: str | None = None) -> ProduceRequest:
    """The ProduceRequest that carries ``taken`` (one sealed batch per partition,
    partitions grouped by topic in the order taken)."""
    topics: dict[str, list[PartitionProduceData]] = {}
    for tp, batch in taken.items():
        topics.setdefault(tp.topic, []).append(
            PartitionProduceData(index=tp.partition, records=batch.records))
    return ProduceRequest(
        transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms,
        topic_data=tuple(TopicProduceData(name=name, partition_data=tuple(parts))
                         for name, parts in topics.items()))
