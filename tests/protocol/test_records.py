"""RecordBatch v2 codec: byte fixtures, round trips, BatchBuilder, restamp, corruption."""

from __future__ import annotations

import dataclasses
import re
import struct
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.protocol.compression import Compression
from pipeline.protocol.crc import crc32c
from pipeline.protocol.records import (
    BATCH_HEADER_SIZE,
    BatchBuilder,
    ControlRecordType,
    CorruptRecordError,
    Record,
    RecordBatch,
    batch_size_for_record,
    control_record_key,
    control_record_type,
    decode_record_batches,
    encode_record_batch,
    restamp_batch,
)


def unhex(text: str) -> bytes:
    """Hex with ``#`` comments and any whitespace -> bytes."""
    return bytes.fromhex(re.sub(r"#[^\n]*", "", text).replace(" ", "").replace("\n", ""))


# --------------------------------------------------------------------------- fixtures


@dataclass(frozen=True)
class Fixture:
    name: str
    wire: bytes
    batch: RecordBatch
    #: "both": encode(batch) == wire and decode(wire) == batch; "decode": decode only
    #: (compressed bytes from another writer: gzip mtime/levels differ)
    direction: str = "both"
    level: int | None = None


# Written by kafka-python's DefaultRecordBatchBuilder (an independent writer):
#   builder(magic=2, compression_type=0, producer_id=1000, producer_epoch=3, base_sequence=7)
#   append(0, timestamp=1700000000000, key=b"k1", value=b"hello", headers=[("h", b"v")])
#   append(1, timestamp=1700000000005, key=None, value=None, headers=[])
KAFKA_PYTHON_WIRE = unhex("""
    00 00 00 00 00 00 00 00     # baseOffset            0
    00 00 00 4a                 # batchLength           74 (bytes after this field)
    00 00 00 00                 # partitionLeaderEpoch  0 (kafka-python writes 0)
    02                          # magic                 2
    26 44 b6 f1                 # crc                   CRC-32C of attributes..end
    00 00                       # attributes            none, create time, not txn/control
    00 00 00 01                 # lastOffsetDelta       1
    00 00 01 8b cf e5 68 00     # baseTimestamp         1700000000000
    00 00 01 8b cf e5 68 05     # maxTimestamp          1700000000005
    00 00 00 00 00 00 03 e8     # producerId            1000
    00 03                       # producerEpoch         3
    00 00 00 07                 # baseSequence          7
    00 00 00 02                 # recordCount           2
    # record 0
    22                          #   length              17 (zigzag 34)
    00                          #   attributes          0
    00                          #   timestampDelta      0
    00                          #   offsetDelta         0
    04 6b 31                    #   key                 len 2, "k1"
    0a 68 65 6c 6c 6f           #   value               len 5, "hello"
    02                          #   headerCount         1
    02 68                       #     header key        len 1, "h"
    02 76                       #     header value      len 1, "v"
    # record 1
    0c                          #   length              6
    00                          #   attributes          0
    0a                          #   timestampDelta      5
    02                          #   offsetDelta         1
    01                          #   key                 null (-1)
    01                          #   value               null (-1)
    00                          #   headerCount         0
""")
KAFKA_PYTHON_BATCH = RecordBatch(
    base_offset=0, partition_leader_epoch=0, crc=0x2644B6F1, attributes=0,
    last_offset_delta=1, base_timestamp=1700000000000, max_timestamp=1700000000005,
    producer_id=1000, producer_epoch=3, base_sequence=7,
    records=(
        Record(offset_delta=0, timestamp_delta=0, key=b"k1", value=b"hello",
               headers=(("h", b"v"),)),
        Record(offset_delta=1, timestamp_delta=5, key=None, value=None),
    ),
)

# A transaction COMMIT marker as a broker writes it (hand-assembled from the
# protocol spec; CRC computed with kafka-python's pure-Python CRC-32C).
CONTROL_WIRE = unhex("""
    00 00 00 00 00 00 00 39     # baseOffset            57
    00 00 00 42                 # batchLength           66
    00 00 00 04                 # partitionLeaderEpoch  4
    02                          # magic                 2
    3b 78 26 41                 # crc
    00 30                       # attributes            0x30 = transactional | control
    00 00 00 00                 # lastOffsetDelta       0
    00 00 01 8b cf e5 68 7b     # baseTimestamp         1700000000123
    00 00 01 8b cf e5 68 7b     # maxTimestamp          1700000000123
    00 00 00 00 00 00 03 e8     # producerId            1000
    00 03                       # producerEpoch         3
    ff ff ff ff                 # baseSequence          -1
    00 00 00 01                 # recordCount           1
    # control record
    20                          #   length              16
    00                          #   attributes
    00                          #   timestampDelta      0
    00                          #   offsetDelta         0
    08 00 00 00 01              #   key                 len 4: version 0 (int16), type 1 = COMMIT
    0c 00 00 00 00 00 05        #   value               len 6: version 0, coordinatorEpoch 5
    00                          #   headerCount         0
""")
CONTROL_BATCH = RecordBatch(
    base_offset=57, partition_leader_epoch=4, crc=0x3B782641, attributes=0x30,
    last_offset_delta=0, base_timestamp=1700000000123, max_timestamp=1700000000123,
    producer_id=1000, producer_epoch=3, base_sequence=-1,
    records=(Record(key=b"\x00\x00\x00\x01", value=b"\x00\x00\x00\x00\x00\x05"),),
)

# Compressed batches written by aiokafka's Cython DefaultRecordBatchBuilder:
#   builder(magic=2, compression_type=codec, producer_id=42, producer_epoch=1, base_sequence=100)
#   for i in 0..2: append(i, timestamp=1700000000000 + i, key=b"key-%d" % i,
#                         value=b"value-%d " % i * 8, headers=[("trace", b"abc")] if i == 1 else [])
_AIOKAFKA_HEADER = """
    00 00 00 00 00 00 00 00     # baseOffset            0
    {length}                    # batchLength
    ff ff ff ff                 # partitionLeaderEpoch  -1
    02                          # magic                 2
    {crc}                       # crc
    {attributes}                # attributes            codec in bits 0-2
    00 00 00 02                 # lastOffsetDelta       2
    00 00 01 8b cf e5 68 00     # baseTimestamp         1700000000000
    00 00 01 8b cf e5 68 02     # maxTimestamp          1700000000002
    00 00 00 00 00 00 00 2a     # producerId            42
    00 01                       # producerEpoch         1
    00 00 00 64                 # baseSequence          100
    00 00 00 03                 # recordCount           3
"""


def _aiokafka_batch(codec: Compression, crc: int, length: int) -> RecordBatch:
    return RecordBatch(
        base_offset=0, partition_leader_epoch=-1, crc=crc, attributes=int(codec),
        last_offset_delta=2, base_timestamp=1700000000000, max_timestamp=1700000000002,
        producer_id=42, producer_epoch=1, base_sequence=100,
        records=tuple(
            Record(offset_delta=i, timestamp_delta=i, key=b"key-%d" % i,
                   value=b"value-%d " % i * 8, headers=(("trace", b"abc"),) if i == 1 else ())
            for i in range(3)
        ),
    )


def _aiokafka_fixture(codec: Compression, length: int, crc: int, body: str,
                      direction: str, level: int | None = None) -> Fixture:
    header = _AIOKAFKA_HEADER.format(length=f"{length:08x}", crc=f"{crc:08x}",
                                     attributes=f"{int(codec):04x}")
    return Fixture(f"aiokafka-{codec.name.lower()}", unhex(header + body),
                   _aiokafka_batch(codec, crc, length), direction, level)


AIOKAFKA_FIXTURES = [
    _aiokafka_fixture(Compression.GZIP, 0x86, 0xA2201710, """
        # gzip member (mtime set, level 9: our encoder differs, so decode only)
        1f8b0800e553026b02ff9bc1c8c0c0c0959d5aa96bd0c0589698539aaa6ba0402ecdb086918189096c9a21
        cc344305726926ae92a2c4e454b6c4a4e4198c0c2c2c60738d60e61a29904b330000ba788d54f4000000
    """, "decode"),
    _aiokafka_fixture(Compression.SNAPPY, 0x95, 0x85581DB9, """
        82 53 4e 41 50 50 59 00     # xerial magic "\\x82SNAPPY\\0"
        00 00 00 01                 # xerial version 1
        00 00 00 01                 # xerial compatible version 1
        00 00 00 50                 # block length 80, then one raw snappy block
        f4015098010000000a6b65792d30800176616c75652d3020de08001400ac01000202054e0031114e00310d4e
        c608003c020a747261636506616263980100040405580432800da600320d58c608000000
    """, "both"),
    _aiokafka_fixture(Compression.LZ4, 0x95, 0x497BF936, """
        04 22 4d 18                 # LZ4 frame magic 0x184D2204 (little-endian)
        70 40 ad                    # FLG independent blocks + block checksums, BD 64 KiB, HC
        51000000                    # block size 81 (compressed)
        ff0698010000000a6b65792d30800176616c75652d30200800256100ac010002024e0014314e002f312008
        0025f101020a74726163650661626398010004045800143258002f322008002150652d322000
        99 28 b8 66                 # block checksum (xxh32)
        00000000                    # end mark
    """, "both", level=9),
    _aiokafka_fixture(Compression.ZSTD, 0x82, 0xEC579C1C, """
        28 b5 2f fd                 # zstd frame magic
        20f4450200040398010000000a6b65792d30800176616c75652d302000ac010002023131020a74726163
        6506616263980100040432320009008308201f10b3850b06d1406640220a57d99d8509
    """, "decode"),
]

FIXTURES = [
    Fixture("kafka-python-uncompressed", KAFKA_PYTHON_WIRE, KAFKA_PYTHON_BATCH),
    Fixture("control-commit", CONTROL_WIRE, CONTROL_BATCH),
    *AIOKAFKA_FIXTURES,
]


@pytest.mark.parametrize("fx", FIXTURES, ids=lambda f: f.name)
def test_fixture_decode(fx: Fixture) -> None:
    assert decode_record_batches(fx.wire) == [fx.batch]


@pytest.mark.parametrize("fx", [f for f in FIXTURES if f.direction == "both"],
                         ids=lambda f: f.name)
def test_fixture_encode(fx: Fixture) -> None:
    assert encode_record_batch(fx.batch, compression_level=fx.level) == fx.wire


def test_fixture_crc_is_crc32c_of_attributes_to_end() -> None:
    for fx in FIXTURES:
        (stored,) = struct.unpack_from(">I", fx.wire, 17)
        assert stored == crc32c(fx.wire[21:]) == fx.batch.crc


def test_fixture_headers_are_61_bytes_and_length_counts_after_length_field() -> None:
    for fx in FIXTURES:
        (length,) = struct.unpack_from(">i", fx.wire, 8)
        assert length == len(fx.wire) - 12, fx.name
        assert len(fx.wire) > BATCH_HEADER_SIZE


def test_control_batch_properties() -> None:
    (batch,) = decode_record_batches(CONTROL_WIRE)
    assert batch.is_control
    assert batch.is_transactional
    assert batch.compression is Compression.NONE
    assert batch.timestamp_type == 0
    assert batch.last_offset == 57
    assert control_record_type(batch.records[0]) == ControlRecordType.COMMIT == 1
    abort = Record(key=b"\x00\x00\x00\x00", value=b"\x00\x00\x00\x00\x00\x00")
    assert control_record_type(abort) == ControlRecordType.ABORT
    assert control_record_key(ControlRecordType.COMMIT) == batch.records[0].key


@pytest.mark.parametrize("key", [None, b"", b"\x00\x01"])
def test_control_record_type_rejects_short_keys(key: bytes | None) -> None:
    with pytest.raises(CorruptRecordError, match="control record key"):
        control_record_type(Record(key=key))


def test_batch_properties_from_attributes() -> None:
    b = RecordBatch(attributes=0x08 | 0x10 | int(Compression.ZSTD))
    assert b.compression is Compression.ZSTD
    assert b.timestamp_type == 1
    assert b.is_transactional
    assert not b.is_control


# --------------------------------------------------------------------------- round trips

int8 = st.integers(-(2**7), 2**7 - 1)
int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
small_bytes = st.binary(max_size=40)
headers_st = st.lists(
    st.tuples(st.text(max_size=8), st.none() | small_bytes), max_size=3
).map(tuple)
record_st = st.builds(
    Record,
    offset_delta=int32,
    timestamp_delta=int64,
    key=st.none() | small_bytes,
    value=st.none() | small_bytes | st.binary(min_size=100, max_size=300),
    headers=headers_st,
    attributes=int8,
)


@st.composite
def batch_st(draw: st.DrawFn, codec: Compression) -> RecordBatch:
    flags = draw(st.sampled_from([0, 0x08, 0x10, 0x20, 0x30, 0x18]))
    return RecordBatch(
        base_offset=draw(int64), partition_leader_epoch=draw(int32),
        attributes=int(codec) | flags, last_offset_delta=draw(int32),
        base_timestamp=draw(int64), max_timestamp=draw(int64),
        producer_id=draw(int64), producer_epoch=draw(int16), base_sequence=draw(int32),
        records=tuple(draw(st.lists(record_st, max_size=6))),
    )


FAST = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.name.lower())
def test_batch_roundtrip(codec: Compression) -> None:
    @FAST
    @given(batch_st(codec))
    def check(batch: RecordBatch) -> None:
        wire = encode_record_batch(batch)
        (decoded,) = decode_record_batches(wire)
        assert decoded == dataclasses.replace(batch, crc=decoded.crc)
        assert decoded.crc == crc32c(wire[21:])
        assert encode_record_batch(decoded) == wire

    check()


@FAST
@given(st.lists(batch_st(Compression.NONE), min_size=1, max_size=4), st.data())
def test_concatenated_batches_and_truncated_tail(batches: list[RecordBatch],
                                                 data: st.DataObject) -> None:
    wires = [encode_record_batch(b) for b in batches]
    stream = b"".join(wires)
    decoded = decode_record_batches(stream)
    assert [dataclasses.replace(b, crc=0) for b in decoded] == batches
    # Cut the last batch anywhere: it is dropped, the others survive.
    cut = data.draw(st.integers(1, len(wires[-1]) - 1))
    assert decode_record_batches(stream[:-cut]) == decoded[:-1]
    assert decode_record_batches(memoryview(stream)) == decoded
    assert decode_record_batches(bytearray(stream)) == decoded


# --------------------------------------------------------------------------- BatchBuilder

append_st = st.tuples(
    st.integers(1_600_000_000_000, 1_600_000_020_000),  # deltas both ways, some > 16383
    st.none() | small_bytes,
    # sizes around the 16384-entry varint table edge; cheap to generate
    st.none() | small_bytes | st.integers(16380, 16400).map(lambda n: b"L" * n),
    headers_st,
)


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.name.lower())
def test_builder_matches_encode_record_batch(codec: Compression) -> None:
    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(append_st, min_size=1, max_size=8), int64, int16, int32, st.booleans(),
           int32)
    def check(appends: list[tuple[int, bytes | None, bytes | None,
                                  tuple[tuple[str, bytes | None], ...]]],
              pid: int, epoch: int, seq: int, txn: bool, leader_epoch: int) -> None:
        builder = BatchBuilder(compression=codec)
        total = BATCH_HEADER_SIZE
        for ts, key, value, headers in appends:
            size = builder.append(ts, key, value, headers)
            total += size
            assert builder.size_in_bytes == total
            assert size <= batch_size_for_record(key, value, headers) - BATCH_HEADER_SIZE
        assert builder.record_count == len(appends)
        wire = builder.build(producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                             is_transactional=txn, partition_leader_epoch=leader_epoch)
        base = appends[0][0]
        expected = RecordBatch(
            base_offset=0, partition_leader_epoch=leader_epoch,
            attributes=int(codec) | (0x10 if txn else 0),
            last_offset_delta=len(appends) - 1,
            base_timestamp=base, max_timestamp=max(a[0] for a in appends),
            producer_id=pid, producer_epoch=epoch, base_sequence=seq,
            records=tuple(
                Record(offset_delta=i, timestamp_delta=ts - base, key=k, value=v,
                       headers=tuple(h))
                for i, (ts, k, v, h) in enumerate(appends)
            ),
        )
        assert wire == encode_record_batch(expected)
        if codec is Compression.NONE:
            assert len(wire) == builder.size_in_bytes
        (decoded,) = decode_record_batches(wire)
        assert decoded == dataclasses.replace(expected, crc=decoded.crc)

    check()


@dataclass
class _Rec:
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(append_st, min_size=1, max_size=8), st.integers(1, 3))
def test_builder_extend_is_byte_identical_to_append(
    appends: list[tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]],
    chunks: int,
) -> None:
    """extend (the producer's columnar path) takes its fast or general branch per
    record; whichever it takes, the bytes and sizes equal append's, also when the
    records arrive over several extend calls."""
    one = BatchBuilder()
    sizes = [one.append(*a) for a in appends]
    many = BatchBuilder()
    recs = [_Rec(*a) for a in appends]
    step = max(1, len(recs) // chunks)
    for start in range(0, len(recs), step):
        many.extend(recs[start:start + step])
    assert many.size_in_bytes - BATCH_HEADER_SIZE == sum(sizes)
    assert (many.record_count, many.size_in_bytes) == (one.record_count, one.size_in_bytes)
    assert many.build(producer_id=7, base_sequence=3) == one.build(producer_id=7, base_sequence=3)


def test_builder_extend_beyond_the_tables_and_bad_timestamps() -> None:
    base = 1_700_000_000_000
    recs = [_Rec(base + i, b"k" if i % 3 else None, b"v" * (i % 5), ()) for i in range(20_000)]
    recs.append(_Rec(base + 40_000, None, b"x" * 20_000, ()))  # delta and length > 16383
    recs.append(_Rec(base - 5, None, None, (("h", b"1"),)))  # earlier timestamp, headers
    builder = BatchBuilder()
    builder.extend(recs)
    wire = builder.build()
    assert len(wire) == builder.size_in_bytes
    (batch,) = decode_record_batches(wire)
    assert [r.offset_delta for r in batch.records] == list(range(len(recs)))
    assert [base + r.timestamp_delta for r in batch.records] == [r.timestamp for r in recs]
    assert [(r.key, r.value, r.headers) for r in batch.records] == [
        (r.key, r.value, r.headers) for r in recs
    ]
    assert batch.max_timestamp == base + 40_000
    before = (builder.record_count, builder.size_in_bytes)
    builder.extend([])
    assert (builder.record_count, builder.size_in_bytes) == before
    with pytest.raises(TypeError, match="timestamp must be an int"):
        BatchBuilder().extend([_Rec(None, None, b"v", ())])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="timestamp must be an int"):
        builder.extend([_Rec("soon", None, b"v", ())])  # type: ignore[arg-type]


def test_builder_many_records_crosses_varint_table() -> None:
    builder = BatchBuilder()
    n = 20_000  # offset deltas beyond the 2-byte precomputed table
    for i in range(n):
        builder.append(1_700_000_000_000 + i, None, b"v%d" % i)
    wire = builder.build()
    assert len(wire) == builder.size_in_bytes
    (batch,) = decode_record_batches(wire)
    assert batch.last_offset_delta == n - 1
    assert batch.max_timestamp == 1_700_000_000_000 + n - 1
    assert [r.offset_delta for r in batch.records] == list(range(n))
    assert [r.timestamp_delta for r in batch.records] == list(range(n))
    assert batch.records[-1].value == b"v%d" % (n - 1)


def test_builder_defaults_and_build_is_repeatable() -> None:
    builder = BatchBuilder(compression=Compression.GZIP, compression_level=1)
    assert builder.compression is Compression.GZIP
    assert builder.size_in_bytes == BATCH_HEADER_SIZE
    assert builder.record_count == 0
    builder.append(5, b"k", b"v")
    builder.append(3, None, None)  # an earlier timestamp: negative delta, max stays 5
    first = builder.build()
    assert builder.build() == first
    (batch,) = decode_record_batches(first)
    assert (batch.base_offset, batch.partition_leader_epoch, batch.producer_id,
            batch.producer_epoch, batch.base_sequence) == (0, -1, -1, -1, -1)
    assert (batch.base_timestamp, batch.max_timestamp) == (5, 5)
    assert [r.timestamp_delta for r in batch.records] == [0, -2]
    assert batch.compression is Compression.GZIP
    assert not batch.is_transactional


def test_builder_rejects_empty_build_and_bad_levels() -> None:
    with pytest.raises(ValueError, match="empty"):
        BatchBuilder().build()
    with pytest.raises(ValueError, match="snappy"):
        BatchBuilder(compression=Compression.SNAPPY, compression_level=1)
    with pytest.raises(ValueError, match=r"1\.\.9"):
        BatchBuilder(compression=Compression.GZIP, compression_level=10)


def test_builder_append_returns_record_size() -> None:
    builder = BatchBuilder()
    # 100-byte value, no key: length(2) attrs ts od key(1) vlen(2) value hdrs(1) = 107
    assert builder.append(0, None, b"x" * 100) == 2 + 1 + 1 + 1 + 1 + 2 + 100 + 1
    assert builder.size_in_bytes == BATCH_HEADER_SIZE + 109


def test_batch_size_for_record_is_an_upper_bound_of_a_single_record_batch() -> None:
    for key, value, headers in [
        (None, None, ()),
        (b"k" * 200, b"v" * 70000, (("h\u00e9", None), ("x", b"y" * 300))),
    ]:
        builder = BatchBuilder()
        builder.append(2**40, key, value, headers)
        assert batch_size_for_record(key, value, headers) >= len(builder.build())
    assert batch_size_for_record(None, b"x" * 100, ()) == 61 + 21 + 1 + 2 + 100 + 1


# --------------------------------------------------------------------------- restamp


def test_restamp_rewrites_idempotence_fields_and_crc() -> None:
    builder = BatchBuilder(compression=Compression.LZ4)
    for i in range(10):
        builder.append(1000 + i, b"k", b"value %d" % i)
    wire = builder.build(producer_id=7, producer_epoch=1, base_sequence=40, is_transactional=True)
    new = restamp_batch(wire, producer_id=9, producer_epoch=2, base_sequence=0)
    assert len(new) == len(wire)
    assert new[:17] == wire[:17]
    assert new[21:43] == wire[21:43]
    assert new[57:] == wire[57:]
    (old_b,) = decode_record_batches(wire)
    (new_b,) = decode_record_batches(new)  # CRC verified
    assert (new_b.producer_id, new_b.producer_epoch, new_b.base_sequence) == (9, 2, 0)
    assert dataclasses.replace(new_b, producer_id=7, producer_epoch=1, base_sequence=40,
                               crc=old_b.crc) == old_b
    assert new == builder.build(producer_id=9, producer_epoch=2, base_sequence=0,
                                is_transactional=True)


def test_restamp_rejects_bad_input() -> None:
    builder = BatchBuilder()
    builder.append(0, None, b"x")
    wire = builder.build()
    with pytest.raises(CorruptRecordError, match="exactly one batch"):
        restamp_batch(wire + wire, producer_id=1, producer_epoch=0, base_sequence=0)
    with pytest.raises(CorruptRecordError, match="too short"):
        restamp_batch(wire[:30], producer_id=1, producer_epoch=0, base_sequence=0)
    with pytest.raises(CorruptRecordError, match="magic"):
        restamp_batch(wire[:16] + b"\x01" + wire[17:], producer_id=1, producer_epoch=0,
                      base_sequence=0)
    with pytest.raises(ValueError, match="out of range"):
        restamp_batch(wire, producer_id=1, producer_epoch=2**15, base_sequence=0)


# --------------------------------------------------------------------------- corruption


def _one_batch() -> bytes:
    builder = BatchBuilder()
    for i in range(3):
        builder.append(100 + i, b"key", b"value-%d" % i, [("h", b"1")])
    return builder.build(producer_id=5, producer_epoch=0, base_sequence=0)


@pytest.mark.parametrize("offset", [21, 30, 60, 61, 70, -1])
def test_bad_crc_detected(offset: int) -> None:
    wire = bytearray(_one_batch())
    wire[offset] ^= 0x40
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        decode_record_batches(bytes(wire))


def test_verify_crc_false_skips_the_check() -> None:
    wire = bytearray(_one_batch())
    wire[18] ^= 0xFF  # corrupt the stored CRC itself
    (batch,) = decode_record_batches(bytes(wire), verify_crc=False)
    assert len(batch.records) == 3


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_magic_mismatch(magic: int) -> None:
    wire = bytearray(_one_batch())
    wire[16] = magic
    with pytest.raises(CorruptRecordError, match=f"magic {magic}"):
        decode_record_batches(bytes(wire))


def test_legacy_message_set_is_rejected_clearly() -> None:
    # a magic-1 message set entry: offset, size, crc, magic 1, attributes, timestamp, key, value
    body = struct.pack(">bbqii", 1, 0, 0, -1, 1) + b"x"
    msg = struct.pack(">qi", 0, 4 + len(body)) + struct.pack(">I", 0) + body
    with pytest.raises(CorruptRecordError, match="magic 1"):
        decode_record_batches(msg)


def test_truncated_inputs() -> None:
    wire = _one_batch()
    assert decode_record_batches(b"") == []
    for cut in range(1, len(wire)):
        assert decode_record_batches(wire[:cut]) == []
        assert decode_record_batches(wire + wire[:cut]) == decode_record_batches(wire)


def _with_records(records: bytes, count: int) -> bytes:
    """A valid header (with a correct CRC) around arbitrary record bytes."""
    tail = struct.pack(">hiqqqhii", 0, max(count - 1, 0), 0, 0, -1, -1, -1, count) + records
    return struct.pack(">qiibI", 0, len(tail) + 9, -1, 2, crc32c(tail)) + tail


def test_record_corruption_is_detected_despite_a_valid_crc() -> None:
    good = encode_record_batch(RecordBatch(records=(Record(value=b"abc"),)))
    records = good[61:]
    assert decode_record_batches(_with_records(records, 1))[0].records == (Record(value=b"abc"),)
    cases = {
        "fewer records": _with_records(records, 2),
        "unexpected bytes": _with_records(records + b"\x00", 1),
        "past the end": _with_records(records[:-2], 1),
        "record count": _with_records(b"", -1),
        "bad record length": _with_records(b"\x02\x00", 1),
        "disagrees": _with_records(b"\x10" + records[1:] + b"\x00" * 4, 1),
        "bad key length": _with_records(b"\x0c\x00\x00\x00\x03\x01\x00", 1),
        "UTF-8": _with_records(b"\x12\x00\x00\x00\x01\x01\x02\x02\xff\x01", 1),
    }
    for message, wire in cases.items():
        with pytest.raises(CorruptRecordError, match=message):
            decode_record_batches(wire)


def test_bad_batch_length_and_unknown_codec() -> None:
    with pytest.raises(CorruptRecordError, match="batchLength"):
        decode_record_batches(struct.pack(">qi", 0, 3) + b"\x00" * 60)
    with pytest.raises(CorruptRecordError, match="batchLength 20"):
        decode_record_batches(struct.pack(">qiib", 0, 20, 0, 2) + b"\x00" * 16)
    tail = struct.pack(">hiqqqhii", 6, 0, 0, 0, -1, -1, -1, 0)
    wire = struct.pack(">qiibI", 0, len(tail) + 9, -1, 2, crc32c(tail)) + tail
    with pytest.raises(CorruptRecordError, match="codec 6"):
        decode_record_batches(wire)


def test_corrupt_compressed_payload() -> None:
    tail = struct.pack(">hiqqqhii", int(Compression.GZIP), 0, 0, 0, -1, -1, -1, 1) + b"junk!"
    wire = struct.pack(">qiibI", 0, len(tail) + 9, -1, 2, crc32c(tail)) + tail
    with pytest.raises(CorruptRecordError, match="gzip"):
        decode_record_batches(wire)


def test_encode_validation() -> None:
    with pytest.raises(ValueError, match="magic"):
        encode_record_batch(RecordBatch(magic=1))
    with pytest.raises(ValueError, match="out of range"):
        encode_record_batch(RecordBatch(producer_epoch=2**15))
    with pytest.raises(ValueError, match="int8"):
        encode_record_batch(RecordBatch(records=(Record(attributes=200),)))
    with pytest.raises(ValueError, match="varlong"):
        encode_record_batch(RecordBatch(records=(Record(timestamp_delta=2**63),)))
    with pytest.raises(ValueError, match="codec"):
        encode_record_batch(RecordBatch(attributes=7))
