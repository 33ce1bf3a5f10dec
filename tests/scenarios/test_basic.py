from __future__ import annotations

import trio

from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer, values_in_log


async def test_send_and_await_delivery(fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    fake.create_topic("events", 3)
    async with open_fake_producer(fake) as producer:
        deliveries = [
            await producer.send("events", f"v{i}".encode(), partition=i % 3) for i in range(30)
        ]
        metas = [await d for d in deliveries]
    assert [m.partition for m in metas] == [i % 3 for i in range(30)]
    for p in range(3):
        assert values_in_log(fake, "events", p) == [f"v{i}".encode() for i in range(p, 30, 3)]
        assert [m.offset for m in metas if m.partition == p] == list(range(10))
