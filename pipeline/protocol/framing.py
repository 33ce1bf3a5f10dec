"""Size-prefixed frame splitting, h11 style: feed bytes in, pull frames out.

``FrameBuffer.receive_data(data)`` takes bytes as they arrive; ``next_frame()`` returns
one frame's payload (without its 4-byte size) or ``NEED_DATA``; ``peek(n)`` shows the
next frame's first bytes without consuming anything. A size over ``max_frame_size``
raises ``ProtocolError`` before any of it is buffered. This is the only frame splitter:
the connection, the fake cluster, the fault proxy and the tests' raw client all use it.
"""

from __future__ import annotations

import enum
import struct
from typing import Final, Literal

from pipeline.protocol.errors import ProtocolError

__all__ = ["DEFAULT_MAX_FRAME_SIZE", "NEED_DATA", "FrameBuffer"]

_I32 = struct.Struct(">i")

#: Default guard: Kafka's socket.request.max.bytes default is 100 MiB.
DEFAULT_MAX_FRAME_SIZE: Final = 100 * 1024 * 1024


class _NeedData(enum.Enum):
    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by :meth:`FrameBuffer.next_frame` when no complete frame is buffered.
NEED_DATA: Final = _NeedData.NEED_DATA

# Compact the buffer once the consumed prefix is at least this big and at
# least half of the buffer, so each byte is moved O(1) times on average.
_COMPACT_MIN = 64 * 1024


class FrameBuffer:
    """Accumulates stream bytes and yields complete frames (payload without the size).

    ``receive_data`` appends; ``next_frame`` returns the next frame's payload as
    ``bytes``, or :data:`NEED_DATA`. A negative size or one above
    ``max_frame_size`` raises :class:`ProtocolError` (the stream is unusable).
    """

    __slots__ = ("_buf", "_pos", "max_frame_size")

    def __init__(self, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._buf = bytearray()
        self._pos = 0
        self.max_frame_size = max_frame_size

    def __len__(self) -> int:
        """Bytes buffered and not yet returned as frames."""
        return len(self._buf) - self._pos

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buf += data

    def _next_size(self) -> int | None:
        """The next frame's size once its prefix is buffered; ProtocolError if bad."""
        if len(self._buf) - self._pos < 4:
            return None
        size: int = _I32.unpack_from(self._buf, self._pos)[0]
        if size < 0:
            raise ProtocolError(f"negative frame size {size}")
        if size > self.max_frame_size:
            raise ProtocolError(f"frame size {size} exceeds max_frame_size {self.max_frame_size}")
        return size

    def peek(self, n: int) -> bytes | None:
        """The first ``n`` payload bytes of the next frame (fewer if the frame is
        shorter) as soon as they are buffered, without consuming anything; None
        before. Lets a relay act on a frame's header before its body has arrived.
        Raises :class:`ProtocolError` for a bad size, as :meth:`next_frame` does."""
        size = self._next_size()
        if size is None:
            return None
        want = min(n, size)
        start = self._pos + 4
        if len(self._buf) - start < want:
            return None
        return bytes(self._buf[start : start + want])

    def next_frame(self) -> bytes | Literal[_NeedData.NEED_DATA]:
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail < 4:
            return NEED_DATA
        size: int = _I32.unpack_from(buf, pos)[0]
        if size < 0 or size > self.max_frame_size:
            self._next_size()  # raises the ProtocolError naming the problem
        if avail < 4 + size:
            return NEED_DATA
        start = pos + 4
        end = start + size
        frame = bytes(buf[start:end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        else:
            self._pos = end
            if end >= _COMPACT_MIN and end * 2 >= len(buf):
                del buf[:end]
                self._pos = 0
        return frame
