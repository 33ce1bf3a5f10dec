"""TLS through the transport seam: tcp_connector(ssl_context=...) end to end.

A TLS terminator (trio.serve_ssl_over_tcp with a trustme certificate for
127.0.0.1) sits in front of a FakeCluster broker served on real TCP; the
broker advertises the terminator's port, so bootstrap, metadata, the
idempotent producer's InitProducerId and Produce all go over TLS. A client
that does not trust the certificate fails the handshake with a clear error.
"""

from __future__ import annotations

import ssl
from functools import partial

import pytest
import trio

from pipeline import BrokerConnectionError, open_producer
from pipeline.cluster.transport import tcp_connector
from pipeline.testing.fake_cluster import FakeCluster

trustme = pytest.importorskip("trustme")


async def _pipe(source: trio.abc.Stream, sink: trio.abc.Stream) -> None:
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(sink)


async def _tls_front(nursery: trio.Nursery, upstream_port: int) -> tuple[int, ssl.SSLContext]:
    """Terminate TLS on a free loopback port and forward to upstream_port."""
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    async def handle(tls: trio.SSLStream[trio.SocketStream]) -> None:
        plain = await trio.open_tcp_stream("127.0.0.1", upstream_port)
        async with trio.open_nursery() as pipes:
            pipes.start_soon(_pipe, tls, plain)
            pipes.start_soon(_pipe, plain, tls)

    listeners = await nursery.start(
        partial(trio.serve_ssl_over_tcp, handle, 0, server_ctx, host="127.0.0.1")
    )
    port = listeners[0].transport_listener.socket.getsockname()[1]
    return port, client_ctx


async def test_producer_round_trip_over_tls(nursery: trio.Nursery) -> None:
    fake = FakeCluster(brokers=1, tcp=True, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("secure", 2)
    broker = fake.state.brokers[0]
    tls_port, client_ctx = await _tls_front(nursery, broker.port)
    broker.port = tls_port  # Metadata now advertises the TLS front, as a TLS listener would

    with trio.fail_after(20):
        async with open_producer(
            f"127.0.0.1:{tls_port}", connector=tcp_connector(ssl_context=client_ctx)
        ) as producer:
            metas = [await producer.send_and_wait("secure", b"v%d" % i, partition=i % 2)
                     for i in range(6)]
    assert [(m.partition, m.offset) for m in metas] == [(i % 2, i // 2) for i in range(6)]
    assert [e.record.value for e in fake.log("secure", 0)] == [b"v0", b"v2", b"v4"]
    assert {r.api_key for r in fake.requests} >= {18, 3, 22, 0}  # ApiVersions .. Produce


async def test_untrusted_certificate_fails_clearly(nursery: trio.Nursery) -> None:
    fake = FakeCluster(brokers=1, tcp=True)
    await nursery.start(fake.run)
    tls_port, _ = await _tls_front(nursery, fake.state.brokers[0].port)
    stranger = ssl.create_default_context()  # trusts only the system CAs
    with trio.fail_after(20), pytest.raises(BrokerConnectionError, match="bootstrap"):
        async with open_producer(
            f"127.0.0.1:{tls_port}",
            connector=tcp_connector(ssl_context=stranger),
            request_timeout=2.0,
        ):
            pass  # pragma: no cover - the block is never entered
