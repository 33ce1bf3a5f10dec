"""The fetch stages without a group: positions, pipelining, backpressure, leader moves,
out-of-range resets (FakeCluster, virtual time)."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import trio

from pipeline import open_producer
from pipeline.consumer import (
    ConsumedRecord,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    TopicPartition,
)
from pipeline.consumer._config import ConsumerConfig
from pipeline.consumer._fetcher import Fetcher
from pipeline.consumer._state import Assignment, PartitionState
from pipeline.protocol.api import ApiKey
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import HalfRandom, open_fake_consumer, produce, take, until


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


def fetches_for(fake: FakeCluster, topic: str, partition: int) -> list[tuple[int, int, int]]:
    """(node, fetch offset, current leader epoch) of every Fetch naming the partition."""
    out = []
    for r in fake.requests_of(ApiKey.FETCH):
        for t in r.request.topics:
            for p in t.partitions:
                if t.topic == topic and p.partition == partition:
                    out.append((r.node_id, p.fetch_offset, p.current_leader_epoch))
    return out


async def test_a_leader_move_is_followed_from_the_same_position(fake: FakeCluster, autojump_clock: Any) -> None:
    """The old leader answers FENCED_LEADER_EPOCH (our epoch is older than its own);
    fresh metadata names the new leader and epoch; reading goes on where it was."""
    fake.create_topic("t", 1, leaders=[0])
    await produce(fake, "t", [b"a", b"b"], partition=0)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        assert [r.value for r in await take(consumer, 2)] == [b"a", b"b"]
        new = fake.move_leader("t", 0, to=1)
        await produce(fake, "t", [b"c", b"d"], partition=0)
        assert [r.value for r in await take(consumer, 2)] == [b"c", b"d"]
        seen = fetches_for(fake, "t", 0)
        assert (new, 2, 1) in seen  # from the new leader, same position, its epoch
        assert consumer.position(("t", 0)) == 4


async def test_a_stopped_leader_is_replaced(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 2, leaders=[0, 1])
    await produce(fake, "t", [b"0"], partition=0)
    await produce(fake, "t", [b"1"], partition=1)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        await take(consumer, 2)
        fake.stop_broker(0)
        await produce(fake, "t", [b"0+"], partition=0)
        (rec,) = await take(consumer, 1)
        assert (rec.partition, rec.offset, rec.value) == (0, 1, b"0+")


@pytest.mark.parametrize(("reset", "expected"), [("earliest", [0, 1, 2]), ("latest", [3])])
async def test_out_of_range_positions_are_reset(fake: FakeCluster, autojump_clock: Any,
                                                reset: str, expected: list[int]) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"a", b"b", b"c"], partition=0)
    async with open_fake_consumer(fake, topics=["t"], auto_offset_reset=reset) as consumer:
        if reset == "latest":
            await until(lambda: consumer.position(("t", 0)) == 3)
        await consumer.seek(("t", 0), 1000)
        if reset == "latest":
            await until(lambda: consumer.position(("t", 0)) == 3)
            await produce(fake, "t", [b"d"], partition=0)
        got = await take(consumer, len(expected))
        assert [r.offset for r in got] == expected
        # the reset followed the broker's OFFSET_OUT_OF_RANGE for a fetch at 1000
        assert any(o == 1000 for _, o, _ in fetches_for(fake, "t", 0))


async def test_out_of_range_without_a_reset_policy_is_an_error(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"a"], partition=0)
    async with open_fake_consumer(fake, partitions=[("t", 0)], auto_offset_reset="none") as consumer:
        await consumer.seek(("t", 0), 50)
        with pytest.raises(OffsetOutOfRangeError, match=r"offset 50 is out of range") as info:
            await take(consumer, 1)
        assert info.value.partitions == {("t", 0): 50}


async def test_no_position_without_a_reset_policy_is_an_error(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    async with open_fake_consumer(fake, topics=["t"], auto_offset_reset="none") as consumer:
        with pytest.raises(NoOffsetForPartitionError, match=r"t\[0\]"):
            await take(consumer, 1)


async def test_a_slow_application_bounds_what_is_buffered(fake: FakeCluster, autojump_clock: Any) -> None:
    """Backpressure: a partition is fetched again only while it buffers less than two
    fetches' worth (2 x max_partition_fetch_bytes); while the application reads
    nothing, nothing more is fetched."""
    limit = 16 * 1024
    fake.create_topic("t", 1)
    await produce(fake, "t", [bytes(1000)] * 200, partition=0)
    async with open_fake_consumer(fake, topics=["t"], max_partition_fetch_bytes=limit) as consumer:
        await take(consumer, 1)
        await trio.sleep(10)  # the application works on the first record
        state = consumer._assignment.partitions[("t", 0)]
        before = len(fetches_for(fake, "t", 0))
        await trio.sleep(10)
        assert len(fetches_for(fake, "t", 0)) == before  # full: not fetched again
        # fetched while under two fetches' worth, so never more than three
        assert 2 * limit <= state.buffered_bytes < 3 * limit
        got = await take(consumer, 199)
        assert [r.offset for r in got] == list(range(1, 200))


async def test_the_next_fetch_is_in_flight_while_the_application_works(
    fake: FakeCluster, autojump_clock: Any,
) -> None:
    """Pipelining: while the application works through the first fetch's records, the
    second fetch (from where the first ended) is already on its way, and its records
    are ready when the first run ends."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [bytes(1000)] * 60, partition=0)
    async with open_fake_consumer(fake, topics=["t"], max_partition_fetch_bytes=20_000) as consumer:
        await take(consumer, 1)
        first_end = consumer._assignment.partitions[("t", 0)].chunks[0].next_offset
        await trio.sleep(0.001)  # the application works; no record is taken meanwhile
        assert [o for _, o, _ in fetches_for(fake, "t", 0)][:2] == [0, first_end]
        assert len(consumer._assignment.partitions[("t", 0)].chunks) >= 2


async def test_pause_stops_fetching_and_handing_out(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 2)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        consumer.pause([("t", 0)])
        await produce(fake, "t", [b"p0"], partition=0)
        await produce(fake, "t", [b"p1"], partition=1)
        (rec,) = await take(consumer, 1)
        assert rec.partition == 1 and consumer.paused() == {TopicPartition("t", 0)}
        with trio.move_on_after(5):
            await take(consumer, 1)
            raise AssertionError("a paused partition was handed out")
        consumer.resume([("t", 0)])
        (rec,) = await take(consumer, 1)
        assert (rec.partition, rec.value) == (0, b"p0")


async def test_seek_rereads_and_seek_to_end_skips(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"a", b"b", b"c"], partition=0)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        await take(consumer, 3)
        await consumer.seek(("t", 0), 1)
        assert [r.value for r in await take(consumer, 2)] == [b"b", b"c"]
        await consumer.seek_to_beginning()
        assert [r.value for r in await take(consumer, 1)] == [b"a"]
        await consumer.seek_to_end([("t", 0)])
        await until(lambda: consumer.position(("t", 0)) == 3)
        await produce(fake, "t", [b"d"], partition=0)
        assert [r.value for r in await take(consumer, 1)] == [b"d"]
        assert consumer.lag()[TopicPartition("t", 0)] == 0


async def test_latest_starts_after_what_is_there(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"old"], partition=0)
    async with open_fake_consumer(fake, topics=["t"], auto_offset_reset="latest") as consumer:
        await until(lambda: consumer.position(("t", 0)) == 1)
        await produce(fake, "t", [b"new"], partition=0)
        assert [r.value for r in await take(consumer, 1)] == [b"new"]


async def test_batches_hand_out_lists_and_advance_positions(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [str(i).encode() for i in range(10)], partition=0)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        got: list[list[ConsumedRecord]] = []
        with trio.fail_after(60):
            async for batch in consumer.batches(max_records=4):
                got.append(batch)
                if sum(map(len, got)) == 10:
                    break
        assert [len(b) for b in got][:2] == [4, 4]
        assert [r.offset for b in got for r in b] == list(range(10))
        assert consumer.position(("t", 0)) == 10


@pytest.mark.parametrize("case", ["plain", "buffer-exactly-full", "open-transaction"])
async def test_a_long_poll_for_caught_up_partitions_does_not_hold_up_records(
        fake: FakeCluster, autojump_clock: Any, case: str) -> None:
    """Partition 1 is caught up, partition 0 has many records but a full buffer: no
    fetch for partition 1 alone is sent (it would wait ``fetch_max_wait`` for records
    that do not come, and partition 0 could not be fetched meanwhile); once the
    application drains partition 0's buffer, one fetch takes both. (The application
    takes 5 ms per batch, 26 batches: without the rule each refill waited 0.5 s.)

    ``buffer-exactly-full``: every fetch of partition 0 takes exactly 6 batches, so its
    buffer stops at the limit to the byte (full is ``>=``). ``open-transaction``: at
    read_committed, partition 1 holds a transaction still open from offset 0, so it is
    caught up at its last stable offset 0 though its high watermark is 1."""
    fake.create_topic("t", 2, leaders=[0, 0])
    await produce(fake, "t", [b"x" * 100 for _ in range(300)], partition=0)
    options: dict[str, Any] = {"max_partition_fetch_bytes": 2048}
    if case == "buffer-exactly-full":
        options["max_partition_fetch_bytes"] = 6 * len(fake.partition("t", 0).batches[0].data)
    async with contextlib.AsyncExitStack() as stack:
        if case == "open-transaction":
            options["isolation_level"] = "read_committed"
            producer = await stack.enter_async_context(open_producer(
                fake.bootstrap, connector=fake.connector, linger=0.0, transactional_id="tx",
                retry_backoff_jitter=0, rng=HalfRandom(3)))
            await producer.begin_transaction()
            await producer.send("t", b"y", partition=1)
            await producer.flush()  # in the log, not committed: the transaction stays open
            part = fake.partition("t", 1)
            assert (part.last_stable_offset, part.high_watermark) == (0, 1)
        else:
            await produce(fake, "t", [b"y"], partition=1)
        consumer = await stack.enter_async_context(
            open_fake_consumer(fake, topics=["t"], fetch_max_wait=0.5, **options))
        got = 0
        started = None
        with trio.fail_after(600):
            async for batch in consumer.batches():
                started = trio.current_time() if started is None else started
                got += len(batch)
                if got == (300 if case == "open-transaction" else 301):
                    break
                await trio.sleep(0.005)  # the application's work: the fetcher gets ahead
        assert started is not None
        elapsed = trio.current_time() - started
        assert elapsed < 0.5, f"{elapsed:.1f} s of long polls while records were waiting"
        fetched = [r for r in fake.requests_of(ApiKey.FETCH)
                   if r.request.topics and r.request.max_wait_ms > 0]
        alone = [r for r in fetched if [p.partition for t in r.request.topics
                                        for p in t.partitions] == [1]]
        assert len(alone) <= 2  # only before partition 0's buffer first filled up


@pytest.mark.parametrize(("isolation", "fetch_offset", "high_watermark", "lso", "caught_up"), [
    ("read_uncommitted", 5, 9, 5, False),  # records past an open transaction are readable
    ("read_uncommitted", 9, 9, 5, True),
    ("read_committed", 5, 9, 5, True),  # nothing readable past the last stable offset
    ("read_committed", 4, 9, 5, False),
    ("read_committed", 9, 9, -1, True),  # no last stable offset known: the high watermark
    ("read_committed", 0, 3, 0, True),  # a transaction open from offset 0
    ("read_uncommitted", 0, -1, -1, False),  # never fetched: nothing known yet
    ("read_committed", 0, -1, -1, False),
])
def test_a_partition_is_caught_up_at_the_end_its_isolation_level_reads_to(
        isolation: str, fetch_offset: int, high_watermark: int, lso: int, caught_up: bool) -> None:
    """The long-poll rule's view of a partition (``Fetcher._caught_up``)."""
    fetcher = Fetcher(None, ConsumerConfig(isolation_level=isolation),  # type: ignore[arg-type]
                      Assignment(1024), lambda exc: None)
    state = PartitionState(TopicPartition("t", 0), fetch_offset=fetch_offset,
                           high_watermark=high_watermark, last_stable_offset=lso)
    assert fetcher._caught_up(state) is caught_up
