"""BrokerConnection against a scripted in-memory broker, on trio's autojump clock."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

from pipeline.cluster.connection import BrokerConnection, PendingResponse
from pipeline.cluster.errors import (
    BrokerConnectionError,
    BrokerProtocolError,
    RequestTimedOutError,
)
from pipeline.cluster.transport import MemoryNetwork, parse_address
from pipeline.protocol.api import ApiKey
from pipeline.protocol.messages.api_versions import ApiVersionsRequest
from pipeline.protocol.messages.metadata import MetadataRequest, MetadataResponse
from pipeline.protocol.messages.produce import ProduceRequest, ProduceResponse

from .conftest import HOST, PORT, Connect
from .scripted_broker import ScriptedBroker


def md(i: int) -> MetadataResponse:
    """A response recognisable by its controller id."""
    return MetadataResponse(controller_id=i)


# ---------------------------------------------------------------- handshake


async def test_handshake_negotiates_versions(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    conn = await connect()
    assert conn.api_versions[ApiKey.METADATA] == 12
    assert conn.api_versions[ApiKey.PRODUCE] == 11
    assert conn.api_versions[ApiKey.API_VERSIONS] == 3
    assert ApiKey.FETCH not in conn.api_versions  # the broker does not list it
    [hello] = broker.received
    assert (hello.api_key, hello.version) == (18, 3)
    assert isinstance(hello.request, ApiVersionsRequest)
    assert hello.request.client_software_name == "trio-kafka-pipeline"
    assert trio.current_time() == 0.0
    assert not conn.closed


@pytest.mark.parametrize("broker_max", [0, 2])
async def test_api_versions_unsupported_version_falls_back(
    net: MemoryNetwork,
    nursery: trio.Nursery,
    broker_max: int,
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Kafka answers an ApiVersions request newer than it knows with
    # UNSUPPORTED_VERSION in a v0-format body listing its own ApiVersions range.
    broker = ScriptedBroker(max_api_versions_version=broker_max)
    await nursery.start(broker.serve, net.listen(HOST, PORT))
    conn = await BrokerConnection.connect(nursery, net.connect, HOST, PORT)
    assert [r.version for r in broker.received] == [3, broker_max]
    assert conn.api_versions[ApiKey.METADATA] == 12
    assert conn.api_versions[ApiKey.API_VERSIONS] == 3  # what the broker's list says
    assert trio.current_time() == 0.0


async def test_connect_refused_is_broker_connection_error(
    net: MemoryNetwork, nursery: trio.Nursery
) -> None:
    with pytest.raises(BrokerConnectionError, match="nowhere:1"):
        await BrokerConnection.connect(nursery, net.connect, "nowhere", 1)


async def test_connect_into_a_closed_nursery_fails_at_once_and_closes_the_stream(
    net: MemoryNetwork, nursery: trio.Nursery
) -> None:
    """A connection whose reader task cannot start (its nursery is closed: the stage
    that owned it has ended) raises the nursery's error and closes the stream at once;
    it must not wait, shielded and forever, for a reader that never ran."""
    broker = ScriptedBroker()
    await nursery.start(broker.serve, net.listen(HOST, PORT))
    streams: list[trio.abc.Stream] = []

    async def connect(host: str, port: int) -> trio.abc.Stream:
        streams.append(await net.connect(host, port))
        return streams[-1]

    async with trio.open_nursery() as closed:
        pass
    with trio.fail_after(5), pytest.raises(RuntimeError, match="closed"):
        await BrokerConnection.connect(closed, connect, HOST, PORT)
    (stream,) = streams
    with pytest.raises(trio.ClosedResourceError):
        await stream.send_all(b"x")
    assert broker.received == []


async def test_handshake_timeout(
    net: MemoryNetwork, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    silent = ScriptedBroker(answer_api_versions=False)
    await nursery.start(silent.serve, net.listen(HOST, PORT))
    with pytest.raises(RequestTimedOutError):
        await BrokerConnection.connect(nursery, net.connect, HOST, PORT, request_timeout=3.0)
    assert trio.current_time() == 3.0


# ------------------------------------------------------------- pipelining


async def test_pipelined_requests_get_ordered_responses(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    conn = await connect(max_in_flight=5)
    pendings = [await conn.send(MetadataRequest()) for _ in range(5)]
    # All five are on the wire before any answer: pipelined.
    arrived = [await broker.next_request() for _ in range(5)]
    assert [r.correlation_id for r in arrived] == [p.correlation_id for p in pendings]
    assert len({p.correlation_id for p in pendings}) == 5
    assert conn.in_flight == 5
    for i, received in enumerate(arrived):
        await trio.sleep(1)
        await broker.reply(received, md(i))
    results = [await p.wait() for p in pendings]
    assert [r.controller_id for r in results] == [0, 1, 2, 3, 4]
    assert conn.in_flight == 0
    assert trio.current_time() == 5.0


async def test_responses_are_matched_by_correlation_id(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    conn = await connect()
    pendings = [await conn.send(MetadataRequest()) for _ in range(3)]
    arrived = [await broker.next_request() for _ in range(3)]
    for received in reversed(arrived):  # Kafka never does this; we still match by id
        await broker.reply(received, md(received.correlation_id))
    for p in pendings:
        assert (await p.wait()).controller_id == p.correlation_id


async def test_max_in_flight_is_respected_on_the_wire(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    conn = await connect(max_in_flight=2)
    results: dict[int, int] = {}

    async def caller(i: int) -> None:
        results[i] = (await conn.request(MetadataRequest())).controller_id

    async with trio.open_nursery() as callers:
        for i in range(6):
            callers.start_soon(caller, i)
        for _n in range(6):
            received = await broker.next_request()
            assert broker.outstanding <= 2
            await trio.sleep(1)  # the broker takes 1 s per request
            await broker.reply(received, md(received.correlation_id))
    assert broker.max_outstanding == 2
    # Two go out at t=0; each answer frees the slot for the next one.
    assert [r.time for r in broker.received[1:]] == [0.0, 0.0, 1.0, 2.0, 3.0, 4.0]
    assert trio.current_time() == 6.0
    assert sorted(results.values()) == [r.correlation_id for r in broker.received[1:]]
    assert conn.in_flight == 0


async def test_slot_waiters_are_woken_when_the_connection_fails(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    conn = await connect(max_in_flight=1, request_timeout=5.0)
    first = await conn.send(MetadataRequest())
    failures: list[BaseException] = []

    async def blocked_sender() -> None:
        try:
            await conn.send(MetadataRequest())
        except BrokerConnectionError as exc:
            failures.append(exc)

    async with trio.open_nursery() as n:
        n.start_soon(blocked_sender)
        with pytest.raises(RequestTimedOutError):
            await first.wait()
    assert len(failures) == 1
    assert trio.current_time() == 5.0
    assert len(broker.received) == 2  # ApiVersions + the first request only


async def test_a_wait_for_a_slot_ends_at_its_scopes_deadline_even_when_moved(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    """send_before waits for a request slot until its scope's deadline, which the caller
    may move earlier while it waits (a broker producer does, for what arrives meanwhile):
    None then, nothing written and no slot taken. A slot freed in time is taken."""
    conn = await connect(max_in_flight=1, request_timeout=50.0)
    first = await conn.send(MetadataRequest())
    wait = trio.CancelScope(deadline=10.0)
    outcome: list[Any] = []

    async def waiter() -> None:
        outcome.append(await conn.send_before(MetadataRequest(), wait))

    async with trio.open_nursery() as n:
        n.start_soon(waiter)
        await trio.sleep(1.0)
        wait.deadline = 3.0  # (moved earlier while it waits)
    assert outcome == [None] and trio.current_time() == 3.0
    assert len(broker.received) == 2 and conn.in_flight == 1  # (the first request's slot)
    received = await broker.next_request()
    await broker.reply(received, md(received.correlation_id))
    await first.wait()
    pending = await conn.send_before(MetadataRequest(), trio.CancelScope(deadline=4.0))
    assert pending is not None and conn.in_flight == 1


# ---------------------------------------------------------------- timeouts


async def test_request_timeout_closes_connection_and_fails_all_pending(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    conn = await connect(request_timeout=5.0)
    a = await conn.send(MetadataRequest())
    await trio.sleep(1)
    b = await conn.send(MetadataRequest())
    errors: list[tuple[float, RequestTimedOutError]] = []

    async def waiter(p: PendingResponse) -> None:
        try:
            await p.wait()
        except RequestTimedOutError as exc:
            errors.append((trio.current_time(), exc))

    async with trio.open_nursery() as n:
        n.start_soon(waiter, a)
        n.start_soon(waiter, b)
    # The oldest request's deadline (t=5) closes the connection; b fails with it.
    assert [t for t, _ in errors] == [5.0, 5.0]
    assert all(e.retriable for _, e in errors)
    assert "within 5.0s" in str(errors[0][1])
    assert conn.closed
    assert conn.in_flight == 0
    with pytest.raises(BrokerConnectionError):
        await conn.send(MetadataRequest())
    await trio.testing.wait_all_tasks_blocked()
    assert broker.connections == 1


async def test_timeout_deadline_follows_the_oldest_pending_request(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    conn = await connect(request_timeout=5.0)
    await trio.sleep(100)  # idle connections never time out
    assert not conn.closed
    a = await conn.send(MetadataRequest())  # t=100, deadline 105
    await trio.sleep(3)
    b = await conn.send(MetadataRequest())  # t=103, deadline 108
    await broker.reply(await broker.next_request(), md(1))
    assert (await a.wait()).controller_id == 1
    with pytest.raises(RequestTimedOutError):
        await b.wait()
    assert trio.current_time() == 108.0


# ---------------------------------------------------------- unmatched / acks=0


async def test_unmatched_response_is_dropped_without_harm(
    connect: Connect,
    broker: ScriptedBroker,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn = await connect()
    pending = await conn.send(MetadataRequest())
    received = await broker.next_request()
    with caplog.at_level(logging.WARNING, logger="pipeline.cluster"):
        await broker.reply(received, md(7), correlation_id=999_999)
        await broker.reply(received, md(8))
        assert (await pending.wait()).controller_id == 8
    assert conn.unmatched_responses == 1
    assert "unknown correlation id 999999" in caplog.text
    assert not conn.closed


async def test_acks_0_expects_no_response_and_tansu_style_answer_is_dropped(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    conn = await connect(max_in_flight=1)
    fire = await conn.send(ProduceRequest(acks=0, timeout_ms=1000), expect_response=False)
    assert fire.done
    assert await fire.wait() is None
    assert conn.in_flight == 0  # acks=0 takes no in-flight slot
    produce = await broker.next_request()
    # tansu answers acks=0 anyway; the connection must shrug it off.
    pending = await conn.send(MetadataRequest())
    await broker.reply(produce, ProduceResponse())
    await broker.reply(await broker.next_request(), md(3))
    assert (await pending.wait()).controller_id == 3
    assert conn.unmatched_responses == 1
    assert not conn.closed


# ------------------------------------------------------------ cancellation


async def test_cancelled_waiter_leaves_connection_usable(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    conn = await connect(max_in_flight=1)
    with trio.move_on_after(1) as scope:
        await conn.request(MetadataRequest())
    assert scope.cancelled_caught
    assert conn.in_flight == 1  # still on the wire: never treated as unsent
    first = await broker.next_request()

    later: list[int] = []

    async def second() -> None:
        later.append((await conn.request(MetadataRequest())).controller_id)

    async with trio.open_nursery() as n:
        n.start_soon(second)
        await trio.sleep(1)
        # The second request waits for the slot the cancelled one still holds.
        assert len(broker.received) == 2
        await broker.reply(first, md(1))  # consumed and discarded at t=2
        received = await broker.next_request()
        assert received.time == 2.0
        await broker.reply(received, md(2))
    assert later == [2]
    assert conn.in_flight == 0
    assert not conn.closed


async def test_response_still_reaches_a_remaining_waiter(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    conn = await connect()
    pending = await conn.send(MetadataRequest())
    got: list[Any] = []

    async def patient() -> None:
        got.append(await pending.wait())

    async with trio.open_nursery() as n:
        n.start_soon(patient)
        with trio.move_on_after(1):
            await pending.wait()
        await broker.reply(await broker.next_request(), md(5))
    assert [r.controller_id for r in got] == [5]


async def test_cancel_during_partial_write_closes_the_connection(
    nursery: trio.Nursery,
    broker: ScriptedBroker,
    net: MemoryNetwork,
    autojump_clock: trio.testing.MockClock,
) -> None:
    streams: list[trio.StapledStream[Any, Any]] = []

    async def connector(host: str, port: int) -> trio.abc.Stream:
        stream = await net.connect(host, port)
        assert isinstance(stream, trio.StapledStream)
        streams.append(stream)
        return stream

    conn = await BrokerConnection.connect(nursery, connector, HOST, PORT)
    other = await conn.send(MetadataRequest())
    await broker.next_request()
    # From now on every write hangs after the bytes entered the stream's buffer.
    send_stream = streams[0].send_stream
    pump = send_stream.send_all_hook

    async def stuck() -> None:
        await trio.sleep_forever()

    send_stream.send_all_hook = stuck
    with trio.move_on_after(1):
        await conn.send(MetadataRequest())
    send_stream.send_all_hook = pump
    assert conn.closed
    with pytest.raises(BrokerConnectionError, match="cancelled while being written"):
        await other.wait()
    assert trio.current_time() == 1.0


# ------------------------------------------------------------ bad streams


@pytest.mark.parametrize(
    ("raw", "what"),
    [
        (b"\xff\xff\xff\xf0", "negative frame size"),
        (b"\x00\x00\x00\x02\x00\x00", "frame shorter than a header"),
        ("garbage body", "body that does not decode"),
    ],
)
async def test_malformed_frame_closes_connection_with_protocol_error(
    connect: Connect,
    broker: ScriptedBroker,
    raw: bytes | str,
    what: str,
    autojump_clock: trio.testing.MockClock,
) -> None:
    conn = await connect()
    first = await conn.send(MetadataRequest())
    second = await conn.send(MetadataRequest())
    received = await broker.next_request()
    if isinstance(raw, str):
        # The right correlation id, then a topics array claiming 2**31-1 entries.
        raw = (
            (4 + 1 + 4).to_bytes(4, "big")
            + received.correlation_id.to_bytes(4, "big")
            + b"\x00"  # response header v1: no tagged fields
            + b"\x00\x00\x00\x00"  # throttle_time_ms
            # then nothing: the brokers array is truncated
        )
    await broker.send_raw(received.stream, raw)
    for p in (first, second):
        with pytest.raises(BrokerProtocolError):
            await p.wait()
    assert conn.closed
    assert trio.current_time() == 0.0


async def test_broker_closing_the_stream_fails_pending(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    conn = await connect()
    pending = await conn.send(MetadataRequest())
    received = await broker.next_request()
    await trio.sleep(2)
    await received.stream.aclose()
    with pytest.raises(BrokerConnectionError, match="closed by the broker"):
        await pending.wait()
    assert conn.closed
    assert trio.current_time() == 2.0


async def test_aclose_fails_pending_and_is_idempotent(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    conn = await connect()
    pending = await conn.send(MetadataRequest())
    await conn.aclose()
    await conn.aclose()
    with pytest.raises(BrokerConnectionError, match="closed by the client"):
        await pending.wait()
    assert conn.closed


def test_parse_address() -> None:
    assert parse_address("h:1") == ("h", 1)
    assert parse_address(" h ") == ("h", 9092)
    assert parse_address("[::1]:19092") == ("::1", 19092)
    with pytest.raises(ValueError, match="bad port"):
        parse_address("h:x")
