"""RecordBatch v2 decoding: bytes (a Fetch response's records, a fake broker's log)
to :class:`~pipeline.protocol.batch_format.RecordBatch` objects. Sans-I/O."""

from __future__ import annotations

import struct

from pipeline.protocol.batch_format import (
    ATTR_COMPRESSION_MASK,
    BATCH_HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    CorruptRecordError,
    Record,
    RecordBatch,
)
from pipeline.protocol.batch_format import ATTRIBUTES_OFFSET as _ATTRIBUTES_OFFSET
from pipeline.protocol.batch_format import HEADER as _HEADER
from pipeline.protocol.batch_format import MIN_BATCH_LENGTH as _MIN_BATCH_LENGTH
from pipeline.protocol.batch_format import RECORD_SETTERS as _RECORD_SETTERS
from pipeline.protocol.compression import CompressionError, decompress
from pipeline.protocol.crc import crc32c as _crc32c

__all__ = ["decode_record_batches"]


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Decode a zigzag varint/varlong at ``pos``; return (value, next position)."""
    shift = 0
    z = 0
    while True:
        try:
            b = buf[pos]
        except IndexError:
            raise CorruptRecordError("truncated varint") from None
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptRecordError("varint longer than 10 bytes")


def _decode_records(buf: bytes, pos: int, end: int, count: int) -> tuple[Record, ...]:
    """Parse ``count`` records from ``buf[pos:end]``, which they must fill exactly."""
    out: list[Record] = []
    append = out.append
    rv = _read_varint
    # Building a frozen dataclass through __init__ costs ~1.4 us (six
    # object.__setattr__ calls); writing the slots through their descriptors is
    # ~3x cheaper and yields an identical, equally immutable Record.
    new = object.__new__
    set_od, set_ts, set_key, set_value, set_headers, set_attrs = _RECORD_SETTERS
    try:
        for _ in range(count):
            if pos >= end:
                raise CorruptRecordError(f"batch holds fewer records than its count {count}")
            # length
            b = buf[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                b2 = buf[pos + 1]
                if b2 < 0x80:
                    z = (b & 0x7F) | (b2 << 7)
                    length = (z >> 1) ^ -(z & 1)
                    pos += 2
                else:
                    length, pos = rv(buf, pos)
            rec_end = pos + length
            if length < 6:  # attributes, timestamp, offset, key, value, header count
                raise CorruptRecordError(f"bad record length {length}")
            if rec_end > end:
                raise CorruptRecordError("record runs past the end of its batch")
            attributes = buf[pos]
            if attributes > 127:
                attributes -= 256
            pos += 1
            # timestampDelta
            b = buf[pos]
            if b < 0x80:
                tsd = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                b2 = buf[pos + 1]
                if b2 < 0x80:
                    z = (b & 0x7F) | (b2 << 7)
                    tsd = (z >> 1) ^ -(z & 1)
                    pos += 2
                else:
                    tsd, pos = rv(buf, pos)
            # offsetDelta
            b = buf[pos]
            if b < 0x80:
                od = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                b2 = buf[pos + 1]
                if b2 < 0x80:
                    z = (b & 0x7F) | (b2 << 7)
                    od = (z >> 1) ^ -(z & 1)
                    pos += 2
                else:
                    od, pos = rv(buf, pos)
            # key
            b = buf[pos]
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                b2 = buf[pos + 1]
                if b2 < 0x80:
                    z = (b & 0x7F) | (b2 << 7)
                    n = (z >> 1) ^ -(z & 1)
                    pos += 2
                else:
                    n, pos = rv(buf, pos)
            if n < 0:
                if n != -1:
                    raise CorruptRecordError(f"bad key length {n}")
                key = None
            else:
                key = buf[pos:pos + n]
                pos += n
            # value
            b = buf[pos]
            if b < 0x80:
                n = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                b2 = buf[pos + 1]
                if b2 < 0x80:
                    z = (b & 0x7F) | (b2 << 7)
                    n = (z >> 1) ^ -(z & 1)
                    pos += 2
                else:
                    n, pos = rv(buf, pos)
            if n < 0:
                if n != -1:
                    raise CorruptRecordError(f"bad value length {n}")
                value = None
            else:
                value = buf[pos:pos + n]
                pos += n
            # headers
            b = buf[pos]
            if b == 0:
                pos += 1
                headers: tuple[tuple[str, bytes | None], ...] = ()
            else:
                nh, pos = rv(buf, pos)
                if nh < 0:
                    raise CorruptRecordError(f"bad header count {nh}")
                hl: list[tuple[str, bytes | None]] = []
                for _h in range(nh):
                    n, pos = rv(buf, pos)
                    if n < 0 or pos + n > rec_end:
                        raise CorruptRecordError(f"bad header key length {n}")
                    hkey = buf[pos:pos + n].decode("utf-8")
                    pos += n
                    n, pos = rv(buf, pos)
                    if n < 0:
                        if n != -1:
                            raise CorruptRecordError(f"bad header value length {n}")
                        hval = None
                    else:
                        hval = buf[pos:pos + n]
                        pos += n
                    hl.append((hkey, hval))
                headers = tuple(hl)
            if pos != rec_end:
                raise CorruptRecordError(
                    f"record length {length} disagrees with its fields ({pos - rec_end:+d} bytes)"
                )
            r = new(Record)
            set_od(r, od)
            set_ts(r, tsd)
            set_key(r, key)
            set_value(r, value)
            set_headers(r, headers)
            set_attrs(r, attributes)
            append(r)
    except IndexError:
        raise CorruptRecordError("record runs past the end of its batch") from None
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(f"header key is not valid UTF-8: {exc}") from None
    if pos != end:
        raise CorruptRecordError(f"{end - pos} unexpected bytes after the last record")
    return tuple(out)


def decode_record_batches(data: bytes | bytearray | memoryview, *,
                          verify_crc: bool = True) -> list[RecordBatch]:
    """Decode the concatenated RecordBatch v2 batches in ``data``.

    A truncated trailing batch (Fetch responses may end with one) is ignored.
    Raises :class:`CorruptRecordError` on a CRC mismatch (if ``verify_crc``),
    a magic other than 2, or malformed contents.
    """
    buf = data if type(data) is bytes else bytes(data)
    total = len(buf)
    pos = 0
    batches: list[RecordBatch] = []
    unpack_header = _HEADER.unpack_from
    while total - pos >= LOG_OVERHEAD:
        base_offset, length = struct.unpack_from(">qi", buf, pos)
        if length < 5:  # must at least reach the magic byte
            raise CorruptRecordError(f"batch at offset {base_offset}: bad batchLength {length}")
        end = pos + LOG_OVERHEAD + length
        if end > total:
            break  # truncated trailing batch
        magic = buf[pos + 16]
        if magic != MAGIC:
            raise CorruptRecordError(
                f"batch at offset {base_offset} has magic {magic}; only RecordBatch v2 "
                f"(magic 2) is supported"
            )
        if length < _MIN_BATCH_LENGTH:
            raise CorruptRecordError(
                f"batch at offset {base_offset}: batchLength {length} < {_MIN_BATCH_LENGTH}"
            )
        (_, _, leader_epoch, _, crc, attributes, last_offset_delta, base_ts, max_ts,
         producer_id, producer_epoch, base_sequence, count) = unpack_header(buf, pos)
        if verify_crc:
            actual = _crc32c(memoryview(buf)[pos + _ATTRIBUTES_OFFSET:end])
            if actual != crc:
                raise CorruptRecordError(
                    f"batch at offset {base_offset}: CRC mismatch "
                    f"(stored 0x{crc:08x}, computed 0x{actual:08x})"
                )
        if count < 0:
            raise CorruptRecordError(f"batch at offset {base_offset}: record count {count}")
        codec = attributes & ATTR_COMPRESSION_MASK
        rstart = pos + BATCH_HEADER_SIZE
        if codec == 0:
            records = _decode_records(buf, rstart, end, count)
        else:
            if codec > 4:
                raise CorruptRecordError(
                    f"batch at offset {base_offset}: unknown compression codec {codec}"
                )
            try:
                raw = decompress(codec, memoryview(buf)[rstart:end])
            except CompressionError as exc:
                raise CorruptRecordError(f"batch at offset {base_offset}: {exc}") from exc
            records = _decode_records(raw, 0, len(raw), count)
        batches.append(RecordBatch(
            base_offset=base_offset,
            partition_leader_epoch=leader_epoch,
            magic=magic,
            crc=crc,
            attributes=attributes,
            last_offset_delta=last_offset_delta,
            base_timestamp=base_ts,
            max_timestamp=max_ts,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            records=records,
        ))
        pos = end
    return batches
