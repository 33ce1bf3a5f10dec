"""ClusterConfig: one frozen, validated object, and every entry point reads it.

The point of the config is that an option given once reaches the place it acts
(a connection, the pool's backoff, the consumer), with no second copy of its
default or clamp on the way; these tests follow options to their effect.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
import trio
import trio.testing

from pipeline.cluster import Cluster
from pipeline.cluster.config import ClusterConfig, cluster_config, parse_option_value
from pipeline.cluster.connection import BrokerConnection
from pipeline.cluster.errors import ConfigError, MetadataTimeoutError, RequestTimedOutError
from pipeline.consumer import read_topic, topic_offsets
from pipeline.producer._api import open_producer
from pipeline.producer._config import ProducerConfig, make_config
from pipeline.protocol.api import ApiKey
from pipeline.protocol.messages.metadata import MetadataRequest
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import HOST, PORT, MidpointRandom
from .scripted_broker import ScriptedBroker
from .test_metadata import Partitionable


class NoRandom(random.Random):
    """Fails the test if any jitter is drawn."""

    def random(self) -> float:
        raise AssertionError("jitter drawn although retry_backoff_jitter=0")


BAD = [
    (dict(request_timeout=0), r"invalid request_timeout=0: must be a number of seconds > 0"),
    (dict(connect_timeout=-1.0), r"invalid connect_timeout=-1\.0"),
    (dict(metadata_timeout=True), r"invalid metadata_timeout=True"),
    (dict(metadata_max_age="5"), r"invalid metadata_max_age='5'"),
    (dict(retry_backoff=-0.1), r"invalid retry_backoff=-0\.1: must be a number of seconds >= 0"),
    (dict(retry_backoff=2.0, retry_backoff_max=1.0),
     r"invalid retry_backoff_max=1\.0: must be >= retry_backoff \(2\.0\)"),
    (dict(retry_backoff_jitter=1.0), r"invalid retry_backoff_jitter=1\.0: must be in \[0, 1\)"),
    (dict(max_in_flight=0), r"invalid max_in_flight=0: must be a positive integer"),
    (dict(max_frame_size=1.5), r"invalid max_frame_size=1\.5"),
    (dict(client_id=7), r"invalid client_id=7: must be a string"),
    (dict(allow_auto_topic_creation="yes"), r"invalid allow_auto_topic_creation='yes'"),
    (dict(connector="tcp"), r"invalid connector='tcp': must be an async callable"),
    (dict(rng=3), r"invalid rng=3: must be a random\.Random"),
]


@pytest.mark.parametrize(("options", "match"), BAD, ids=lambda x: str(x)[:30])
def test_invalid_options_are_named(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        ClusterConfig(**options)
    assert isinstance(info.value, ValueError)
    # The producer inherits the same checks, with the same words.
    with pytest.raises(ConfigError, match=match):
        ProducerConfig(**options)


def test_frozen_and_defaults() -> None:
    cfg = ClusterConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.request_timeout = 1.0  # type: ignore[misc]
    assert (cfg.request_timeout, cfg.metadata_timeout, cfg.max_in_flight) == (30.0, 60.0, 5)
    assert (cfg.retry_backoff, cfg.retry_backoff_max, cfg.retry_backoff_jitter) == (0.1, 1.0, 0.2)
    # Injected objects are neither shown nor compared.
    assert "connector" not in repr(ClusterConfig(connector=FakeCluster().connector))
    assert ClusterConfig(rng=random.Random(1)) == ClusterConfig(rng=random.Random(2))


def test_unknown_option_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown cluster option\(s\) \['request_timout'\]"
                       r"; valid options are \[.*'request_timeout'.*\]"):
        cluster_config(None, {"request_timout": 1.0})


def test_producer_config_carries_the_cluster_part() -> None:
    rng = random.Random(4)
    cfg = make_config(None, dict(client_id="p", request_timeout=7.0, linger=0.5, rng=rng,
                                 metadata_timeout=9.0))
    # It holds one ClusterConfig, built and validated once: the same object every
    # time, and the one the cluster client gets (not a copy of inherited fields).
    assert not isinstance(cfg, ClusterConfig)
    cluster = cfg.cluster
    assert type(cluster) is ClusterConfig and cfg.cluster is cluster
    assert (cfg.request_timeout, cfg.max_in_flight) == (7.0, 5)
    # A change of a producer option keeps the very same cluster part.
    assert cfg.replace(linger=0.25).cluster is cluster
    # A cluster option given flat over a whole ClusterConfig wins, and is validated.
    over = ProducerConfig(cluster=cluster, request_timeout=2.0)
    assert (over.cluster.request_timeout, over.cluster.client_id) == (2.0, "p")
    with pytest.raises(ConfigError, match=r"invalid request_timeout=-1"):
        ProducerConfig(cluster=cluster, request_timeout=-1)
    with pytest.raises(ConfigError, match=r"invalid cluster=.*must be a ClusterConfig"):
        ProducerConfig(cluster={"client_id": "x"})  # type: ignore[arg-type]
    assert (cluster.client_id, cluster.request_timeout, cluster.metadata_timeout) == (
        "p", 7.0, 9.0
    )
    assert cluster.rng is rng
    # Over an existing config, keyword options win; the producer fields are dropped.
    merged = cluster_config(cfg, {"request_timeout": 3.0})
    assert type(merged) is ClusterConfig
    assert (merged.client_id, merged.request_timeout) == ("p", 3.0)


def test_parse_option_value() -> None:
    assert [parse_option_value(t) for t in ("10", "0.5", "TRUE", "false", "none", "zstd")] == [
        10, 0.5, True, False, None, "zstd"
    ]


async def test_cluster_open_rejects_a_bad_option_before_connecting(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FakeCluster()
    async with trio.open_nursery() as nursery:
        await nursery.start(fake.run)
        with pytest.raises(ConfigError, match="max_in_flight"):
            async with Cluster.open(fake.bootstrap, connector=fake.connector, max_in_flight=-1):
                pass
        assert fake.requests == []
        nursery.cancel_scope.cancel()


async def test_connection_reads_client_id_timeout_and_slots_from_the_config(
    net: Any, nursery: trio.Nursery, broker: ScriptedBroker, autojump_clock: Any
) -> None:
    cfg = ClusterConfig(client_id="cfg-client", max_in_flight=2, request_timeout=4.0)
    conn = await BrokerConnection.connect(nursery, net.connect, HOST, PORT, config=cfg)
    assert conn.config is cfg
    assert broker.received[-1].header.client_id == "cfg-client"  # the ApiVersions request
    # A keyword option overrides the config's field.
    other = await BrokerConnection.connect(
        nursery, net.connect, HOST, PORT, config=cfg, client_id="kw-client"
    )
    assert broker.received[-1].header.client_id == "kw-client"
    assert other.config.max_in_flight == 2
    # max_in_flight=2 from the config: a third request waits for a slot; and
    # request_timeout=4.0 from the config closes the connection at t0 + 4.
    failures: list[BaseException] = []

    async def call() -> None:
        try:
            await conn.request(MetadataRequest())
        except RequestTimedOutError as exc:
            failures.append(exc)

    t0 = trio.current_time()
    async with trio.open_nursery() as calls:
        for _ in range(3):
            calls.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        assert (broker.outstanding, conn.in_flight) == (2, 2)
    assert len(failures) == 3
    assert all("within 4.0s" in str(e) for e in failures)
    assert trio.current_time() - t0 == 4.0
    with pytest.raises(ConfigError, match="max_in_flight"):
        await BrokerConnection.connect(nursery, net.connect, HOST, PORT, max_in_flight=0)


async def test_jitter_option_reaches_the_reconnect_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Before ClusterConfig the cluster's backoff had its own fixed jitter; now
    # retry_backoff_jitter=0 means no jitter anywhere, so no draw may happen.
    connector = Partitionable(FakeCluster().connector)
    connector.blocked = {"a"}
    async with Cluster.open(
        "a:1", connector=connector, rng=NoRandom(), metadata_timeout=2.0,
        retry_backoff_jitter=0, retry_backoff=0.2, retry_backoff_max=0.8,
    ) as cluster:
        with pytest.raises(MetadataTimeoutError):
            await cluster.partitions_for("t")
    assert sorted({t for t, _ in connector.attempts}) == pytest.approx([0.0, 0.2, 0.6, 1.4])


async def test_zero_backoff_still_lets_time_pass(autojump_clock: trio.testing.MockClock) -> None:
    # retry_backoff=0 is a valid producer option (retry at once); the cluster
    # waits at least 1 ms between reconnects, or a failing loop would spin and
    # never let the autojump clock reach metadata_timeout.
    connector = Partitionable(FakeCluster().connector)
    connector.blocked = {"a"}
    async with Cluster.open(
        "a:1", connector=connector, rng=MidpointRandom(), metadata_timeout=0.01,
        retry_backoff=0, retry_backoff_max=0.001,
    ) as cluster:
        with pytest.raises(MetadataTimeoutError):
            await cluster.partitions_for("t")
    assert trio.current_time() == pytest.approx(0.01)
    assert 5 <= len(connector.attempts) <= 11


async def test_producer_options_reach_every_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with FakeCluster.serve(brokers=2) as fake:
        fake.create_topic("t", 2, leaders=[0, 1])
        async with open_producer(
            fake.bootstrap, connector=fake.connector, client_id="through-config",
            idempotent=False, acks=1,
        ) as producer:
            await producer.send("t", b"v", partition=1)
        assert {r.client_id for r in fake.requests} == {"through-config"}
        assert fake.requests_of(ApiKey.PRODUCE)


async def test_consumer_takes_a_cluster_config(autojump_clock: trio.testing.MockClock) -> None:
    async with FakeCluster.serve(brokers=1) as fake:
        fake.create_topic("t", 1)
        cfg = ClusterConfig(client_id="reader", connector=fake.connector)
        assert await topic_offsets(fake.bootstrap, "t", config=cfg) == {0: (0, 0)}
        got = [r async for r in read_topic(fake.bootstrap, "t", config=cfg, stop_at_end=True)]
        assert got == []
        assert {r.client_id for r in fake.requests} == {"reader"}
        # request_timeout given: it bounds requests and metadata waits alike.
        before = len(fake.requests)
        fake.delay_responses(60.0, api_key=ApiKey.METADATA)
        t0 = trio.current_time()
        # (and the error comes out as itself, not in a nursery's ExceptionGroup)
        with pytest.raises(MetadataTimeoutError, match=r"within 2\.0s"):
            await topic_offsets(fake.bootstrap, "t", config=cfg, request_timeout=2.0)
        assert trio.current_time() - t0 == 2.0
        assert len(fake.requests) > before
