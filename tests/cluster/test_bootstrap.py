"""The first metadata request (bootstrap) fails fast and precisely; outages log once.

On the FakeCluster and the autojump clock, so times are exact: connect_timeout bounds
the bootstrap, the error names every address and its cause, addresses are tried
staggered, and each broker's outage is one WARNING (retries are DEBUG). Real sockets
(refused ports, names that do not resolve, silent listeners, TLS) are in
tests/integration/test_connect_failures.py.
"""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from pipeline.cluster import Cluster
from pipeline.cluster.errors import BootstrapError, MetadataTimeoutError
from pipeline.cluster.transport import Connector
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import MidpointRandom


class Network:
    """Wraps a connector: ``refused`` hosts refuse, ``silent`` hosts never complete the
    connect (a firewall dropping SYNs)."""

    def __init__(self, inner: Connector) -> None:
        self.inner = inner
        self.refused: set[str] = set()
        self.silent: set[str] = set()
        self.attempts: list[tuple[float, str]] = []

    async def __call__(self, host: str, port: int) -> trio.abc.Stream:
        self.attempts.append((trio.current_time(), host))
        if host in self.silent:
            await trio.sleep_forever()
        if host in self.refused:
            await trio.lowlevel.checkpoint()
            raise ConnectionRefusedError(111, "Connection refused")
        return await self.inner(host, port)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("pipeline") and r.levelno >= logging.WARNING]


async def test_refused_everywhere_fails_after_connect_timeout_naming_each_address(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="pipeline")
    net = Network(FakeCluster().connector)
    net.refused = {"a", "b"}
    async with Cluster.open("a:1,b:2", connector=net, rng=MidpointRandom(),
                            connect_timeout=2.0) as cluster:
        with pytest.raises(BootstrapError) as info:
            await cluster.partitions_for("t")
        assert trio.current_time() == 2.0  # not metadata_timeout (60 s)
    error = info.value
    assert isinstance(error, MetadataTimeoutError)  # what callers caught before
    assert error.causes == {"a:1": "connection refused", "b:2": "connection refused"}
    assert str(error) == ("cannot connect to any bootstrap broker (connect_timeout=2.0s): "
                          "a:1: connection refused; b:2: connection refused")
    # Each address retried on its own backoff (0.1, 0.2, 0.4, 0.8, 1.0 apart)...
    assert [t for t, h in net.attempts if h == "a"] == pytest.approx([0.0, 0.1, 0.3, 0.7, 1.5])
    # ...quietly: one WARNING per address, the retries at DEBUG.
    assert _warnings(caplog) == [
        "cannot connect to bootstrap broker a:1: connection refused (retrying; further "
        "failures are logged at DEBUG)",
        "cannot connect to bootstrap broker b:2: connection refused (retrying; further "
        "failures are logged at DEBUG)",
    ]
    retries = [r for r in caplog.records if r.getMessage().startswith("cannot connect to b")
               and r.levelno == logging.DEBUG]
    assert len(retries) == len(net.attempts) - 2


async def test_a_silent_address_is_reported_as_timed_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    net = Network(FakeCluster().connector)
    net.silent = {"a"}
    net.refused = {"b"}
    async with Cluster.open("a:1,b:2", connector=net, rng=MidpointRandom(),
                            connect_timeout=3.0) as cluster:
        with pytest.raises(BootstrapError) as info:
            await cluster.partitions_for("t")
        # A connector that never gives up (tcp_connector does, after connect_timeout)
        # holds the bootstrap for the last address's stagger (0.5 s) and a margin.
        assert trio.current_time() == pytest.approx(3.6)
    assert info.value.causes == {"a:1": "timed out: no answer after 3.6s",
                                 "b:2": "connection refused"}


async def test_a_later_address_starts_after_a_stagger_and_wins(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with FakeCluster.serve(brokers=1) as fake:
        fake.create_topic("t", 1)
        net = Network(fake.connector)
        net.silent = {"dead"}
        live = fake.bootstrap.split(",")[0]
        async with Cluster.open(f"dead:9092,{live}", connector=net,
                                rng=MidpointRandom()) as cluster:
            assert await cluster.partitions_for("t") == 1
            # The silent first address holds the second back by 0.25 s only; the
            # first's attempt is cancelled once the second connected.
            assert trio.current_time() == 0.25
            assert [h for _, h in net.attempts] == ["dead", live.split(":")[0]]


async def test_an_outage_after_bootstrap_is_one_warning_per_broker(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    """Later outages wait until metadata_timeout (no fail-fast once a broker was
    reached); each broker's is one WARNING, its end one INFO line."""
    caplog.set_level(logging.DEBUG, logger="pipeline")
    async with FakeCluster.serve(brokers=1) as fake:
        fake.create_topic("t", 1)
        net = Network(fake.connector)
        host = fake.bootstrap.split(":")[0]
        async with Cluster.open(fake.bootstrap, connector=net, rng=MidpointRandom(),
                                metadata_timeout=20.0) as cluster:
            await cluster.connection(0)
            caplog.clear()
            net.refused.add(host)
            fake.drop_connections(0)
            await trio.sleep(12.0)  # well past connect_timeout: still waiting
            net.refused.clear()
            await cluster.refresh(force=True)
            assert 0 in cluster.metadata.brokers
    warnings = _warnings(caplog)
    assert [w for w in warnings if "cannot connect" in w] == [
        f"cannot connect to broker 0 ({host}:9092): connection refused (retrying; "
        "further failures are logged at DEBUG)"]
    assert not [w for w in warnings if "metadata" in w]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any(m.startswith(f"connected to broker 0 ({host}:9092) after ") for m in infos)
