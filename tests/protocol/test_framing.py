"""FrameBuffer: h11-style frame splitting."""

from __future__ import annotations

import time

import pytest

from pipeline.protocol.errors import ProtocolError
from pipeline.protocol.framing import NEED_DATA, FrameBuffer


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def drain(fb: FrameBuffer) -> list[bytes]:
    out = []
    while (f := fb.next_frame()) is not NEED_DATA:
        assert isinstance(f, bytes)
        out.append(f)
    return out


def test_whole_frame() -> None:
    fb = FrameBuffer()
    assert fb.next_frame() is NEED_DATA
    fb.receive_data(frame(b"hello"))
    assert fb.next_frame() == b"hello"
    assert fb.next_frame() is NEED_DATA
    assert len(fb) == 0


def test_empty_frame() -> None:
    fb = FrameBuffer()
    fb.receive_data(b"\x00\x00\x00\x00")
    assert fb.next_frame() == b""


def test_one_byte_at_a_time() -> None:
    data = frame(b"abc") + frame(b"") + frame(b"x" * 300)
    fb = FrameBuffer()
    got: list[bytes] = []
    for i in range(len(data)):
        fb.receive_data(data[i : i + 1])
        got += drain(fb)
    assert got == [b"abc", b"", b"x" * 300]


def test_trailing_partial_bytes_are_kept() -> None:
    fb = FrameBuffer()
    fb.receive_data(frame(b"one") + frame(b"two")[:5])
    assert drain(fb) == [b"one"]
    assert len(fb) == 5
    fb.receive_data(frame(b"two")[5:])
    assert drain(fb) == [b"two"]


def test_many_frames_in_one_chunk() -> None:
    payloads = [bytes([i % 256]) * (i % 7) for i in range(1000)]
    fb = FrameBuffer()
    fb.receive_data(b"".join(frame(p) for p in payloads))
    assert drain(fb) == payloads
    assert len(fb) == 0


def test_memoryview_and_bytearray_input() -> None:
    fb = FrameBuffer()
    fb.receive_data(memoryview(frame(b"mv")))
    fb.receive_data(bytearray(frame(b"ba")))
    assert drain(fb) == [b"mv", b"ba"]


def test_negative_size() -> None:
    fb = FrameBuffer()
    fb.receive_data(b"\xff\xff\xff\xfe")
    with pytest.raises(ProtocolError, match="negative"):
        fb.next_frame()


def test_max_frame_size() -> None:
    fb = FrameBuffer(max_frame_size=10)
    fb.receive_data(frame(b"x" * 10))
    assert fb.next_frame() == b"x" * 10
    fb.receive_data(b"\x00\x00\x00\x0b")  # detected from the size alone
    with pytest.raises(ProtocolError, match="max_frame_size"):
        fb.next_frame()


def test_no_quadratic_behaviour() -> None:
    # 200k tiny frames fed in small chunks: linear time (well under a second).
    data = frame(b"ab") * 200_000
    fb = FrameBuffer()
    t0 = time.perf_counter()
    n = 0
    for i in range(0, len(data), 4096):
        fb.receive_data(data[i : i + 4096])
        n += len(drain(fb))
    assert n == 200_000
    assert time.perf_counter() - t0 < 5.0
    assert len(fb._buf) < 64 * 1024 + 4096  # compacted as it goes


def test_peek_sees_a_frame_head_before_the_frame_is_complete() -> None:
    fb = FrameBuffer()
    assert fb.peek(4) is None
    fb.receive_data(b"\x00\x00\x00\x0a\x00\x00")
    assert fb.peek(4) is None  # only 2 payload bytes so far
    fb.receive_data(b"\x00\x07abc")
    assert fb.peek(4) == b"\x00\x00\x00\x07"
    assert fb.next_frame() is NEED_DATA  # 10 bytes announced, 7 buffered
    assert len(fb) == 11  # peek consumed nothing
    fb.receive_data(b"def")
    assert fb.next_frame() == b"\x00\x00\x00\x07abcdef"
    fb.receive_data(b"\x00\x00\x00\x02hi")
    assert fb.peek(4) == b"hi"  # a frame shorter than asked for: all of it


def test_peek_rejects_bad_sizes_like_next_frame() -> None:
    fb = FrameBuffer(max_frame_size=10)
    fb.receive_data(b"\x00\x00\x00\x0b")
    with pytest.raises(ProtocolError, match="max_frame_size"):
        fb.peek(4)
    neg = FrameBuffer()
    neg.receive_data(b"\xff\xff\xff\xff")
    with pytest.raises(ProtocolError, match="negative"):
        neg.peek(1)
