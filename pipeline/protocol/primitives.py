"""Kafka wire primitives: an append-only ``Writer`` and a bounds-checked ``Reader``.

Sans-I/O. Naming follows the Kafka protocol guide: ``string`` is an int16
length-prefixed UTF-8 string, ``compact_string`` an unsigned-varint (length+1)
prefixed one, ``bytes_`` an int32 length-prefixed byte string, and so on.
``Reader`` raises :class:`~pipeline.protocol.errors.DecodeError` on truncation
or malformed data, never ``struct.error``/``IndexError``.
"""

from __future__ import annotations

import struct
import uuid as _uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

from pipeline.protocol.errors import DecodeError

__all__ = ["ZERO_UUID", "Reader", "Writer"]

T = TypeVar("T")

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_F64 = struct.Struct(">d")

ZERO_UUID = _uuid.UUID(int=0)

_MAX_UVARINT = (1 << 32) - 1
_MAX_UVARLONG = (1 << 64) - 1


class Writer:
    """Append-only encoder over a ``bytearray``."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def __len__(self) -> int:
        return len(self.buf)

    def getvalue(self) -> bytes:
        return bytes(self.buf)

    def raw(self, data: bytes | bytearray | memoryview) -> None:
        self.buf += data

    # fixed-width ---------------------------------------------------------------
    def int8(self, v: int) -> None:
        self.buf += _I8.pack(v)

    def int16(self, v: int) -> None:
        self.buf += _I16.pack(v)

    def int32(self, v: int) -> None:
        self.buf += _I32.pack(v)

    def int64(self, v: int) -> None:
        self.buf += _I64.pack(v)

    def uint16(self, v: int) -> None:
        self.buf += _U16.pack(v)

    def uint32(self, v: int) -> None:
        self.buf += _U32.pack(v)

    def float64(self, v: float) -> None:
        self.buf += _F64.pack(v)

    def boolean(self, v: bool) -> None:
        self.buf.append(1 if v else 0)

    def uuid(self, v: _uuid.UUID) -> None:
        self.buf += v.bytes

    # variable-width ------------------------------------------------------------
    def uvarint(self, v: int) -> None:
        """Unsigned varint (up to 64 bits: also used for unsigned varlongs)."""
        if v < 0 or v > _MAX_UVARLONG:
            raise ValueError(f"unsigned varint out of range: {v}")
        buf = self.buf
        while v >= 0x80:
            buf.append((v & 0x7F) | 0x80)
            v >>= 7
        buf.append(v)

    def varint(self, v: int) -> None:
        """Signed zig-zag varint (32-bit)."""
        if not -(1 << 31) <= v < (1 << 31):
            raise ValueError(f"varint out of range: {v}")
        self.uvarint(((v << 1) ^ (v >> 31)) & 0xFFFFFFFF)

    def varlong(self, v: int) -> None:
        """Signed zig-zag varlong (64-bit)."""
        if not -(1 << 63) <= v < (1 << 63):
            raise ValueError(f"varlong out of range: {v}")
        self.uvarint(((v << 1) ^ (v >> 63)) & _MAX_UVARLONG)

    # strings -------------------------------------------------------------------
    def string(self, v: str) -> None:
        data = v.encode("utf-8")
        n = len(data)
        if n > 0x7FFF:
            raise ValueError(f"string too long for an int16 length: {n} bytes")
        self.buf += _I16.pack(n)
        self.buf += data

    def nullable_string(self, v: str | None) -> None:
        if v is None:
            self.buf += b"\xff\xff"
        else:
            self.string(v)

    def compact_string(self, v: str) -> None:
        data = v.encode("utf-8")
        self.uvarint(len(data) + 1)
        self.buf += data

    def compact_nullable_string(self, v: str | None) -> None:
        if v is None:
            self.buf.append(0)
        else:
            self.compact_string(v)

    # bytes ---------------------------------------------------------------------
    def bytes_(self, v: bytes | bytearray | memoryview) -> None:
        self.buf += _I32.pack(len(v))
        self.buf += v

    def nullable_bytes(self, v: bytes | bytearray | memoryview | None) -> None:
        if v is None:
            self.buf += b"\xff\xff\xff\xff"
        else:
            self.bytes_(v)

    def compact_bytes(self, v: bytes | bytearray | memoryview) -> None:
        self.uvarint(len(v) + 1)
        self.buf += v

    def compact_nullable_bytes(self, v: bytes | bytearray | memoryview | None) -> None:
        if v is None:
            self.buf.append(0)
        else:
            self.compact_bytes(v)

    # arrays --------------------------------------------------------------------
    def array(self, items: Sequence[T] | None, write_item: Callable[[T], object]) -> None:
        """int32 count (-1 for null) then each item via ``write_item``."""
        if items is None:
            self.buf += b"\xff\xff\xff\xff"
            return
        self.buf += _I32.pack(len(items))
        for item in items:
            write_item(item)

    def compact_array(self, items: Sequence[T] | None, write_item: Callable[[T], object]) -> None:
        """unsigned varint count+1 (0 for null) then each item."""
        if items is None:
            self.buf.append(0)
            return
        self.uvarint(len(items) + 1)
        for item in items:
            write_item(item)

    def tagged_fields(self, fields: Sequence[tuple[int, bytes]] = ()) -> None:
        """A tagged-field section: count, then (tag, size, data) sorted by tag."""
        self.uvarint(len(fields))
        for tag, data in sorted(fields, key=lambda f: f[0]):
            self.uvarint(tag)
            self.uvarint(len(data))
            self.buf += data


class Reader:
    """Decoder over a ``memoryview``; every read is bounds-checked."""

    __slots__ = ("_buf", "_end", "pos")

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        mv = memoryview(data)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        self._buf = mv
        self._end = len(mv)
        self.pos = 0

    @property
    def remaining(self) -> int:
        return self._end - self.pos

    def _truncated(self, what: str, need: int) -> DecodeError:
        return DecodeError(
            f"truncated data reading {what} at offset {self.pos}: "
            f"need {need} bytes, {self._end - self.pos} left"
        )

    def raw(self, n: int) -> memoryview:
        """The next ``n`` bytes as a zero-copy ``memoryview``."""
        pos = self.pos
        end = pos + n
        if n < 0 or end > self._end:
            raise self._truncated("raw bytes", n)
        self.pos = end
        return self._buf[pos:end]

    def skip(self, n: int) -> None:
        self.raw(n)

    def sub(self, n: int) -> Reader:
        """A reader over the next ``n`` bytes (consumed from this reader)."""
        return Reader(self.raw(n))

    def rest(self) -> memoryview:
        return self.raw(self._end - self.pos)

    # fixed-width ---------------------------------------------------------------
    def int8(self) -> int:
        pos = self.pos
        if pos >= self._end:
            raise self._truncated("int8", 1)
        self.pos = pos + 1
        v: int = self._buf[pos]
        return v - 256 if v > 127 else v

    def int16(self) -> int:
        pos = self.pos
        if pos + 2 > self._end:
            raise self._truncated("int16", 2)
        self.pos = pos + 2
        v: int = _I16.unpack_from(self._buf, pos)[0]
        return v

    def int32(self) -> int:
        pos = self.pos
        if pos + 4 > self._end:
            raise self._truncated("int32", 4)
        self.pos = pos + 4
        v: int = _I32.unpack_from(self._buf, pos)[0]
        return v

    def int64(self) -> int:
        pos = self.pos
        if pos + 8 > self._end:
            raise self._truncated("int64", 8)
        self.pos = pos + 8
        v: int = _I64.unpack_from(self._buf, pos)[0]
        return v

    def uint16(self) -> int:
        pos = self.pos
        if pos + 2 > self._end:
            raise self._truncated("uint16", 2)
        self.pos = pos + 2
        v: int = _U16.unpack_from(self._buf, pos)[0]
        return v

    def uint32(self) -> int:
        pos = self.pos
        if pos + 4 > self._end:
            raise self._truncated("uint32", 4)
        self.pos = pos + 4
        v: int = _U32.unpack_from(self._buf, pos)[0]
        return v

    def float64(self) -> float:
        pos = self.pos
        if pos + 8 > self._end:
            raise self._truncated("float64", 8)
        self.pos = pos + 8
        v: float = _F64.unpack_from(self._buf, pos)[0]
        return v

    def boolean(self) -> bool:
        pos = self.pos
        if pos >= self._end:
            raise self._truncated("bool", 1)
        self.pos = pos + 1
        return self._buf[pos] != 0

    def uuid(self) -> _uuid.UUID:
        pos = self.pos
        if pos + 16 > self._end:
            raise self._truncated("uuid", 16)
        self.pos = pos + 16
        return _uuid.UUID(bytes=bytes(self._buf[pos : pos + 16]))

    # variable-width ------------------------------------------------------------
    def _uvar(self, max_bytes: int, what: str) -> int:
        buf = self._buf
        pos = self.pos
        end = self._end
        result = 0
        shift = 0
        for _ in range(max_bytes):
            if pos >= end:
                raise self._truncated(what, 1)
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                self.pos = pos
                return result
            shift += 7
        raise DecodeError(f"{what} longer than {max_bytes} bytes at offset {self.pos}")

    def uvarint(self) -> int:
        """Unsigned varint (at most 5 bytes, 32 bits)."""
        pos = self.pos
        if pos < self._end:
            b: int = self._buf[pos]
            if b < 0x80:  # fast path: one byte
                self.pos = pos + 1
                return b
        v = self._uvar(5, "unsigned varint")
        if v > _MAX_UVARINT:
            raise DecodeError(f"unsigned varint out of range: {v}")
        return v

    def uvarlong(self) -> int:
        return self._uvar(10, "unsigned varlong") & _MAX_UVARLONG

    def varint(self) -> int:
        v = self.uvarint()
        return (v >> 1) ^ -(v & 1)

    def varlong(self) -> int:
        v = self.uvarlong()
        return (v >> 1) ^ -(v & 1)

    # strings -------------------------------------------------------------------
    def _utf8(self, n: int, what: str) -> str:
        pos = self.pos
        end = pos + n
        if end > self._end:
            raise self._truncated(what, n)
        self.pos = end
        try:
            return str(self._buf[pos:end], "utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"invalid UTF-8 in {what} at offset {pos}") from exc

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise DecodeError(f"null string where a non-null string is required (offset {self.pos - 2})")
        return self._utf8(n, "string")

    def nullable_string(self) -> str | None:
        n = self.int16()
        if n < 0:
            if n != -1:
                raise DecodeError(f"invalid string length {n}")
            return None
        return self._utf8(n, "string")

    def compact_string(self) -> str:
        n = self.uvarint() - 1
        if n < 0:
            raise DecodeError("null compact string where a non-null string is required")
        return self._utf8(n, "compact string")

    def compact_nullable_string(self) -> str | None:
        n = self.uvarint() - 1
        if n < 0:
            return None
        return self._utf8(n, "compact string")

    # bytes ---------------------------------------------------------------------
    def bytes_(self) -> bytes:
        n = self.int32()
        if n < 0:
            raise DecodeError("null bytes where non-null bytes are required")
        return bytes(self.raw(n))

    def nullable_bytes(self) -> bytes | None:
        n = self.int32()
        if n < 0:
            if n != -1:
                raise DecodeError(f"invalid bytes length {n}")
            return None
        return bytes(self.raw(n))

    def compact_bytes(self) -> bytes:
        n = self.uvarint() - 1
        if n < 0:
            raise DecodeError("null compact bytes where non-null bytes are required")
        return bytes(self.raw(n))

    def compact_nullable_bytes(self) -> bytes | None:
        n = self.uvarint() - 1
        if n < 0:
            return None
        return bytes(self.raw(n))

    # arrays --------------------------------------------------------------------
    def array_length(self, *, nullable: bool = False) -> int:
        """An int32 array count; -1 (null) only when ``nullable``; sanity-checked."""
        n = self.int32()
        if n < 0:
            if nullable and n == -1:
                return -1
            raise DecodeError(f"invalid array length {n}")
        if n > self._end - self.pos:
            raise DecodeError(f"array length {n} exceeds the {self._end - self.pos} bytes left")
        return n

    def compact_array_length(self, *, nullable: bool = False) -> int:
        """A compact (uvarint count+1) array count; -1 means null."""
        n = self.uvarint() - 1
        if n < 0:
            if nullable:
                return -1
            raise DecodeError("null compact array where a non-null array is required")
        if n > self._end - self.pos:
            raise DecodeError(f"array length {n} exceeds the {self._end - self.pos} bytes left")
        return n

    def array(self, read_item: Callable[[], T]) -> tuple[T, ...]:
        n = self.array_length()
        return tuple([read_item() for _ in range(n)])

    def nullable_array(self, read_item: Callable[[], T]) -> tuple[T, ...] | None:
        n = self.array_length(nullable=True)
        if n < 0:
            return None
        return tuple([read_item() for _ in range(n)])

    def compact_array(self, read_item: Callable[[], T]) -> tuple[T, ...]:
        n = self.compact_array_length()
        return tuple([read_item() for _ in range(n)])

    def compact_nullable_array(self, read_item: Callable[[], T]) -> tuple[T, ...] | None:
        n = self.compact_array_length(nullable=True)
        if n < 0:
            return None
        return tuple([read_item() for _ in range(n)])

    def tagged_fields(self) -> list[tuple[int, memoryview]]:
        """A tagged-field section as ``[(tag, data), ...]``."""
        out: list[tuple[int, memoryview]] = []
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            size = self.uvarint()
            out.append((tag, self.raw(size)))
        return out

    def skip_tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.skip(self.uvarint())
