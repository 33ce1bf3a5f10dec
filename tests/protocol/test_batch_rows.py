"""The row decoder: fetched batches to row tuples, the C kernel and its Python twin alike.

The reference is the general decoder (``decode_record_batches``, ``Record`` objects):
for any batches, both kernels give the rows it implies, skip what the consumer skips, and
refuse malformed records with the same error.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.protocol import _kernel_py, batch_rows
from pipeline.protocol.compression import Compression
from pipeline.protocol.records import (
    BatchBuilder,
    CorruptRecordError,
    decode_record_batches,
    encode_end_txn_marker,
)

T = 1_700_000_000_000


class Row(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    leader_epoch: int


KERNELS = ["python"] + (["c"] if batch_rows.KERNEL == "c" else [])


@pytest.fixture(params=KERNELS)
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(batch_rows, "_impl", _kernel_py)
    name: str = request.param
    return name


def at(base: int, data: bytes) -> bytes:
    return struct.pack(">q", base) + data[8:]


record = st.tuples(
    st.none() | st.binary(max_size=20),
    st.none() | st.binary(max_size=300),
    st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=3),
    st.integers(0, 10_000),
)


@st.composite
def fetched(draw: st.DrawFn) -> tuple[bytes, list[Row]]:
    """Concatenated batches and the rows they hold (from the general decoder)."""
    out = b""
    base = draw(st.integers(0, 1000))
    for _ in range(draw(st.integers(1, 4))):
        recs = draw(st.lists(record, min_size=1, max_size=8))
        codec = draw(st.sampled_from([Compression.NONE, Compression.GZIP, Compression.ZSTD]))
        b = BatchBuilder(compression=codec)
        for key, value, headers, dt in recs:
            b.append(T + dt, key, value, headers)
        out += at(base, b.build(partition_leader_epoch=draw(st.integers(-1, 9))))
        base += len(recs)
    rows = [Row("t", 3, batch.base_offset + r.offset_delta, batch.base_timestamp + r.timestamp_delta,
                r.key, r.value, tuple(r.headers), batch.partition_leader_epoch)
            for batch in decode_record_batches(out) for r in batch.records]
    return out, rows


@settings(max_examples=200, deadline=None)
@given(case=fetched(), skip=st.integers(0, 40), cut=st.integers(0, 30))
def test_rows_are_the_general_decoders_records(case: tuple[bytes, list[Row]], skip: int,
                                               cut: int) -> None:
    data, rows = case
    for impl in [_kernel_py] + ([batch_rows._load()[0]] if batch_rows.KERNEL == "c" else []):
        original = batch_rows._impl
        batch_rows._impl = impl
        try:
            start = rows[0].offset + skip
            got, nxt = batch_rows.decode_rows(data, Row, "t", 3, start)
            assert got == [r for r in rows if r.offset >= start]
            assert all(type(r) is Row for r in got)
            assert nxt == max(start, rows[-1].offset + 1)
            assert batch_rows.next_fetch_offset(data, start) == nxt
            # a fetch cut short: the incomplete last batch is left for the next fetch
            short = data[: max(0, len(data) - cut)] if cut else data
            got2, nxt2 = batch_rows.decode_rows(short, Row, "t", 3, start)
            assert got2 == got[: len(got2)] and batch_rows.next_fetch_offset(short, start) == nxt2
        finally:
            batch_rows._impl = original


def test_log_append_time_and_control_batches(kernel: str) -> None:
    b = BatchBuilder()
    b.append(T, b"k", b"v")
    data = bytearray(at(5, b.build()))
    data[22] |= 0x08  # LogAppendTime: every record gets the batch's max timestamp
    struct.pack_into(">q", data, 35, T + 77)
    from pipeline.protocol.crc import crc32c
    struct.pack_into(">I", data, 17, crc32c(bytes(data[21:])))
    marker = encode_end_txn_marker(commit=True, producer_id=1, producer_epoch=0,
                                   coordinator_epoch=0, timestamp=T, base_offset=6)
    rows, nxt = batch_rows.decode_rows(bytes(data) + marker, Row, "t", 0, 0)
    assert [(r.offset, r.timestamp) for r in rows] == [(5, T + 77)] and nxt == 7


def test_keep_refuses_batches_and_the_position_still_moves(kernel: str) -> None:
    one = BatchBuilder()
    one.append(T, None, b"a")
    two = BatchBuilder()
    two.append(T, None, b"b")
    data = at(0, one.build()) + at(1, two.build())
    seen: list[int] = []

    def keep(batch: Any) -> bool:
        seen.append(batch.base_offset)
        return bool(batch.base_offset != 0)

    rows, nxt = batch_rows.decode_rows(data, Row, "t", 0, 0, keep=keep)
    assert [r.value for r in rows] == [b"b"] and nxt == 2 and seen == [0, 1]


def corrupted(where: int, value: bytes) -> bytes:
    b = BatchBuilder()
    b.append(T, b"key", b"value", [("h", b"x")])
    data = bytearray(b.build())
    data[where:where + len(value)] = value
    return bytes(data)


@pytest.mark.parametrize(("where", "value", "message"), [
    (61, b"\x7f", "bad record length"),  # a record longer than its batch
    (65, b"\x7f", "bad key length"),  # key length past the record
    (69, b"\x7f", "bad value length"),  # after length, attributes, deltas, 3-byte key
])
def test_malformed_records_are_refused_alike(kernel: str, where: int, value: bytes,
                                             message: str) -> None:
    with pytest.raises(CorruptRecordError, match=message):
        batch_rows.decode_rows(corrupted(where, value), Row, "t", 0, 0, verify_crc=False)


def test_a_bad_crc_is_refused(kernel: str) -> None:
    data = bytearray(corrupted(0, b""))
    data[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        batch_rows.decode_rows(bytes(data), Row, "t", 0, 0)


def test_row_type_must_be_a_tuple_subclass(kernel: str) -> None:
    class NotATuple:
        pass

    with pytest.raises(TypeError, match="tuple subclass"):
        batch_rows.decode_rows(corrupted(0, b""), NotATuple, "t", 0, 0)  # type: ignore[type-var]


@pytest.mark.skipif(batch_rows.KERNEL != "c", reason="the C kernel is not built")
def test_c_rows_are_left_out_of_the_cyclic_gc() -> None:
    """A consumer buffers many rows; the cyclic GC need not walk them (they hold no
    container but untracked tuples), unless the row type has an instance dict."""
    import gc

    class WithDict(tuple):  # type: ignore[type-arg]
        pass

    data = corrupted(0, b"")
    (row,), _ = batch_rows.decode_rows(data, Row, "t", 0, 0)
    assert not gc.is_tracked(row) and not gc.is_tracked(row.headers)
    assert not gc.is_tracked(row.headers[0])
    (loose,), _ = batch_rows.decode_rows(data, WithDict, "t", 0, 0)
    assert gc.is_tracked(loose)


# ------------------------------------------------------------------ the columnar form


def column_rows(cols: batch_rows.RecordColumns) -> list[Row]:
    """The rows the columns hold, read cell by cell through the column types."""
    return [Row("t", 3, cols.offsets[i], cols.timestamps[i], cols.keys[i], cols.values[i],
                cols.headers[i], cols.leader_epochs[i]) for i in range(len(cols.offsets))]


def buffers(cols: batch_rows.RecordColumns) -> list[bytes]:
    out = [bytes(cols.offsets), bytes(cols.timestamps), bytes(cols.leader_epochs)]
    for col in (cols.keys, cols.values, cols.headers.keys, cols.headers.values):
        out += [bytes(col.offsets), bytes(col.data),
                b"" if col.validity is None else bytes(col.validity), bytes([col.null_count])]
    return [*out, bytes(cols.headers.offsets)]


@settings(max_examples=200, deadline=None)
@given(case=fetched(), skip=st.integers(0, 40), cut=st.integers(0, 30))
def test_columns_hold_the_rows_and_both_kernels_give_the_same_bytes(
        case: tuple[bytes, list[Row]], skip: int, cut: int) -> None:
    data, rows = case
    start = rows[0].offset + skip
    short = data[: max(0, len(data) - cut)] if cut else data
    results = []
    for impl in [_kernel_py] + ([batch_rows._load()[0]] if batch_rows.KERNEL == "c" else []):
        original = batch_rows._impl
        batch_rows._impl = impl
        try:
            for buf in (data, short):
                expected, nxt = batch_rows.decode_rows(buf, Row, "t", 3, start)
                cols, nxt2 = batch_rows.decode_columns(buf, start)
                assert column_rows(cols) == expected and nxt2 == nxt
                assert cols.values.to_pylist() == [r.value for r in expected]
                assert list(cols.keys) == [r.key for r in expected]
                results.append(buffers(cols))
        finally:
            batch_rows._impl = original
    if len(results) == 4:
        assert results[:2] == results[2:]  # C and Python: byte for byte


def _outcome(impl: Any, buf: bytes, start: int, columns: bool) -> tuple[Any, ...]:
    """What one kernel makes of ``buf``: the rows (or columns' rows) and the next offset,
    or the error's text."""
    original = batch_rows._impl
    batch_rows._impl = impl
    try:
        if columns:
            cols, nxt = batch_rows.decode_columns(buf, start, verify_crc=False)
            return ("ok", column_rows(cols), nxt)
        rows, nxt = batch_rows.decode_rows(buf, Row, "t", 3, start, verify_crc=False)
        return ("ok", rows, nxt)
    except CorruptRecordError as exc:
        return ("error", str(exc))
    finally:
        batch_rows._impl = original


@settings(max_examples=300, deadline=None)
@given(case=fetched(), skip=st.integers(0, 40), where=st.integers(61, 400),
       byte=st.integers(0, 255))
def test_a_corrupted_record_gets_one_answer_from_both_kernels_and_both_forms(
        case: tuple[bytes, list[Row]], skip: int, where: int, byte: int) -> None:
    """One byte of a record overwritten (the CRC not checked): rows and columns, C and
    Python, all give the same records or refuse with the same words."""
    data, rows = case
    buf = bytearray(data)
    buf[min(where, len(buf) - 1)] = byte
    start = rows[0].offset + skip
    impls = [_kernel_py] + ([batch_rows._load()[0]] if batch_rows.KERNEL == "c" else [])
    outcomes = {(i, columns): _outcome(impl, bytes(buf), start, columns)
                for i, impl in enumerate(impls) for columns in (False, True)}
    assert len(set(map(repr, outcomes.values()))) == 1, outcomes


def test_a_skipped_record_is_checked_for_shape_but_not_for_utf_8(kernel: str) -> None:
    """A record before the fetch offset is walked (its lengths must hold) but its header
    keys are never decoded, so a key that is not UTF-8 there refuses nothing."""
    b = BatchBuilder()
    b.append(T, b"key", b"value", [("h", b"x")])
    b.append(T, b"key", b"next", [("h", b"y")])
    data = bytearray(b.build())
    data[77] = 0xFF  # the first record's header key
    rows, nxt = batch_rows.decode_rows(bytes(data), Row, "t", 0, 1, verify_crc=False)
    assert [r.value for r in rows] == [b"next"] and nxt == 2
    cols, _ = batch_rows.decode_columns(bytes(data), 1, verify_crc=False)
    assert cols.values.to_pylist() == [b"next"]
    with pytest.raises(CorruptRecordError, match="header key is not valid UTF-8"):
        batch_rows.decode_rows(bytes(data), Row, "t", 0, 0, verify_crc=False)


def test_columns_of_log_append_time_control_and_refused_batches(kernel: str) -> None:
    one = BatchBuilder()
    one.append(T, None, b"a")
    two = BatchBuilder()
    two.append(T, b"k", b"b", [("h", None)])
    marker = encode_end_txn_marker(commit=False, producer_id=1, producer_epoch=0,
                                   coordinator_epoch=0, timestamp=T, base_offset=2)
    data = at(0, one.build()) + at(1, two.build(partition_leader_epoch=3)) + marker
    cols, nxt = batch_rows.decode_columns(data, 0, keep=lambda b: b.base_offset != 0)
    assert column_rows(cols) == [Row("t", 3, 1, T, b"k", b"b", (("h", None),), 3)]
    assert nxt == 3 and cols.keys.validity is None and cols.headers.values.null_count == 1
    empty, nxt = batch_rows.decode_columns(b"", 7)
    assert len(empty.offsets) == 0 and len(empty.values) == 0 and nxt == 7


@pytest.mark.parametrize(("where", "value", "message"), [
    (61, b"\x7f", "bad record length"),
    (65, b"\x7f", "bad key length"),
    (69, b"\x7f", "bad value length"),
    (75, b"\x7f", "bad header count"),
    (76, b"\x7f", "bad header key length"),
    (77, b"\xff", "header key is not valid UTF-8"),
    (78, b"\x7f", "bad header value length"),
])
def test_malformed_records_are_refused_alike_as_columns(kernel: str, where: int, value: bytes,
                                                       message: str) -> None:
    bad = corrupted(where, value)
    with pytest.raises(CorruptRecordError, match=message) as rows_error:
        batch_rows.decode_rows(bad, Row, "t", 0, 0, verify_crc=False)
    with pytest.raises(CorruptRecordError, match=message) as columns_error:
        batch_rows.decode_columns(bad, 0, verify_crc=False)
    assert str(columns_error.value) == str(rows_error.value)


def test_columns_refuse_a_bad_crc_and_a_record_count_beyond_the_records(kernel: str) -> None:
    data = bytearray(corrupted(0, b""))
    data[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        batch_rows.decode_columns(bytes(data), 0)
    data = bytearray(corrupted(0, b""))
    struct.pack_into(">i", data, 57, 1_000_000_000)  # a hostile count: no huge reservation
    with pytest.raises(CorruptRecordError, match="fewer records than its count"):
        batch_rows.decode_columns(bytes(data), 0, verify_crc=False)


def test_binary_list_reads_nulls_and_refuses_bad_offsets() -> None:
    from array import array

    from pipeline.protocol.columnar import BinaryColumn

    impls = [_kernel_py] + ([batch_rows._load()[0]] if batch_rows.KERNEL == "c" else [])
    good = BinaryColumn(memoryview(array("q", [0, 2, 2, 5])), memoryview(b"abcde"),
                        memoryview(bytes([0b101])), 0, 1)
    bad = BinaryColumn(memoryview(array("q", [0, 9])), memoryview(b"abc"))
    for impl in impls:
        assert impl.binary_list(good.spec()) == [b"ab", None, b"cde"]
        with pytest.raises(ValueError, match="binary: row 0: offsets"):
            impl.binary_list(bad.spec())


def test_the_kernels_check_the_lengths_in_use_they_are_given() -> None:
    """``lens`` says how much of each buffer is in use (the C kernel keeps reserved room
    past it); a length outside its buffer, or the wrong number of them, is refused."""
    from array import array

    region = corrupted(0, b"")
    for impl in [_kernel_py] + ([batch_rows._load()[0]] if batch_rows.KERNEL == "c" else []):
        out = [bytearray(8) for _ in range(15)]
        with pytest.raises(ValueError, match="lens: a length outside its buffer"):
            impl.decode_columns(region, 61, len(region), 1, 0, 0, T, -1, 0, out,
                                array("q", [9] * 15))
        with pytest.raises(ValueError, match="lens must hold 15 int64"):
            impl.decode_columns(region, 61, len(region), 1, 0, 0, T, -1, 0, out,
                                array("q", [0] * 14))
        # room past the length in use is overwritten, never read: the same bytes
        out = [bytearray(b"\xee" * 64) for _ in range(15)]
        lens = array("q", [8 if i in (3, 6, 9, 10, 12) else 0 for i in range(15)])
        for i in (3, 6, 9, 10, 12):
            out[i][:8] = bytes(8)
        impl.decode_columns(region, 61, len(region), 1, 0, 0, T, -1, 0, out, lens)
        got = [bytes(b[:n]) for b, n in zip(out, lens, strict=True)]
        assert got[0] == struct.pack("=q", 0) and got[4] == b"key" and got[7] == b"value"
        assert got[11] == b"h" and got[13] == b"x" and got[5] == got[8] == b"\x01"
