"""A group consumer on the fake cluster: joins, reads, commits, shares with a second member."""

from __future__ import annotations

from typing import Any

import trio

from pipeline.consumer import ConsumedRecord, TopicPartition
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_consumer, produce, take, until


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


async def consume_all(consumer: Any, seen: list[ConsumedRecord], stop: trio.Event) -> None:
    async for record in consumer:
        seen.append(record)
        if stop.is_set():
            return


async def test_two_members_split_the_partitions_and_process_every_record_once(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """Range, eager: the second member's join rebalances; the first commits on revoke
    (auto-commit), so the partitions it hands over continue after what it processed."""
    fake.create_topic("t", 4)
    for p in range(4):
        await produce(fake, "t", [f"{p}-{i}".encode() for i in range(10)], partition=p)
    seen_a: list[ConsumedRecord] = []
    seen_b: list[ConsumedRecord] = []
    async with open_fake_consumer(fake, group_id="g", topics=["t"],
                                  partition_assignment_strategy="range") as a:
        first = await take(a, 20)
        seen_a.extend(first)
        async with open_fake_consumer(fake, group_id="g", topics=["t"],
                                      partition_assignment_strategy="range") as b, \
                trio.open_nursery() as nursery:
            stop = trio.Event()
            nursery.start_soon(consume_all, a, seen_a, stop)
            nursery.start_soon(consume_all, b, seen_b, stop)
            await until(lambda: len(b.assignment()) == 2)
            assert len(a.assignment()) == 2
            assert fake.group("g").generation == 2
            assert a.assignment() | b.assignment() == {TopicPartition("t", p) for p in range(4)}
            for p in range(4):
                await produce(fake, "t", [f"{p}-{i}".encode() for i in range(10, 20)], partition=p)
            await until(lambda: len(seen_a) + len(seen_b) == 80)
            nursery.cancel_scope.cancel()
    everything = sorted((r.partition, r.offset) for r in seen_a + seen_b)
    assert everything == [(p, o) for p in range(4) for o in range(20)]  # no duplicate, no gap
