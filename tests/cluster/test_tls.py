"""TLS through the transport seam: tcp_connector(ssl_context=...) end to end.

A TLS terminator (trio.serve_ssl_over_tcp with a trustme certificate for
127.0.0.1) sits in front of a FakeCluster broker served on real TCP; the
broker advertises the terminator's port, so bootstrap, metadata, the
idempotent producer's InitProducerId and Produce all go over TLS. A client
that does not trust the certificate fails the handshake with a clear error,
at once (not retried until request_timeout).
"""

from __future__ import annotations

import ssl
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from pipeline import open_producer
from pipeline.cluster.errors import (
    TlsCertificateError,
    TlsClientCertificateError,
    TlsHostnameError,
)
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


async def _relay(tls: trio.SSLStream[trio.SocketStream], upstream_port: int) -> None:
    """Forward one TLS connection to the plaintext broker on upstream_port, both ways."""
    plain = await trio.open_tcp_stream("127.0.0.1", upstream_port)
    async with trio.open_nursery() as pipes:
        pipes.start_soon(_pipe, tls, plain)
        pipes.start_soon(_pipe, plain, tls)


async def _serve_tls(nursery: trio.Nursery, handle: Any, server_ctx: ssl.SSLContext) -> int:
    """Serve ``handle`` over TLS on a free loopback port; returns the port."""
    listeners = await nursery.start(
        partial(trio.serve_ssl_over_tcp, handle, 0, server_ctx, host="127.0.0.1")
    )
    port: int = listeners[0].transport_listener.socket.getsockname()[1]
    return port


async def _tls_front(nursery: trio.Nursery, upstream_port: int) -> tuple[int, ssl.SSLContext]:
    """Terminate TLS on a free loopback port and forward to upstream_port."""
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)

    port = await _serve_tls(nursery, partial(_relay, upstream_port=upstream_port), server_ctx)
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
    started = trio.current_time()
    with trio.fail_after(20), pytest.raises(TlsCertificateError, match="not trusted") as info:
        async with open_producer(
            f"127.0.0.1:{tls_port}",
            connector=tcp_connector(ssl_context=stranger),
            request_timeout=10.0,
        ):
            pass  # pragma: no cover - the block is never entered
    assert f"bootstrap broker 127.0.0.1:{tls_port}" in str(info.value)
    assert "ssl_cafile" in str(info.value)
    assert trio.current_time() - started < 5.0  # failed at once, not after request_timeout


# ---------------------------------------------------------------------------- from options


async def _tls_front_files(nursery: trio.Nursery, upstream_port: int, tmp: Path, *,
                           client_ca: Any = None) -> tuple[int, str]:
    """A TLS front for 127.0.0.1 (only that IP in its certificate); with ``client_ca``
    it requires a client certificate signed by that CA (mTLS). Returns (port, ca file)."""
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    if client_ca is not None:
        server_ctx.verify_mode = ssl.CERT_REQUIRED
        client_ca.configure_trust(server_ctx)
    ca_file = tmp / f"ca-{upstream_port}.pem"
    ca.cert_pem.write_to_path(str(ca_file))

    async def handle(tls: trio.SSLStream[trio.SocketStream]) -> None:
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError:
            # Send the alert OpenSSL queued (certificate_required), as Kafka's TLS stack
            # does; trio drops it when the handshake fails (private API: tests only).
            await tls.transport_stream.send_all(tls._outgoing.read())  # type: ignore[attr-defined]
            return
        await _relay(tls, upstream_port)

    return await _serve_tls(nursery, handle, server_ctx), str(ca_file)


async def _fronted_fake(nursery: trio.Nursery, tmp: Path, **kwargs: Any
                        ) -> tuple[FakeCluster, int, str]:
    fake = FakeCluster(brokers=1, tcp=True, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("secure", 1)
    broker = fake.state.brokers[0]
    port, ca_file = await _tls_front_files(nursery, broker.port, tmp, **kwargs)
    broker.port = port
    return fake, port, ca_file


async def test_ssl_from_options_round_trip(nursery: trio.Nursery, tmp_path: Path) -> None:
    fake, port, ca_file = await _fronted_fake(nursery, tmp_path)
    with trio.fail_after(20):
        async with open_producer(f"127.0.0.1:{port}", security_protocol="SSL",
                                 ssl_cafile=ca_file) as producer:
            meta = await producer.send_and_wait("secure", b"over tls")
    assert meta.offset == 0
    assert [e.record.value for e in fake.log("secure", 0)] == [b"over tls"]


async def test_hostname_mismatch_is_named(nursery: trio.Nursery, tmp_path: Path) -> None:
    _, port, ca_file = await _fronted_fake(nursery, tmp_path)
    with trio.fail_after(20), pytest.raises(TlsHostnameError, match="does not match") as info:
        async with open_producer(f"localhost:{port}", security_protocol="SSL",
                                 ssl_cafile=ca_file, request_timeout=10.0):
            pass  # pragma: no cover
    assert f"localhost:{port}" in str(info.value)
    # The same name with the check off (tests only) connects.
    with trio.fail_after(20):
        async with open_producer(f"localhost:{port}", security_protocol="SSL",
                                 ssl_cafile=ca_file, ssl_check_hostname=False) as producer:
            await producer.send_and_wait("secure", b"x")


async def test_mtls_client_certificate(nursery: trio.Nursery, tmp_path: Path) -> None:
    client_ca = trustme.CA()
    _, port, ca_file = await _fronted_fake(nursery, tmp_path, client_ca=client_ca)
    started = trio.current_time()
    with trio.fail_after(20), pytest.raises(TlsClientCertificateError,
                                            match="refused the client certificate"):
        async with open_producer(f"127.0.0.1:{port}", security_protocol="SSL",
                                 ssl_cafile=ca_file, request_timeout=10.0):
            pass  # pragma: no cover
    assert trio.current_time() - started < 5.0
    leaf = client_ca.issue_cert("client@example")
    cert, key = tmp_path / "client.pem", tmp_path / "client.key"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    with trio.fail_after(20):
        async with open_producer(f"127.0.0.1:{port}", security_protocol="SSL",
                                 ssl_cafile=ca_file, ssl_certfile=str(cert),
                                 ssl_keyfile=str(key)) as producer:
            assert (await producer.send_and_wait("secure", b"m")).offset == 0
