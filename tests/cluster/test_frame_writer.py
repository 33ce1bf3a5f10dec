"""transport.FrameWriter: a connection's frames on a real socket, written by the C writer
(``_writer.c``: the kernel first, then a thread of its own) and by its twin, trio's write
(``send_parts``). Both must put the same bytes on the wire in the same order, fail the same
way, and the writer's thread must stop, write nothing more, before the socket is closed.

Real sockets, so real time: every wait here is bounded by a short ``fail_after``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from pipeline.cluster import transport
from pipeline.cluster.transport import FrameWriter

native = pytest.mark.skipif(transport._writer_c is None,
                            reason="pipeline.cluster._writer is not built (or PIPELINE_PURE_PYTHON)")

# Larger than what the kernel takes of a frame its reader is not reading (~200 KB on
# loopback): such a frame has to wait, in the writer's thread or in trio.
BIG = 3 * 1024 * 1024


def frames() -> list[list[bytes | bytearray | memoryview]]:
    """Frames of every shape a request has: one buffer, a gather of small parts, a
    large batch among small ones, empty parts, a memoryview, a bytearray header."""
    big = bytes(range(256)) * (BIG // 256)
    return [
        [b"\x00\x00\x00\x05hello"],
        [bytearray(b"\x00\x00\x00\x07head"), b"", b"abc"],
        [bytearray(b"HDR1"), big, b"tail-1"],
        [b"small after a big one"],
        [bytearray(b"HDR2"), memoryview(big)[1000:BIG // 2], b"", memoryview(b"xyz")[1:]],
        [b"last"],
    ]


def joined(parts: list[bytes | bytearray | memoryview]) -> bytes:
    return b"".join(bytes(p) for p in parts)


async def tcp_pair() -> tuple[trio.SocketStream, socket.socket]:
    """A trio stream (the writer's side) and the peer's blocking socket."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stream = await trio.open_tcp_stream("127.0.0.1", listener.getsockname()[1])
    peer, _ = listener.accept()
    listener.close()
    return stream, peer


def drain(peer: socket.socket, into: bytearray, delay: float = 0.0) -> None:
    """Read ``peer`` until EOF (a slow reader when ``delay``: the writer must wait)."""
    import time

    while True:
        if delay:
            time.sleep(delay)
        data = peer.recv(65536)
        if not data:
            return
        into += data


@contextlib.asynccontextmanager
async def wire(*, kind: str = "native", read_delay: float | None = None,
               ) -> AsyncIterator[tuple[FrameWriter, socket.socket, bytearray]]:
    """A ``FrameWriter`` on a TCP stream (``kind`` "twin": trio's write), the peer's
    socket, and what a reader thread read from it (``read_delay`` None: nobody reads;
    else the pause before each read). Everything is closed and joined at the end."""
    if kind == "native" and transport._writer_c is None:
        pytest.skip("pipeline.cluster._writer is not built")
    stream, peer = await tcp_pair()
    writer = FrameWriter(stream)
    if kind == "twin":
        writer._plain = False
    got = bytearray()
    reader = None
    if read_delay is not None:
        reader = threading.Thread(target=drain, args=(peer, got, read_delay))
        reader.start()
    try:
        yield writer, peer, got
    finally:
        writer.close()
        await stream.aclose()
        if reader is not None:
            await trio.to_thread.run_sync(reader.join)
        peer.close()


def reset(peer: socket.socket) -> None:
    """Close ``peer`` with a reset: the writer's next send fails."""
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    peer.close()


async def written_out(writer: FrameWriter) -> None:
    """Until the writer's thread has written every frame queued so far."""
    native = writer._native
    while native.queued_bytes:
        await trio.lowlevel.wait_readable(native.done_fd)
        native.reap()


async def write_all(writer: FrameWriter, sequence: list[list[bytes | bytearray | memoryview]],
                    *, until_written: bool) -> None:
    for parts in sequence:
        await writer.write(parts, until_written=until_written)


@pytest.mark.parametrize("kind", ["native", "twin"])
@pytest.mark.parametrize("until_written", [False, True])
async def test_both_writers_put_the_same_bytes_on_the_wire_in_order(
        kind: str, until_written: bool) -> None:
    sequence = frames()
    async with wire(kind=kind, read_delay=0.002) as (writer, _, got):
        with trio.fail_after(30):
            await write_all(writer, sequence, until_written=until_written)
            if kind == "native":
                # the big frames waited for the slow reader in the writer's thread
                assert writer.threaded
                await written_out(writer)
    assert bytes(got) == b"".join(joined(p) for p in sequence)


@native
async def test_a_frame_the_kernel_takes_at_once_needs_no_thread() -> None:
    async with wire() as (writer, peer, _):
        for _ in range(100):
            await writer.write([bytearray(b"\x00\x00\x00\x04"), b"ping"], until_written=False)
        assert not writer.threaded
        data = b""
        while len(data) < 800:
            data += await trio.to_thread.run_sync(peer.recv, 65536)
        assert data == b"\x00\x00\x00\x04ping" * 100


@native
async def test_a_queued_frame_returns_before_it_is_written_unless_asked_to_wait() -> None:
    async with wire() as (writer, _, _):  # the peer reads nothing
        with trio.fail_after(5):
            await writer.write([b"q" * BIG], until_written=False)  # queued: returns at once
        assert writer.threaded and writer._native.queued_bytes > 0
        with trio.move_on_after(0.3) as waited:
            await writer.write([b"acks=0 request"], until_written=True)
        assert waited.cancelled_caught, "returned before the peer read anything"


@native
async def test_until_written_returns_once_the_frame_is_in_the_kernel() -> None:
    async with wire(read_delay=0.001) as (writer, _, got):
        with trio.fail_after(30):
            await writer.write([b"a" * BIG], until_written=True)
            assert writer._native.completed == 1 and writer._native.queued_bytes == 0
    assert bytes(got) == b"a" * BIG


@pytest.mark.parametrize("kind", ["native", "twin"])
async def test_a_peer_that_goes_away_fails_the_next_write(kind: str) -> None:
    async with wire(kind=kind) as (writer, peer, _):
        reset(peer)

        async def write_on() -> None:
            for _ in range(1000):
                await writer.write([b"x" * 65536], until_written=True)
                await trio.sleep(0.001)

        with trio.fail_after(5), pytest.raises(trio.BrokenResourceError):
            await write_on()


@native
async def test_close_stops_the_thread_at_once_and_fails_its_waiters() -> None:
    outcome: list[BaseException] = []
    async with wire() as (writer, peer, _):  # the peer never reads: the thread waits in poll()

        async def acks0() -> None:
            try:
                await writer.write([b"never read" * 100_000], until_written=True)
            except trio.ClosedResourceError as exc:
                outcome.append(exc)

        with trio.fail_after(5):
            await writer.write([b"b" * BIG], until_written=False)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(acks0)
                await trio.sleep(0.1)
                assert writer.threaded
                writer.close()  # joins the thread: no write happens after this
        assert len(outcome) == 1
        peer.setblocking(False)
        received = 0
        for _ in range(2):  # (were the thread alive, it would write in between)
            try:
                while chunk := peer.recv(1 << 20):
                    received += len(chunk)
            except BlockingIOError:
                pass
            await trio.sleep(0.1)
        assert received < BIG, "the writer wrote on after close()"
        with pytest.raises(trio.ClosedResourceError):
            await writer.write([b"after close"], until_written=False)


@pytest.mark.parametrize("kind", ["native", "twin"])
async def test_a_writer_closed_before_its_first_write_refuses_writes(kind: str) -> None:
    async with wire(kind=kind) as (writer, _, _):
        writer.close()
        with pytest.raises(trio.ClosedResourceError):
            await writer.write([b"x"], until_written=False)


async def test_streams_other_than_plain_tcp_are_written_by_trio() -> None:
    from trio.testing import memory_stream_pair

    client, server = memory_stream_pair()
    writer = FrameWriter(client)
    await writer.write([bytearray(b"ab"), b"cd"], until_written=False)
    assert await server.receive_some() == b"abcd"
    assert writer._native is None and not writer.threaded
    writer.close()


@native
async def test_the_kernel_never_takes_a_frame_ahead_of_a_queued_one() -> None:
    # The peer reads as fast as it can, so the kernel has room again and again while
    # the big frame's rest waits for the writer's thread: a small frame written to the
    # kernel then would land inside the big one.
    sequence: list[list[bytes | bytearray | memoryview]] = [[b"B" * (16 * BIG)]]
    sequence += [[b"<%05d>" % i] for i in range(20_000)]
    async with wire(read_delay=0.0) as (writer, _, got):
        with trio.fail_after(30):
            for parts in sequence:
                await writer.write(parts, until_written=False)
            await written_out(writer)
    assert bytes(got) == b"".join(joined(p) for p in sequence)


@native
async def test_a_write_that_fails_in_the_thread_fails_its_waiter_and_the_next_write() -> None:
    failures: list[BaseException] = []
    async with wire() as (writer, peer, _):  # the peer reads nothing: the big frame waits

        async def waiter() -> None:
            try:
                await writer.write([b"acks=0"], until_written=True)
            except trio.BrokenResourceError as exc:
                failures.append(exc)

        with trio.fail_after(5):
            await writer.write([b"w" * BIG], until_written=False)
            assert writer.threaded
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.sleep(0.05)
                reset(peer)  # while the thread waits to write: its next sendmsg fails
            assert len(failures) == 1
            with pytest.raises(trio.BrokenResourceError):
                await writer.write([b"next"], until_written=False)


@pytest.mark.parametrize("kind", ["native", "twin"])
async def test_a_write_is_a_checkpoint_and_a_cancelled_one_writes_nothing(kind: str) -> None:
    async with wire(kind=kind) as (writer, peer, _):
        with trio.testing.assert_checkpoints():
            await writer.write([b"one"], until_written=False)
        with trio.CancelScope() as scope:
            scope.cancel()
            await writer.write([b"two"], until_written=False)
        assert scope.cancelled_caught
        await writer.write([b"three"], until_written=True)
        data = b""
        while len(data) < 8:
            data += await trio.to_thread.run_sync(peer.recv, 100)
        assert data == b"onethree"


@native
async def test_close_wakes_a_waiter_the_thread_has_nothing_to_tell() -> None:
    # A waiter parked on the writer's pipe while its thread is idle (never started
    # here): only close() itself can wake it.
    outcome: list[BaseException] = []
    async with wire() as (writer, _, _):
        await writer.write([b"x"], until_written=False)  # (the native writer exists)
        assert not writer.threaded

        async def waiter() -> None:
            try:
                await writer._until_written(99)
            except trio.ClosedResourceError as exc:
                outcome.append(exc)

        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(waiter)
                await trio.sleep(0.05)
                writer.close()
    assert len(outcome) == 1


@native
def test_the_native_writer_refuses_to_write_once_closed() -> None:
    left, right = socket.socketpair()
    try:
        assert transport._writer_c is not None
        w = transport._writer_c.Writer(left.fileno())
        assert w.write([b"before"]) == 0  # (the kernel took it)
        w.close()
        with pytest.raises(OSError, match="Bad file descriptor"):
            w.write([b"after"])
        with pytest.raises(OSError, match="Bad file descriptor"):
            w.reap()
        assert right.recv(100) == b"before"
    finally:
        left.close()
        right.close()


def big_produce(size: int) -> object:
    from pipeline.protocol.messages.produce import (
        PartitionProduceData,
        ProduceRequest,
        TopicProduceData,
    )

    return ProduceRequest(acks=-1, timeout_ms=1000, topic_data=(TopicProduceData(
        name="t", partition_data=(PartitionProduceData(index=0, records=b"r" * size),)),))


@pytest.mark.parametrize("kind", ["native", "twin"])
async def test_a_connection_queues_its_requests_while_the_broker_reads_none(kind: str) -> None:
    # What the writer is for: Kafka reads a connection's next request only after it
    # answered the one before, and meanwhile the kernel holds ~200 KB of the request.
    # A connection whose requests are queued for its writer thread sends all it may
    # (max_in_flight) without the broker reading a byte; written by trio, a request
    # larger than what the kernel holds waits for the broker to read it.
    from pipeline.cluster.connection import BrokerConnection

    if kind == "native" and transport._writer_c is None:
        pytest.skip("pipeline.cluster._writer is not built")
    stream, peer = await tcp_pair()  # the "broker": reads nothing
    conn = BrokerConnection(stream, "127.0.0.1", 0)
    if kind == "twin":
        conn._writer._plain = False
    conn.api_versions = {}
    sent = 0
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(conn._run_reader)
            with trio.move_on_after(1.0):
                for _ in range(3):
                    await conn.send(big_produce(BIG), version=3)  # type: ignore[arg-type]
                    sent += 1
            await conn.aclose()
    finally:
        peer.close()
    assert sent == (3 if kind == "native" else 0)
    assert conn._writer._native is None or conn._writer._native.closed
