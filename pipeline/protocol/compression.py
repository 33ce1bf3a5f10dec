"""Record-batch compression codecs, as Kafka clients write them on the wire.

``compress(codec, data, level)`` / ``decompress(codec, data)`` operate on the
*records section* of a RecordBatch v2 (everything after the 61-byte header).

Formats (what the Java client writes, what we write, what we read):

* GZIP: an RFC 1952 gzip member (Java's ``GZIPOutputStream``). We write one
  deterministic member (mtime 0); we read any number of concatenated members.
* SNAPPY: the xerial ``SnappyOutputStream`` framing used by the Java client::

      magic   82 53 4E 41 50 50 59 00   ("\\x82SNAPPY\\0")
      version 00 00 00 01               (int32 BE)
      compat  00 00 00 01               (int32 BE)
      then per 32 KiB of input: [int32 BE compressed length][raw snappy block]

  We read xerial-framed data (ignoring the version/compat words, which some
  writers get wrong) and plain raw snappy (what librdkafka writes).
* LZ4: the standard LZ4 *frame* format (magic ``04 22 4D 18``) with
  independent blocks, which is what Kafka >= 0.10 clients (Java, librdkafka)
  write for magic >= 1. (The broken header checksum of Kafka 0.8 concerns
  magic 0 only; frames with such a checksum are still accepted on decode.)
* ZSTD: a standard zstd frame (streaming frames without a content size, as the
  Java client writes them, are accepted).

Levels follow KIP-390: gzip 1..9 (default 6, zlib's default), lz4 1..17
(1 = the fast compressor, 2..17 = LZ4-HC at that level; default 1, as
librdkafka does), zstd -131072..22 (default 3). Snappy has no levels (passing
one is an error). Java's gzip "default" sentinel -1 is accepted as gzip's default.
"""

from __future__ import annotations

import struct
import zlib
from enum import IntEnum
from typing import Final

import cramjam

__all__ = [
    "LEVEL_RANGES",
    "Compression",
    "CompressionError",
    "compress",
    "decompress",
    "validate_level",
]


class Compression(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class CompressionError(ValueError):
    """Compressed data could not be decoded (corrupt or unsupported framing)."""


#: inclusive (min, max) level per codec (KIP-390); snappy/none take no level.
LEVEL_RANGES: Final[dict[Compression, tuple[int, int]]] = {
    Compression.GZIP: (1, 9),
    Compression.LZ4: (1, 17),
    Compression.ZSTD: (-131072, 22),
}
_DEFAULT_LEVELS: Final[dict[Compression, int]] = {
    Compression.GZIP: 6,
    Compression.LZ4: 1,
    Compression.ZSTD: 3,
}

XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
XERIAL_HEADER: Final = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
XERIAL_BLOCK_SIZE: Final = 32 * 1024
LZ4_FRAME_MAGIC: Final = 0x184D2204

_INT32_BE = struct.Struct(">i")
_UINT32_LE = struct.Struct("<I")


def validate_level(codec: Compression | int, level: int | None) -> int | None:
    """Check ``level`` against the codec's KIP-390 range; return the effective level.

    Returns ``None`` for codecs without levels. Raises ``ValueError`` naming the
    codec and the valid range.
    """
    try:
        c = Compression(codec)
    except ValueError:
        raise ValueError(f"unknown compression codec {codec!r} (valid: 0..4)") from None
    if level is None:
        return _DEFAULT_LEVELS.get(c)
    if isinstance(level, bool) or not isinstance(level, int):
        raise ValueError(f"compression level must be an int or None, got {level!r}")
    if c is Compression.NONE:
        raise ValueError(f"compression level {level} given but compression is none")
    if c is Compression.SNAPPY:
        raise ValueError(f"snappy does not support compression levels (got level {level})")
    if c is Compression.GZIP and level == -1:  # Java's Deflater.DEFAULT_COMPRESSION
        return _DEFAULT_LEVELS[c]
    lo, hi = LEVEL_RANGES[c]
    if not lo <= level <= hi:
        raise ValueError(
            f"{c.name.lower()} compression level {level} out of range: must be {lo}..{hi}"
        )
    return level


def compress(codec: Compression | int, data: bytes | bytearray | memoryview,
             level: int | None = None) -> bytes:
    """Compress ``data`` the way the Java client frames it for ``codec``."""
    lvl = validate_level(codec, level)
    codec = Compression(codec)
    if codec is Compression.NONE:
        return bytes(data)
    if codec is Compression.GZIP:
        assert lvl is not None
        # wbits=31: one gzip member, mtime 0, deterministic output.
        return zlib.compress(data, lvl, 31)
    if codec is Compression.SNAPPY:
        return _snappy_xerial_compress(data)
    if codec is Compression.LZ4:
        # Independent blocks (Kafka's Java reader decodes blocks independently),
        # no content checksum, 64 KiB blocks: FLG/BD = 0x70 0x40.
        c = cramjam.lz4.Compressor(level=lvl, content_checksum=False, block_linked=False)
        if data:
            c.compress(data)
        return bytes(c.finish())
    # ZSTD
    return bytes(cramjam.zstd.compress(data, level=lvl))


def decompress(codec: Compression | int, data: bytes | bytearray | memoryview) -> bytes:
    """Inverse of :func:`compress`; also reads the other framings Kafka clients write.

    Raises :class:`CompressionError` (a ``ValueError``) on corrupt input.
    """
    try:
        codec = Compression(codec)
    except ValueError:
        raise CompressionError(f"unknown compression codec {codec!r} (valid: 0..4)") from None
    try:
        if codec is Compression.NONE:
            return bytes(data)
        if codec is Compression.GZIP:
            return _gzip_decompress(data)
        if codec is Compression.SNAPPY:
            return _snappy_decompress(data)
        if codec is Compression.LZ4:
            return _lz4_decompress(data)
        return bytes(cramjam.zstd.decompress(data))
    except CompressionError:
        raise
    except (cramjam.DecompressionError, zlib.error, ValueError, struct.error) as exc:
        raise CompressionError(f"corrupt {codec.name.lower()} data: {exc}") from exc


# ---------------------------------------------------------------- gzip


def _gzip_decompress(data: bytes | bytearray | memoryview) -> bytes:
    out: list[bytes] = []
    buf = bytes(data)
    while True:
        d = zlib.decompressobj(31)
        out.append(d.decompress(buf))
        if not d.eof:
            raise CompressionError("truncated gzip data")
        buf = d.unused_data
        if not buf:
            break
    return out[0] if len(out) == 1 else b"".join(out)


# ---------------------------------------------------------------- snappy


def _snappy_xerial_compress(data: bytes | bytearray | memoryview) -> bytes:
    mv = memoryview(data)
    parts = [XERIAL_HEADER]
    pack = _INT32_BE.pack
    compress_raw = cramjam.snappy.compress_raw
    for i in range(0, len(mv), XERIAL_BLOCK_SIZE):
        block = bytes(compress_raw(mv[i:i + XERIAL_BLOCK_SIZE]))
        parts.append(pack(len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data: bytes | bytearray | memoryview) -> bytes:
    mv = memoryview(data)
    if len(mv) >= 16 and mv[:8].tobytes() == XERIAL_MAGIC:
        # version/compat words (bytes 8..15) are deliberately not checked:
        # some writers (e.g. redpanda) emit them little-endian.
        out: list[bytes] = []
        pos, end = 16, len(mv)
        decompress_raw = cramjam.snappy.decompress_raw
        while pos < end:
            if pos + 4 > end:
                raise CompressionError("truncated xerial snappy block length")
            (n,) = _INT32_BE.unpack_from(mv, pos)
            pos += 4
            if n < 0 or pos + n > end:
                raise CompressionError(f"xerial snappy block length {n} exceeds the data")
            out.append(bytes(decompress_raw(mv[pos:pos + n])))
            pos += n
        return b"".join(out)
    return bytes(cramjam.snappy.decompress_raw(mv))


# ---------------------------------------------------------------- lz4


def _lz4_decompress(data: bytes | bytearray | memoryview) -> bytes:
    try:
        return bytes(cramjam.lz4.decompress(data))
    except cramjam.DecompressionError:
        # Kafka 0.8/0.9 wrote a wrong header checksum; a frame with independent
        # blocks can still be read by hand. Anything else re-raises the original.
        try:
            return _lz4_frame_decode_lenient(memoryview(data))
        except Exception:
            pass
        raise


def _lz4_frame_decode_lenient(mv: memoryview) -> bytes:
    """Decode LZ4 frames with independent blocks without checking the header checksum.

    (Integrity is covered by the RecordBatch CRC32C anyway.)
    """
    out: list[bytes] = []
    pos, end = 0, len(mv)
    unpack = _UINT32_LE.unpack_from
    decompress_block_into = cramjam.lz4.decompress_block_into
    while pos < end:
        (magic,) = unpack(mv, pos)
        if magic != LZ4_FRAME_MAGIC:
            raise CompressionError(f"bad lz4 frame magic 0x{magic:08x}")
        flg, bd = mv[pos + 4], mv[pos + 5]
        if flg >> 6 != 1 or not flg & 0x20:
            raise CompressionError("unsupported lz4 frame (version or dependent blocks)")
        block_max = 1 << (8 + 2 * ((bd >> 4) & 7))
        pos += 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0) + 1  # + HC byte
        block_checksum = 4 if flg & 0x10 else 0
        while True:
            (size,) = unpack(mv, pos)
            pos += 4
            if size == 0:
                break
            n = size & 0x7FFFFFFF
            if pos + n > end:
                raise CompressionError("truncated lz4 block")
            if size & 0x80000000:
                out.append(bytes(mv[pos:pos + n]))
            else:
                buf = bytearray(block_max)
                got = decompress_block_into(mv[pos:pos + n], buf, output_len=block_max)
                out.append(bytes(buf[:got]))
            pos += n + block_checksum
        if flg & 0x04:
            pos += 4
    return b"".join(out)
