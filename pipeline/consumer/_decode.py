"""One partition's fetched bytes to the records the application gets (a :class:`Chunk`).

What is skipped, as the Java consumer skips it: records before the fetch offset (a
compressed batch is returned whole, so it may start earlier), control batches
(transaction markers), and a truncated batch at the end (a fetch may stop mid-batch;
the next fetch starts at it). The chunk's ``next_offset`` is past the last complete
batch, control batches included, so the position moves over them.

Under read_committed (``aborted`` given: the fetch's aborted transactions) the batches
of aborted transactions are skipped too, by the protocol layer's
:class:`~pipeline.protocol.read_committed.ReadCommittedFilter` (the Java fetcher's rule).

Timestamps: a batch written with LogAppendTime (attribute bit 3) stamps every record
with the batch's max timestamp, the broker's append time.
"""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.consumer._state import Chunk
from pipeline.consumer._types import ConsumedRecord
from pipeline.protocol.batch_format import ATTR_CONTROL, ATTR_TIMESTAMP_TYPE
from pipeline.protocol.read_committed import AbortedTransactionLike, ReadCommittedFilter
from pipeline.protocol.records import decode_record_batches

__all__ = ["decode_chunk"]

# Slot descriptors of ConsumedRecord, in field order: writing them directly is
# about three times cheaper than the frozen dataclass's __init__.
_SETTERS = tuple(
    getattr(ConsumedRecord, name).__set__ for name in ConsumedRecord.__dataclass_fields__
)


def decode_chunk(
    data: bytes | None, topic: str, partition: int, fetch_offset: int, *, check_crcs: bool = True,
    aborted: Iterable[AbortedTransactionLike] | None = None,
) -> Chunk:
    """The records at or after ``fetch_offset`` in ``data`` (a Fetch response's
    records for one partition); with ``aborted`` (read_committed) without those of
    aborted transactions. Raises ``CorruptRecordError`` on a bad batch."""
    out: list[ConsumedRecord] = []
    next_offset = fetch_offset
    if not data:
        return Chunk(out, next_offset, 0)
    append = out.append
    new = object.__new__
    s_topic, s_part, s_off, s_ts, s_key, s_value, s_headers, s_epoch = _SETTERS
    keep = ReadCommittedFilter(aborted) if aborted is not None else None
    for batch in decode_record_batches(data, verify_crc=check_crcs):
        base = batch.base_offset
        end = base + batch.last_offset_delta + 1
        if keep is not None and not keep(batch):
            next_offset = max(next_offset, end)
            continue
        if end <= fetch_offset:
            continue
        next_offset = end
        attributes = batch.attributes
        if attributes & ATTR_CONTROL:
            continue
        epoch = batch.partition_leader_epoch
        log_append = attributes & ATTR_TIMESTAMP_TYPE
        base_ts = batch.base_timestamp
        max_ts = batch.max_timestamp
        for r in batch.records:
            offset = base + r.offset_delta
            if offset < fetch_offset:
                continue
            rec = new(ConsumedRecord)
            s_topic(rec, topic)
            s_part(rec, partition)
            s_off(rec, offset)
            s_ts(rec, max_ts if log_append else base_ts + r.timestamp_delta)
            s_key(rec, r.key)
            s_value(rec, r.value)
            s_headers(rec, r.headers)
            s_epoch(rec, epoch)
            append(rec)
    return Chunk(out, next_offset, len(data))
