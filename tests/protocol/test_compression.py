"""Compression codecs: round trips, on-the-wire framing, interop framings, levels."""

from __future__ import annotations

import gzip
import random
import struct

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.protocol.compression import (
    LEVEL_RANGES,
    Compression,
    CompressionError,
    compress,
    decompress,
    validate_level,
)

CODECS = list(Compression)


def sample(size: int, seed: int = 0) -> bytes:
    """Compressible but not trivial data."""
    rng = random.Random(seed)
    words = [bytes(rng.choice(b"abcdefghijklmnop") for _ in range(rng.randint(2, 9)))
             for _ in range(200)]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + b" %d " % rng.randrange(1000)
    return bytes(out[:size])


def xxh32(data: bytes, seed: int = 0) -> int:
    """Reference XXH32 (for building LZ4 frame headers by hand)."""
    p1, p2, p3, p4, p5, m = 2654435761, 2246822519, 3266489917, 668265263, 374761393, 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & m

    n, i = len(data), 0
    if n >= 16:
        v = [(seed + p1 + p2) & m, (seed + p2) & m, seed, (seed - p1) & m]
        while i + 16 <= n:
            for j in range(4):
                lane = int.from_bytes(data[i + 4 * j:i + 4 * j + 4], "little")
                v[j] = (rotl((v[j] + lane * p2) & m, 13) * p1) & m
            i += 16
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & m
    else:
        h = (seed + p5) & m
    h = (h + n) & m
    while i + 4 <= n:
        h = (rotl((h + int.from_bytes(data[i:i + 4], "little") * p3) & m, 17) * p4) & m
        i += 4
    while i < n:
        h = (rotl((h + data[i] * p5) & m, 11) * p1) & m
        i += 1
    h ^= h >> 15
    h = (h * p2) & m
    h ^= h >> 13
    h = (h * p3) & m
    h ^= h >> 16
    return h


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
@pytest.mark.parametrize("size", [0, 1, 100, 32767, 32768, 32769, 65536, 65537, 200_000])
def test_roundtrip_sizes(codec: Compression, size: int) -> None:
    data = sample(size)
    packed = compress(codec, data)
    assert decompress(codec, packed) == data
    assert decompress(codec, memoryview(packed)) == data
    assert decompress(codec, bytearray(packed)) == data
    if codec is Compression.NONE:
        assert packed == data
    elif size >= 32768:
        assert len(packed) < size


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(CODECS), st.binary(max_size=3000))
def test_roundtrip_any_bytes(codec: Compression, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD],
                         ids=lambda c: c.name.lower())
def test_roundtrip_every_level_edge(codec: Compression) -> None:
    data = sample(50_000)
    lo, hi = LEVEL_RANGES[codec]
    levels = {lo, hi, lo + 1, (lo + hi) // 2}
    if codec is Compression.ZSTD:
        levels |= {-1, 0, 1, 3}
    sizes = {}
    for level in sorted(levels):
        packed = compress(codec, data, level)
        assert decompress(codec, packed) == data
        sizes[level] = len(packed)
    assert sizes[hi] < sizes[lo]  # levels actually reach the codec


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name.lower())
def test_compression_is_deterministic(codec: Compression) -> None:
    data = sample(70_000)
    assert compress(codec, data) == compress(codec, data)


# --------------------------------------------------------------------------- gzip


def test_gzip_member_layout() -> None:
    packed = compress(Compression.GZIP, b"hello kafka")
    assert packed[:4] == b"\x1f\x8b\x08\x00"  # magic, deflate, no flags
    assert packed[4:8] == b"\x00\x00\x00\x00"  # mtime 0: deterministic
    assert struct.unpack("<I", packed[-4:])[0] == len(b"hello kafka")  # ISIZE


def test_gzip_reads_stdlib_and_multi_member_streams() -> None:
    a, b = sample(5000, 1), sample(7000, 2)
    assert decompress(Compression.GZIP, gzip.compress(a, 9)) == a
    assert decompress(Compression.GZIP, gzip.compress(a) + gzip.compress(b)) == a + b


# --------------------------------------------------------------------------- snappy


def test_snappy_xerial_header_layout() -> None:
    data = sample(70_000)
    packed = compress(Compression.SNAPPY, data)
    assert packed[:16] == bytes([
        0x82, 0x53, 0x4E, 0x41, 0x50, 0x50, 0x59, 0x00,  # "\x82SNAPPY\0"
        0x00, 0x00, 0x00, 0x01,                          # version 1 (int32 BE)
        0x00, 0x00, 0x00, 0x01,                          # compatible version 1 (int32 BE)
    ])
    # then [int32 BE length][raw snappy block] per 32 KiB of input
    pos, chunks = 16, []
    while pos < len(packed):
        (n,) = struct.unpack_from(">i", packed, pos)
        chunks.append(bytes(cramjam.snappy.decompress_raw(packed[pos + 4:pos + 4 + n])))
        pos += 4 + n
    assert pos == len(packed)
    assert [len(c) for c in chunks] == [32768, 32768, 70_000 - 65536]
    assert b"".join(chunks) == data


def test_snappy_empty_input_is_just_the_header() -> None:
    assert compress(Compression.SNAPPY, b"") == b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01"


def test_snappy_reads_raw_blocks() -> None:
    data = sample(100_000)
    raw = bytes(cramjam.snappy.compress_raw(data))  # what librdkafka writes
    assert decompress(Compression.SNAPPY, raw) == data


def test_snappy_ignores_xerial_version_words() -> None:
    # some writers (redpanda) emit version/compat little-endian
    data = sample(1000)
    block = bytes(cramjam.snappy.compress_raw(data))
    framed = b"\x82SNAPPY\x00" + b"\x01\x00\x00\x00" * 2 + struct.pack(">i", len(block)) + block
    assert decompress(Compression.SNAPPY, framed) == data


def test_snappy_corrupt_xerial_framing() -> None:
    data = compress(Compression.SNAPPY, sample(1000))
    with pytest.raises(CompressionError, match="exceeds"):
        decompress(Compression.SNAPPY, data[:16] + b"\x7f" + data[17:])
    with pytest.raises(CompressionError, match="truncated"):
        decompress(Compression.SNAPPY, data + b"\x00\x00")


# --------------------------------------------------------------------------- lz4


def test_lz4_frame_layout() -> None:
    packed = compress(Compression.LZ4, sample(150_000))
    (magic,) = struct.unpack_from("<I", packed)
    assert magic == 0x184D2204
    flg, bd, hc = packed[4], packed[5], packed[6]
    assert flg >> 6 == 0b01  # version 01
    assert flg & 0x20  # independent blocks: Kafka's Java reader needs them
    assert not flg & 0x08  # no content size
    assert bd == 0x40  # 64 KiB max block size
    assert hc == (xxh32(bytes([flg, bd])) >> 8) & 0xFF  # correct header checksum
    assert packed[-4:] == b"\x00\x00\x00\x00"  # end mark, no content checksum


def test_xxh32_reference_matches_the_java_kafka_lz4_header() -> None:
    # Java's KafkaLZ4BlockOutputStream header: FLG 0x60, BD 0x40, HC 0x82
    assert (xxh32(b"\x60\x40") >> 8) & 0xFF == 0x82
    assert xxh32(b"") == 0x02CC5D05
    assert xxh32(b"abcdefghijklmnopqrstuvwxyz") == 0x63A14D5F  # published test vectors


def _java_lz4_frame(data: bytes) -> bytes:
    """A frame laid out like Java's KafkaLZ4BlockOutputStream (FLG 0x60, no checksums)."""
    out = [b"\x04\x22\x4d\x18\x60\x40\x82"]
    for i in range(0, len(data), 65536):
        chunk = data[i:i + 65536]
        block = bytes(cramjam.lz4.compress_block(chunk, store_size=False))
        if len(block) < len(chunk):
            out.append(struct.pack("<I", len(block)) + block)
        else:  # incompressible: stored with the high bit set
            out.append(struct.pack("<I", len(chunk) | 0x80000000) + chunk)
    out.append(b"\x00\x00\x00\x00")
    return b"".join(out)


def _librdkafka_lz4_frame(data: bytes) -> bytes:
    """Standard LZ4F output as librdkafka writes it: content size in the descriptor."""
    descriptor = bytes([0x68, 0x40]) + struct.pack("<Q", len(data))  # B.Indep | C.Size
    out = [b"\x04\x22\x4d\x18", descriptor, bytes([(xxh32(descriptor) >> 8) & 0xFF])]
    for i in range(0, len(data), 65536):
        block = bytes(cramjam.lz4.compress_block(data[i:i + 65536], store_size=False))
        out.append(struct.pack("<I", len(block)) + block)
    out.append(b"\x00\x00\x00\x00")
    return b"".join(out)


def test_lz4_reads_java_and_librdkafka_style_frames() -> None:
    data = sample(150_000)
    assert decompress(Compression.LZ4, _java_lz4_frame(data)) == data
    assert decompress(Compression.LZ4, _librdkafka_lz4_frame(data)) == data
    stored = bytes(range(256)) * 10  # incompressible-ish -> stored blocks possible
    assert decompress(Compression.LZ4, _java_lz4_frame(stored)) == stored
    stored_frame = b"\x04\x22\x4d\x18\x60\x40\x82" + struct.pack("<I", 5 | 0x80000000) + \
        b"hello" + b"\x00" * 4
    assert decompress(Compression.LZ4, stored_frame) == b"hello"


def test_lz4_reads_linked_blocks_and_checksums() -> None:
    data = sample(200_000)
    default_frame = bytes(cramjam.lz4.compress(data))  # linked blocks + content checksum
    assert decompress(Compression.LZ4, default_frame) == data


def test_lz4_accepts_kafka_08_broken_header_checksum() -> None:
    data = sample(100_000)
    frame = bytearray(_java_lz4_frame(data))
    frame[6] = (xxh32(bytes(frame[:6])) >> 8) & 0xFF  # 0.8's bug: checksum over the magic too
    assert frame[6] != 0x82
    assert decompress(Compression.LZ4, bytes(frame)) == data


def test_lz4_corrupt() -> None:
    with pytest.raises(CompressionError, match="lz4"):
        decompress(Compression.LZ4, b"\x04\x22\x4d\x18\x60\x40\x82" + b"\xff" * 10)
    with pytest.raises(CompressionError, match="lz4"):
        decompress(Compression.LZ4, b"not an lz4 frame at all")


# --------------------------------------------------------------------------- zstd


def test_zstd_frame_magic_and_streaming_frames() -> None:
    data = sample(100_000)
    assert compress(Compression.ZSTD, data)[:4] == b"\x28\xb5\x2f\xfd"
    c = cramjam.zstd.Compressor(level=3)  # streamed: no content size, like Java's ZstdOutputStream
    c.compress(data)
    assert decompress(Compression.ZSTD, bytes(c.finish())) == data


def test_zstd_corrupt() -> None:
    with pytest.raises(CompressionError, match="zstd"):
        decompress(Compression.ZSTD, b"\x28\xb5\x2f\xfd garbage")


# --------------------------------------------------------------------------- levels


@pytest.mark.parametrize(("codec", "level", "message"), [
    (Compression.GZIP, 0, r"gzip compression level 0 out of range: must be 1\.\.9"),
    (Compression.GZIP, 10, r"gzip compression level 10 out of range: must be 1\.\.9"),
    (Compression.LZ4, 0, r"lz4 compression level 0 out of range: must be 1\.\.17"),
    (Compression.LZ4, 18, r"lz4 compression level 18 out of range: must be 1\.\.17"),
    (Compression.ZSTD, 23, r"zstd compression level 23 out of range: must be -131072\.\.22"),
    (Compression.ZSTD, -131073, r"zstd compression level -131073 out of range"),
    (Compression.SNAPPY, 1, "snappy does not support compression levels"),
    (Compression.SNAPPY, 0, "snappy does not support compression levels"),
    (Compression.NONE, 1, "compression is none"),
    (Compression.GZIP, 1.5, "must be an int"),
    (Compression.GZIP, True, "must be an int"),
    (5, None, "unknown compression codec 5"),
])
def test_level_validation(codec: Compression, level: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_level(codec, level)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        compress(codec, b"data", level)  # type: ignore[arg-type]


def test_level_defaults() -> None:
    assert validate_level(Compression.NONE, None) is None
    assert validate_level(Compression.SNAPPY, None) is None
    assert validate_level(Compression.GZIP, None) == 6
    assert validate_level(Compression.GZIP, -1) == 6  # Java's Deflater.DEFAULT_COMPRESSION
    assert validate_level(Compression.LZ4, None) == 1
    assert validate_level(Compression.ZSTD, None) == 3
    assert validate_level(Compression.ZSTD, -131072) == -131072
    assert compress(Compression.GZIP, b"x" * 1000) == compress(Compression.GZIP, b"x" * 1000, 6)


def test_unknown_codec_on_decompress() -> None:
    with pytest.raises(CompressionError, match="unknown compression codec 7"):
        decompress(7, b"")


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.SNAPPY],
                         ids=lambda c: c.name.lower())
def test_corrupt_is_a_value_error(codec: Compression) -> None:
    with pytest.raises(ValueError, match="corrupt"):
        decompress(codec, b"\x1f\x8b\x08\x00 definitely not compressed")
