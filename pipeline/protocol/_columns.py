"""The column types of the columnar codec, and which kernel runs it.

Split from ``columnar`` so that ``_columnar_input`` (which builds these types)
and ``columnar`` (which encodes them) both sit on top of it without an import
cycle. Tests swap ``_impl`` to run every case on both kernels.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeAlias

from pipeline.protocol import _kernel_py

__all__ = [
    "KERNEL",
    "BinaryColumn",
    "ColumnInput",
    "Columns",
    "HeaderColumn",
    "HeadersInput",
    "IntsInput",
    "kernel",
]

ColumnInput: TypeAlias = Any
"""A binary column: Arrow array, list/tuple of bytes-like | str | None, numpy array."""
HeadersInput: TypeAlias = Any
"""Arrow list<struct<key, value>>, or per row None | mapping | sequence of pairs."""
IntsInput: TypeAlias = Any
"""Arrow/numpy integer array, array.array, or a list of int | None."""


class _Kernel(Protocol):
    """What both kernels implement (argument layouts: the top of ``_kernel.c``)."""

    def encode_records(self, spec: Any, rows: Any, start: int, stop: int, /
                       ) -> tuple[bytes, int, int]: ...
    def size_bounds(self, spec: Any, out: Any, /) -> None: ...
    def cut_batches(self, spec: Any, rows: Any, start: int, stop: int, max_bytes: int,
                    max_records: int, /) -> list[tuple[int, int]]: ...
    def pack_binary(self, seq: Sequence[Any], what: str, /
                    ) -> tuple[bytes, bytes, bytes | None, int]: ...
    def find_outside(self, buf: Any, wide: bool, lo: int, hi: int, /) -> int: ...
    def pack_ints(self, seq: Sequence[Any], wide: bool, /) -> bytes | None: ...
    def binary_list(self, spec: tuple[Any, ...], /) -> list[bytes | None]: ...


def _load_kernel() -> tuple[_Kernel, str]:
    if os.environ.get("PIPELINE_PURE_PYTHON", "") not in ("", "0"):
        return _kernel_py, "python"
    try:
        from pipeline.protocol import _kernel
    except ImportError:  # not built (no compiler at install time): the twin
        return _kernel_py, "python"
    return _kernel, "c"


_impl: _Kernel
_impl, _kernel_name = _load_kernel()
KERNEL: Final[str] = _kernel_name
"""Which kernel this process loaded: ``"c"`` or ``"python"``."""


def kernel() -> _Kernel:
    """The kernel in use (tests swap ``_impl`` to run both)."""
    return _impl


# ------------------------------------------------------------------ columns


@dataclass(frozen=True, slots=True, eq=False)
class BinaryColumn:
    """A column of ``bytes | None`` in Arrow's layout. Row ``i`` is
    ``data[offsets[i]:offsets[i + 1]]``, null where its validity bit is 0.
    ``offsets`` (format ``i`` or ``q``, ``len + 1`` items) need not start at 0
    (a sliced Arrow array's do not); the buffers may be borrowed from Arrow."""

    offsets: memoryview
    data: memoryview
    validity: memoryview | None = None  # bit i + validity_offset, LSB first; None: no nulls
    validity_offset: int = 0
    null_count: int = 0

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, row: int) -> bytes | None:
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} out of range")
        if self.validity is not None:
            k = self.validity_offset + row
            if not (self.validity[k >> 3] >> (k & 7)) & 1:
                return None
        return bytes(self.data[self.offsets[row]:self.offsets[row + 1]])

    def spec(self) -> tuple[Any, ...]:
        return (self.offsets, self.offsets.itemsize == 8, self.data, self.validity,
                self.validity_offset, len(self))

    def to_pylist(self) -> list[bytes | None]:
        """Every row as ``bytes`` or None, in one pass of the kernel (``binary_list``)."""
        return _impl.binary_list(self.spec())

    def __iter__(self) -> Iterator[bytes | None]:
        return iter(self.to_pylist())


@dataclass(frozen=True, slots=True, eq=False)
class HeaderColumn:
    """Per row a list of (key, value) headers: row ``i`` holds header entries
    ``offsets[i]:offsets[i + 1]`` of ``keys`` (UTF-8, never null) and
    ``values`` (nullable); a null row (validity bit 0) has no headers. This is
    Arrow's ``list<struct<key: string, value: binary>>`` (Spark's Kafka sink)."""

    offsets: memoryview
    keys: BinaryColumn
    values: BinaryColumn
    validity: memoryview | None = None
    validity_offset: int = 0

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, row: int) -> tuple[tuple[str, bytes | None], ...]:
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} out of range")
        if self.validity is not None:
            k = self.validity_offset + row
            if not (self.validity[k >> 3] >> (k & 7)) & 1:
                return ()
        return tuple(
            ((self.keys[j] or b"").decode("utf-8"), self.values[j])
            for j in range(self.offsets[row], self.offsets[row + 1])
        )

    def spec(self) -> tuple[Any, ...]:
        return (self.offsets, self.offsets.itemsize == 8, self.validity, self.validity_offset,
                len(self), self.keys.spec(), self.values.spec())


@dataclass(frozen=True, slots=True, eq=False)
class Columns:
    """The normalized rows of one bulk send. Build with :func:`build_columns`.

    ``timestamps`` (int64 ms) is None when every row uses
    ``default_timestamp``; ``partitions`` (int32) is None when no row is
    pinned, else -1 marks a row the partitioner chooses for."""

    values: BinaryColumn
    keys: BinaryColumn | None = None
    headers: HeaderColumn | None = None
    timestamps: memoryview | None = None
    partitions: memoryview | None = None
    default_timestamp: int = 0
    # The kernel's argument tuple, built once (the kernels re-read it per call).
    spec: tuple[Any, ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        n = len(self.values)
        for name in ("keys", "headers", "timestamps", "partitions"):
            col = getattr(self, name)
            if col is not None and len(col) != n:
                raise ValueError(f"{name}: {len(col)} rows, but values has {n} rows")
        object.__setattr__(self, "spec", (
            n,
            self.values.spec(),
            None if self.keys is None else self.keys.spec(),
            None if self.headers is None else self.headers.spec(),
            self.timestamps,
            self.default_timestamp,
        ))

    def __len__(self) -> int:
        return len(self.values)

    @property
    def num_rows(self) -> int:
        return len(self.values)

    def row(self, i: int) -> tuple[int, bytes | None, bytes | None,
                                   tuple[tuple[str, bytes | None], ...], int | None]:
        """Row ``i`` as Python objects: (timestamp, key, value, headers,
        partition or None). For error reports and tests, not the hot path."""
        ts = self.default_timestamp if self.timestamps is None else self.timestamps[i]
        key = None if self.keys is None else self.keys[i]
        headers = () if self.headers is None else self.headers[i]
        part = None if self.partitions is None or self.partitions[i] < 0 else self.partitions[i]
        return ts, key, self.values[i], headers, part
