"""Bugs the schedule explorer found, each as a plain scenario that names it.

The shrunk schedules themselves are replayed by test_regressions.py; these
are the same bugs written out by hand, on autojump_clock against the
FakeCluster, so that each reads as what went wrong.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio

from pipeline import ProducerError
from pipeline.producer.api import open_producer
from pipeline.protocol.errors import ErrorCode
from pipeline.testing.fake_cluster import FakeCluster

PRODUCE = 0


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    cluster = FakeCluster(brokers=2, seed=5, auto_create_topics=False, max_message_bytes=600)
    await nursery.start(cluster.run)
    cluster.create_topic("t", 2, leaders=[0, 0])
    return cluster


def producer(fake: FakeCluster, **options: Any) -> Any:
    base: dict[str, Any] = dict(
        linger=0.0, retry_backoff=0.1, retry_backoff_jitter=0.0, request_timeout=5.0,
        delivery_timeout=60.0, close_timeout=10.0, max_message_bytes=600,
        rng=random.Random(1), timestamp_ms=lambda: 1_700_000_000_000,
    )
    base.update(options)
    return open_producer(fake.bootstrap, connector=fake.connector, **base)


def log(fake: FakeCluster, partition: int = 0) -> list[bytes | None]:
    return [e.record.value for e in fake.log("t", partition)]


async def test_batches_never_exceed_max_message_bytes(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """batch_bytes above max_message_bytes (the broker's limit on a whole batch):
    a burst of small messages was sealed as one batch the broker refused with
    MESSAGE_TOO_LARGE, failing every message although each one fits."""
    async with producer(fake, idempotent=False, batch_bytes=4 * 600, linger=0.05) as p:
        deliveries = [await p.send("t", b"%03d" % i + b"x" * 100, partition=0) for i in range(20)]
        offsets = [(await d).offset for d in deliveries]
    assert offsets == list(range(20))
    assert all(len(r.request.topic_data[0].partition_data[0].records) <= 600
               for r in fake.requests_of(PRODUCE))


async def test_idempotent_fatal_error_does_not_fail_the_next_batch(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A non-retriable answer (here INVALID_RECORD) failed an idempotent batch; its
    sequences never reached the broker, so the partition's next batch was
    answered OUT_OF_ORDER_SEQUENCE_NUMBER and failed too, although nothing was
    wrong with it. Now the failure bumps the epoch and the next batch goes."""
    fake.fail_next(PRODUCE, ErrorCode.INVALID_RECORD, topic="t", partition=0)
    async with producer(fake, idempotent=True) as p:
        with pytest.raises(ProducerError, match="INVALID_RECORD"):
            await p.send_and_wait("t", b"refused", partition=0)
        meta = await p.send_and_wait("t", b"next", partition=0)
    assert meta.offset == 0
    assert log(fake) == [b"next"]
    assert p._core.idempotence is not None and p._core.idempotence.bumps == 1
