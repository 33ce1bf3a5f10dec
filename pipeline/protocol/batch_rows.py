"""A fetched partition's batches as rows: one tuple per record, nothing in between.

:func:`decode_rows` is the consumer's decoder. Where ``decode_record_batches`` builds a
``RecordBatch`` and a ``Record`` per record (the general model), this walks the batch
headers in Python and hands each batch's records region to the kernel
(``_kernel.decode_rows`` in C, its twin in ``_kernel_py.py``), which builds the rows
themselves: instances of a caller-given tuple subclass of eight fields,
``(topic, partition, offset, timestamp, key, value, headers, leader_epoch)``.

What is skipped: records before ``min_offset`` (a compressed batch is returned whole),
control batches, batches ``keep`` refuses (read_committed: :mod:`read_committed`), and
a truncated batch at the end (a fetch may stop mid-batch). The second result is the
offset after the last complete batch, control and refused batches included: where the
next fetch starts. Sans-I/O.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from pipeline.protocol import _kernel_py
from pipeline.protocol.batch_decoder import decode_record_batches
from pipeline.protocol.batch_format import (
    ATTR_COMPRESSION_MASK,
    ATTR_CONTROL,
    ATTR_TIMESTAMP_TYPE,
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_SIZE,
    HEADER,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    CorruptRecordError,
    RecordBatch,
)
from pipeline.protocol.compression import CompressionError, decompress
from pipeline.protocol.crc import crc32c

__all__ = ["KERNEL", "decode_rows", "next_fetch_offset"]

R = TypeVar("R", bound=tuple[Any, ...])


class _Rows(Protocol):
    def decode_rows(self, buf: bytes, start: int, end: int, count: int,
                    row_type: type[tuple[Any, ...]], topic: str, partition: int,
                    base_offset: int, min_offset: int, base_ts: int, stamp_ts: int, epoch: int,
                    out: list[Any], /) -> None: ...


def _load() -> tuple[_Rows, str]:
    if os.environ.get("PIPELINE_PURE_PYTHON", "") not in ("", "0"):
        return _kernel_py, "python"
    try:
        from pipeline.protocol import _kernel
    except ImportError:  # not built: the twin
        return _kernel_py, "python"
    return _kernel, "c"


_impl, KERNEL = _load()


def decode_rows(
    data: bytes | bytearray | memoryview,
    row_type: type[R],
    topic: str,
    partition: int,
    min_offset: int,
    *,
    verify_crc: bool = True,
    keep: Callable[[RecordBatch], bool] | None = None,
) -> tuple[list[R], int]:
    """``(rows, next_offset)`` of the concatenated v2 batches in ``data`` (module doc).
    ``keep(batch)`` sees each batch's header (and a control batch's records) in offset
    order. Raises :class:`CorruptRecordError` on a bad CRC, magic or record."""
    buf = data if type(data) is bytes else bytes(data)
    total = len(buf)
    pos = 0
    out: list[R] = []
    next_offset = min_offset
    rows = _impl.decode_rows
    while total - pos >= LOG_OVERHEAD:
        base_offset, length = struct.unpack_from(">qi", buf, pos)
        end = pos + LOG_OVERHEAD + length
        if length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(f"batch at offset {base_offset}: bad batchLength {length}")
        if end > total:
            break  # truncated trailing batch: the next fetch starts there
        (_, _, epoch, magic, crc, attributes, last_delta, base_ts, max_ts, producer_id,
         producer_epoch, base_sequence, count) = HEADER.unpack_from(buf, pos)
        if magic != MAGIC:
            raise CorruptRecordError(
                f"batch at offset {base_offset} has magic {magic}; only RecordBatch v2 "
                "(magic 2) is supported")
        if verify_crc:
            actual = crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET:end])
            if actual != crc:
                raise CorruptRecordError(
                    f"batch at offset {base_offset}: CRC mismatch "
                    f"(stored 0x{crc:08x}, computed 0x{actual:08x})")
        batch_end = base_offset + last_delta + 1
        start, pos = pos, end
        if keep is not None:
            if attributes & ATTR_CONTROL:
                header = decode_record_batches(buf[start:end], verify_crc=False)[0]
            else:
                header = RecordBatch(
                    base_offset=base_offset, partition_leader_epoch=epoch, magic=magic,
                    crc=crc, attributes=attributes, last_offset_delta=last_delta,
                    base_timestamp=base_ts, max_timestamp=max_ts, producer_id=producer_id,
                    producer_epoch=producer_epoch, base_sequence=base_sequence)
            if not keep(header):
                next_offset = max(next_offset, batch_end)
                continue
        if batch_end <= min_offset:
            continue
        next_offset = batch_end
        if attributes & ATTR_CONTROL:
            continue
        if count < 0:
            raise CorruptRecordError(f"batch at offset {base_offset}: record count {count}")
        region, rstart, rend = buf, start + BATCH_HEADER_SIZE, end
        codec = attributes & ATTR_COMPRESSION_MASK
        if codec:
            if codec > 4:
                raise CorruptRecordError(
                    f"batch at offset {base_offset}: unknown compression codec {codec}")
            try:
                region = bytes(decompress(codec, memoryview(buf)[rstart:rend]))
            except CompressionError as exc:
                raise CorruptRecordError(f"batch at offset {base_offset}: {exc}") from exc
            rstart, rend = 0, len(region)
        stamp = max_ts if attributes & ATTR_TIMESTAMP_TYPE else -1
        try:
            rows(region, rstart, rend, count, row_type, topic, partition, base_offset,
                 min_offset, base_ts, stamp, epoch, out)
        except ValueError as exc:
            raise CorruptRecordError(f"batch at offset {base_offset}: {exc}") from None
    return out, next_offset


def next_fetch_offset(data: bytes | bytearray | memoryview, min_offset: int) -> int:
    """Where the next fetch starts: the offset after the last complete batch of ``data``
    (what :func:`decode_rows` returns second), from the batch headers alone, so a
    fetcher can ask for more before the records are decoded."""
    total = len(data)
    pos = 0
    next_offset = min_offset
    while total - pos >= LOG_OVERHEAD:
        base_offset, length = struct.unpack_from(">qi", data, pos)
        if length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(f"batch at offset {base_offset}: bad batchLength {length}")
        end = pos + LOG_OVERHEAD + length
        if end > total:
            break
        (last_delta,) = struct.unpack_from(">i", data, pos + 23)
        next_offset = max(next_offset, base_offset + last_delta + 1)
        pos = end
    return next_offset
