"""Columnar RecordBatch v2 encoding: many rows, no Python object per record.

The bulk counterpart of ``records.BatchBuilder``. A :class:`Columns` holds
the rows of one ``send_batch`` call as flat buffers in Arrow's layout (per
binary column: offsets + data + an optional validity bitmap), built by
:func:`build_columns` from Arrow arrays (zero-copy), Python lists or numpy
arrays. Batches are then encoded straight from those buffers by a small C
kernel (``_kernel.c``, built by ``pip install``) or, when it is missing, its
pure-Python twin (``_kernel_py.py``); both give the same bytes as
``BatchBuilder`` fed the same records (tests compare all three).

* :func:`encode_batch` encodes the rows ``rows`` (a ``range``, an int64
  buffer of row indices, or ``None`` for all rows) into one RecordBatch
  (compression through ``compression.compress``, CRC-32C, producer fields).
* :func:`record_size_bounds` gives each row's ``batch_size_for_record``
  bound, the number the per-message path reserves from ``buffer_memory``
  and checks against ``max_message_bytes`` (:func:`first_row_over` finds the
  first row over such a limit).
* :func:`cut_batches` splits a row selection into consecutive batches of at
  most ``max_bytes`` encoded (uncompressed, header included) and
  ``max_records`` records, using the exact encoded sizes.

Rows are identified by their index in the ``Columns``; a selection keeps the
given order (it is the batch's offset order). Sans-I/O: no clock here, so a
row without a timestamp gets ``default_timestamp``, chosen by the caller.
``PIPELINE_PURE_PYTHON=1`` in the environment forces the Python kernel.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any, TypeAlias

from pipeline.protocol._columnar_input import normalize
from pipeline.protocol._columns import (
    KERNEL,
    BinaryColumn,
    ColumnInput,
    Columns,
    HeaderColumn,
    HeadersInput,
    IntsInput,
    kernel,
)
from pipeline.protocol.batch_format import ATTR_TRANSACTIONAL
from pipeline.protocol.compression import Compression, validate_level
from pipeline.protocol.compression import compress as _compress
from pipeline.protocol.records import _assemble

__all__ = [
    "KERNEL",
    "BinaryColumn",
    "Columns",
    "HeaderColumn",
    "Rows",
    "build_columns",
    "cut_batches",
    "encode_batch",
    "first_row_over",
    "kernel",
    "record_size_bounds",
]

#: what encode_batch/cut_batches accept as a row selection
Rows: TypeAlias = "range | memoryview | array[int] | Sequence[int] | None"


def build_columns(values: ColumnInput, keys: ColumnInput | None = None,
                  headers: HeadersInput | None = None, timestamps: IntsInput | None = None,
                  partitions: IntsInput | None = None, *,
                  default_timestamp: int | None = None) -> Columns:
    """Normalize a bulk send's columns (see ``_columnar_input`` for what each
    accepts). Arrow arrays are borrowed, not copied; lists are packed once.

    ``default_timestamp`` (ms) is the CreateTime of rows without one (no
    ``timestamps`` column, or a null in it); it is required then. Raises
    ``TypeError``/``ValueError`` naming the column and the row on bad input.
    """
    return normalize(values, keys, headers, timestamps, partitions, default_timestamp)


# ------------------------------------------------------------------ row selections


def _selection(columns: Columns, rows: Rows) -> tuple[Any, int, int]:
    """(rows buffer | None, start, stop) for the kernels."""
    if rows is None:
        return None, 0, len(columns)
    if isinstance(rows, range):
        if rows.step == 1:
            return None, rows.start, max(rows.start, rows.stop)
        rows = array("q", rows)
    if isinstance(rows, array) and rows.typecode == "q":
        return rows, 0, len(rows)
    if isinstance(rows, memoryview) and rows.format in ("q", "l", "<q", "=q") \
            and rows.itemsize == 8 and rows.c_contiguous:
        return rows, 0, len(rows)
    try:
        picked = array("q", rows)
    except (TypeError, OverflowError) as exc:
        raise TypeError(
            f"rows must be a range, an int64 buffer or a sequence of row indices ({exc})"
        ) from None
    return picked, 0, len(picked)


# ------------------------------------------------------------------ encoding


def encode_batch(columns: Columns, rows: Rows = None, *,
                 compression: Compression = Compression.NONE,
                 compression_level: int | None = None, producer_id: int = -1,
                 producer_epoch: int = -1, base_sequence: int = -1,
                 is_transactional: bool = False, partition_leader_epoch: int = -1) -> bytes:
    """One RecordBatch v2 of the selected rows, in selection order: the same
    bytes as ``BatchBuilder`` given those records in that order (base offset 0,
    CreateTime, base timestamp = the first row's)."""
    level = validate_level(compression, compression_level)
    sel, start, stop = _selection(columns, rows)
    if stop <= start:
        raise ValueError("cannot build an empty record batch")
    records, base_ts, max_ts = kernel().encode_records(columns.spec, sel, start, stop)
    codec = Compression(compression)
    if codec:
        records = _compress(codec, records, level)
    count = stop - start
    return _assemble(
        records,
        base_offset=0,
        partition_leader_epoch=partition_leader_epoch,
        attributes=codec | (ATTR_TRANSACTIONAL if is_transactional else 0),
        last_offset_delta=count - 1,
        base_timestamp=base_ts,
        max_timestamp=max_ts,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        count=count,
    )


def record_size_bounds(columns: Columns) -> memoryview:
    """Per row (int64), ``records.batch_size_for_record(key, value, headers)``:
    the upper bound the per-message path reserves and checks against
    ``max_message_bytes`` (batch header + worst-case record overhead)."""
    out = bytearray(8 * len(columns))
    kernel().size_bounds(columns.spec, out)
    return memoryview(out).cast("q")


def first_row_over(sizes: memoryview, limit: int) -> int:
    """The first row whose size (from :func:`record_size_bounds`) exceeds
    ``limit`` (e.g. ``max_message_bytes``), or -1: one C pass, no int per row."""
    return kernel().find_outside(sizes, True, 0, limit)


def cut_batches(columns: Columns, rows: Rows = None, *, max_bytes: int,
                max_records: int = 1 << 31) -> list[tuple[int, int, int]]:
    """Split the selection into consecutive batches: ``[(start, stop, nbytes)]``
    as positions in the selection, each batch's exact encoded size
    (uncompressed, 61-byte header included) at most ``max_bytes`` and at most
    ``max_records`` rows. A row too big for ``max_bytes`` on its own makes a
    batch of one (checking it against ``max_message_bytes`` is the caller's
    job, with :func:`record_size_bounds`)."""
    sel, start, stop = _selection(columns, rows)
    cuts = kernel().cut_batches(columns.spec, sel, start, stop, max_bytes, max_records)
    out: list[tuple[int, int, int]] = []
    prev = start
    for end, nbytes in cuts:
        out.append((prev - start, end - start, nbytes))
        prev = end
    return out
