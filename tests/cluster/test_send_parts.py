"""``send_parts``: a frame's buffers written in order, by one gather write per
round on a TCP stream (``sendmsg``), joined on any other stream."""

from __future__ import annotations

import random
import socket
from typing import Any

import pytest
import trio
import trio.testing

from pipeline.cluster import transport
from pipeline.cluster.transport import send_parts


def _parts(seed: int, count: int, longest: int) -> list[bytes | bytearray | memoryview]:
    rng = random.Random(seed)
    out: list[bytes | bytearray | memoryview] = []
    for k in range(count):
        data = rng.randbytes(rng.randint(1, longest))
        out.append((bytes, bytearray, memoryview)[k % 3](data))
    return out


async def _pair() -> tuple[trio.SocketStream, trio.socket.SocketType]:
    a, b = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return trio.SocketStream(a), b


async def _read_all(sock: trio.socket.SocketType, size: int, into: bytearray) -> None:
    while len(into) < size:
        chunk = await sock.recv(65536)
        assert chunk, "the writer closed early"
        into += chunk


class _Short:
    """A socket whose sendmsg writes at most ``cap`` bytes a call (what a full
    send buffer does), recording each call's buffer count."""

    def __init__(self, sock: Any, cap: int) -> None:
        self._sock, self._cap = sock, cap
        self.calls: list[int] = []

    async def sendmsg(self, buffers: list[memoryview]) -> int:
        self.calls.append(len(buffers))
        room, cut = self._cap, []
        for b in buffers:
            if room == 0:
                break
            cut.append(b[:room])
            room -= len(cut[-1])
        sent: int = await self._sock.sendmsg(cut)
        return sent


async def _write_and_read(stream: trio.SocketStream, peer: trio.socket.SocketType,
                          parts: list[bytes | bytearray | memoryview]) -> bytes:
    """``send_parts`` while the peer reads; what the peer got. Closes both ends."""
    got = bytearray()
    with trio.fail_after(20):  # a write that never ends fails, not hangs
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_all, peer, len(b"".join(parts)), got)
            await send_parts(stream, parts)
    peer.close()
    if isinstance(stream.socket, _Short):
        stream.socket = stream.socket._sock
    await stream.aclose()
    return bytes(got)


async def _short_pair(cap: int) -> tuple[trio.SocketStream, trio.socket.SocketType, _Short]:
    stream, peer = await _pair()
    short = _Short(stream.socket, cap)
    stream.socket = short  # type: ignore[assignment]
    return stream, peer, short


@pytest.mark.parametrize("cap", [1, 7, 1000, 4096, 10**9])
async def test_every_split_of_a_short_write_resumes_at_the_right_byte(cap: int) -> None:
    stream, peer, short = await _short_pair(cap)
    parts = _parts(cap, 40 if cap > 1 else 8, 3000 if cap > 1 else 40)
    want = b"".join(parts)
    assert await _write_and_read(stream, peer, parts) == want
    # one call per cap's worth (a whole buffer list when nothing is short)
    assert len(short.calls) == -(-len(want) // cap)


async def test_more_buffers_than_one_call_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "_IOV_MAX", 16)
    stream, peer, short = await _short_pair(10**9)
    parts = _parts(5, 100, 50)
    assert await _write_and_read(stream, peer, parts) == b"".join(parts)
    assert short.calls == [16] * 6 + [4]  # 100 buffers, 16 at a time


async def test_a_frame_larger_than_the_socket_buffers() -> None:
    stream, peer = await _pair()
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    parts = _parts(9, 300, 20_000)  # ~3 MB: many rounds of waiting for room
    assert await _write_and_read(stream, peer, parts) == b"".join(parts)


async def test_a_closed_stream_and_a_broken_one_raise_as_send_all_does() -> None:
    stream, peer = await _pair()
    await stream.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await send_parts(stream, [b"a" * 2000, b"b" * 2000])
    peer.close()
    stream, peer = await _pair()
    peer.close()

    async def write_until_it_breaks() -> None:
        for _ in range(100):  # the first writes may still be buffered
            await send_parts(stream, [b"a" * 20_000, b"b" * 20_000])

    with pytest.raises(trio.BrokenResourceError) as info:
        await write_until_it_breaks()
    assert isinstance(info.value.__cause__, OSError)
    await stream.aclose()


async def test_other_streams_get_the_joined_frame() -> None:
    client, server = trio.testing.memory_stream_pair()
    parts = _parts(3, 5, 100)
    await send_parts(client, parts)
    got = await server.receive_some()
    assert got == b"".join(parts)
    await send_parts(client, [b"one part"])
    assert await server.receive_some() == b"one part"
