"""A fetched partition's batches as rows (one tuple per record, nothing in between) or
as columns (no object per record).

:func:`decode_rows` is the consumer's decoder. Where ``decode_record_batches`` builds a
``RecordBatch`` and a ``Record`` per record (the general model), this walks the batch
headers in Python and hands each batch's records region to the kernel
(``_kernel.decode_rows`` in C, its twin in ``_kernel_py.py``), which builds the rows
themselves: instances of a caller-given tuple subclass of eight fields,
``(topic, partition, offset, timestamp, key, value, headers, leader_epoch)``.

:func:`decode_columns` is its columnar twin: the same records, skips and errors, into
flat buffers in Arrow's layout (:class:`RecordColumns`; the kernel's
``decode_columns``), with no Python object per record.

What is skipped: records before ``min_offset`` (a compressed batch is returned whole),
control batches, batches ``keep`` refuses (read_committed: :mod:`read_committed`), and
a truncated batch at the end (a fetch may stop mid-batch). The second result is the
offset after the last complete batch, control and refused batches included: where the
next fetch starts. Sans-I/O.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Callable, Iterator
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

from pipeline.protocol import _kernel_py
from pipeline.protocol._columns import BinaryColumn, HeaderColumn
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

__all__ = ["KERNEL", "RecordColumns", "decode_columns", "decode_rows", "next_fetch_offset"]

R = TypeVar("R", bound=tuple[Any, ...])


class _Rows(Protocol):
    def decode_rows(self, buf: bytes, start: int, end: int, count: int,
                    row_type: type[tuple[Any, ...]], topic: str, partition: int,
                    base_offset: int, min_offset: int, base_ts: int, stamp_ts: int, epoch: int,
                    out: list[Any], /) -> None: ...
    def decode_columns(self, buf: bytes, start: int, end: int, count: int, base_offset: int,
                       min_offset: int, base_ts: int, stamp_ts: int, epoch: int,
                       out: list[Any], lens: Any, /) -> None: ...
    def binary_list(self, spec: tuple[Any, ...], /) -> list[bytes | None]: ...


def _load() -> tuple[_Rows, str]:
    if os.environ.get("PIPELINE_PURE_PYTHON", "") not in ("", "0"):
        return _kernel_py, "python"
    try:
        from pipeline.protocol import _kernel
    except ImportError:  # not built: the twin
        return _kernel_py, "python"
    return _kernel, "c"


_impl, KERNEL = _load()


class _Walk:
    """The batch walk shared by both decoders: :meth:`regions` yields each batch whose
    records are to be decoded; ``next_offset`` is where the next fetch starts once the
    walk is done (module doc)."""

    __slots__ = ("next_offset",)

    def __init__(self, min_offset: int) -> None:
        self.next_offset = min_offset

    def regions(
        self, buf: bytes, min_offset: int, verify_crc: bool,
        keep: Callable[[RecordBatch], bool] | None,
    ) -> Iterator[tuple[bytes, int, int, int, int, int, int, int]]:
        """``(region, start, end, count, base_offset, base_ts, stamp_ts, epoch)`` per
        batch to decode (a compressed one decompressed): its records are
        ``region[start:end]``. Raises :class:`CorruptRecordError` on a bad batch."""
        total = len(buf)
        pos = 0
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
                    self.next_offset = max(self.next_offset, batch_end)
                    continue
            if batch_end <= min_offset:
                continue
            self.next_offset = batch_end
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
            yield region, rstart, rend, count, base_offset, base_ts, stamp, epoch


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
    out: list[R] = []
    rows = _impl.decode_rows
    walk = _Walk(min_offset)
    for region, start, end, count, base_offset, base_ts, stamp, epoch in walk.regions(
            buf, min_offset, verify_crc, keep):
        try:
            rows(region, start, end, count, row_type, topic, partition, base_offset,
                 min_offset, base_ts, stamp, epoch, out)
        except ValueError as exc:
            raise CorruptRecordError(f"batch at offset {base_offset}: {exc}") from None
    return out, walk.next_offset


class RecordColumns(NamedTuple):
    """Decoded records as columns (:func:`decode_columns`), row ``i`` of each being the
    ``i``-th record: int64 ``offsets`` and ``timestamps``, int32 ``leader_epochs`` (all
    read-only memoryviews), ``keys`` and ``values`` (nullable), and ``headers`` (a row
    without headers has an empty list; header values nullable, keys UTF-8)."""

    offsets: memoryview
    timestamps: memoryview
    leader_epochs: memoryview
    keys: BinaryColumn
    values: BinaryColumn
    headers: HeaderColumn


_ZERO_OFFSET = bytes(8)  # an offsets buffer's leading 0 (int64)


def _view(buf: bytearray, fmt: Literal["B", "i", "q"]) -> memoryview:
    """A read-only view of a filled buffer as ``fmt`` items (native order, as written)."""
    return memoryview(buf).toreadonly().cast(fmt)


def _binary(offsets: bytearray, data: bytearray, validity: bytearray | None, n: int) -> BinaryColumn:
    """A decoded binary column; its validity bitmap only if a row is null."""
    nulls = 0 if validity is None else n - int.from_bytes(validity, "little").bit_count()
    bitmap = _view(validity, "B") if validity is not None and nulls else None
    return BinaryColumn(_view(offsets, "q"), _view(data, "B"), bitmap, 0, nulls)


def decode_columns(
    data: bytes | bytearray | memoryview,
    min_offset: int,
    *,
    verify_crc: bool = True,
    keep: Callable[[RecordBatch], bool] | None = None,
) -> tuple[RecordColumns, int]:
    """``(columns, next_offset)``: what :func:`decode_rows` gives, as columns, with no
    Python object per record (the kernel's ``decode_columns`` fills flat buffers).
    The same records, skips and errors."""
    buf = data if type(data) is bytes else bytes(data)
    out = [bytearray() for _ in range(15)]
    lens = array("q", bytes(15 * 8))  # the length in use of each (the kernel reserves room)
    for i in _LEADING_ZERO:
        out[i] += _ZERO_OFFSET
        lens[i] = len(_ZERO_OFFSET)
    columns = _impl.decode_columns
    walk = _Walk(min_offset)
    for region, start, end, count, base_offset, base_ts, stamp, epoch in walk.regions(
            buf, min_offset, verify_crc, keep):
        try:
            columns(region, start, end, count, base_offset, min_offset, base_ts, stamp, epoch,
                    out, lens)
        except ValueError as exc:
            raise CorruptRecordError(f"batch at offset {base_offset}: {exc}") from None
    for buffer, length in zip(out, lens, strict=True):
        del buffer[length:]
    (offsets, timestamps, epochs, key_offsets, key_data, key_valid, value_offsets, value_data,
     value_valid, header_offsets, hkey_offsets, hkey_data, hvalue_offsets, hvalue_data,
     hvalue_valid) = out
    n = len(offsets) // 8
    entries = len(hkey_offsets) // 8 - 1
    headers = HeaderColumn(_view(header_offsets, "q"), _binary(hkey_offsets, hkey_data, None, entries),
                           _binary(hvalue_offsets, hvalue_data, hvalue_valid, entries))
    return RecordColumns(_view(offsets, "q"), _view(timestamps, "q"), _view(epochs, "i"),
                         _binary(key_offsets, key_data, key_valid, n),
                         _binary(value_offsets, value_data, value_valid, n), headers), walk.next_offset


#: the buffers of ``_kernel.decode_columns`` that start with an offset 0
_LEADING_ZERO = (3, 6, 9, 10, 12)


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
