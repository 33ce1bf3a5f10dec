"""A group consumer on the fake cluster: joins, reads, commits, shares with a second member."""

from __future__ import annotations

from typing import Any

import trio

from pipeline.consumer import ConsumedRecord, TopicPartition
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_consumer, produce


async def take(consumer: Any, n: int) -> list[ConsumedRecord]:
    out: list[ConsumedRecord] = []
    with trio.fail_after(120):
        async for record in consumer:
            out.append(record)
            if len(out) == n:
                break
    return out


async def test_one_member_reads_everything_and_commits(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 3)
    for p in range(3):
        await produce(fake, "t", [f"{p}-{i}".encode() for i in range(4)], partition=p)
    async with open_fake_consumer(fake, group_id="g", topics=["t"],
                                  enable_auto_commit=False) as consumer:
        got = await take(consumer, 12)
        assert sorted((r.partition, r.offset) for r in got) == [(p, o) for p in range(3) for o in range(4)]
        assert consumer.state == "stable"
        assert consumer.assignment() == {TopicPartition("t", p) for p in range(3)}
        await consumer.commit()
        assert [fake.committed("g", "t", p) for p in range(3)] == [4, 4, 4]
        meta = consumer.group_metadata()
        assert (meta.group_id, meta.generation_id) == ("g", 1)
        assert fake.group("g").state == "Stable"
    assert fake.group("g").state == "Empty"  # left on close
