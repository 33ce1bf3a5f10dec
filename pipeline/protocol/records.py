"""Kafka RecordBatch v2 (magic 2) codec: encode, decode, the producer's batch builder.

Wire layout of one batch (all integers big-endian)::

    offset  size  field
         0     8  baseOffset            int64
         8     4  batchLength           int32   bytes after this field
        12     4  partitionLeaderEpoch  int32
        16     1  magic                 int8    = 2
        17     4  crc                   uint32  CRC-32C of bytes [21, end)
        21     2  attributes            int16   bits 0-2 codec, 3 timestamp type,
                                                4 transactional, 5 control
        23     4  lastOffsetDelta       int32
        27     8  baseTimestamp         int64
        35     8  maxTimestamp          int64
        43     8  producerId            int64
        51     2  producerEpoch         int16
        53     4  baseSequence          int32
        57     4  recordCount           int32
        61     -  records (compressed as a whole when the codec is not NONE)

One record (zigzag varints; "varlong" is the same encoding, 64-bit)::

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint
    | keyLength varint (-1 = null) | key | valueLength varint (-1 = null) | value
    | headerCount varint | headers: keyLength varint, key utf-8,
                                   valueLength varint (-1 = null), value

This module is self-contained (its own varint helpers) and sans-I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Final, Protocol

from pipeline.protocol.compression import Compression, CompressionError, decompress, validate_level
from pipeline.protocol.compression import compress as _compress
from pipeline.protocol.crc import crc32c as _crc32c

__all__ = [
    "BATCH_HEADER_SIZE",
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "CREATE_TIME",
    "LOG_APPEND_TIME",
    "BatchBuilder",
    "ControlRecordType",
    "CorruptRecordError",
    "Record",
    "RecordBatch",
    "RecordLike",
    "batch_size_for_record",
    "control_record_key",
    "control_record_type",
    "decode_record_batches",
    "encode_record_batch",
    "restamp_batch",
]


class CorruptRecordError(ValueError):
    """A record batch failed to decode: bad CRC, bad magic, malformed or truncated fields."""


# ------------------------------------------------------------------ constants

BATCH_HEADER_SIZE: Final = 61
#: bytes before the batchLength field counts (baseOffset + batchLength)
LOG_OVERHEAD: Final = 12
#: the smallest legal batchLength (header after the length field, no records)
_MIN_BATCH_LENGTH: Final = BATCH_HEADER_SIZE - LOG_OVERHEAD
MAGIC: Final = 2

_CRC_OFFSET: Final = 17
_ATTRIBUTES_OFFSET: Final = 21
_PRODUCER_ID_OFFSET: Final = 43

ATTR_COMPRESSION_MASK: Final = 0x07
ATTR_TIMESTAMP_TYPE: Final = 0x08
ATTR_TRANSACTIONAL: Final = 0x10
ATTR_CONTROL: Final = 0x20

CREATE_TIME: Final = 0
LOG_APPEND_TIME: Final = 1

# upper bound of a record's overhead besides key/value/headers:
# length varint (5) + attributes (1) + timestampDelta varlong (10) + offsetDelta varint (5)
_MAX_RECORD_OVERHEAD: Final = 21


class ControlRecordType(IntEnum):
    ABORT = 0
    COMMIT = 1


CONTROL_ABORT: Final = ControlRecordType.ABORT
CONTROL_COMMIT: Final = ControlRecordType.COMMIT

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc
_PREFIX = struct.Struct(">qiibI")
# attributes .. recordCount: the CRC-covered header part
_TAIL = struct.Struct(">hiqqqhii")
_HEADER = struct.Struct(">qiibIhiqqqhii")
_IDEMPOTENCE = struct.Struct(">qhi")
_UINT32 = struct.Struct(">I")
assert _HEADER.size == BATCH_HEADER_SIZE

# ------------------------------------------------------------------ varints


def _zigzag_varint(n: int) -> bytes:
    """Zigzag varint/varlong encoding of a signed 64-bit int."""
    if not -0x8000000000000000 <= n <= 0x7FFFFFFFFFFFFFFF:
        raise ValueError(f"{n} does not fit a varlong (int64)")
    z = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    if z < 0x80:
        return bytes((z,))
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _varint_size(n: int) -> int:
    z = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    size = 1
    while z > 0x7F:
        z >>= 7
        size += 1
    return size


#: precomputed zigzag varints of 0.._TABLE_SIZE-1 (index = value)
_TABLE_SIZE: Final = 1 << 14
# Tables are tuples, not lists: a tuple of bytes or ints is untracked by the
# cyclic GC after its first pass, while a list's 16k items would be walked by
# every full collection for the life of the process (tests/test_imports.py).
_ZZ: Final[tuple[bytes, ...]] = tuple(_zigzag_varint(i) for i in range(_TABLE_SIZE))
_ZL: Final[tuple[int, ...]] = tuple(len(b) for b in _ZZ)  # their lengths
# Fixed neighbours joined ahead of time, so a common record is 6 parts, not 8:
# attributes (0) + timestampDelta, and null key (-1) + valueLength.
_AT: Final[tuple[bytes, ...]] = tuple(b"\x00" + b for b in _ZZ)
_NK: Final[tuple[bytes, ...]] = tuple(b"\x01" + b for b in _ZZ)
_NO_TIMESTAMP: Final = object()
_B00: Final = b"\x00"  # attributes 0 / header count 0 / length 0
_B01: Final = b"\x01"  # zigzag(-1): null key / null value


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


# ------------------------------------------------------------------ data model


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    offset_delta: int = 0
    timestamp_delta: int = 0
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    attributes: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordBatch:
    base_offset: int = 0
    partition_leader_epoch: int = -1
    magic: int = 2
    crc: int = 0  # filled on decode; ignored on encode
    attributes: int = 0
    last_offset_delta: int = 0
    base_timestamp: int = 0
    max_timestamp: int = 0
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    records: tuple[Record, ...] = ()

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & ATTR_COMPRESSION_MASK)

    @property
    def timestamp_type(self) -> int:
        """``CREATE_TIME`` (0) or ``LOG_APPEND_TIME`` (1)."""
        return LOG_APPEND_TIME if self.attributes & ATTR_TIMESTAMP_TYPE else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta


_RECORD_SETTERS: Final = tuple(
    getattr(Record, name).__set__
    for name in ("offset_delta", "timestamp_delta", "key", "value", "headers", "attributes")
)
assert len(_RECORD_SETTERS) == len(Record.__dataclass_fields__)


def control_record_type(record: Record) -> int:
    """The type of a control record (0 = ABORT, 1 = COMMIT, see ``ControlRecordType``).

    A control record's key is ``version: int16, type: int16``.
    """
    key = record.key
    if key is None or len(key) < 4:
        raise CorruptRecordError(f"control record key must be >= 4 bytes, got {key!r}")
    version, ctype = struct.unpack_from(">hh", key)
    if version < 0:
        raise CorruptRecordError(f"bad control record key version {version}")
    return int(ctype)


def control_record_key(ctype: int, version: int = 0) -> bytes:
    """The key of a control record of type ``ctype`` (for writers such as a fake broker)."""
    return struct.pack(">hh", version, ctype)


# ------------------------------------------------------------------ encoding


def _encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None,
                   value: bytes | None, headers: Sequence[tuple[str, bytes | None]],
                   attributes: int = 0) -> bytes:
    """One record including its length prefix (general, unoptimised path)."""
    if not -128 <= attributes <= 127:
        raise ValueError(f"record attributes {attributes} do not fit an int8")
    zz = _zigzag_varint
    parts: list[bytes] = [bytes((attributes & 0xFF,)), zz(timestamp_delta), zz(offset_delta)]
    if key is None:
        parts.append(_B01)
    else:
        parts.append(zz(len(key)))
        parts.append(key)
    if value is None:
        parts.append(_B01)
    else:
        parts.append(zz(len(value)))
        parts.append(value)
    parts.append(zz(len(headers)))
    for hkey, hvalue in headers:
        if not isinstance(hkey, str):
            raise TypeError(f"header key must be str, got {type(hkey).__name__}")
        hk = hkey.encode("utf-8")
        parts.append(zz(len(hk)))
        parts.append(hk)
        if hvalue is None:
            parts.append(_B01)
        else:
            parts.append(zz(len(hvalue)))
            parts.append(hvalue)
    body = b"".join(parts)
    return zz(len(body)) + body


def _assemble(records: bytes, *, base_offset: int, partition_leader_epoch: int,
              attributes: int, last_offset_delta: int, base_timestamp: int,
              max_timestamp: int, producer_id: int, producer_epoch: int,
              base_sequence: int, count: int) -> bytes:
    try:
        tail = _TAIL.pack(attributes, last_offset_delta, base_timestamp, max_timestamp,
                          producer_id, producer_epoch, base_sequence, count)
    except struct.error as exc:
        raise ValueError(f"record batch header field out of range: {exc}") from None
    crc = _crc32c(records, _crc32c(tail))
    length = len(records) + (BATCH_HEADER_SIZE - LOG_OVERHEAD)
    try:
        prefix = _PREFIX.pack(base_offset, length, partition_leader_epoch, MAGIC, crc)
    except struct.error as exc:
        raise ValueError(f"record batch header field out of range: {exc}") from None
    return b"".join((prefix, tail, records))


def encode_record_batch(batch: RecordBatch, *, compression_level: int | None = None) -> bytes:
    """Encode ``batch`` verbatim (its header fields are written as given; ``crc`` is computed).

    The records section is compressed with ``batch.compression`` at
    ``compression_level`` (``None`` = the codec's default).
    """
    if batch.magic != MAGIC:
        raise ValueError(f"can only encode RecordBatch v2 (magic 2), got magic {batch.magic}")
    codec = batch.attributes & ATTR_COMPRESSION_MASK
    level = validate_level(codec, compression_level)  # also rejects codecs 5..7
    records = b"".join(
        [_encode_record(r.offset_delta, r.timestamp_delta, r.key, r.value, r.headers,
                        r.attributes) for r in batch.records]
    )
    if codec:
        records = _compress(codec, records, level)
    return _assemble(
        records,
        base_offset=batch.base_offset,
        partition_leader_epoch=batch.partition_leader_epoch,
        attributes=batch.attributes,
        last_offset_delta=batch.last_offset_delta,
        base_timestamp=batch.base_timestamp,
        max_timestamp=batch.max_timestamp,
        producer_id=batch.producer_id,
        producer_epoch=batch.producer_epoch,
        base_sequence=batch.base_sequence,
        count=len(batch.records),
    )


def batch_size_for_record(key: bytes | None, value: bytes | None,
                          headers: Sequence[tuple[str, bytes | None]] = ()) -> int:
    """Upper bound of the size of a batch holding just this record (61-byte header + record).

    Used for ``max_message_bytes`` checks before a record is accepted.
    """
    size = BATCH_HEADER_SIZE + _MAX_RECORD_OVERHEAD
    size += 1 if key is None else _varint_size(len(key)) + len(key)
    size += 1 if value is None else _varint_size(len(value)) + len(value)
    size += _varint_size(len(headers))
    for hkey, hvalue in headers:
        hk = len(hkey.encode("utf-8"))
        size += _varint_size(hk) + hk
        size += 1 if hvalue is None else _varint_size(len(hvalue)) + len(hvalue)
    return size


class RecordLike(Protocol):
    """What ``BatchBuilder.extend`` reads of each record (the producer's messages)."""

    @property
    def timestamp(self) -> int | None: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]]: ...


class BatchBuilder:
    """Accumulates records for one partition and encodes them into a RecordBatch once.

    The producer's hot path: ``append`` encodes the record immediately into a
    list of byte strings (table-driven varints, one ``b"".join`` per record);
    ``build`` joins them, compresses, and writes the header and CRC.
    ``build`` does not consume the builder (it can be called again, e.g. with
    other producer fields).
    """

    __slots__ = ("_base_ts", "_codec", "_level", "_max_ts", "_parts", "record_count")

    def __init__(self, *, compression: Compression = Compression.NONE,
                 compression_level: int | None = None) -> None:
        self._level = validate_level(compression, compression_level)
        self._codec = Compression(compression)
        self._parts: list[bytes] = []
        self._base_ts = 0
        self._max_ts = 0
        self.record_count = 0

    @property
    def compression(self) -> Compression:
        return self._codec

    @property
    def size_in_bytes(self) -> int:
        """The uncompressed batch size so far, header included (computed on
        demand: the producer's hot path never asks, so extend keeps no tally)."""
        return BATCH_HEADER_SIZE + sum(map(len, self._parts))

    def append(self, timestamp_ms: int, key: bytes | None, value: bytes | None,
               headers: Sequence[tuple[str, bytes | None]] = ()) -> int:
        """Add a record; return its encoded size (length prefix included)."""
        n = self.record_count
        if n:
            tsd = timestamp_ms - self._base_ts
            if timestamp_ms > self._max_ts:
                self._max_ts = timestamp_ms
        else:
            self._base_ts = self._max_ts = timestamp_ms
            tsd = 0
        if 0 <= tsd < _TABLE_SIZE:
            zz = _ZZ
            try:
                if key is None:
                    kh = _B01
                    kb = b""
                else:
                    kh = zz[len(key)]
                    kb = key
                if value is None:
                    vh = _B01
                    vb = b""
                else:
                    vh = zz[len(value)]
                    vb = value
                if headers:
                    hparts = [zz[len(headers)]]
                    for hkey, hvalue in headers:
                        hk = hkey.encode()
                        hparts.append(zz[len(hk)])
                        hparts.append(hk)
                        if hvalue is None:
                            hparts.append(_B01)
                        else:
                            hparts.append(zz[len(hvalue)])
                            hparts.append(hvalue)
                    hb = b"".join(hparts)
                else:
                    hb = _B00
                body = b"".join((_B00, zz[tsd], zz[n], kh, kb, vh, vb, hb))
                size = len(body)
                head = zz[size]
            except (IndexError, AttributeError, TypeError):
                # A length or offset delta beyond the table, or a bad header:
                # the general path encodes it (or raises a clear error).
                rec = _encode_record(n, tsd, key, value, headers)
            else:
                parts = self._parts
                parts.append(head)
                parts.append(body)
                self.record_count = n + 1
                return size + len(head)
        else:
            rec = _encode_record(n, tsd, key, value, headers)
        self._parts.append(rec)
        size = len(rec)
        self.record_count = n + 1
        return size

    def extend(self, records: Sequence[RecordLike]) -> None:
        """Add many records (any objects with ``timestamp``, ``key``, ``value``
        and ``headers``). Same bytes as ``append`` per record, in one loop: the
        per-record work is a few lookups in the varint tables and one
        ``list.extend``, no call, no join and no size tally per record
        (``size_in_bytes`` is computed when asked).
        """
        if not records:
            return
        n = self.record_count
        if not n:
            first = records[0].timestamp
            if first is None:
                raise TypeError("record timestamp must be an int (milliseconds), not None")
            self._base_ts = self._max_ts = first
        base = self._base_ts
        max_ts = self._max_ts
        zz = _ZZ
        zl = _ZL
        at = _AT
        nk = _NK
        parts = self._parts
        add = parts.extend
        # Consecutive records usually share one timestamp *object* (the producer
        # reuses it within a millisecond): then the delta is not recomputed.
        last_ts: object = _NO_TIMESTAMP
        tsd = 0
        attr_tsd = b""  # at[tsd]: attributes byte + timestamp delta varint
        fixed = 0  # 2 + zl[tsd]: attributes, header count and the delta's length
        for r in records:
            ts = r.timestamp
            key = r.key
            value = r.value
            try:
                if ts is not last_ts:
                    if ts > max_ts:  # type: ignore[operator]
                        max_ts = ts  # type: ignore[assignment]
                    tsd = ts - base  # type: ignore[operator]
                    attr_tsd = at[tsd]  # IndexError past the table (or < 0: checked below)
                    fixed = 2 + zl[tsd]
                    last_ts = ts
                if r.headers or tsd < 0:
                    raise IndexError  # not the common shape: the general path
                lv = len(value)  # type: ignore[arg-type]
                if key is None:
                    # attributes + tsd + offset delta + null key + value + header count
                    size = fixed + 1 + zl[n] + zl[lv] + lv
                    add((zz[size], attr_tsd, zz[n], nk[lv], value, _B00))  # type: ignore[arg-type]
                else:
                    lk = len(key)
                    size = fixed + zl[n] + zl[lk] + lk + zl[lv] + lv
                    add((zz[size], attr_tsd, zz[n], zz[lk], key, zz[lv], value, _B00))  # type: ignore[arg-type]
            except (IndexError, TypeError):
                # A delta or length beyond the tables, a null value, headers,
                # a timestamp before the batch's first: encoded (or rejected
                # with a clear error) by the general path.
                if ts is None or type(ts) is not int:
                    raise TypeError(
                        f"record timestamp must be an int (milliseconds), not {ts!r}"
                    ) from None
                if ts > max_ts:
                    max_ts = ts
                last_ts = _NO_TIMESTAMP
                parts.append(_encode_record(n, ts - base, key, value, r.headers))
            n += 1
        self._max_ts = max_ts
        self.record_count = n

    def build(self, *, producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
              is_transactional: bool = False, partition_leader_epoch: int = -1) -> bytes:
        """Encode the batch (base offset 0, create-time timestamps)."""
        n = self.record_count
        if not n:
            raise ValueError("cannot build an empty record batch")
        records = b"".join(self._parts)
        codec = self._codec
        if codec:
            records = _compress(codec, records, self._level)
        return _assemble(
            records,
            base_offset=0,
            partition_leader_epoch=partition_leader_epoch,
            attributes=codec | (ATTR_TRANSACTIONAL if is_transactional else 0),
            last_offset_delta=n - 1,
            base_timestamp=self._base_ts,
            max_timestamp=self._max_ts,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
            count=n,
        )


def restamp_batch(batch: bytes, *, producer_id: int, producer_epoch: int,
                  base_sequence: int) -> bytes:
    """Rewrite producerId/producerEpoch/baseSequence of an encoded batch and fix its CRC."""
    buf = bytearray(batch)
    if len(buf) < BATCH_HEADER_SIZE:
        raise CorruptRecordError(f"record batch too short to restamp ({len(buf)} bytes)")
    (length,) = struct.unpack_from(">i", buf, 8)
    if length + LOG_OVERHEAD != len(buf):
        raise CorruptRecordError(
            f"restamp_batch takes exactly one batch: batchLength {length} + 12 != {len(buf)} bytes"
        )
    if buf[16] != MAGIC:
        raise CorruptRecordError(f"cannot restamp a batch with magic {buf[16]} (need 2)")
    try:
        _IDEMPOTENCE.pack_into(buf, _PRODUCER_ID_OFFSET, producer_id, producer_epoch,
                               base_sequence)
    except struct.error as exc:
        raise ValueError(f"producer field out of range: {exc}") from None
    _UINT32.pack_into(buf, _CRC_OFFSET, _crc32c(memoryview(buf)[_ATTRIBUTES_OFFSET:]))
    return bytes(buf)


# ------------------------------------------------------------------ decoding


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
