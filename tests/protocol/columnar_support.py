"""Shared helpers of the columnar tests: run a test on either kernel, build the
same rows as Arrow arrays, and spell out what BatchBuilder must be given."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from pipeline.protocol import _columns, _kernel_py, columnar

KERNELS = ["c", "python"]
Headers = tuple[tuple[str, bytes | None], ...]


@contextlib.contextmanager
def use_kernel(name: str) -> Iterator[None]:
    """Run the block on the C kernel or on the pure-Python twin."""
    if name == "c":
        if columnar.KERNEL != "c":
            pytest.skip("the C kernel is not built in this environment")
        impl = _columns._impl
    else:
        impl = _kernel_py
    saved = _columns._impl
    _columns._impl = impl
    try:
        yield
    finally:
        _columns._impl = saved


def _b(x: bytes | str | None) -> bytes | None:
    return x.encode() if isinstance(x, str) else x


def _headers(h: Any) -> Headers:
    if not h:
        return ()
    items = h.items() if isinstance(h, Mapping) else h
    return tuple((k, _b(v)) for k, v in items)


def expected_rows(rows: list[tuple[Any, Any, Any, Any]],
                  default_ts: int) -> list[tuple[int, bytes | None, bytes | None, Headers]]:
    """(timestamp, key, value, headers) as BatchBuilder.append takes them."""
    return [(default_ts if ts is None else ts, _b(k), _b(v), _headers(h))
            for ts, k, v, h in rows]


def as_arrow(values: list[Any], keys: list[Any], headers: list[Any], ts: list[Any],
             offset: int = 0) -> tuple[Any, Any, Any, Any]:
    """The same columns as Arrow arrays, each sliced after ``offset`` padding rows
    (so offsets and validity bitmaps start mid-buffer), alternating 32-bit and
    64-bit offset types."""
    pa = pytest.importorskip("pyarrow")
    pad = [b"pad"] * offset
    large = offset % 2 == 1
    vtype = pa.large_binary() if large else pa.binary()
    ktype = pa.binary() if large else pa.large_binary()
    header_t = pa.struct([("key", pa.string()), ("value", pa.binary())])
    htype = pa.large_list(header_t) if large else pa.list_(header_t)
    hrows = [None if h is None else [{"key": k, "value": v} for k, v in _headers(h)]
             for h in headers]
    return (
        pa.array(pad + [_b(v) for v in values], vtype).slice(offset),
        pa.array(pad + [_b(k) for k in keys], ktype).slice(offset),
        pa.array([None] * offset + hrows, htype).slice(offset),
        pa.array([0] * offset + ts, pa.int64()).slice(offset),
    )
