"""``consumer.statistics()`` on the fake cluster, on virtual time: every value a schedule
determines is asserted exactly (records handed out, positions, lag, fetched bytes,
commits, the group's view).

Fetched bytes are compared with the bytes of the batches the fake stores (what its
Fetch answers carry).
"""

from __future__ import annotations

import json

import pytest
import trio

from pipeline import ConfigError, ConsumerStatistics
from pipeline.testing.fake.coordinators import GROUP
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_consumer, produce

VALUE = b"v" * 50


def log_bytes(fake: FakeCluster, topic: str, partition: int) -> int:
    return sum(len(b.data) for b in fake.partition(topic, partition).batches)


async def test_records_positions_and_bytes_per_partition_without_a_group(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    fake.create_topic("t", 2)
    await produce(fake, "t", [VALUE] * 4, partition=0)
    await produce(fake, "t", [VALUE] * 6, partition=1)
    async with open_fake_consumer(fake, partitions=[("t", 0), ("t", 1)]) as consumer:
        seen = 0
        async for _ in consumer:
            seen += 1
            if seen == 10:
                break
        stats = consumer.statistics()
    assert isinstance(stats, ConsumerStatistics)
    assert (stats.group_id, stats.member_id, stats.generation, stats.commits) == (None, "", -1, 0)
    assert stats.state == "assigned" and stats.assigned_partitions == 2
    b0, b1 = log_bytes(fake, "t", 0), log_bytes(fake, "t", 1)
    assert stats.consumed_records == 10
    assert stats.fetched_bytes == b0 + b1
    assert (stats.lag, stats.buffered_bytes) == (0, 0)
    topic = stats.topics["t"]
    assert (topic.consumed_records, topic.fetched_bytes, topic.lag) == (10, b0 + b1, 0)
    p0, p1 = topic.partitions[0], topic.partitions[1]
    for part, n, nbytes in ((p0, 4, b0), (p1, 6, b1)):
        assert (part.position, part.fetch_offset, part.high_watermark) == (n, n, n)
        assert (part.last_stable_offset, part.log_start_offset, part.lag) == (n, 0, 0)
        assert (part.consumed_records, part.fetched_bytes) == (n, nbytes)
        assert (part.buffered_bytes, part.buffered_offsets, part.committed) == (0, 0, None)
        assert part.fetches >= 1
        assert part.leader == fake.leader("t", 0 if part is p0 else 1)
    # Responses that brought data for a partition are Fetch requests sent.
    assert stats.fetches >= max(p0.fetches, p1.fetches)
    leaders = {fake.leader("t", 0), fake.leader("t", 1)}
    assert leaders <= set(stats.brokers)
    for node in leaders:
        assert stats.brokers[node].requests_by_api.get("Fetch", 0) >= 1


async def test_records_in_the_buffer_are_not_consumed_yet(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [VALUE] * 10, partition=0)
    async with open_fake_consumer(fake, partitions=[("t", 0)]) as consumer:
        seen = 0
        async for _ in consumer:
            seen += 1
            if seen == 3:
                break
        # The rest of the log is fetched, not handed out: position 3, lag 7.
        await trio.sleep(1.0)
        stats = consumer.statistics()
    part = stats.topics["t"].partitions[0]
    assert (part.position, part.fetch_offset, part.high_watermark, part.lag) == (3, 10, 10, 7)
    assert (part.consumed_records, stats.consumed_records) == (3, 3)
    assert part.buffered_offsets == 7
    assert part.fetched_bytes == stats.fetched_bytes == log_bytes(fake, "t", 0)
    # The buffer holds the fetched bytes until the last of their records is handed out.
    assert part.buffered_bytes == stats.buffered_bytes == stats.topics["t"].buffered_bytes
    assert 0 < part.buffered_bytes <= part.fetched_bytes
    assert (stats.lag, stats.topics["t"].lag) == (7, 7)
    assert part.fetch_state in ("fetching", "ready")


async def test_a_group_member_reports_its_group_and_its_commits(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    fake.create_topic("t", 2)
    await produce(fake, "t", [VALUE] * 3, partition=0)
    await produce(fake, "t", [VALUE] * 2, partition=1)
    async with open_fake_consumer(fake, group_id="g", topics=["t"],
                                  enable_auto_commit=False) as consumer:
        seen = 0
        async for _ in consumer:
            seen += 1
            if seen == 5:
                break
        await consumer.commit()
        await consumer.commit()
        await trio.sleep(2.5)  # heartbeats every second
        stats = consumer.statistics()
    assert stats.group_id == "g" and stats.state == "stable"
    assert stats.member_id and stats.leader is True
    assert (stats.generation, stats.rebalances, stats.commits) == (1, 1, 2)
    assert stats.coordinator == fake.coordinator("g", key_type=GROUP)
    assert stats.coordinator_moves == 0
    assert stats.since_last_heartbeat is not None and 0 <= stats.since_last_heartbeat <= 1.0
    parts = stats.topics["t"].partitions
    assert {p: parts[p].committed for p in parts} == {0: 3, 1: 2}
    assert stats.consumed_records == 5
    assert stats.fetched_bytes == log_bytes(fake, "t", 0) + log_bytes(fake, "t", 1)
    assert stats.age >= 2.5


async def test_interceptor_failures_are_counted(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    class Broken:
        def on_consume(self, records: list[object]) -> list[object]:
            raise RuntimeError("boom")

        def on_commit(self, offsets: object) -> None:
            raise RuntimeError("bang")

    fake.create_topic("t", 1)
    await produce(fake, "t", [VALUE] * 3, partition=0)
    async with open_fake_consumer(fake, group_id="g", topics=["t"], enable_auto_commit=False,
                                  interceptors=[Broken()]) as consumer:
        seen = 0
        async for _ in consumer:  # on_consume runs once per record here
            seen += 1
            if seen == 3:
                break
        await consumer.commit()
        stats = consumer.statistics()
    assert (stats.interceptor_errors, stats.consumed_records, stats.commits) == (4, 3, 1)


async def test_on_statistics_every_interval(
        fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [VALUE] * 2, partition=0)
    got: list[tuple[float, ConsumerStatistics]] = []
    async with open_fake_consumer(fake, partitions=[("t", 0)], statistics_interval=0.5,
                                  on_statistics=lambda s: got.append((trio.current_time(), s))
                                  ) as consumer:
        start = trio.current_time()
        seen = 0
        async for _ in consumer:
            seen += 1
            if seen == 2:
                break
        await trio.sleep(2.0 - (trio.current_time() - start) + 0.01)
    assert [round(t - start, 6) for t, _ in got] == [0.5, 1.0, 1.5, 2.0]
    assert got[-1][1].consumed_records == 2


async def test_plain_and_json_forms(fake: FakeCluster, autojump_clock: trio.abc.Clock) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [VALUE], partition=0)
    async with open_fake_consumer(fake, partitions=[("t", 0)], client_id="c1") as consumer:
        async for _ in consumer:
            break
        stats = consumer.statistics()
    plain = stats.to_dict()
    assert plain["client_id"] == "c1" and plain["consumed_records"] == 1
    assert plain["topics"]["t"]["partitions"][0]["position"] == 1
    back = json.loads(stats.to_json())
    assert back["topics"]["t"]["partitions"]["0"]["position"] == 1
    assert back["brokers"].keys() == {str(n) for n in stats.brokers}


@pytest.mark.parametrize(("options", "message"), [
    ({"statistics_interval": 1.0}, "needs on_statistics"),
    ({"on_statistics": print}, "on_statistics needs statistics_interval"),
    ({"statistics_interval": -1, "on_statistics": print}, "invalid statistics_interval=-1"),
])
def test_statistics_options_are_checked(options: dict[str, object], message: str) -> None:
    from pipeline import ConsumerConfig
    with pytest.raises(ConfigError, match=message):
        ConsumerConfig(**options)
