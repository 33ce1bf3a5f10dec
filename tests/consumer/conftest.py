"""Consumer scenarios against the in-memory FakeCluster, on virtual time."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

import pytest
import trio

from pipeline import open_producer
from pipeline.consumer import ConsumedRecord, open_consumer
from pipeline.testing.fake_cluster import FakeCluster


class HalfRandom(random.Random):
    """``random()`` is always 0.5: jittered backoffs are exactly their base value."""

    def random(self) -> float:
        return 0.5


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    cluster = FakeCluster(brokers=3, seed=7, auto_create_topics=False)
    await nursery.start(cluster.run)
    return cluster


def consumer_options(**overrides: Any) -> dict[str, Any]:
    options: dict[str, Any] = dict(
        auto_offset_reset="earliest",
        retry_backoff=0.125,
        retry_backoff_max=0.125,
        retry_backoff_jitter=0,
        request_timeout=5.0,
        session_timeout=10.0,
        heartbeat_interval=1.0,
        max_poll_interval=30.0,
        rng=HalfRandom(1),
    )
    options.update(overrides)
    return options


def open_fake_consumer(fake: FakeCluster, **overrides: Any) -> Any:
    connector = overrides.pop("connector", fake.connector)
    return open_consumer(fake.bootstrap, connector=connector, **consumer_options(**overrides))


async def produce(fake: FakeCluster, topic: str, values: Iterable[bytes], *,
                  partition: int | None = None, key: bytes | None = None) -> None:
    """Write ``values`` (acks=all) to ``topic``, to ``partition`` or spread by key."""
    async with open_producer(fake.bootstrap, connector=fake.connector, linger=0.0,
                             retry_backoff_jitter=0, rng=HalfRandom(2)) as producer:
        for v in values:
            await producer.send_and_wait(topic, v, key=key, partition=partition)


async def until(condition: Callable[[], bool], within: float = 120.0) -> None:
    """Wait (virtual time) until ``condition()`` holds; fail after ``within`` seconds."""
    with trio.fail_after(within):
        while not condition():  # noqa: ASYNC110 - state several tasks change: no one event
            await trio.sleep(0.05)


async def take(consumer: Any, n: int, within: float = 120.0) -> list[ConsumedRecord]:
    """The next ``n`` records the consumer yields (fail after ``within`` virtual seconds)."""
    out: list[ConsumedRecord] = []
    with trio.fail_after(within):
        async for record in consumer:
            out.append(record)
            if len(out) == n:
                break
    return out
