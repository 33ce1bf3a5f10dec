"""KIP-368 re-authentication on one connection, step by step against the scripted broker.

The interleavings pinned here last zero virtual time, which the FakeCluster (it serves a
connection's requests one at a time, as Kafka does) cannot show: requests in flight when
the re-authentication starts, their answers arriving between its requests, and a request
sent meanwhile held back until it is done.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import trio

from pipeline.cluster.config import ClusterConfig
from pipeline.cluster.connection import BrokerConnection
from pipeline.cluster.errors import SaslAuthenticationError
from pipeline.cluster.transport import MemoryNetwork
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.metadata import MetadataRequest, MetadataResponse
from pipeline.protocol.messages.sasl_authenticate import SaslAuthenticateResponse
from pipeline.protocol.messages.sasl_handshake import SaslHandshakeResponse

from .conftest import HOST, PORT, MidpointRandom
from .scripted_broker import DEFAULT_VERSIONS, ScriptedBroker

SASL_VERSIONS = {**DEFAULT_VERSIONS, ApiKey.SASL_HANDSHAKE: (0, 1),
                 ApiKey.SASL_AUTHENTICATE: (0, 2)}


@pytest.fixture
async def sasl_broker(net: MemoryNetwork, nursery: trio.Nursery) -> ScriptedBroker:
    b = ScriptedBroker(api_versions=SASL_VERSIONS)
    await nursery.start(b.serve, net.listen(HOST, PORT))
    return b


def config(**overrides: Any) -> ClusterConfig:
    options: dict[str, Any] = dict(
        security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="alice",
        sasl_password="alice-pw", rng=MidpointRandom(), request_timeout=60.0,
    )
    options.update(overrides)
    return ClusterConfig(**options)


async def authenticate(broker: ScriptedBroker, lifetime_ms: int) -> None:
    """Answer one SaslHandshake + PLAIN SaslAuthenticate."""
    handshake = await broker.next_request()
    assert handshake.api_key == ApiKey.SASL_HANDSHAKE
    assert handshake.request.mechanism == "PLAIN"
    await broker.reply(handshake, SaslHandshakeResponse(mechanisms=("PLAIN",)))
    auth = await broker.next_request()
    assert auth.api_key == ApiKey.SASL_AUTHENTICATE
    assert auth.request.auth_bytes == b"\x00alice\x00alice-pw"
    await broker.reply(auth, SaslAuthenticateResponse(session_lifetime_ms=lifetime_ms))


async def connect(nursery: trio.Nursery, net: MemoryNetwork, broker: ScriptedBroker,
                  lifetime_ms: int) -> BrokerConnection:
    box: list[BrokerConnection] = []

    async def run() -> None:
        box.append(await BrokerConnection.connect(nursery, net.connect, HOST, PORT,
                                                  config=config()))

    async with trio.open_nursery() as inner:
        inner.start_soon(run)
        await authenticate(broker, lifetime_ms)
    return box[0]


async def test_reauthentication_between_requests_loses_no_in_flight_response(
    nursery: trio.Nursery, net: MemoryNetwork, sasl_broker: ScriptedBroker, autojump_clock: Any
) -> None:
    broker = sasl_broker
    conn = await connect(nursery, net, broker, lifetime_ms=1000)
    t0 = trio.current_time()
    assert conn.session_lifetime == 1.0
    pending = [await conn.send(MetadataRequest(topics=())) for _ in range(3)]
    in_flight = [await broker.next_request() for _ in range(3)]
    # 85% + 10% * 0.5 of the lifetime (MidpointRandom): the re-authentication starts.
    await trio.sleep_until(t0 + 0.9)
    await trio.testing.wait_all_tasks_blocked()
    handshake = broker.inbox.receive_nowait()
    assert handshake.api_key == ApiKey.SASL_HANDSHAKE
    assert trio.current_time() == t0 + 0.9

    # A request sent now waits for the re-authentication (never between its requests).
    late: list[Any] = []

    async def send_late() -> None:
        late.append(await conn.request(MetadataRequest(topics=())))

    nursery.start_soon(send_late)
    await trio.testing.wait_all_tasks_blocked()
    with pytest.raises(trio.WouldBlock):
        broker.inbox.receive_nowait()

    # Old answers arrive before, between and after the re-authentication's own.
    await broker.reply(in_flight[1], MetadataResponse(cluster_id="one"))
    await broker.reply(handshake, SaslHandshakeResponse(mechanisms=("PLAIN",)))
    auth = await broker.next_request()
    assert auth.api_key == ApiKey.SASL_AUTHENTICATE
    await broker.reply(in_flight[0], MetadataResponse(cluster_id="zero"))
    await trio.testing.wait_all_tasks_blocked()
    with pytest.raises(trio.WouldBlock):
        broker.inbox.receive_nowait()  # still nothing after SaslAuthenticate
    await broker.reply(auth, SaslAuthenticateResponse(session_lifetime_ms=2000))
    after = await broker.next_request()
    assert after.api_key == ApiKey.METADATA
    await broker.reply(in_flight[2], MetadataResponse(cluster_id="two"))
    await broker.reply(after, MetadataResponse(cluster_id="late"))
    answers = [(await p.wait()).cluster_id for p in pending]
    assert answers == ["zero", "one", "two"]
    await trio.testing.wait_all_tasks_blocked()
    assert [r.cluster_id for r in late] == ["late"]
    assert conn.reauthentications == 1
    assert conn.session_lifetime == 2.0
    assert not conn.closed
    assert broker.connections == 1
    # The next one is due at 90% of the new 2 s lifetime.
    await trio.sleep_until(t0 + 0.9 + 1.8 - 0.001)
    with pytest.raises(trio.WouldBlock):
        broker.inbox.receive_nowait()
    await trio.sleep(0.001)
    assert (await broker.next_request()).api_key == ApiKey.SASL_HANDSHAKE


async def test_refused_reauthentication_closes_the_connection_with_the_reason(
    nursery: trio.Nursery, net: MemoryNetwork, sasl_broker: ScriptedBroker, autojump_clock: Any
) -> None:
    broker = sasl_broker
    conn = await connect(nursery, net, broker, lifetime_ms=1000)
    await trio.sleep(0.95)
    handshake = await broker.next_request()
    errors: list[BaseException] = []

    async def send_late() -> None:
        try:
            await conn.send(MetadataRequest(topics=()))
        except Exception as exc:
            errors.append(exc)

    nursery.start_soon(send_late)
    await broker.reply(handshake, SaslHandshakeResponse(mechanisms=("PLAIN",)))
    auth = await broker.next_request()
    await broker.reply(auth, SaslAuthenticateResponse(
        error_code=ErrorCode.SASL_AUTHENTICATION_FAILED,
        error_message="Authentication failed: Invalid username or password"))
    await trio.testing.wait_all_tasks_blocked()
    assert conn.closed
    [error] = errors
    assert isinstance(error, SaslAuthenticationError)
    assert "user 'alice'" in str(error) and "alice-pw" not in str(error)
    with pytest.raises(SaslAuthenticationError):
        await conn.send(MetadataRequest(topics=()))


async def test_no_lifetime_means_no_reauthentication(
    nursery: trio.Nursery, net: MemoryNetwork, sasl_broker: ScriptedBroker, autojump_clock: Any
) -> None:
    conn = await connect(nursery, net, sasl_broker, lifetime_ms=0)
    assert conn.session_lifetime == 0
    await trio.sleep(10_000)
    await trio.testing.wait_all_tasks_blocked()
    with pytest.raises(trio.WouldBlock):
        sasl_broker.inbox.receive_nowait()
    assert conn.reauthentications == 0
    assert not math.isnan(conn.session_lifetime)
