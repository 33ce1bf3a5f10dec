"""The columnar kernels under odd and hostile inputs: no crash, and C == Python.

* odd but legal rows (0 rows, empty and null values, null keys, values over
  2 MB, thousands of headers) encode to BatchBuilder's bytes on both kernels;
* raw column specs with random offsets, bitmaps and row indices (what a broken
  or malicious Arrow producer could hand over) make both kernels return the
  same result or raise the same ValueError; the C kernel never reads or writes
  out of bounds (a crash would take the test process down).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.protocol import _columns, _kernel_py, columnar
from pipeline.protocol.columnar import build_columns, cut_batches, encode_batch
from pipeline.protocol.compression import Compression
from pipeline.protocol.records import BatchBuilder, batch_size_for_record, decode_record_batches

BASE = 1_700_000_000_000
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _builder(records: list[tuple[int, bytes | None, bytes | None, Any]],
             codec: Compression = Compression.NONE) -> bytes:
    b = BatchBuilder(compression=codec)
    for r in records:
        b.append(*r)
    return b.build()


# --------------------------------------------------------------------------- odd rows


def test_zero_rows(kernel: str) -> None:
    cols = build_columns([], [], [], [], [], default_timestamp=BASE)
    assert len(cols) == 0
    assert list(columnar.record_size_bounds(cols)) == []
    assert cut_batches(cols, max_bytes=100) == []
    with pytest.raises(ValueError, match="empty record batch"):
        encode_batch(cols)


def test_empty_and_null_values_and_keys(kernel: str) -> None:
    values = [b"", None, b"", None]
    keys = [None, None, b"", b""]
    cols = build_columns(values, keys, default_timestamp=BASE)
    records = [(BASE, k, v, ()) for k, v in zip(keys, values, strict=True)]
    assert encode_batch(cols) == _builder(records)
    (batch,) = decode_record_batches(encode_batch(cols))
    assert [(r.key, r.value) for r in batch.records] == list(zip(keys, values, strict=True))


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.name.lower())
def test_values_over_2_mb(kernel: str, codec: Compression) -> None:
    big = bytes(range(256)) * (9 * 1024 + 7)  # 2.36 MB
    cols = build_columns([b"a", big, b"b"], [None, b"k" * 70_000, b"x"],
                         [None, [("h", big[:300_000])], None], default_timestamp=BASE)
    records = [(BASE, None, b"a", ()), (BASE, b"k" * 70_000, big, (("h", big[:300_000]),)),
               (BASE, b"x", b"b", ())]
    assert encode_batch(cols, compression=codec) == _builder(records, codec)
    cuts = cut_batches(cols, max_bytes=1 << 20)
    assert [c[:2] for c in cuts] == [(0, 1), (1, 2), (2, 3)]  # the big row goes alone
    assert columnar.record_size_bounds(cols)[1] == batch_size_for_record(*records[1][1:])


def test_thousands_of_headers(kernel: str) -> None:
    many = tuple((f"h{i}", None if i % 3 == 0 else b"v" * (i % 200)) for i in range(9000))
    few = (("", b""), ("ключ", None))
    cols = build_columns([b"v", None, b"w"], None, [list(many), list(few), many[:64]],
                         default_timestamp=BASE)
    records = [(BASE, None, b"v", many), (BASE, None, None, few), (BASE, None, b"w", many[:64])]
    wire = encode_batch(cols)
    assert wire == _builder(records)
    (batch,) = decode_record_batches(wire)
    assert [r.headers for r in batch.records] == [many, few, many[:64]]


# --------------------------------------------------------------------------- hostile specs


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except (ValueError, TypeError) as exc:
        return type(exc).__name__, str(exc)


def _i32(values: list[int]) -> bytes:
    from array import array

    return array("i", values).tobytes()


@st.composite
def binary_spec(draw: st.DrawFn, n: int) -> tuple[Any, ...]:
    data = draw(st.binary(max_size=40))
    # mostly sane offsets, sometimes anything (descending, negative, past the data)
    sane = sorted(draw(st.lists(st.integers(0, len(data)), min_size=n + 1, max_size=n + 1)))
    wild = draw(st.lists(st.integers(-5, 60), min_size=n + 1, max_size=n + 1))
    short = sane[:draw(st.integers(0, n))]
    # mostly well-formed, so that the deep paths (cells, headers) are reached too
    offsets = draw(st.sampled_from([sane] * 6 + [wild] * 3 + [short]))
    voff = draw(st.integers(0, 9))
    need = (voff + n + 7) // 8
    kind = draw(st.sampled_from(["none"] * 3 + ["ones"] * 3 + ["random"] * 3 + ["short"]))
    validity = {
        "none": None,
        "ones": b"\xff" * need,
        "random": draw(st.binary(min_size=need, max_size=need + 1)),
        "short": draw(st.binary(max_size=max(need - 1, 0))),
    }[kind]
    return (_i32(offsets), False, data, validity, voff, n)


@st.composite
def columns_spec(draw: st.DrawFn) -> tuple[Any, ...]:
    n = draw(st.integers(0, 6))
    values = draw(binary_spec(n))
    keys = draw(st.none() | binary_spec(n))
    headers = None
    if draw(st.booleans()):
        m = draw(st.integers(0, 6))
        sane = sorted(draw(st.lists(st.integers(0, m), min_size=n + 1, max_size=n + 1)))
        wild = draw(st.lists(st.integers(-1, m + 1), min_size=n + 1, max_size=n + 1))
        hoff = draw(st.sampled_from([sane, sane, wild]))
        hkeys = draw(binary_spec(m))
        hvalues = draw(binary_spec(m))
        hvalid = draw(st.sampled_from([None, None, b"\xff", b"\x55", b""]))
        headers = (_i32(hoff), False, hvalid, 0, n, hkeys, hvalues)
    ts = draw(st.none() | st.lists(st.integers(0, 1 << 62), min_size=n, max_size=n))
    from array import array

    return (n, values, keys, headers, None if ts is None else array("q", ts).tobytes(),
            draw(st.integers(0, 1 << 62)))


@FUZZ
@given(columns_spec(), st.lists(st.integers(-2, 8), max_size=8), st.integers(1, 300),
       st.integers(1, 4))
def test_hostile_specs_never_crash_and_both_kernels_agree(
    spec: tuple[Any, ...], rows: list[int], max_bytes: int, max_records: int
) -> None:
    if columnar.KERNEL != "c":
        pytest.skip("the C kernel is not built in this environment")
    from array import array

    c = _columns._impl
    sel = array("q", rows).tobytes()
    for call in (
        lambda k: k.encode_records(spec, sel, 0, len(rows)),
        lambda k: k.encode_records(spec, None, 0, spec[0]),
        lambda k: k.cut_batches(spec, sel, 0, len(rows), max_bytes, max_records),
        lambda k: (lambda out: (k.size_bounds(spec, out), bytes(out)))(bytearray(8 * spec[0])),
    ):
        assert _outcome(lambda: call(c)) == _outcome(lambda: call(_kernel_py))  # noqa: B023


def test_malformed_arguments_raise_instead_of_crashing() -> None:
    if columnar.KERNEL != "c":
        pytest.skip("the C kernel is not built in this environment")
    c: Any = _columns._impl
    good = build_columns([b"a"], default_timestamp=0).spec
    for args in [(None, None, 0, 1), ((1, 2), None, 0, 1), (good, b"\x00", 0, 1),
                 (good, None, -1, 1), (good, None, 1, 0), (good, "rows", 0, 1)]:
        with pytest.raises((TypeError, ValueError)):
            c.encode_records(*args)
    with pytest.raises(TypeError, match="writable"):
        c.size_bounds(good, b"\x00" * 8)
    with pytest.raises(ValueError, match="fewer than n int64s"):
        c.size_bounds(good, bytearray(4))
    with pytest.raises(TypeError):
        c.pack_binary(5, "values")


_INT_ITEMS = st.one_of(
    st.integers(-3, 3), st.integers(0, (1 << 63) + 5), st.sampled_from(
        [(1 << 31) - 1, 1 << 31, (1 << 63) - 1, 1 << 63, 1_700_000_000_000]),
    st.sampled_from([None, True, False, 1.0, "1", b"1"]),
)


@FUZZ
@given(st.lists(_INT_ITEMS, max_size=40), st.booleans(), st.booleans(), st.integers(0, 5))
def test_pack_ints_both_kernels_agree_and_match_array(
    items: list[Any], wide: bool, as_tuple: bool, repeat: int
) -> None:
    """``pack_ints``: C and its twin give the same bytes, or both None; the bytes
    are ``array(code, items)``'s exactly when every item is an exact int in
    range (0..INT64_MAX wide, 0..INT32_MAX narrow), and None otherwise (bools and
    int subclasses included: the caller's slow path names such a row). Items
    repeated one after the other (a burst's timestamps share their millisecond's
    int) take the C loop's pointer-equal path."""
    from array import array

    seq_list = [v for v in items for _ in range(1 + repeat)]
    seq: Any = tuple(seq_list) if as_tuple else seq_list
    top = (1 << 63) - 1 if wide else (1 << 31) - 1
    ok = all(type(v) is int and 0 <= v <= top for v in seq_list)
    want = array("q" if wide else "i", seq_list).tobytes() if ok else None
    assert _kernel_py.pack_ints(seq, wide) == want
    if columnar.KERNEL == "c":
        assert _columns._impl.pack_ints(seq, wide) == want


def test_pack_ints_refuses_what_is_no_list_or_tuple() -> None:
    kernels: list[Any] = [_kernel_py] + ([_columns._impl] if columnar.KERNEL == "c" else [])
    for k in kernels:
        with pytest.raises(TypeError, match="list or tuple"):
            k.pack_ints(iter([1]), True)
        assert k.pack_ints([], True) == b""
        assert k.pack_ints([5, 5, -1], False) is None  # (the repeat, then a bad one)
