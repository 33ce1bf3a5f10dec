"""What a connection counts into its broker's statistics (cluster/stats.py), against the
scripted broker on virtual time: requests and bytes written, responses and bytes read,
round trips, throttle times, top-level error codes, timeouts and lost connections."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from pipeline.cluster.errors import ConfigError, RequestTimedOutError
from pipeline.cluster.stats import BrokerStats, check_statistics_options
from pipeline.protocol.codec import encode_request
from pipeline.protocol.messages.find_coordinator import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
)
from pipeline.protocol.messages.metadata import MetadataRequest, MetadataResponse
from pipeline.util.stats import Summary

from .conftest import Connect
from .scripted_broker import ScriptedBroker


async def test_round_trips_throttle_and_bytes(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    conn = await connect(client_id="stats")
    stats = conn.stats
    handshake_bytes = stats.sent_bytes  # (the ApiVersions request)
    assert (stats.requests, stats.responses, stats.by_api) == (1, 1, {18: 1})
    request = MetadataRequest()
    frame_size = len(encode_request(request, version=conn.version_for(request.API_KEY),
                                    correlation_id=1, client_id="stats"))
    pendings = [await conn.send(request) for _ in range(3)]
    arrived = [await broker.next_request() for _ in range(3)]
    for delay, throttle_ms, received in zip((0.5, 0.25, 1.0), (0, 250, 1500), arrived,
                                            strict=True):
        await trio.sleep(delay)
        await broker.reply(received, MetadataResponse(throttle_time_ms=throttle_ms))
    for p in pendings:
        await p.wait()
    assert stats.sent_bytes == handshake_bytes + 3 * frame_size
    assert stats.requests == stats.responses == 4
    snap = stats.snapshot(conn.in_flight)
    assert snap.requests_by_api == {"Metadata": 3, "ApiVersions": 1}
    # Answered 0.5, 0.75 and 1.75 s after they were written (all at t=0), the
    # handshake at once.
    assert snap.rtt == Summary(4, 3.0, 4, 0.0, 1.75, 0.5, 1.75, 1.75)
    # ApiVersions v3 carries a throttle time too (0).
    assert snap.throttle == Summary(4, 1.75, 4, 0.0, 1.5, 0.0, 1.5, 1.5)
    assert snap.received_bytes == stats.received_bytes > 0
    assert (snap.state, snap.in_flight_requests, snap.errors) == ("up", 0, {})


async def test_top_level_error_codes_are_counted_by_name(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    broker.api_versions[10] = (0, 4)  # FindCoordinator
    conn = await connect()
    for code in (15, 15, 0):  # COORDINATOR_NOT_AVAILABLE twice, then none
        pending = await conn.send(FindCoordinatorRequest(key="g"), version=1)
        await broker.reply(await broker.next_request(), FindCoordinatorResponse(error_code=code))
        await pending.wait()
    conn.stats.error(6, 3)  # what a client adds: a partition's NOT_LEADER_OR_FOLLOWER
    conn.stats.error(0)  # NONE is no error
    assert conn.stats.snapshot(0).errors == {
        "COORDINATOR_NOT_AVAILABLE": 2, "NOT_LEADER_OR_FOLLOWER": 3}


async def test_timeouts_and_lost_connections(
    connect: Connect, broker: ScriptedBroker, autojump_clock: trio.testing.MockClock
) -> None:
    conn = await connect(request_timeout=5.0)
    pending = await conn.send(MetadataRequest())
    with pytest.raises(RequestTimedOutError):
        await pending.wait()
    snap = conn.stats.snapshot(None)
    assert (snap.timeouts, snap.disconnects, snap.state, snap.responses) == (1, 1, "down", 1)
    # A connection closed by the client itself is not lost.
    other = await connect()
    await other.aclose()
    assert other.stats.disconnects == 0


def test_a_fresh_broker_has_empty_windows() -> None:
    snap = BrokerStats(3, "h:1").snapshot(None)
    assert snap.rtt == Summary() and snap.rtt.p50 is None
    assert (snap.node_id, snap.address, snap.state) == (3, "h:1", "down")
    assert snap.to_dict()["rtt"]["p99"] is None


def test_the_statistics_options_check() -> None:
    check_statistics_options(0, None)
    check_statistics_options(2.5, print)
    for interval, callback in ((-1, None), (float("nan"), print), (1, 42), (1, None),
                               (0, print)):
        with pytest.raises(ConfigError):
            check_statistics_options(interval, callback)
