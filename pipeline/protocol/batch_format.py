"""Kafka RecordBatch v2 (magic 2): the wire layout, its constants and the data model.

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

The encoder (and the producer's ``BatchBuilder``) is ``records.py``, the decoder
``batch_decoder.py``; ``records.py`` re-exports all of it. Sans-I/O.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

from pipeline.protocol.compression import Compression

__all__ = [
    "ATTRIBUTES_OFFSET",
    "ATTR_COMPRESSION_MASK",
    "ATTR_CONTROL",
    "ATTR_TIMESTAMP_TYPE",
    "ATTR_TRANSACTIONAL",
    "BATCH_HEADER_SIZE",
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "CRC_OFFSET",
    "CREATE_TIME",
    "HEADER",
    "IDEMPOTENCE",
    "LOG_APPEND_TIME",
    "LOG_OVERHEAD",
    "MAGIC",
    "MAX_RECORD_OVERHEAD",
    "MIN_BATCH_LENGTH",
    "PREFIX",
    "PRODUCER_ID_OFFSET",
    "RECORD_SETTERS",
    "TAIL",
    "UINT32",
    "ControlRecordType",
    "CorruptRecordError",
    "Record",
    "RecordBatch",
    "control_record_key",
    "control_record_type",
    "end_txn_marker_coordinator_epoch",
    "end_txn_marker_value",
]


class CorruptRecordError(ValueError):
    """A record batch failed to decode: bad CRC, bad magic, malformed or truncated fields."""


# ------------------------------------------------------------------ constants

BATCH_HEADER_SIZE: Final = 61
#: bytes before the batchLength field counts (baseOffset + batchLength)
LOG_OVERHEAD: Final = 12
#: the smallest legal batchLength (header after the length field, no records)
MIN_BATCH_LENGTH: Final = BATCH_HEADER_SIZE - LOG_OVERHEAD
MAGIC: Final = 2

CRC_OFFSET: Final = 17
ATTRIBUTES_OFFSET: Final = 21
PRODUCER_ID_OFFSET: Final = 43

ATTR_COMPRESSION_MASK: Final = 0x07
ATTR_TIMESTAMP_TYPE: Final = 0x08
ATTR_TRANSACTIONAL: Final = 0x10
ATTR_CONTROL: Final = 0x20

CREATE_TIME: Final = 0
LOG_APPEND_TIME: Final = 1

# upper bound of a record's overhead besides key/value/headers:
# length varint (5) + attributes (1) + timestampDelta varlong (10) + offsetDelta varint (5)
MAX_RECORD_OVERHEAD: Final = 21


class ControlRecordType(IntEnum):
    ABORT = 0
    COMMIT = 1


CONTROL_ABORT: Final = ControlRecordType.ABORT
CONTROL_COMMIT: Final = ControlRecordType.COMMIT

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc
PREFIX = struct.Struct(">qiibI")
# attributes .. recordCount: the CRC-covered header part
TAIL = struct.Struct(">hiqqqhii")
HEADER = struct.Struct(">qiibIhiqqqhii")
IDEMPOTENCE = struct.Struct(">qhi")
UINT32 = struct.Struct(">I")
assert HEADER.size == BATCH_HEADER_SIZE

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


RECORD_SETTERS: Final = tuple(
    getattr(Record, name).__set__
    for name in ("offset_delta", "timestamp_delta", "key", "value", "headers", "attributes")
)
assert len(RECORD_SETTERS) == len(Record.__dataclass_fields__)


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


def end_txn_marker_value(coordinator_epoch: int, version: int = 0) -> bytes:
    """The value of a COMMIT / ABORT marker: ``version: int16, coordinatorEpoch: int32``."""
    return struct.pack(">hi", version, coordinator_epoch)


def end_txn_marker_coordinator_epoch(record: Record) -> int:
    """The coordinator epoch a COMMIT / ABORT marker was written under."""
    value = record.value
    if value is None or len(value) < 6:
        raise CorruptRecordError(f"transaction marker value must be >= 6 bytes, got {value!r}")
    version, epoch = struct.unpack_from(">hi", value)
    if version < 0:
        raise CorruptRecordError(f"bad transaction marker version {version}")
    return int(epoch)
