"""The project's producer writing to Apache Kafka, judged by librdkafka's consumer.

Proves the path end to end on both session clusters: what our producer acknowledged is on
the brokers, in order, once. The Kafka-specific semantics (duplicates, epoch bumps, size
limits, min.insync.replicas...) are their own tests, built on these fixtures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

from pipeline import RecordMetadata, open_producer
from pipeline.cluster import Cluster
from pipeline.testing.kafka import KafkaCluster
from pipeline.testing.proxy import FaultProxy

from .conftest import read_partitions

Topic = Callable[..., str]


async def produce(bootstrap: str, topic: str, n: int, *,
                  midway: Callable[[], object] | None = None, **options: Any
                  ) -> list[tuple[bytes, RecordMetadata]]:
    """Send ``n`` keyed, numbered values; return (value, metadata) in send order. With
    ``midway``: flush half of them (so every leader has a connection), send 300 more and
    call ``midway()`` while those are in flight."""
    sent: list[tuple[bytes, Any]] = []
    async with open_producer(bootstrap, request_timeout=10.0, delivery_timeout=60.0,
                             close_timeout=30.0, **options) as producer:
        for i in range(n):
            value = f"v{i:06d}".encode()
            sent.append((value, await producer.send(topic, value, key=f"k{i % 17}".encode())))
            if midway is not None and i == n // 2:
                await producer.flush()
            if midway is not None and i == n // 2 + 300:
                midway()
        await producer.flush()
        stats = producer.statistics()
    assert stats.accepted == stats.succeeded == n
    assert stats.failed == 0
    return [(value, await delivery) for value, delivery in sent]


def check_read_back(bootstrap: str, topic: str, partitions: int,
                    sent: list[tuple[bytes, RecordMetadata]]) -> None:
    """Each partition holds exactly what was acknowledged for it, at the acknowledged
    offsets, once, in send order."""
    got = read_partitions(bootstrap, topic, list(range(partitions)), len(sent))
    assert len(got) == len(sent)
    want: dict[int, list[tuple[int, bytes]]] = {}
    for value, meta in sent:
        want.setdefault(meta.partition, []).append((meta.offset, value))
    have: dict[int, list[tuple[int, bytes]]] = {}
    for msg in got:
        have.setdefault(msg.partition(), []).append((msg.offset(), msg.value()))
    assert have == want
    for records in have.values():
        assert [o for o, _ in records] == list(range(len(records)))


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
async def test_producer_to_single_node(kafka_single: KafkaCluster, kafka_topic: Topic,
                                       compression: str) -> None:
    topic = kafka_topic(compression)
    await kafka_single.call(kafka_single.create_topic, topic, 3)
    sent = await produce(kafka_single.bootstrap, topic, 600, compression=compression)
    await trio.to_thread.run_sync(check_read_back, kafka_single.bootstrap, topic, 3, sent)


async def test_idempotent_producer_to_three_nodes(kafka_cluster: KafkaCluster,
                                                  kafka_topic: Topic) -> None:
    topic = kafka_topic("rf3")
    await kafka_cluster.call(kafka_cluster.create_topic, topic, 6, 3,
                             {"min.insync.replicas": "2"})
    sent = await produce(kafka_cluster.bootstrap, topic, 3000)  # acks=all, idempotent
    assert {meta.partition for _, meta in sent} == set(range(6))
    await trio.to_thread.run_sync(
        check_read_back, kafka_cluster.internal_bootstrap, topic, 6, sent)


async def test_fault_proxies_on_the_advertised_ports(kafka_cluster: KafkaCluster,
                                                     kafka_topic: Topic) -> None:
    """Each node advertises its proxy: clients that bootstrap there learn only proxy
    addresses, so every request crosses a FaultProxy; killing every proxied connection
    mid-stream loses and duplicates nothing (idempotence)."""
    assert kafka_cluster.advertised_ports is not None
    topic = kafka_topic("proxied")
    await kafka_cluster.call(kafka_cluster.create_topic, topic, 3, 3)
    proxies = {
        n: FaultProxy(*kafka_cluster.proxy_upstream(n),
                      listen_port=kafka_cluster.advertised_ports[n], seed=n)
        for n in kafka_cluster.nodes
    }
    async with trio.open_nursery() as nursery:
        for proxy in proxies.values():
            await nursery.start(proxy.run)
        async with Cluster.open(kafka_cluster.proxied_bootstrap) as cluster:
            await cluster.refresh([topic], force=True)
            advertised = {n: a.port for n, a in cluster.metadata.brokers.items()}
        assert advertised == kafka_cluster.advertised_ports

        killed: list[int] = []
        sent = await produce(
            kafka_cluster.proxied_bootstrap, topic, 4000, linger=0.01,
            midway=lambda: killed.extend(p.kill_all() for p in proxies.values()),
        )
        nursery.cancel_scope.cancel()
    assert sum(killed) >= 3, killed  # the producer's connection to each leader, at least
    assert all(p.stats.requests > 0 for p in proxies.values())
    assert all(p.stats.accepted > 1 for p in proxies.values())  # it reconnected
    await trio.to_thread.run_sync(
        check_read_back, kafka_cluster.internal_bootstrap, topic, 3, sent)
