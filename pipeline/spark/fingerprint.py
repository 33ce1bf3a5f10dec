"""A running fingerprint of a partition's rows, for resuming an exactly-once export.

An exactly-once export commits a large partition in chunks; the ledger marker of each
chunk records how many rows are done and this fingerprint of them. A retry re-reads the
partition from its start (Spark recomputes it), fingerprints the rows the marker says
are done, and resumes after them only if the fingerprints match: a partition whose
content or order changed between attempts (a non-deterministic shuffle, a source that
changed) is refused instead of half written twice.

What it covers: every column the export sends (``value``, ``key``, ``headers``,
``topic``, ``partition``): for a byte column its bytes and each row's length (null: -1),
for ``headers`` each row's header count and every header key and value, for
``partition`` each row's value. The message-id header is derived from the row index, so
it adds nothing. Each of these streams keeps its own CRC-32C, continued batch after
batch, so the fingerprint does not depend on how the rows were cut into Arrow batches
(only on the rows and their order); :meth:`Fingerprint.digest` folds the streams and the
row count into one hex string. CRC-32C runs at memory speed (the ``crc32c`` package),
so fingerprinting costs little beside encoding. It detects accidents (a changed row,
another order), not tampering.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

__all__ = ["Fingerprint"]

# The streams, in digest order. A column that is absent leaves its streams untouched.
_STREAMS = (
    "value.len", "value.data", "key.len", "key.data",
    "headers.count", "headers.key.len", "headers.key.data",
    "headers.value.len", "headers.value.data",
    "topic.len", "topic.data", "partition",
)
_INDEX = {name: i for i, name in enumerate(_STREAMS)}


def _crc(data: Any, value: int) -> int:
    import crc32c

    result: int = crc32c.crc32c(data, value)
    return result


class Fingerprint:
    """The fingerprint of the rows seen so far (``rows`` of them)."""

    __slots__ = ("_crcs", "rows")

    def __init__(self) -> None:
        self.rows = 0
        self._crcs = [0] * len(_STREAMS)

    def copy(self) -> Fingerprint:
        other = Fingerprint()
        other.rows = self.rows
        other._crcs = list(self._crcs)
        return other

    def digest(self) -> str:
        """32 hex digits standing for the rows so far (their count included)."""
        packed = struct.pack(f">q{len(_STREAMS)}I", self.rows, *self._crcs)
        return hashlib.blake2b(packed, digest_size=16).hexdigest()

    def update(self, n: int, values: Any, keys: Any = None, headers: Any = None,
               topics: Any = None, partitions: Any = None) -> None:
        """Add ``n`` rows given as Arrow columns (None: the column is absent)."""
        self._bytes("value", values)
        self._bytes("key", keys)
        self._bytes("topic", topics)
        if headers is not None:
            self._headers(headers)
        if partitions is not None:
            self._ints("partition", partitions)
        self.rows += n

    def _add(self, stream: str, data: Any) -> None:
        i = _INDEX[stream]
        self._crcs[i] = _crc(data, self._crcs[i])

    def _bytes(self, name: str, column: Any) -> None:
        if column is None:
            return
        lengths, data = _binary_parts(column)
        self._add(f"{name}.len", lengths)
        if data is not None:
            self._add(f"{name}.data", data)

    def _ints(self, name: str, column: Any) -> None:
        import pyarrow as pa  # type: ignore[import-untyped]
        import pyarrow.compute as pc  # type: ignore[import-untyped]

        filled = pc.fill_null(column.cast(pa.int64()), -1)
        self._add(name, filled.to_numpy(zero_copy_only=False).tobytes())

    def _headers(self, column: Any) -> None:
        import numpy as np

        self._add("headers.count", _lengths(column, np.asarray(
            column.offsets, dtype=np.int64)))
        items = column.flatten()  # the headers of the valid rows, in row order
        self._bytes("headers.key", items.field("key"))
        self._bytes("headers.value", items.field("value"))


def _lengths(column: Any, offsets: Any) -> bytes:
    """Each row's length (int64; null: -1) from a list or binary column's offsets."""
    import numpy as np

    lengths = np.diff(offsets).astype(np.int64)
    if column.null_count:
        lengths[~column.is_valid().to_numpy(zero_copy_only=False)] = -1
    out: bytes = lengths.tobytes()
    return out


def _binary_parts(column: Any) -> tuple[bytes, Any]:
    """(each row's length as int64 bytes with -1 for null, the bytes of the valid rows
    or None) of a string or binary Arrow array (a slice of one is fine)."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_string(kind):
        column = column.cast(pa.binary())
    elif pa.types.is_large_string(kind):
        column = column.cast(pa.large_binary())
    lengths = _lengths(column, _offsets(column))
    if column.null_count:
        # A null row's bytes are unspecified in Arrow: only the valid rows' bytes count.
        column = column.filter(column.is_valid())
    data = column.buffers()[2]
    if data is None or len(column) == 0:
        return lengths, None
    offsets = _offsets(column)
    return lengths, memoryview(data)[int(offsets[0]):int(offsets[-1])]


def _offsets(column: Any) -> Any:
    """The offsets of a (possibly sliced) binary array's rows, as int64."""
    import numpy as np
    import pyarrow as pa

    wide = pa.types.is_large_binary(column.type)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int64 if wide else np.int32)
    return offsets[column.offset:column.offset + len(column) + 1].astype(np.int64)
