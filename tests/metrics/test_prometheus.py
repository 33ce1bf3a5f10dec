"""``pipeline.metrics.prometheus``: statistics as Prometheus text, read back by an
independent parser (``prometheus_client``'s) and checked value by value."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from pipeline import open_producer
from pipeline.consumer import open_consumer
from pipeline.metrics import CONTENT_TYPE, prometheus_text
from pipeline.testing.fake_cluster import FakeCluster
from pipeline.util.stats import (
    Statistics,
    Summary,
    children,
    counter,
    gauge,
    info,
    labelled,
    summary,
)


@dataclass(frozen=True, slots=True)
class Part(Statistics):
    METRIC_PREFIX: ClassVar[str] = "partition"
    sent: int = counter("records sent", "messages")
    position: int | None = gauge("next offset", "offset", default=None)
    wait: Summary = summary("time waited", "seconds")


@dataclass(frozen=True, slots=True)
class Root(Statistics):
    METRIC_PREFIX: ClassVar[str] = "client"
    client_id: str = info("the client", default="")
    received_bytes: int = counter("bytes read", "bytes")
    age: float = gauge("seconds open", "seconds", default=0.0)
    errors: dict[str, int] = labelled("counter", "code", "errors by code\nper broker", "errors")
    parts: dict[int, Part] = children("partition", Part, "per partition")


def samples_of(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"sample {key} written twice"
            out[key] = s.value
    return out


def lab(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


def test_names_labels_types_and_values() -> None:
    root = Root(client_id='a "b"\\c', received_bytes=10, age=1.5,
                errors={"NOT_LEADER_OR_FOLLOWER": 2},
                parts={0: Part(3, 7, Summary(4, 1.0, 4, 0.1, 0.4, 0.2, 0.4, 0.4)),
                       1: Part(5, None, Summary())})
    text = prometheus_text(root)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["pipeline_client_received_bytes"].type == "counter"
    assert families["pipeline_client_age_seconds"].type == "gauge"
    assert families["pipeline_client_partition_wait_seconds"].type == "summary"
    assert families["pipeline_client_errors"].documentation == \
        "errors by code\nper broker (errors)"
    c = 'a "b"\\c'
    assert samples_of(text) == {
        ("pipeline_client_received_bytes_total", lab(client_id=c)): 10,
        ("pipeline_client_age_seconds", lab(client_id=c)): 1.5,
        ("pipeline_client_errors_total", lab(client_id=c, code="NOT_LEADER_OR_FOLLOWER")): 2,
        ("pipeline_client_partition_sent_total", lab(client_id=c, partition="0")): 3,
        ("pipeline_client_partition_sent_total", lab(client_id=c, partition="1")): 5,
        # partition 1's position is unknown: left out
        ("pipeline_client_partition_position", lab(client_id=c, partition="0")): 7,
        ("pipeline_client_partition_wait_seconds",
         lab(client_id=c, partition="0", quantile="0.5")): 0.2,
        ("pipeline_client_partition_wait_seconds",
         lab(client_id=c, partition="0", quantile="0.9")): 0.4,
        ("pipeline_client_partition_wait_seconds",
         lab(client_id=c, partition="0", quantile="0.99")): 0.4,
        ("pipeline_client_partition_wait_seconds_sum", lab(client_id=c, partition="0")): 1.0,
        ("pipeline_client_partition_wait_seconds_count", lab(client_id=c, partition="0")): 4,
        # an empty window: no quantiles, the count and sum still
        ("pipeline_client_partition_wait_seconds_sum", lab(client_id=c, partition="1")): 0,
        ("pipeline_client_partition_wait_seconds_count", lab(client_id=c, partition="1")): 0,
    }
    assert text.endswith("\n") and CONTENT_TYPE.startswith("text/plain; version=0.0.4")


def test_two_clients_share_one_header_per_metric() -> None:
    text = prometheus_text(Root(client_id="a", received_bytes=1),
                           Root(client_id="b", received_bytes=2), namespace="app")
    assert text.count("# TYPE app_client_received_bytes_total counter") == 1
    got = samples_of(text)
    assert got[("app_client_received_bytes_total", lab(client_id="a"))] == 1
    assert got[("app_client_received_bytes_total", lab(client_id="b"))] == 2
    assert prometheus_text() == ""
    with pytest.raises(ValueError, match="invalid namespace '1x'"):
        prometheus_text(Root(), namespace="1x")


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    cluster = FakeCluster(brokers=3, seed=7, auto_create_topics=False)
    await nursery.start(cluster.run)
    return cluster


async def test_a_producer_and_a_consumer_on_the_fake_cluster(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    fake.create_topic("t", 2)
    options: dict[str, Any] = dict(connector=fake.connector, linger=0.0)
    async with open_producer(fake.bootstrap, client_id="p", **options) as producer:
        for i in range(6):
            await producer.send_and_wait("t", b"x" * 10, partition=i % 2)
        produced = producer.statistics()
    async with open_consumer(fake.bootstrap, connector=fake.connector, client_id="c",
                             partitions=[("t", 0), ("t", 1)],
                             auto_offset_reset="earliest") as consumer:
        n = 0
        async for _ in consumer:
            n += 1
            if n == 6:
                break
        consumed = consumer.statistics()
    got = samples_of(prometheus_text(produced, consumed))
    assert got[("pipeline_producer_succeeded_total", lab(client_id="p"))] == 6
    for p in ("0", "1"):
        key = lab(client_id="p", topic="t", partition=p)
        assert got[("pipeline_producer_topic_partition_delivered_messages_total", key)] == 3
        key = lab(client_id="c", topic="t", partition=p)
        assert got[("pipeline_consumer_topic_partition_consumed_records_total", key)] == 3
        assert got[("pipeline_consumer_topic_partition_position", key)] == 3
        assert got[("pipeline_consumer_topic_partition_lag", key)] == 0
    assert got[("pipeline_consumer_consumed_records_total", lab(client_id="c"))] == 6
    leader = str(fake.leader("t", 0))
    rtt = got[("pipeline_producer_broker_rtt_seconds_count", lab(client_id="p", broker=leader))]
    assert rtt == produced.brokers[int(leader)].rtt.count > 0
    assert got[("pipeline_producer_broker_requests_by_api_total",
                lab(client_id="p", broker=leader, api="Produce"))] == \
        produced.brokers[int(leader)].requests_by_api["Produce"]
