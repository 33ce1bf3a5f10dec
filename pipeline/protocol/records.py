"""Kafka RecordBatch v2 (magic 2) codec: encode, decode, the producer's batch builder.

This module is the encoder (``encode_record_batch``, the producer's hot-path
``BatchBuilder``, ``restamp_batch``) and the one place to import the record
codec from: it re-exports the wire format and data model
(:mod:`~pipeline.protocol.batch_format`, where the layout is drawn) and the
decoder (:mod:`~pipeline.protocol.batch_decoder`). Self-contained varint
encoding, sans-I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, Protocol

from pipeline.protocol.batch_decoder import decode_record_batches
from pipeline.protocol.batch_format import (
    ATTR_COMPRESSION_MASK,
    ATTR_CONTROL,
    ATTR_TRANSACTIONAL,
    BATCH_HEADER_SIZE,
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CREATE_TIME,
    LOG_APPEND_TIME,
    LOG_OVERHEAD,
    MAGIC,
    ControlRecordType,
    CorruptRecordError,
    Record,
    RecordBatch,
    control_record_key,
    control_record_type,
    end_txn_marker_coordinator_epoch,
    end_txn_marker_value,
)
from pipeline.protocol.batch_format import ATTRIBUTES_OFFSET as _ATTRIBUTES_OFFSET
from pipeline.protocol.batch_format import CRC_OFFSET as _CRC_OFFSET
from pipeline.protocol.batch_format import IDEMPOTENCE as _IDEMPOTENCE
from pipeline.protocol.batch_format import MAX_RECORD_OVERHEAD as _MAX_RECORD_OVERHEAD
from pipeline.protocol.batch_format import PREFIX as _PREFIX
from pipeline.protocol.batch_format import PRODUCER_ID_OFFSET as _PRODUCER_ID_OFFSET
from pipeline.protocol.batch_format import TAIL as _TAIL
from pipeline.protocol.batch_format import UINT32 as _UINT32
from pipeline.protocol.compression import Compression, validate_level
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
    "encode_end_txn_marker",
    "encode_record_batch",
    "end_txn_marker_coordinator_epoch",
    "end_txn_marker_value",
    "restamp_batch",
]


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


def encode_end_txn_marker(*, commit: bool, producer_id: int, producer_epoch: int,
                          coordinator_epoch: int, timestamp: int, base_offset: int = 0,
                          partition_leader_epoch: int = -1) -> bytes:
    """A COMMIT / ABORT marker batch as a broker writes one into each partition of an
    ended transaction: transactional and control, no sequence, one control record."""
    ctype = ControlRecordType.COMMIT if commit else ControlRecordType.ABORT
    return encode_record_batch(RecordBatch(
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        attributes=ATTR_TRANSACTIONAL | ATTR_CONTROL,
        last_offset_delta=0,
        base_timestamp=timestamp,
        max_timestamp=timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=-1,
        records=(Record(key=control_record_key(ctype),
                        value=end_txn_marker_value(coordinator_epoch)),),
    ))


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
