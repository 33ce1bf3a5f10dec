"""Wire primitives: known encodings, round-trips, truncation."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.protocol.errors import DecodeError
from pipeline.protocol.primitives import ZERO_UUID, Reader, Writer


def enc(method: str, *args: Any) -> bytes:
    w = Writer()
    getattr(w, method)(*args)
    return w.getvalue()


def dec(method: str, data: bytes, *args: Any) -> Any:
    r = Reader(data)
    v = getattr(r, method)(*args)
    assert r.remaining == 0
    return v


# (method, value, bytes): drives both directions
TABLE: list[tuple[str, Any, bytes]] = [
    ("int8", -1, b"\xff"),
    ("int8", 127, b"\x7f"),
    ("int16", -2, b"\xff\xfe"),
    ("int16", 9092, b"\x23\x84"),
    ("int32", 30000, b"\x00\x00\x75\x30"),
    ("int32", -(2**31), b"\x80\x00\x00\x00"),
    ("int64", -1, b"\xff" * 8),
    ("int64", 2**63 - 1, b"\x7f" + b"\xff" * 7),
    ("uint16", 65535, b"\xff\xff"),
    ("uint32", 2**32 - 1, b"\xff\xff\xff\xff"),
    ("float64", 1.5, b"\x3f\xf8\x00\x00\x00\x00\x00\x00"),
    ("boolean", True, b"\x01"),
    ("boolean", False, b"\x00"),
    # unsigned varints
    ("uvarint", 0, b"\x00"),
    ("uvarint", 1, b"\x01"),
    ("uvarint", 127, b"\x7f"),
    ("uvarint", 128, b"\x80\x01"),
    ("uvarint", 300, b"\xac\x02"),
    ("uvarint", 2**32 - 1, b"\xff\xff\xff\xff\x0f"),
    # zig-zag varints (values from Kafka's ByteUtilsTest)
    ("varint", 0, b"\x00"),
    ("varint", -1, b"\x01"),
    ("varint", 1, b"\x02"),
    ("varint", -64, b"\x7f"),
    ("varint", 64, b"\x80\x01"),
    ("varint", 2**31 - 1, b"\xfe\xff\xff\xff\x0f"),
    ("varint", -(2**31), b"\xff\xff\xff\xff\x0f"),
    ("varlong", 0, b"\x00"),
    ("varlong", -1, b"\x01"),
    ("varlong", 2**63 - 1, b"\xfe" + b"\xff" * 8 + b"\x01"),
    ("varlong", -(2**63), b"\xff" * 9 + b"\x01"),
    # strings
    ("string", "", b"\x00\x00"),
    ("string", "orders", b"\x00\x06orders"),
    ("string", "h\u00e9", b"\x00\x03h\xc3\xa9"),
    ("nullable_string", None, b"\xff\xff"),
    ("nullable_string", "a", b"\x00\x01a"),
    ("compact_string", "", b"\x01"),
    ("compact_string", "orders", b"\x07orders"),
    ("compact_nullable_string", None, b"\x00"),
    ("compact_nullable_string", "a", b"\x02a"),
    # bytes
    ("bytes_", b"", b"\x00\x00\x00\x00"),
    ("bytes_", b"\x01\x02", b"\x00\x00\x00\x02\x01\x02"),
    ("nullable_bytes", None, b"\xff\xff\xff\xff"),
    ("compact_bytes", b"\x01\x02", b"\x03\x01\x02"),
    ("compact_nullable_bytes", None, b"\x00"),
    ("compact_nullable_bytes", b"", b"\x01"),
    # uuid
    ("uuid", ZERO_UUID, b"\x00" * 16),
    ("uuid", uuid.UUID("00010203-0405-0607-0809-0a0b0c0d0e0f"), bytes(range(16))),
]


@pytest.mark.parametrize(("method", "value", "data"), TABLE, ids=[f"{t[0]}-{t[1]!r}" for t in TABLE])
def test_table(method: str, value: Any, data: bytes) -> None:
    assert enc(method, value) == data
    assert dec(method, data) == value


@pytest.mark.parametrize(("method", "value", "data"), TABLE, ids=[f"{t[0]}-{t[1]!r}" for t in TABLE])
def test_truncation_raises_decode_error(method: str, value: Any, data: bytes) -> None:
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            Reader(data[:cut]).__getattribute__(method)()


def test_arrays() -> None:
    w = Writer()
    w.array([1, 2], w.int32)
    w.array(None, w.int32)
    w.compact_array(["a"], w.compact_string)
    w.compact_array(None, w.int8)
    w.compact_array([], w.int8)
    data = w.getvalue()
    assert data == (
        b"\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00\x00\x02"  # [1, 2]
        b"\xff\xff\xff\xff"  # null
        b"\x02\x02a"  # compact ["a"]
        b"\x00"  # compact null
        b"\x01"  # compact []
    )
    r = Reader(data)
    assert r.array(r.int32) == (1, 2)
    assert r.nullable_array(r.int32) is None
    assert r.compact_array(r.compact_string) == ("a",)
    assert r.compact_nullable_array(r.int8) is None
    assert r.compact_nullable_array(r.int8) == ()
    assert r.remaining == 0


def test_array_length_checks() -> None:
    with pytest.raises(DecodeError):
        Reader(b"\xff\xff\xff\xff").array_length()  # null where not nullable
    with pytest.raises(DecodeError):
        Reader(b"\xff\xff\xff\xfe").array_length(nullable=True)  # -2
    with pytest.raises(DecodeError):
        Reader(b"\x7f\xff\xff\xff").array_length()  # more items than bytes left
    with pytest.raises(DecodeError):
        Reader(b"\x00").compact_array_length()
    assert Reader(b"\x00").compact_array_length(nullable=True) == -1
    with pytest.raises(DecodeError):
        Reader(b"\xff\xff\xff\xff\x0f").compact_array_length()


def test_tagged_fields() -> None:
    w = Writer()
    w.tagged_fields([(5, b"\x01\x02"), (1, b"")])
    assert w.getvalue() == b"\x02" b"\x01\x00" b"\x05\x02\x01\x02"  # sorted by tag
    r = Reader(w.getvalue())
    assert [(t, bytes(d)) for t, d in r.tagged_fields()] == [(1, b""), (5, b"\x01\x02")]
    r = Reader(w.getvalue() + b"\x99")
    r.skip_tagged_fields()
    assert r.remaining == 1
    assert Writer().tagged_fields.__defaults__ == ((),)
    w = Writer()
    w.tagged_fields()
    assert w.getvalue() == b"\x00"


def test_decode_errors() -> None:
    with pytest.raises(DecodeError):
        Reader(b"\x00\x02\xff\xfe").string()  # invalid UTF-8
    with pytest.raises(DecodeError):
        Reader(b"\xff\xff").string()  # null where not nullable
    with pytest.raises(DecodeError):
        Reader(b"\xff\xfe").nullable_string()  # -2
    with pytest.raises(DecodeError):
        Reader(b"\x00").compact_string()
    with pytest.raises(DecodeError):
        Reader(b"\xff\xff\xff\xff").bytes_()
    with pytest.raises(DecodeError):
        Reader(b"\x00").compact_bytes()
    with pytest.raises(DecodeError):
        Reader(b"\xff\xff\xff\xff\xff\x01").uvarint()  # more than 5 bytes
    with pytest.raises(DecodeError):
        Reader(b"\xff\xff\xff\xff\x1f").uvarint()  # > 32 bits
    with pytest.raises(DecodeError):
        Reader(b"\x01").raw(2)
    with pytest.raises(DecodeError):
        Reader(b"\x01").sub(2)


def test_writer_range_errors() -> None:
    with pytest.raises(ValueError, match="out of range"):
        Writer().uvarint(-1)
    with pytest.raises(ValueError, match="out of range"):
        Writer().varint(2**31)
    with pytest.raises(ValueError, match="out of range"):
        Writer().varlong(2**63)
    with pytest.raises(ValueError, match="too long"):
        Writer().string("x" * 40000)


def test_reader_over_memoryview_slices() -> None:
    data = memoryview(b"xx\x00\x02hi")[2:]
    r = Reader(data)
    assert r.string() == "hi"
    r = Reader(bytearray(b"\x00\x00\x00\x07"))
    assert r.int32() == 7
    sub = Reader(b"\x01\x02\x03").sub(2)
    assert sub.remaining == 2
    assert sub.int16() == 0x0102


def _roundtrip(write: Callable[[Writer], None], read: Callable[[Reader], Any]) -> Any:
    w = Writer()
    write(w)
    r = Reader(w.getvalue())
    v = read(r)
    assert r.remaining == 0
    return v


@settings(max_examples=100, deadline=None)
@given(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**32 - 1))
def test_varint_roundtrip(i32: int, i64: int, u32: int) -> None:
    assert _roundtrip(lambda w: w.varint(i32), Reader.varint) == i32
    assert _roundtrip(lambda w: w.varlong(i64), Reader.varlong) == i64
    assert _roundtrip(lambda w: w.uvarint(u32), Reader.uvarint) == u32


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=50), st.none() | st.binary(max_size=50))
def test_string_bytes_roundtrip(s: str, b: bytes | None) -> None:
    assert _roundtrip(lambda w: w.compact_string(s), Reader.compact_string) == s
    assert _roundtrip(lambda w: w.string(s), Reader.string) == s
    assert _roundtrip(lambda w: w.nullable_bytes(b), Reader.nullable_bytes) == b
    assert _roundtrip(lambda w: w.compact_nullable_bytes(b), Reader.compact_nullable_bytes) == b
