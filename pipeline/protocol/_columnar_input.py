"""Turning what users pass to a bulk send into ``columnar.Columns``.

Accepted per column:

* binary columns (``values``, ``keys``): an Arrow array or chunked array of
  binary / string / large_binary / large_string / fixed_size_binary (borrowed
  zero-copy: its offsets, data and validity buffers), or of binary_view /
  string_view / dictionary / null type (converted); anything exposing the
  Arrow C data interface (``__arrow_c_array__``, e.g. polars); a list or
  tuple of ``bytes | bytearray | memoryview | str | None`` (str sent as
  UTF-8; packed once into one buffer); a numpy array of objects, ``S`` or
  ``U`` strings (numpy's own item semantics: ``S`` drops trailing NULs), or a
  2-D uint8 array, one fixed-width value per row (borrowed).
* ``headers``: Arrow ``list<struct<key: string, value: binary>>`` (Spark's
  Kafka sink; large_list and ``map<string, binary>`` too); or per row
  ``None``, a mapping, or a sequence of ``(str, bytes | str | None)`` pairs.
* ``timestamps`` (ms since the epoch, >= 0; null = ``default_timestamp``) and
  ``partitions`` (>= 0; null = the partitioner decides): Arrow integer arrays
  (timestamps also ``timestamp[s|ms|us|ns]``, truncated to ms), numpy integer
  arrays, ``array.array``, or lists of ``int | None``.

pyarrow and numpy are imported only when such an object is passed: lists
work without either installed.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any, cast

from pipeline.protocol._columns import (
    BinaryColumn,
    ColumnInput,
    Columns,
    HeaderColumn,
    HeadersInput,
    IntsInput,
    kernel,
)

__all__ = ["normalize"]

_INT64_MAX = (1 << 63) - 1
_INT32_MAX = (1 << 31) - 1
_NOT_A_COLUMN = (str, bytes, bytearray, memoryview)


def normalize(values: ColumnInput, keys: ColumnInput | None, headers: HeadersInput | None,
              timestamps: IntsInput | None, partitions: IntsInput | None,
              default_timestamp: int | None) -> Columns:
    vcol = _binary(values, "values")
    n = len(vcol)
    kcol = None if keys is None else _binary(keys, "keys")
    if kcol is not None and kcol.null_count == len(kcol):
        kcol = None  # all null: the same bytes as no key column
    _same_length(kcol, "keys", n)
    hcol = None if headers is None else _headers(headers, n)
    if default_timestamp is not None and (
        type(default_timestamp) is not int or not 0 <= default_timestamp <= _INT64_MAX
    ):
        raise ValueError(
            f"default_timestamp must be milliseconds since the epoch (int >= 0), "
            f"not {default_timestamp!r}"
        )
    ts = None
    if timestamps is not None:
        ts = _ints(timestamps, "timestamps", True, default_timestamp)
        _same_length(ts, "timestamps", n)
    elif default_timestamp is None:
        raise ValueError(
            "no timestamps given: pass default_timestamp (the CreateTime in ms for rows "
            "without one) or a timestamps column"
        )
    parts = None
    if partitions is not None:
        parts = _ints(partitions, "partitions", False, -1)
        _same_length(parts, "partitions", n)
    return Columns(vcol, kcol, hcol, ts, parts,
                   default_timestamp if default_timestamp is not None else 0)


def _same_length(col: Any, what: str, n: int) -> None:
    if col is not None and len(col) != n:
        raise ValueError(f"{what}: {len(col)} rows, but values has {n} rows")


def _arrow() -> tuple[Any, Any]:
    """pyarrow and pyarrow.compute, imported on first use (lists need neither)."""
    import pyarrow  # type: ignore[import-untyped]
    import pyarrow.compute  # type: ignore[import-untyped]

    return pyarrow, pyarrow.compute


def _module(obj: object) -> str:
    return type(obj).__module__.split(".")[0]


def _bytes_view(buf: Any) -> memoryview:
    return memoryview(b"") if buf is None else memoryview(buf).cast("B")


# ------------------------------------------------------------------ binary columns


def _binary(obj: Any, what: str) -> BinaryColumn:
    if obj is None or isinstance(obj, _NOT_A_COLUMN):
        raise TypeError(
            f"{what} must be a column (a list, an Arrow array or a numpy array) of values, "
            f"not {type(obj).__name__}: wrap a single value in a list"
        )
    kind = _module(obj)
    if kind == "pyarrow":
        return _arrow_binary(obj, what)
    if kind == "numpy":
        return _numpy_binary(obj, what)
    if kind != "builtins" and (hasattr(obj, "__arrow_c_array__")
                               or hasattr(obj, "__arrow_c_stream__")):
        return _arrow_binary(_import_arrow(obj, what), what)
    if kind == "pandas" and hasattr(obj, "to_numpy"):
        return _numpy_binary(obj.to_numpy(), what)
    if not isinstance(obj, list | tuple):
        if not isinstance(obj, Sequence):
            raise TypeError(
                f"{what} must be a list, tuple, Arrow array or numpy array, not "
                f"{type(obj).__name__} (materialize iterators first)"
            )
        obj = list(obj)
    return _pack(obj, what)


def _pack(seq: Sequence[Any], what: str) -> BinaryColumn:
    offsets, data, validity, nulls = kernel().pack_binary(seq, what)
    return BinaryColumn(memoryview(offsets).cast("q"), memoryview(data),
                        None if validity is None else memoryview(validity), 0, nulls)


def _import_arrow(obj: Any, what: str) -> Any:
    try:
        pa, _ = _arrow()
    except ImportError:
        raise TypeError(f"{what}: {type(obj).__name__} needs pyarrow to be read") from None
    if hasattr(obj, "__arrow_c_array__"):
        return pa.array(obj)
    return pa.chunked_array(obj)


def _arrow_binary(arr: Any, what: str) -> BinaryColumn:
    pa, _ = _arrow()

    arr = _one_chunk(arr, what)
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    if pa.types.is_binary_view(t) or pa.types.is_string_view(t) or pa.types.is_null(t):
        arr = arr.cast(pa.binary())
        t = arr.type
    n = len(arr)
    validity, voff = None, 0
    if arr.null_count:
        validity, voff = _bytes_view(arr.buffers()[0]), arr.offset
    if pa.types.is_fixed_size_binary(t):
        width = t.byte_width
        data = _bytes_view(arr.buffers()[1])[arr.offset * width:(arr.offset + n) * width]
        offsets = memoryview(array("q", range(0, (n + 1) * width, width)))
        return BinaryColumn(offsets, data, validity, voff, arr.null_count)
    if pa.types.is_binary(t) or pa.types.is_string(t):
        w = 4
    elif pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        w = 8
    else:
        raise TypeError(
            f"{what}: Arrow type {t} is not binary or string: cast it first, e.g. "
            f"pyarrow.compute.cast(column, pyarrow.binary())"
        )
    bufs = arr.buffers()
    if bufs[1] is None:  # an empty array may have no offsets buffer
        offsets = memoryview(array("q" if w == 8 else "i", [0]))
    else:
        offsets = _bytes_view(bufs[1])[arr.offset * w:(arr.offset + n + 1) * w]
        offsets = offsets.cast("q" if w == 8 else "i")
    return BinaryColumn(offsets, _bytes_view(bufs[2]), validity, voff, arr.null_count)


def _one_chunk(arr: Any, what: str) -> Any:
    pa, _ = _arrow()

    if isinstance(arr, pa.ChunkedArray):
        if arr.num_chunks == 1:
            return arr.chunk(0)
        return arr.combine_chunks() if arr.num_chunks else pa.array([], arr.type)
    if not isinstance(arr, pa.Array):
        raise TypeError(f"{what}: expected an Arrow array, got {type(arr).__name__}")
    return arr


def _numpy_binary(arr: Any, what: str) -> BinaryColumn:
    import numpy as np

    if arr.ndim == 2 and arr.dtype in (np.uint8, np.int8):
        rows, width = arr.shape
        data = memoryview(cast(Any, np.ascontiguousarray(arr))).cast("B")
        offsets = memoryview(array("q", range(0, (rows + 1) * width, width)))
        return BinaryColumn(offsets, data)
    if arr.ndim == 1 and arr.dtype.kind in "OSU":
        return _pack(arr.tolist(), what)
    raise TypeError(
        f"{what}: a numpy array of dtype {arr.dtype} and {arr.ndim} dimension(s) is not a "
        f"column of values: pass bytes/str objects (dtype object, S or U) or a 2-D uint8 "
        f"array of fixed-width values"
    )


# ------------------------------------------------------------------ headers


def _headers(obj: Any, n: int) -> HeaderColumn | None:
    if isinstance(obj, _NOT_A_COLUMN) or isinstance(obj, Mapping):
        raise TypeError(
            f"headers must be a column (one entry per row), not {type(obj).__name__}"
        )
    kind = _module(obj)
    if kind == "pyarrow" or (kind != "builtins" and hasattr(obj, "__arrow_c_array__")):
        col = _arrow_headers(obj if kind == "pyarrow" else _import_arrow(obj, "headers"))
    else:
        if kind == "numpy" or kind == "pandas":
            obj = obj.tolist()
        if not isinstance(obj, Sequence):
            raise TypeError(f"headers must be a list or an Arrow array, not {type(obj).__name__}")
        col = _list_headers(obj)
    _same_length(col, "headers", n)
    return col if len(col.keys) else None  # no header at all: the same bytes as none


def _list_headers(rows: Sequence[Any]) -> HeaderColumn:
    offsets = array("q", [0])
    keys: list[str] = []
    values: list[Any] = []
    for i, row in enumerate(rows):
        if row:
            if isinstance(row, Mapping):
                row = row.items()
            elif isinstance(row, _NOT_A_COLUMN):
                raise TypeError(
                    f"headers: row {i}: expected a sequence of (str, bytes | None) pairs or a "
                    f"mapping, not {type(row).__name__}"
                )
            for pair in row:
                try:
                    if isinstance(pair, _NOT_A_COLUMN):
                        raise TypeError  # "kv" would unpack into ("k", "v")
                    key, value = pair
                except (TypeError, ValueError):
                    raise TypeError(
                        f"headers: row {i}: expected (str, bytes | None) pairs, got {pair!r}"
                    ) from None
                if type(key) is not str:
                    raise TypeError(
                        f"headers: row {i}: header key must be str, not {type(key).__name__}"
                    )
                if value is not None and type(value) is not bytes:
                    if not isinstance(value, str | bytearray | memoryview):
                        raise TypeError(
                            f"headers: row {i}: header {key!r} value must be bytes, bytearray, "
                            f"memoryview, str or None, not {type(value).__name__}"
                        )
                keys.append(key)
                values.append(value)
        offsets.append(len(keys))
    return HeaderColumn(memoryview(offsets), _pack(keys, "header keys"),
                        _pack(values, "header values"))


def _arrow_headers(arr: Any) -> HeaderColumn:
    pa, pc = _arrow()

    arr = _one_chunk(arr, "headers")
    t = arr.type
    struct_t = t.value_type if (pa.types.is_list(t) or pa.types.is_large_list(t)) else None
    if pa.types.is_map(t):
        struct_t = arr.values.type
    if struct_t is None or not pa.types.is_struct(struct_t) \
            or {f.name for f in struct_t} != {"key", "value"}:
        raise TypeError(
            f"headers: Arrow type {t} is not list<struct<key: string, value: binary>> "
            "(the Spark Kafka sink's headers column)"
        )
    key_t = struct_t.field("key").type
    if not (pa.types.is_string(key_t) or pa.types.is_large_string(key_t)):
        raise TypeError(f"headers: header keys must be Arrow string, not {key_t}")
    n = len(arr)
    w = 8 if pa.types.is_large_list(t) else 4
    offsets = _bytes_view(arr.buffers()[1])[arr.offset * w:(arr.offset + n + 1) * w]
    offsets = offsets.cast("q" if w == 8 else "i")
    validity, voff = None, 0
    if arr.null_count:
        validity, voff = _bytes_view(arr.buffers()[0]), arr.offset
    entries = arr.values
    first, last = (offsets[0], offsets[n]) if n else (0, 0)
    used = entries.slice(first, last - first)
    for nulls, problem in ((used.is_null(), "a header is null"),
                           (used.field("key").is_null(), "a header key is null")):
        idx = pc.index(nulls, True).as_py()
        if idx >= 0:
            row = bisect_right(offsets, first + idx) - 1
            raise ValueError(f"headers: row {row}: {problem}")
    keys = _arrow_binary(entries.field("key"), "header keys")
    values = _arrow_binary(entries.field("value"), "header values")
    return HeaderColumn(offsets, keys, values, validity, voff)


# ------------------------------------------------------------------ integer columns


def _ints(obj: Any, what: str, wide: bool, fill: int | None) -> memoryview:
    """An int64 (``wide``) or int32 column, nulls replaced by ``fill`` (None:
    nulls are an error), every given value checked to be >= 0."""
    if obj is None or isinstance(obj, _NOT_A_COLUMN):
        raise TypeError(f"{what} must be a column of ints, not {type(obj).__name__}")
    kind = _module(obj)
    if kind == "pyarrow" or (kind != "builtins" and hasattr(obj, "__arrow_c_array__")):
        return _arrow_ints(obj if kind == "pyarrow" else _import_arrow(obj, what), what,
                           wide, fill)
    if kind == "numpy" or kind == "pandas":
        import numpy as np

        arr = np.asarray(obj)
        if arr.dtype.kind == "O":
            return _list_ints(arr.tolist(), what, wide, fill)
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            raise TypeError(f"{what}: numpy dtype {arr.dtype} ({arr.ndim}-D) is not a 1-D "
                            "integer array")
        top = _INT64_MAX if wide else _INT32_MAX
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) > top):
            bad = int(np.flatnonzero((arr < 0) | (arr > top))[0])
            raise ValueError(f"{what}: row {bad}: {arr[bad]} is out of range 0..{top}")
        contiguous = np.ascontiguousarray(arr, np.int64 if wide else np.int32)
        return memoryview(cast(Any, contiguous)).cast("B").cast("q" if wide else "i")
    if not isinstance(obj, Sequence):
        try:
            obj = memoryview(obj).tolist()  # array.array and other buffers
        except TypeError:
            raise TypeError(
                f"{what} must be a list, Arrow array or numpy array of ints, not "
                f"{type(obj).__name__}"
            ) from None
    return _list_ints(obj, what, wide, fill)


def _list_ints(seq: Sequence[Any], what: str, wide: bool, fill: int | None) -> memoryview:
    code = "q" if wide else "i"
    top = _INT64_MAX if wide else _INT32_MAX
    if isinstance(seq, list | tuple):
        packed = kernel().pack_ints(seq, wide)  # every item an int in range: C speed
        if packed is not None:
            return memoryview(packed).cast("q" if wide else "i")
    try:
        out = array(code, seq)  # (array.array's C loop; then each item checked)
    except (TypeError, OverflowError):
        out = array(code)
        for i, v in enumerate(seq):
            if v is None:
                if fill is None:
                    raise ValueError(
                        f"{what}: row {i} is null and no default_timestamp was given"
                    ) from None
                out.append(fill)
            elif isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{what}: row {i}: expected an int or None, "
                                f"not {type(v).__name__}") from None
            elif not 0 <= v <= top:
                raise ValueError(f"{what}: row {i}: {v} is out of range 0..{top}") from None
            else:
                out.append(v)
        return memoryview(out)
    bad = kernel().find_outside(out, wide, 0, top)
    if bad >= 0:
        raise ValueError(f"{what}: row {bad}: {out[bad]} is out of range 0..{top}")
    return memoryview(out)


def _arrow_ints(arr: Any, what: str, wide: bool, fill: int | None) -> memoryview:
    pa, pc = _arrow()

    arr = _one_chunk(arr, what)
    t = arr.type
    top = _INT64_MAX if wide else _INT32_MAX
    if pa.types.is_timestamp(t) and wide:
        per_ms = {"s": 1, "ms": 1, "us": 1000, "ns": 1_000_000}[t.unit]
        raw = arr.cast(pa.int64())
        try:  # checked: a seconds value past int64 ms raises instead of wrapping
            arr = pc.multiply_checked(raw, 1000) if t.unit == "s" else pc.divide(raw, per_ms)
        except pa.ArrowInvalid as exc:
            raise ValueError(f"{what}: {exc} converting timestamp[s] to milliseconds") from None
    elif not pa.types.is_integer(t):
        raise TypeError(f"{what}: Arrow type {t} is not an integer type")
    if len(arr) - arr.null_count:
        low, high = pc.min_max(arr).values()
        if low.as_py() < 0 or high.as_py() > top:
            bad = pc.index(pc.or_(pc.less(arr, 0), pc.greater(arr, top)), True).as_py()
            raise ValueError(f"{what}: row {bad}: {arr[bad].as_py()} is out of range 0..{top}")
    target = pa.int64() if wide else pa.int32()
    if arr.type != target:
        arr = arr.cast(target)  # in range: checked above
    if arr.null_count:
        if fill is None:
            row = pc.index(arr.is_null(), True).as_py()
            raise ValueError(f"{what}: row {row} is null and no default_timestamp was given")
        arr = pc.fill_null(arr, pa.scalar(fill, target))
    width = 8 if wide else 4
    data = _bytes_view(arr.buffers()[1])[arr.offset * width:(arr.offset + len(arr)) * width]
    return data.cast("q" if wide else "i")
