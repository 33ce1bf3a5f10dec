"""Cluster metadata and the broker pool, against the FakeCluster on the autojump clock.

The rng fixture's ``random()`` is always 0.5, so jittered backoffs equal their
nominal values (retry_backoff=0.1 doubling up to retry_backoff_max=1.0) and the
exact virtual times below are what the code guarantees.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from pipeline.cluster import Cluster
from pipeline.cluster.brokers import cluster_backoff
from pipeline.cluster.config import ClusterConfig
from pipeline.cluster.errors import (
    BootstrapError,
    BrokerConnectionError,
    MetadataTimeoutError,
    UnknownTopicError,
)
from pipeline.cluster.metadata import (
    BrokerAddress,
    ClusterMetadata,
    PartitionInfo,
    apply_metadata_response,
)
from pipeline.cluster.transport import Connector
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.produce import (
    PartitionProduceData,
    ProduceRequest,
    TopicProduceData,
)
from pipeline.protocol.records import BatchBuilder
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import MidpointRandom


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    cluster = FakeCluster(brokers=3, seed=7)
    cluster.create_topic("t", 3, leaders=[0, 1, 2])
    await nursery.start(cluster.run)
    return cluster


class Partitionable:
    """Wraps a connector; connects to blocked hosts are refused (a network partition)."""

    def __init__(self, inner: Connector) -> None:
        self.inner = inner
        self.blocked: set[str] = set()
        self.attempts: list[tuple[float, str]] = []

    async def __call__(self, host: str, port: int) -> trio.abc.Stream:
        self.attempts.append((trio.current_time(), host))
        if host in self.blocked:
            await trio.lowlevel.checkpoint()
            raise ConnectionRefusedError(f"{host} unreachable")
        return await self.inner(host, port)


@asynccontextmanager
async def open_cluster(
    fake: FakeCluster, connector: Connector | None = None, **kwargs: Any
) -> AsyncIterator[Cluster]:
    kwargs.setdefault("bootstrap", fake.bootstrap)
    async with Cluster.open(
        connector=connector or fake.connector, rng=MidpointRandom(), **kwargs
    ) as cluster:
        yield cluster


def metadata_times(fake: FakeCluster) -> list[float]:
    return [r.time for r in fake.requests_of(ApiKey.METADATA)]


# ------------------------------------------------------------ issue 3, acceptance 2


async def test_leader_move_followed_by_refresh(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_cluster(fake) as cluster:
        assert await cluster.leader_for("t", 0) == 0
        epoch = cluster.metadata.topics["t"].partitions[0].leader_epoch
        fake.move_leader("t", 0, to=1)

        # The old leader now answers NOT_LEADER_OR_FOLLOWER...
        builder = BatchBuilder()
        builder.append(0, b"k", b"v")
        request = ProduceRequest(
            acks=-1,
            timeout_ms=1000,
            topic_data=(
                TopicProduceData(
                    name="t",
                    partition_data=(PartitionProduceData(index=0, records=builder.build()),),
                ),
            ),
        )
        old_leader = await cluster.connection(0)
        response = await old_leader.request(request)
        code = response.responses[0].partition_responses[0].error_code
        assert code == ErrorCode.NOT_LEADER_OR_FOLLOWER

        # ...so the producer asks for a refresh and waits for it.
        cluster.request_refresh(["t"])
        await cluster.refresh(["t"], force=True)
        assert await cluster.leader_for("t", 0) == 1
        assert cluster.metadata.topics["t"].partitions[0] == PartitionInfo(1, epoch + 1)
        # One request at t=0, the forced one after the 0.1 s refresh spacing.
        assert metadata_times(fake) == [0.0, 0.1]


async def test_concurrent_refresh_callers_share_one_request(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_cluster(fake) as cluster:
        counts: list[int] = []

        async def user() -> None:
            counts.append(await cluster.partitions_for("t"))

        async with trio.open_nursery() as n:
            for _ in range(10):
                n.start_soon(user)
        assert counts == [3] * 10
        assert metadata_times(fake) == [0.0]

        async with trio.open_nursery() as n:
            for _ in range(10):
                n.start_soon(lambda: cluster.refresh(["t"], force=True))
        assert metadata_times(fake) == [0.0, 0.1]
        assert cluster.metadata_requests == 2


async def test_unknown_topic_with_auto_creation_off_is_a_clear_error(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_cluster(fake) as cluster:
        with pytest.raises(UnknownTopicError) as info:
            await cluster.partitions_for("missing")
        message = str(info.value)
        assert info.value.topic == "missing"
        assert "'missing' does not exist" in message
        assert "allow_auto_topic_creation=True" in message
        assert "--create --topic missing" in message
        [request] = fake.requests_of(ApiKey.METADATA)
        assert request.request.allow_auto_topic_creation is False
        assert "missing" not in fake.state.topics
        assert trio.current_time() == 0.0


async def test_unknown_topic_is_created_when_auto_creation_is_on(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_cluster(fake, allow_auto_topic_creation=True) as cluster:
        assert await cluster.partitions_for("fresh") == 1
        assert "fresh" in fake.state.topics


@pytest.mark.parametrize("order", ["dead-first", "live-first"])
async def test_bootstrap_with_one_dead_address_and_one_live_one(
    fake: FakeCluster, order: str, autojump_clock: trio.testing.MockClock
) -> None:
    addresses = ["dead-host:9092", "fake-1:9092"]
    if order == "live-first":
        addresses.reverse()
    async with open_cluster(fake, bootstrap=addresses) as cluster:
        assert await cluster.partitions_for("t") == 3
        assert set(cluster.metadata.brokers) == {0, 1, 2}
        assert cluster.metadata.brokers[2] == BrokerAddress("fake-2", 9092)
        [request] = fake.requests_of(ApiKey.METADATA)
        assert request.node_id == 1
        assert trio.current_time() == 0.0


# ------------------------------------------------------------------- refresh


async def test_metadata_max_age_refreshes_periodically(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_cluster(fake, metadata_max_age=10.0) as cluster:
        await cluster.partitions_for("t")
        fake.move_leader("t", 2, to=0)
        await trio.sleep(25)
        assert metadata_times(fake) == [0.0, 10.0, 20.0]
        assert cluster.metadata.leader_for("t", 2) == 0


async def test_no_reachable_broker_backs_off_then_times_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    connector = Partitionable(FakeCluster().connector)  # never started: every host refused
    connector.blocked = {"a", "b"}
    async with Cluster.open(
        "a:1,b:2", connector=connector, rng=MidpointRandom(), metadata_timeout=3.0
    ) as cluster:
        # Bootstrapping, metadata_timeout (3 s) is the shorter limit: the error still
        # names each address and why (a MetadataTimeoutError too).
        with pytest.raises(BootstrapError) as info:
            await cluster.partitions_for("t")
        assert isinstance(info.value, MetadataTimeoutError)
        assert info.value.causes == {"a:1": "connection refused (a unreachable)",
                                     "b:2": "connection refused (b unreachable)"}
        assert trio.current_time() == 3.0
        # Each cycle tries both addresses; cycles are 0.1, 0.2, 0.4, 0.8, 1.0, 1.0 apart.
        # (An address still in its own reconnect backoff is skipped.)
        times = sorted({t for t, _ in connector.attempts})
        assert times == pytest.approx([0.0, 0.1, 0.3, 0.7, 1.5, 2.5])


async def test_connection_loss_triggers_a_refresh(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_cluster(fake) as cluster:
        assert await cluster.leader_for("t", 1) == 1
        await cluster.connection(1)
        fake.stop_broker(1)  # partition 1 moves to another replica
        await trio.sleep(1)
        assert metadata_times(fake) == [0.0, 0.1]
        assert 1 not in cluster.metadata.brokers
        assert await cluster.leader_for("t", 1) in {0, 2}


async def test_leader_for_waits_for_an_offline_partition(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_cluster(fake) as cluster:
        await cluster.partitions_for("t")
        fake.stop_broker(2, elect=False)  # partition 2 goes offline (leader -1)
        await cluster.refresh(["t"], force=True)
        assert cluster.metadata.leader_for("t", 2) == -1

        async def restart_later() -> None:
            await trio.sleep(0.5)
            fake.restart_broker(2)

        async with trio.open_nursery() as n:
            n.start_soon(restart_later)
            assert await cluster.leader_for("t", 2) == 2
        # Rounds at 0, 0.1, then backing off while incomplete: 0.3, 0.7 sees it back.
        assert metadata_times(fake) == pytest.approx([0.0, 0.1, 0.3, 0.7])


# ---------------------------------------------------------------- broker pool


async def test_pool_connects_lazily_and_reconnects_with_backoff(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock
) -> None:
    connector = Partitionable(fake.connector)
    async with open_cluster(fake, connector) as cluster:
        await cluster.partitions_for("t")
        assert [h for _, h in connector.attempts] == ["fake-0"]  # bootstrap only
        connector.blocked.add("fake-2")
        for _ in range(3):
            with pytest.raises(BrokerConnectionError):
                await cluster.connection(2)
        connector.blocked.clear()
        conn = await cluster.connection(2)
        assert conn.node_id == 2
        assert not conn.closed
        assert [t for t, h in connector.attempts if h == "fake-2"] == pytest.approx(
            [0.0, 0.1, 0.3, 0.7]
        )
        assert await cluster.connection(2) is conn  # reused while open
        fake.drop_connections(2)
        await trio.testing.wait_all_tasks_blocked()
        assert conn.closed
        assert (await cluster.connection(2)) is not conn  # reconnects at once after a drop


async def test_any_connection_reuses_an_open_one(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_cluster(fake) as cluster:
        first = await cluster.any_connection()
        assert first.node_id >= 0
        assert await cluster.any_connection() is first


# ------------------------------------------------------------------ pure rules


def _response(*, epoch: int, leader: int, topic_error: int = 0) -> Any:
    part = SimpleNamespace(error_code=0, partition_index=0, leader_id=leader, leader_epoch=epoch)
    topic = SimpleNamespace(
        error_code=topic_error,
        name="t",
        topic_id=None,
        partitions=(part,) if not topic_error else (),
    )
    broker = SimpleNamespace(node_id=leader, host=f"h{leader}", port=1)
    return SimpleNamespace(brokers=(broker,), topics=(topic,), controller_id=0, cluster_id="c")


def test_stale_leader_epoch_is_ignored() -> None:
    first = apply_metadata_response(
        ClusterMetadata(), _response(epoch=5, leader=1), requested={"t"}, now=1.0
    )
    stale = apply_metadata_response(
        first.metadata, _response(epoch=4, leader=2), requested={"t"}, now=2.0
    )
    assert stale.metadata.leader_for("t", 0) == 1
    newer = apply_metadata_response(
        first.metadata, _response(epoch=6, leader=2), requested={"t"}, now=3.0
    )
    assert newer.metadata.leader_for("t", 0) == 2
    assert newer.metadata.fetched_at == 3.0


def test_leaderless_and_unknown_topics() -> None:
    leaderless = apply_metadata_response(
        ClusterMetadata(), _response(epoch=1, leader=-1), requested={"t"}, now=0.0
    )
    assert leaderless.incomplete == {"t"}
    gone = apply_metadata_response(
        leaderless.metadata,
        _response(epoch=1, leader=0, topic_error=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        requested={"t"},
        now=1.0,
    )
    assert "t" not in gone.metadata.topics
    assert gone.topic_errors == {"t": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    assert gone.incomplete == frozenset()


@pytest.mark.parametrize(
    ("attempt", "expected"), [(0, 0.1), (1, 0.2), (2, 0.4), (3, 0.8), (4, 1.0), (40, 1.0)]
)
def test_backoff_delay(attempt: int, expected: float) -> None:
    # `attempt` counts failures so far (0: the first retry), as the pool and the
    # refresher count them.
    backoff = cluster_backoff(ClusterConfig(), MidpointRandom())
    assert backoff.delay(attempt + 1) == pytest.approx(expected)


def test_backoff_jitter_stays_within_20_percent() -> None:
    backoff = cluster_backoff(ClusterConfig(), random.Random(3))
    delays = [backoff.delay(2) for _ in range(200)]
    assert min(delays) >= 0.16
    assert max(delays) < 0.24
    assert len(set(delays)) > 100


# ------------------------------------------------------------------ real TCP


async def test_tcp_connector_end_to_end_on_loopback(nursery: trio.Nursery) -> None:
    # Real sockets on 127.0.0.1 (real clock): the same Cluster over tcp_connector().
    from pipeline.cluster.transport import tcp_connector

    fake = FakeCluster(brokers=2, tcp=True)
    fake.create_topic("t", 2, leaders=[1, 0])
    await nursery.start(fake.run)
    async with Cluster.open(
        fake.bootstrap, connector=tcp_connector(connect_timeout=5.0)
    ) as cluster:
        with trio.fail_after(10):
            assert await cluster.partitions_for("t") == 2
            assert await cluster.leader_for("t", 0) == 1
            conn = await cluster.connection(1)
            assert conn.host == "127.0.0.1"
            assert conn.api_versions[ApiKey.PRODUCE] == 12
