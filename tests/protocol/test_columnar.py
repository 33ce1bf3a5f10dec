"""pipeline.protocol.columnar: columnar RecordBatch encoding, byte-identical to BatchBuilder.

Every test runs against both kernels (the C extension and its pure-Python twin,
through the ``kernel`` fixture), so each proves the kernel it runs on: the bytes
are compared with ``BatchBuilder`` fed the same records one by one.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.protocol import _kernel_py, columnar
from pipeline.protocol.columnar import build_columns, cut_batches, encode_batch
from pipeline.protocol.compression import Compression
from pipeline.protocol.records import (
    BATCH_HEADER_SIZE,
    BatchBuilder,
    batch_size_for_record,
    decode_record_batches,
)
from tests.protocol.columnar_support import as_arrow, expected_rows

pa = pytest.importorskip("pyarrow")

Headers = tuple[tuple[str, bytes | None], ...]
Row = tuple[int | None, bytes | str | None, bytes | str | None, Any]
BASE = 1_700_000_000_000
CHECK = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass
class _Rec:  # what BatchBuilder.extend reads
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers


def _builder_bytes(records: list[tuple[int, bytes | None, bytes | None, Headers]],
                   codec: Compression = Compression.NONE, *, extend: bool = False,
                   **producer: Any) -> bytes:
    builder = BatchBuilder(compression=codec)
    if extend:
        builder.extend([_Rec(*r) for r in records])
    else:
        for r in records:
            builder.append(*r)
    return builder.build(**producer)


# --------------------------------------------------------------------------- strategies

text_or_bytes = st.binary(max_size=200) | st.text(max_size=40)
header_value = st.none() | st.binary(max_size=70) | st.text(max_size=10)
header_rows = st.none() | st.lists(st.tuples(st.text(max_size=12), header_value), max_size=4)
timestamps = st.none() | st.integers(BASE - 20_000, BASE + 20_000) | st.integers(0, 1 << 62)
row_st = st.tuples(
    timestamps,
    st.none() | text_or_bytes,
    st.none() | text_or_bytes | st.integers(16_370, 16_400).map(lambda n: b"L" * n),
    header_rows,
)


@st.composite
def table_st(draw: st.DrawFn) -> tuple[list[Row], list[int], int]:
    rows = draw(st.lists(row_st, min_size=1, max_size=12))
    # a selection: any rows, in any order, repeats allowed (a batch's offset order)
    picks = draw(st.lists(st.integers(0, len(rows) - 1), min_size=1, max_size=16))
    return rows, picks, draw(st.integers(0, BASE))


def _columns(rows: list[Row], default_ts: int, arrow: bool, offset: int = 0) -> Any:
    ts, keys, values, headers = (list(c) for c in zip(*rows, strict=True))
    if arrow:
        return build_columns(*as_arrow(values, keys, headers, ts, offset),
                             default_timestamp=default_ts)
    return build_columns(values, keys, headers, ts, default_timestamp=default_ts)


# --------------------------------------------------------------------------- byte identity


@pytest.mark.parametrize("arrow", [False, True], ids=["lists", "arrow"])
def test_encode_batch_is_byte_identical_to_batch_builder(kernel: str, arrow: bool) -> None:
    @CHECK
    @given(table_st(), st.integers(0, 9), st.integers(-1, 1 << 40), st.integers(-1, 300),
           st.integers(-1, 1 << 20), st.booleans())
    def check(table: tuple[list[Row], list[int], int], offset: int, pid: int, epoch: int,
              seq: int, txn: bool) -> None:
        rows, picks, default_ts = table
        cols = _columns(rows, default_ts, arrow, offset)
        records = expected_rows(rows, default_ts)
        chosen = [records[i] for i in picks]
        producer = {"producer_id": pid, "producer_epoch": epoch, "base_sequence": seq,
                    "is_transactional": txn}
        wire = encode_batch(cols, picks, **producer)
        assert wire == _builder_bytes(chosen, **producer)
        assert wire == _builder_bytes(chosen, extend=True, **producer)
        # the contiguous forms: all rows (None) and a range
        assert encode_batch(cols) == _builder_bytes(records)
        assert encode_batch(cols, range(1, len(rows))) == _builder_bytes(records[1:]) \
            if len(rows) > 1 else True

    check()


@pytest.mark.parametrize("codec", [c for c in Compression if c], ids=lambda c: c.name.lower())
def test_every_codec_is_byte_identical(kernel: str, codec: Compression) -> None:
    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(table_st())
    def check(table: tuple[list[Row], list[int], int]) -> None:
        rows, picks, default_ts = table
        cols = _columns(rows, default_ts, arrow=False)
        chosen = [expected_rows(rows, default_ts)[i] for i in picks]
        wire = encode_batch(cols, picks, compression=codec)
        assert wire == _builder_bytes(chosen, codec)
        (batch,) = decode_record_batches(wire)
        assert batch.compression is codec
        assert [r.value for r in batch.records] == [r[2] for r in chosen]

    check()


def test_compression_level_and_producer_fields_reach_the_header(kernel: str) -> None:
    cols = build_columns([b"x" * 500] * 20, default_timestamp=BASE)
    fast = encode_batch(cols, compression=Compression.ZSTD, compression_level=1)
    slow = encode_batch(cols, compression=Compression.ZSTD, compression_level=19)
    assert fast != slow
    assert decode_record_batches(fast)[0].records == decode_record_batches(slow)[0].records
    wire = encode_batch(cols, range(3, 5), producer_id=77, producer_epoch=3, base_sequence=9,
                        is_transactional=True, partition_leader_epoch=4)
    (batch,) = decode_record_batches(wire)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (77, 3, 9)
    assert batch.is_transactional and batch.partition_leader_epoch == 4
    assert batch.last_offset_delta == 1 and len(batch.records) == 2
    with pytest.raises(ValueError, match="snappy does not support compression levels"):
        encode_batch(cols, compression=Compression.SNAPPY, compression_level=3)


def test_row_selection_forms_agree(kernel: str) -> None:
    from array import array

    cols = build_columns([b"v%d" % i for i in range(10)], default_timestamp=BASE)
    want = encode_batch(cols, [7, 2, 2, 9])
    assert encode_batch(cols, array("q", [7, 2, 2, 9])) == want
    assert encode_batch(cols, memoryview(array("q", [7, 2, 2, 9]))) == want
    assert encode_batch(cols, (7, 2, 2, 9)) == want
    assert encode_batch(cols, range(8, 0, -3)) == encode_batch(cols, [8, 5, 2])
    with pytest.raises(ValueError, match="empty record batch"):
        encode_batch(cols, [])
    with pytest.raises(ValueError, match="row index 10 is outside the columns"):
        encode_batch(cols, [1, 10])
    with pytest.raises(ValueError, match="row index -1 is outside the columns"):
        encode_batch(cols, [-1])
    with pytest.raises(ValueError, match="row index 10 is outside"):
        encode_batch(cols, range(5, 11))
    with pytest.raises(TypeError, match="rows must be"):
        encode_batch(cols, ["a"])  # type: ignore[list-item]


# --------------------------------------------------------------------------- sizes and cuts


def test_size_bounds_are_batch_size_for_record(kernel: str) -> None:
    @CHECK
    @given(st.lists(row_st, min_size=0, max_size=12), st.integers(0, BASE))
    def check(rows: list[Row], default_ts: int) -> None:
        if not rows:
            cols = build_columns([], default_timestamp=default_ts)
            assert list(columnar.record_size_bounds(cols)) == []
            return
        cols = _columns(rows, default_ts, arrow=False)
        bounds = columnar.record_size_bounds(cols)
        records = expected_rows(rows, default_ts)
        assert list(bounds) == [batch_size_for_record(k, v, h) for _, k, v, h in records]
        limit = sorted(bounds)[len(bounds) // 2]
        over = [i for i, b in enumerate(bounds) if b > limit]
        assert columnar.first_row_over(bounds, limit) == (over[0] if over else -1)
        for i, (ts, k, v, h) in enumerate(records):  # a bound, also at any position
            builder = BatchBuilder()
            builder.append(BASE, b"", b"")
            assert builder.append(ts, k, v, h) <= bounds[i] - BATCH_HEADER_SIZE

    check()


def test_cut_batches_is_exact_greedy_and_covers_the_selection(kernel: str) -> None:
    @CHECK
    @given(table_st(), st.integers(BATCH_HEADER_SIZE, 3000), st.integers(1, 5))
    def check(table: tuple[list[Row], list[int], int], max_bytes: int,
              max_records: int) -> None:
        rows, picks, default_ts = table
        cols = _columns(rows, default_ts, arrow=False)
        cuts = cut_batches(cols, picks, max_bytes=max_bytes, max_records=max_records)
        assert cuts[0][0] == 0 and cuts[-1][1] == len(picks)
        for (_, stop, _), (start, _, _) in itertools.pairwise(cuts):
            assert stop == start
        for start, stop, nbytes in cuts:
            wire = encode_batch(cols, picks[start:stop])
            assert len(wire) == nbytes  # the exact encoded size
            assert stop - start <= max_records
            assert nbytes <= max_bytes or stop - start == 1  # an oversized row goes alone
            if stop < len(picks) and stop - start < max_records:  # greedy: the next row
                assert len(encode_batch(cols, picks[start:stop + 1])) > max_bytes

    check()


def test_cut_batches_edges(kernel: str) -> None:
    cols = build_columns([b"x" * 100] * 10, default_timestamp=BASE)
    assert cut_batches(cols, [], max_bytes=1000) == []
    assert [c[:2] for c in cut_batches(cols, max_bytes=1 << 20, max_records=4)] == [
        (0, 4), (4, 8), (8, 10)]
    assert [c[:2] for c in cut_batches(cols, max_bytes=1)] == [(i, i + 1) for i in range(10)]
    with pytest.raises(ValueError, match="max_records must be >= 1"):
        cut_batches(cols, max_bytes=100, max_records=0)
    exact = len(encode_batch(cols, range(3)))  # a batch of exactly max_bytes is allowed
    assert cut_batches(cols, max_bytes=exact)[0] == (0, 3, exact)
    assert cut_batches(cols, max_bytes=exact - 1)[0][:2] == (0, 2)


# --------------------------------------------------------------------------- inputs


def test_arrow_inputs_are_borrowed_not_copied(kernel: str) -> None:
    values = pa.array([b"a" * 10, None, b"c"] * 3, pa.binary()).slice(2)
    keys = pa.array(["k"] * 9, pa.large_string()).slice(2)
    cols = build_columns(values, keys, default_timestamp=BASE)
    assert values.buffers()[2].address == _address(cols.values.data)
    assert values.buffers()[1].address + 2 * 4 == _address(cols.values.offsets)
    assert keys.buffers()[2].address == _address(cols.keys.data)  # type: ignore[union-attr]
    assert cols.values.validity_offset == 2 and cols.values.null_count == values.null_count
    assert [cols.values[i] for i in range(len(cols))] == values.to_pylist()


def _address(view: memoryview) -> int:
    address: int = pa.py_buffer(view).address  # wraps the view's memory, no copy
    return address


@pytest.mark.parametrize("form", ["chunked", "fixed", "view", "dict", "null", "map", "numpy",
                                  "numpy2d", "c_array", "timestamp_us"])
def test_other_input_forms_give_the_same_bytes(kernel: str, form: str) -> None:
    np = pytest.importorskip("numpy")
    values = [b"ab", b"cd", b"ef", b"gh"]
    headers = [[("h", b"1")], [], [("h", None), ("i", b"2")], None]
    ts = [BASE, BASE + 1, BASE - 7, BASE + 20_000]
    want = encode_batch(build_columns(values, None, headers, ts))
    v: Any = values
    h: Any = headers
    t: Any = ts
    if form == "chunked":
        v = pa.chunked_array([values[:1], values[1:]], pa.binary())
    elif form == "fixed":
        v = pa.array(values, pa.binary(2))
    elif form == "view":
        v = pa.array(values, pa.binary_view())
    elif form == "dict":
        v = pa.array(values, pa.binary()).dictionary_encode()
    elif form == "map":
        h = pa.array([[(k, x) for k, x in r or ()] for r in headers],
                     pa.map_(pa.string(), pa.binary()))
    elif form == "numpy":
        v = np.array(values, dtype=object)
        t = np.array(ts, dtype=np.int64)
    elif form == "numpy2d":
        v = np.frombuffer(b"".join(values), np.uint8).reshape(4, 2)
    elif form == "c_array":
        class Exported:  # another library speaking the Arrow C data interface
            def __arrow_c_array__(self, requested_schema: Any = None) -> Any:
                return pa.array(values, pa.binary()).__arrow_c_array__(requested_schema)
        v = Exported()
    elif form == "timestamp_us":
        t = pa.array([x * 1000 + 999 for x in ts], pa.timestamp("us"))
    elif form == "null":
        got = build_columns(values, pa.nulls(4), headers, ts)
        assert got.keys is None  # all-null keys: the same bytes as no key column
        assert encode_batch(got) == want
        return
    assert encode_batch(build_columns(v, None, h, t)) == want


def test_str_and_buffer_items_are_sent_as_bytes(kernel: str) -> None:
    from array import array

    cols = build_columns(["é", bytearray(b"ba"), memoryview(b"mv"), array("h", [1]), None],
                         default_timestamp=BASE)
    assert [cols.values[i] for i in range(5)] == [
        "é".encode(), b"ba", b"mv", array("h", [1]).tobytes(), None]


def test_timestamps_and_partitions(kernel: str) -> None:
    cols = build_columns([b"a", b"b", b"c"], timestamps=[5, None, 7],
                         partitions=[None, 2, 0], default_timestamp=100)
    assert [cols.row(i)[0] for i in range(3)] == [5, 100, 7]
    assert [cols.row(i)[4] for i in range(3)] == [None, 2, 0]
    arrow = build_columns(pa.array([b"a", b"b", b"c"]),
                          timestamps=pa.array([5, None, 7], pa.int32()),
                          partitions=pa.array([None, 2, 0], pa.int64()), default_timestamp=100)
    assert list(arrow.timestamps or ()) == [5, 100, 7]
    assert list(arrow.partitions or ()) == [-1, 2, 0]
    assert build_columns([b"a"], default_timestamp=3).timestamps is None


# --------------------------------------------------------------------------- bad input


BAD_INPUTS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"values": b"abc"}, TypeError, "values must be a column"),
    ({"values": None}, TypeError, "values must be a column"),
    ({"values": iter([b"a"])}, TypeError, "materialize iterators"),
    ({"values": [b"a", 3]}, TypeError, r"values: row 1: expected bytes.*not int"),
    ({"values": [b"a"], "keys": [b"k", b"l"]}, ValueError, "keys: 2 rows, but values has 1"),
    ({"values": [b"a", b"b"], "keys": [None, {}]}, TypeError, r"keys: row 1: .*not dict"),
    ({"values": ["\ud800"]}, ValueError, "values: row 0: str is not encodable as UTF-8"),
    ({"values": [b"a"], "partitions": [-1]}, ValueError,
     r"partitions: row 0: -1 is out of range 0\.\.2147483647"),
    ({"values": [b"a", b"b"], "partitions": [0, 1 << 31]}, ValueError, "partitions: row 1"),
    ({"values": [b"a", b"b"], "partitions": [0, "1"]}, TypeError,
     "partitions: row 1: expected an int or None, not str"),
    ({"values": [b"a", b"b"], "timestamps": [1, -5]}, ValueError, "timestamps: row 1: -5"),
    ({"values": [b"a"], "timestamps": [1.5]}, TypeError, "timestamps: row 0: expected an int"),
    ({"values": [b"a", b"b"], "timestamps": [1, None], "default_timestamp": None},
     ValueError, "timestamps: row 1 is null and no default_timestamp"),
    ({"values": [b"a"], "default_timestamp": None}, ValueError, "pass default_timestamp"),
    ({"values": [b"a"], "default_timestamp": -1}, ValueError, "default_timestamp must be"),
    ({"values": [b"a"], "timestamps": [1, 2]}, ValueError, "timestamps: 2 rows, but values"),
    ({"values": [b"a", b"b"], "headers": [None, [("k", 5)]]}, TypeError,
     "headers: row 1: header 'k' value must be bytes"),
    ({"values": [b"a", b"b"], "headers": [None, [(b"k", b"v")]]}, TypeError,
     "headers: row 1: header key must be str, not bytes"),
    ({"values": [b"a", b"b"], "headers": [None, ["kv"]]}, TypeError,
     "headers: row 1: expected .* pairs"),
    ({"values": [b"a"], "headers": [b"k=v"]}, TypeError, "headers: row 0: expected a sequence"),
    ({"values": [b"a"], "headers": {"k": b"v"}}, TypeError, "headers must be a column"),
    ({"values": [b"a"], "headers": [None, None]}, ValueError, "headers: 2 rows, but values"),
]


@pytest.mark.parametrize(("kwargs", "exc", "match"), BAD_INPUTS,
                         ids=[m for _, _, m in BAD_INPUTS])
def test_bad_input_names_the_column_and_row(kernel: str, kwargs: dict[str, Any],
                                            exc: type[Exception], match: str) -> None:
    kwargs = {"default_timestamp": BASE, **kwargs}
    with pytest.raises(exc, match=match):
        build_columns(**kwargs)


ARROW_BAD: list[tuple[Any, type[Exception], str]] = [
    ({"values": pa.array([1, 2])}, TypeError, r"values: Arrow type int64 is not binary"),
    ({"values": pa.array([b"a", b"b"]), "partitions": pa.array([0, -3], pa.int8())},
     ValueError, "partitions: row 1: -3 is out of range"),
    ({"values": pa.array([b"a", b"b"]), "timestamps": pa.array([1, None])}, ValueError,
     "timestamps: row 1 is null"),
    ({"values": pa.array([b"a"]), "timestamps": pa.array([1 << 60], pa.timestamp("s"))},
     ValueError, r"timestamps: .*overflow.* converting timestamp\[s\] to milliseconds"),
    ({"values": pa.array([b"a"]), "timestamps": pa.array([1.0])}, TypeError,
     "timestamps: Arrow type double is not an integer type"),
    ({"values": pa.array([b"a"]), "headers": pa.array([[1]])}, TypeError,
     r"headers: Arrow type list<item: int64> is not list<struct"),
    ({"values": pa.array([b"a", b"b"]),
      "headers": pa.array([[], [None]], pa.list_(pa.struct([("key", pa.string()),
                                                             ("value", pa.binary())])))},
     ValueError, "headers: row 1: a header is null"),
    ({"values": pa.array([b"a", b"b"]),
      "headers": pa.array([[], [{"key": None, "value": b"v"}]],
                          pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))},
     ValueError, "headers: row 1: a header key is null"),
    ({"values": pa.array([b"a"]),
      "headers": pa.array([[{"key": b"k", "value": b"v"}]],
                          pa.list_(pa.struct([("key", pa.binary()), ("value", pa.binary())])))},
     TypeError, "header keys must be Arrow string"),
]


@pytest.mark.parametrize(("kwargs", "exc", "match"), ARROW_BAD, ids=[m for _, _, m in ARROW_BAD])
def test_bad_arrow_input_names_the_column_and_row(kernel: str, kwargs: dict[str, Any],
                                                  exc: type[Exception], match: str) -> None:
    kwargs = {"default_timestamp": None if "timestamps" in kwargs else BASE, **kwargs}
    with pytest.raises(exc, match=match):
        build_columns(**kwargs)


# --------------------------------------------------------------------------- kernel selection


def test_the_c_kernel_is_built_where_a_compiler_is() -> None:
    """`make venv` builds the extension; only a machine without a compiler may
    fall back (the install then succeeds without it: test_build.py)."""
    import shutil
    import sysconfig

    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): the Python kernel is expected")
    assert columnar.KERNEL == "c"
    assert columnar.kernel() is not _kernel_py


def test_env_var_forces_the_python_kernel() -> None:
    probe = "from pipeline.protocol import columnar; print(columnar.KERNEL)"
    env = {**os.environ, "PIPELINE_PURE_PYTHON": "1"}
    env_out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             check=True, env=env, timeout=60)
    assert env_out.stdout.strip() == "python"


def test_lists_need_neither_pyarrow_nor_numpy() -> None:
    """The core package works without pyarrow/numpy installed (both imported lazily)."""
    probe = (
        "import sys\n"
        "sys.modules['pyarrow'] = None; sys.modules['numpy'] = None  # imports now fail\n"
        "from pipeline.protocol.columnar import build_columns, encode_batch\n"
        "from pipeline.producer._columnar.partitioning import key_partitions\n"
        "cols = build_columns([b'v', None], [b'k', None], [[('h', b'1')], None], [1, None],"
        " [None, 0], default_timestamp=5)\n"
        "assert len(encode_batch(cols)) > 61 and list(key_partitions(cols, 3))[1] == 0\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
