"""The fetch stages without a group: positions, pipelining, backpressure, leader moves,
out-of-range resets (FakeCluster, virtual time)."""

from __future__ import annotations

from typing import Any

import trio

from pipeline.consumer import ConsumedRecord, TopicPartition
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_consumer, produce


async def take(consumer: Any, n: int) -> list[ConsumedRecord]:
    out: list[ConsumedRecord] = []
    with trio.fail_after(60):
        async for record in consumer:
            out.append(record)
            if len(out) == n:
                break
    return out


async def test_reads_every_partition_from_the_beginning(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 3)
    for p in range(3):
        await produce(fake, "t", [f"{p}-{i}".encode() for i in range(5)], partition=p)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        got = await take(consumer, 15)
        assert consumer.state == "assigned"
        assert consumer.assignment() == {TopicPartition("t", p) for p in range(3)}
        for p in range(3):
            mine = [r for r in got if r.partition == p]
            assert [r.offset for r in mine] == list(range(5))
            assert [r.value for r in mine] == [f"{p}-{i}".encode() for i in range(5)]
            assert consumer.position(("t", p)) == 5
        assert all(r.leader_epoch == 0 for r in got)
