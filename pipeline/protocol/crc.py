"""CRC-32C (Castagnoli), the checksum of Kafka RecordBatch v2.

Backed by the C ``crc32c`` package (hardware SSE4.2 / ARMv8 CRC instructions
where available, a table-driven C fallback otherwise).
"""

from __future__ import annotations

from crc32c import crc32c as _crc32c_impl

__all__ = ["crc32c"]


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """Return the CRC-32C of ``data`` as an unsigned 32-bit int.

    ``value`` continues a running checksum: ``crc32c(b, crc32c(a)) == crc32c(a + b)``.
    """
    return _crc32c_impl(data, value)
