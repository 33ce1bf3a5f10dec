"""One partition's fetched bytes to the records the application gets (a :class:`Chunk`).

The protocol layer's row decoder (:func:`~pipeline.protocol.batch_rows.decode_rows`,
C where built) builds each :class:`ConsumedRecord` directly. What it skips, as the Java
consumer skips it: records before the fetch offset (a compressed batch is returned
whole, so it may start earlier), control batches (transaction markers), and a
truncated batch at the end (a fetch may stop mid-batch; the next fetch starts at it).
The chunk's ``next_offset`` is past the last complete batch, control batches included,
so the position moves over them.

Under read_committed (``aborted`` given: the fetch's aborted transactions) the batches
of aborted transactions are skipped too, by the protocol layer's
:class:`~pipeline.protocol.read_committed.ReadCommittedFilter` (the Java fetcher's rule).

The columnar form (:func:`decode_columns`, for ``batches(columns=True)``) decodes the
same records, with the same skips and errors, into a :class:`ConsumedColumns` with no
Python object per record (the protocol layer's
:func:`~pipeline.protocol.batch_rows.decode_columns`). A lazy chunk decodes into
whichever form the application's iteration asks for first.

Timestamps: a batch written with LogAppendTime (attribute bit 3) stamps every record
with the batch's max timestamp, the broker's append time.
"""

from __future__ import annotations

from collections.abc import Iterable

from pipeline.consumer._errors import ConsumerError
from pipeline.consumer._state import Chunk
from pipeline.consumer._types import ConsumedColumns, ConsumedRecord
from pipeline.protocol.batch_format import CorruptRecordError
from pipeline.protocol.batch_rows import decode_columns as decode_record_columns
from pipeline.protocol.batch_rows import decode_rows, next_fetch_offset
from pipeline.protocol.read_committed import AbortedTransactionLike, ReadCommittedFilter

__all__ = ["decode_chunk", "decode_columns", "lazy_chunk"]


def decode_chunk(
    data: bytes | None, topic: str, partition: int, fetch_offset: int, *, check_crcs: bool = True,
    aborted: Iterable[AbortedTransactionLike] | None = None,
) -> Chunk:
    """The records at or after ``fetch_offset`` in ``data`` (a Fetch response's
    records for one partition); with ``aborted`` (read_committed) without those of
    aborted transactions. Raises ``CorruptRecordError`` on a bad batch."""
    if not data:
        return Chunk([], fetch_offset, 0)
    keep = ReadCommittedFilter(aborted) if aborted is not None else None
    records, next_offset = decode_rows(data, ConsumedRecord, topic, partition, fetch_offset,
                                       verify_crc=check_crcs, keep=keep)
    return Chunk(records, next_offset, len(data))


def decode_columns(
    data: bytes | None, topic: str, partition: int, fetch_offset: int, *, check_crcs: bool = True,
    aborted: Iterable[AbortedTransactionLike] | None = None,
) -> tuple[ConsumedColumns, int]:
    """:func:`decode_chunk`'s records as columns, and the chunk's ``next_offset``.
    Raises ``CorruptRecordError`` on a bad batch."""
    keep = ReadCommittedFilter(aborted) if aborted is not None else None
    cols, next_offset = decode_record_columns(data or b"", fetch_offset, verify_crc=check_crcs,
                                              keep=keep)
    return ConsumedColumns(topic, partition, cols.offsets, cols.timestamps, cols.keys,
                           cols.values, cols.headers, cols.leader_epochs), next_offset


def lazy_chunk(
    data: bytes | None, topic: str, partition: int, fetch_offset: int, *, check_crcs: bool = True,
    aborted: Iterable[AbortedTransactionLike] | None = None,
) -> Chunk:
    """:func:`decode_chunk`, decoded when first used, as rows or as columns (a corrupt
    batch is then a :class:`ConsumerError` naming the partition); its ``next_offset``
    is read from the batch headers now (``CorruptRecordError`` for a bad batch
    length)."""
    if not data:
        return Chunk([], fetch_offset, 0)
    aborted_list = list(aborted) if aborted is not None else None

    def corrupt(exc: CorruptRecordError) -> ConsumerError:
        return ConsumerError(
            f"{topic}[{partition}] at offset {fetch_offset}: corrupt record batch ({exc}); "
            "seek past it to skip it")

    def load() -> list[ConsumedRecord]:
        try:
            return decode_chunk(data, topic, partition, fetch_offset, check_crcs=check_crcs,
                                aborted=aborted_list).decoded()
        except CorruptRecordError as exc:
            raise corrupt(exc) from exc

    def load_columns() -> ConsumedColumns:
        try:
            return decode_columns(data, topic, partition, fetch_offset, check_crcs=check_crcs,
                                  aborted=aborted_list)[0]
        except CorruptRecordError as exc:
            raise corrupt(exc) from exc

    return Chunk(None, next_fetch_offset(data, fetch_offset), len(data), load=load,
                 load_columns=load_columns)
