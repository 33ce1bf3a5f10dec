"""Producer scenarios against the in-memory FakeCluster, on autojump_clock."""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio

from pipeline.producer.api import Producer, open_producer
from pipeline.producer.message import ProducerMessage
from pipeline.testing.fake_cluster import FakeCluster

# The idempotence default for open_fake_producer: the sarama suite and the
# regressions run in both modes (see the autouse fixture in those modules).
MODE: dict[str, Any] = {"idempotent": False}


@pytest.fixture(params=[False, True], ids=["plain", "idempotent"])
def both_modes(request: pytest.FixtureRequest) -> Any:
    MODE["idempotent"] = request.param
    yield request.param
    MODE["idempotent"] = False


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    cluster = FakeCluster(brokers=3, seed=7, auto_create_topics=False)
    await nursery.start(cluster.run)
    return cluster


def producer_options(**overrides: Any) -> dict[str, Any]:
    options: dict[str, Any] = dict(
        acks="all",
        idempotent=MODE["idempotent"],
        linger=0.0,
        retry_backoff=0.1,
        retry_backoff_max=0.1,
        request_timeout=5.0,
        delivery_timeout=60.0,
        close_timeout=10.0,
        rng=random.Random(1),
        timestamp_ms=lambda: 1_700_000_000_000,
    )
    options.update(overrides)
    return options


def open_fake_producer(fake: FakeCluster, **overrides: Any) -> Any:
    connector = overrides.pop("connector", fake.connector)
    return open_producer(fake.bootstrap, connector=connector, **producer_options(**overrides))


def values_in_log(fake: FakeCluster, topic: str, partition: int) -> list[bytes | None]:
    return [entry.record.value for entry in fake.log(topic, partition)]


def assert_one_outcome(producer: Producer, msgs: list[ProducerMessage]) -> None:
    stats = producer.statistics()
    assert stats.double_settles == 0
    assert all(m.done() for m in msgs)
