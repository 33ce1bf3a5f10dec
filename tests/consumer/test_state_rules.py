"""The per-partition state's rules (``consumer/_state.py``), each pinned where a user
sees it (FakeCluster, virtual time): committed leader epochs, pause and resume with
records buffered, the buffer bound to the byte, lag and the statistics before and
after a fetch, transaction markers, the columnar path, and the chunk's memory."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

import pytest
import trio

from pipeline import open_producer
from pipeline.consumer import ConsumedColumns, ConsumedRecord, OffsetAndMetadata, TopicPartition
from pipeline.consumer._decode import lazy_chunk
from pipeline.consumer._state import Assignment, Chunk
from pipeline.protocol.api import ApiKey
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import HalfRandom, open_fake_consumer, produce, take, until


def fetch_count(fake: FakeCluster) -> int:
    return len(fake.requests_of(ApiKey.FETCH))


def partition_stats(consumer: Any, topic: str = "t", partition: int = 0) -> Any:
    return consumer.statistics().topics[topic].partitions[partition]


# ------------------------------------------------------------------ leader epochs


async def test_the_committed_epoch_is_that_of_the_last_record_handed_out(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """What ``commit()`` sends with each offset (KIP-320) is the leader epoch of the
    record just before it: after every record of a fetch that spans leader epochs
    0, 1, 1, 2, and after the fetch is handed out to its end. A seek forgets it (the
    record before a sought offset is unknown: -1, as with Java's ``seek``)."""
    fake.create_topic("t", 1, leaders=[0])
    await produce(fake, "t", [b"a"], partition=0)
    fake.move_leader("t", 0, to=1)
    await produce(fake, "t", [b"b", b"c"], partition=0)
    fake.move_leader("t", 0, to=2)
    await produce(fake, "t", [b"d"], partition=0)
    tp = TopicPartition("t", 0)
    async with open_fake_consumer(fake, partitions=[("t", 0)]) as consumer:
        await consumer.seek(("t", 0), 0)  # the record before offset 0: none, epoch -1
        assert consumer.consumed_offsets()[tp] == OffsetAndMetadata(0, "", -1)
        await until(lambda: partition_stats(consumer).buffered_offsets == 4)
        assert len(consumer._assignment.partitions[tp].chunks) == 1  # one fetch
        epochs = []
        for _ in range(4):
            (record,) = await take(consumer, 1)
            epochs.append(record.leader_epoch)
            assert consumer.consumed_offsets()[tp] == OffsetAndMetadata(
                record.offset + 1, "", record.leader_epoch)
        assert epochs == [0, 1, 1, 2]
        assert not consumer._assignment.partitions[tp].chunks  # handed out to its end
        assert consumer.consumed_offsets()[tp] == OffsetAndMetadata(4, "", 2)
        await consumer.seek(("t", 0), 1)
        assert consumer.consumed_offsets()[tp] == OffsetAndMetadata(1, "", -1)


# ------------------------------------------------------------------ transaction markers


async def test_a_transaction_marker_fetched_alone_moves_the_position_past_it(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """A fetch that brings only a commit marker (the transaction's records were read
    before it was written) hands out nothing, and the position moves past the marker:
    the next record handed out is the one after it."""
    fake.create_topic("t", 1)
    async with contextlib.AsyncExitStack() as stack:
        producer = await stack.enter_async_context(open_producer(
            fake.bootstrap, connector=fake.connector, linger=0.0, transactional_id="tx",
            retry_backoff_jitter=0, rng=HalfRandom(3)))
        consumer = await stack.enter_async_context(open_fake_consumer(fake, topics=["t"]))
        await producer.begin_transaction()
        await producer.send("t", b"in-tx", partition=0)
        await producer.flush()
        (record,) = await take(consumer, 1)
        assert (record.offset, record.value) == (0, b"in-tx")
        before = fetch_count(fake)
        await producer.commit_transaction()  # the marker is offset 1
        await until(lambda: fetch_count(fake) > before + 1)  # the marker was fetched
        await produce(fake, "t", [b"after"], partition=0)
        (record,) = await take(consumer, 1)
        assert (record.offset, record.value) == (2, b"after")
        assert consumer.position(("t", 0)) == 3


# ------------------------------------------------------------------ pause and resume


async def test_pause_stops_handing_out_what_is_already_buffered(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """Java's ``pause``: records already fetched for a paused partition are kept but
    not handed out, even in the middle of a fetch's records; the other partitions go
    on; after ``resume`` the kept records come, in order, from where it stopped."""
    fake.create_topic("t", 2)
    await produce(fake, "t", [f"a{i}".encode() for i in range(10)], partition=0)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        await until(lambda: partition_stats(consumer).buffered_offsets == 10)
        await produce(fake, "t", [b"b0", b"b1"], partition=1)
        await until(lambda: partition_stats(consumer, "t", 1).buffered_offsets == 2)
        (first,) = await take(consumer, 1)
        assert (first.partition, first.offset) == (0, 0)
        consumer.pause([("t", 0)])
        got = await take(consumer, 2)
        assert [(r.partition, r.value) for r in got] == [(1, b"b0"), (1, b"b1")]
        with trio.move_on_after(5):
            await take(consumer, 1)
            raise AssertionError("a paused partition's buffered record was handed out")
        consumer.resume([("t", 0)])
        got = await take(consumer, 9)
        assert [(r.partition, r.offset) for r in got] == [(0, i) for i in range(1, 10)]


async def test_resume_wakes_an_iteration_waiting_for_the_buffered_records(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """An application already waiting for records gets a resumed partition's buffered
    records at once (nothing else is fetched meanwhile that could wake it)."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"x", b"y"], partition=0)
    async with open_fake_consumer(fake, partitions=[("t", 0)]) as consumer:
        await until(lambda: partition_stats(consumer).buffered_offsets == 2)
        consumer.pause([("t", 0)])
        got: list[ConsumedRecord] = []

        async def reader() -> None:
            got.extend(await take(consumer, 2))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.sleep(1)
            assert got == []
            resumed_at = trio.current_time()
            consumer.resume([("t", 0)])
        assert [r.value for r in got] == [b"x", b"y"]
        assert trio.current_time() - resumed_at < 0.1


async def test_resuming_a_partition_that_is_not_paused_changes_nothing(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """``resume`` of a partition that is not paused: every buffered record is still
    handed out exactly once, in order."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"x", b"y"], partition=0)
    async with open_fake_consumer(fake, partitions=[("t", 0)]) as consumer:
        await until(lambda: partition_stats(consumer).buffered_offsets == 2)
        consumer.resume([("t", 0)])
        got = await take(consumer, 2)
        assert [r.offset for r in got] == [0, 1]
        with trio.move_on_after(5):
            await take(consumer, 1)
            raise AssertionError("a record was handed out twice")
        assert consumer.position(("t", 0)) == 2


async def test_seek_to_beginning_of_a_paused_partition_looks_the_position_up_at_once(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """``seek_to_beginning`` forgets the position and the lookup starts at once, even
    with nothing else going on (the partition is paused: nothing is fetched)."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"x", b"y"], partition=0)
    async with open_fake_consumer(fake, partitions=[("t", 0)]) as consumer:
        await consumer.seek(("t", 0), 2)
        consumer.pause([("t", 0)])
        await trio.sleep(1)
        await consumer.seek_to_beginning()
        assert consumer.position(("t", 0)) is None
        await until(lambda: consumer.position(("t", 0)) == 0, within=1)


# ------------------------------------------------------------------ the buffer bound


def exact_fetch_bytes(fake: FakeCluster, batches: int) -> int:
    """A max_partition_fetch_bytes that ``batches`` of the topic's equal batches fill
    to the byte (every fetch then takes exactly that many)."""
    sizes = {len(b.data) for b in fake.partition("t", 0).batches}
    assert len(sizes) == 1
    return batches * sizes.pop()


async def test_a_buffer_full_to_the_byte_is_not_fetched_again(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """Backpressure at the bound itself: a partition that buffers exactly two fetches'
    worth (2 x max_partition_fetch_bytes) is full, and not fetched again until the
    application takes records."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [bytes(100)] * 30, partition=0)
    fetch_bytes = exact_fetch_bytes(fake, 5)
    async with open_fake_consumer(fake, partitions=[("t", 0)],
                                  max_partition_fetch_bytes=fetch_bytes) as consumer:
        await until(lambda: partition_stats(consumer).buffered_bytes == 2 * fetch_bytes)
        before = fetch_count(fake)
        await trio.sleep(10)
        assert fetch_count(fake) == before
        stats = partition_stats(consumer)
        assert (stats.buffered_bytes, stats.fetch_state) == (2 * fetch_bytes, "buffer_full")


@pytest.mark.parametrize("columns", [False, True])
async def test_a_batch_that_ends_a_fetch_frees_its_bytes_while_the_application_works(
        fake: FakeCluster, autojump_clock: Any, columns: bool) -> None:
    """Pipelining with a full buffer: handing out a list (or columns) that ends a
    fetch's records frees that fetch's bytes at once, so the next fetch is under way
    while the application works on the list, not only when it asks for more."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [bytes(100)] * 30, partition=0)
    fetch_bytes = exact_fetch_bytes(fake, 5)
    async with open_fake_consumer(fake, partitions=[("t", 0)],
                                  max_partition_fetch_bytes=fetch_bytes) as consumer:
        await until(lambda: partition_stats(consumer).buffered_bytes == 2 * fetch_bytes)
        before = fetch_count(fake)
        with trio.fail_after(60):
            async for batch in consumer.batches(columns=columns):
                assert len(batch) == 5  # the first fetch's records, all of them
                await trio.sleep(1)  # the application works on them
                assert fetch_count(fake) == before + 1
                assert partition_stats(consumer).buffered_bytes == 2 * fetch_bytes
                break


async def test_seek_empties_a_full_buffer(fake: FakeCluster, autojump_clock: Any) -> None:
    """A seek drops what was buffered for the partition, bytes and all: the buffer is
    empty at once, and fetching goes on from the new position."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [bytes(100)] * 30, partition=0)
    fetch_bytes = exact_fetch_bytes(fake, 5)
    async with open_fake_consumer(fake, partitions=[("t", 0)],
                                  max_partition_fetch_bytes=fetch_bytes) as consumer:
        await until(lambda: partition_stats(consumer).buffered_bytes == 2 * fetch_bytes)
        consumer.pause([("t", 0)])
        await consumer.seek(("t", 0), 20)
        assert partition_stats(consumer).buffered_bytes == 0
        consumer.resume([("t", 0)])
        got = await take(consumer, 10)
        assert [r.offset for r in got] == list(range(20, 30))


# ------------------------------------------------------------------ lag and statistics


async def test_before_its_first_fetch_a_partition_knows_no_log_end_and_no_lag(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """A partition never fetched yet (its position being looked up, then paused from
    the start): lag unknown (None, not 0), the log's offsets unknown, nothing
    buffered, no fetch counted; fetched once, they are known."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"x", b"y", b"z"], partition=0)
    async with open_fake_consumer(fake, partitions=[("t", 0)]) as consumer:
        consumer.pause([("t", 0)])
        stats = partition_stats(consumer)  # the position is being looked up
        assert (stats.fetch_state, stats.buffered_bytes, stats.fetches) == ("offset_lookup", 0, 0)
        await until(lambda: consumer.position(("t", 0)) == 0)
        await trio.sleep(1)
        stats = partition_stats(consumer)
        assert consumer.lag() == {TopicPartition("t", 0): None}
        assert (stats.lag, stats.high_watermark, stats.last_stable_offset,
                stats.log_start_offset) == (None, None, None, None)
        assert (stats.buffered_bytes, stats.fetches, stats.fetch_state) == (0, 0, "paused")
        consumer.resume([("t", 0)])
        await until(lambda: partition_stats(consumer).fetches == 1)
        stats = partition_stats(consumer)
        assert (stats.lag, stats.high_watermark, stats.last_stable_offset,
                stats.log_start_offset) == (3, 3, 3, 0)
        assert consumer.lag() == {TopicPartition("t", 0): 3}
        await take(consumer, 1)
        assert consumer.lag() == {TopicPartition("t", 0): 2}


async def test_an_empty_partition_has_lag_zero_once_fetched(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """An empty partition's log ends at 0: once fetched, its lag is 0 (known)."""
    fake.create_topic("t", 1)
    async with open_fake_consumer(fake, partitions=[("t", 0)]) as consumer:
        await until(lambda: partition_stats(consumer).high_watermark == 0)
        assert consumer.lag() == {TopicPartition("t", 0): 0}
        assert partition_stats(consumer).lag == 0


@pytest.mark.parametrize(("isolation", "lag"), [("read_committed", 0), ("read_uncommitted", 1)])
async def test_lag_counts_to_the_end_the_isolation_level_reads_to(
        fake: FakeCluster, autojump_clock: Any, isolation: str, lag: int) -> None:
    """A transaction is open from offset 0 (last stable offset 0, high watermark 1).
    read_committed can read nothing yet: lag 0. read_uncommitted can read the open
    transaction's record: lag 1 (Java's ``currentLag``: the last stable offset for
    read_committed, the high watermark otherwise)."""
    fake.create_topic("t", 1)
    async with contextlib.AsyncExitStack() as stack:
        producer = await stack.enter_async_context(open_producer(
            fake.bootstrap, connector=fake.connector, linger=0.0, transactional_id="tx",
            retry_backoff_jitter=0, rng=HalfRandom(3)))
        await producer.begin_transaction()
        await producer.send("t", b"open", partition=0)
        await producer.flush()
        consumer = await stack.enter_async_context(open_fake_consumer(
            fake, partitions=[("t", 0)], isolation_level=isolation))
        await until(lambda: partition_stats(consumer).high_watermark == 1)
        stats = partition_stats(consumer)
        assert (stats.position, stats.last_stable_offset) == (0, 0)
        assert consumer.lag() == {TopicPartition("t", 0): lag}
        assert stats.lag == lag


async def test_a_partition_with_a_known_leader_is_fetched_as_soon_as_it_has_a_position(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """A newly assigned partition whose leader the cached metadata names is fetched as
    soon as its position is known (the ListOffsets answer), with no wait for a
    metadata refresh first."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"x"], partition=0)
    async with open_fake_consumer(fake, partitions=[("t", 0)]) as consumer:
        await take(consumer, 1)
        (lookup,) = fake.requests_of(ApiKey.LIST_OFFSETS)
        first_fetch = fake.requests_of(ApiKey.FETCH)[0]
        assert first_fetch.time - lookup.time < 0.01


# ------------------------------------------------------------------ the columnar path


async def test_columns_are_handed_out_without_a_python_object_per_record(
        fake: FakeCluster, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``batches(columns=True)`` decodes straight to columns, never to
    :class:`ConsumedRecord` rows, even when a fetch's records come out in several
    parts; what they hand out counts as consumed and commits with its epoch."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [str(i).encode() for i in range(10)], partition=0)

    def no_rows(self: ConsumedColumns) -> list[ConsumedRecord]:
        raise AssertionError("columns were turned into rows")

    monkeypatch.setattr(ConsumedColumns, "records", no_rows)
    async with open_fake_consumer(fake, partitions=[("t", 0)]) as consumer:
        await until(lambda: partition_stats(consumer).buffered_offsets == 10)
        got: list[bytes] = []
        with trio.fail_after(60):
            async for columns in consumer.batches(4, columns=True):
                got.extend(columns.values)
                if len(got) == 10:
                    break
        assert got == [str(i).encode() for i in range(10)]
        assert partition_stats(consumer).consumed_records == 10
        assert consumer.statistics().consumed_records == 10
        assert consumer.consumed_offsets()[TopicPartition("t", 0)] == OffsetAndMetadata(10, "", 0)


async def test_switching_from_records_to_columns_hands_out_each_record_once(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """Iterating records, then asking for columns: a fetch already decoded as rows
    (of one record) is handed out as columns holding that record."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"a"], partition=0)
    async with open_fake_consumer(fake, partitions=[("t", 0)]) as consumer:
        await until(lambda: partition_stats(consumer).buffered_offsets == 1)
        await produce(fake, "t", [b"b"], partition=0)
        state = consumer._assignment.partitions[TopicPartition("t", 0)]
        await until(lambda: len(state.chunks) == 2)  # two fetches of one record each
        (record,) = await take(consumer, 1)
        assert record.value == b"a"
        with trio.fail_after(60):
            async for columns in consumer.batches(columns=True):
                assert (list(columns.offsets), list(columns.values)) == ([1], [b"b"])
                assert (columns.topic, columns.partition) == ("t", 0)
                break
        assert consumer.position(("t", 0)) == 2


# ------------------------------------------------------------------ memory


@pytest.mark.parametrize("columns", [False, True])
async def test_a_decoded_fetch_no_longer_holds_its_wire_bytes(
        fake: FakeCluster, autojump_clock: Any, columns: bool) -> None:
    """Once a fetch's records are decoded (as rows or columns), the buffer holds them,
    not also the response's bytes they came from."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"x" * 1000] * 3, partition=0)
    data = b"".join(b.data for b in fake.partition("t", 0).batches)
    held = sys.getrefcount(data)
    chunk = lazy_chunk(data, "t", 0, 0)
    assert sys.getrefcount(data) > held  # undecoded, the chunk keeps its bytes
    assert chunk.count(columns) == 3
    assert sys.getrefcount(data) == held
    assert chunk.count(not columns) == 3  # the other form, converted
    assert sys.getrefcount(data) == held


async def test_an_empty_fetch_answer_while_records_are_buffered_moves_no_position(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """Two fetches' records are buffered (one record each) and a third fetch, caught
    up, comes back empty after its long poll: handing out the first fetch's record
    puts the position right after it (where the second fetch starts), not at the end
    of what is buffered."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"a"], partition=0)
    async with open_fake_consumer(fake, partitions=[("t", 0)], fetch_max_wait=0.1) as consumer:
        state = consumer._assignment.partitions[TopicPartition("t", 0)]
        await until(lambda: len(state.chunks) == 1)
        await produce(fake, "t", [b"b"], partition=0)
        await until(lambda: len(state.chunks) == 2)
        fetches = fetch_count(fake)
        await until(lambda: fetch_count(fake) >= fetches + 2)  # an empty answer came back
        assert state.fetch_offset == 2
        with trio.fail_after(60):
            async for batch in consumer.batches():
                assert [r.value for r in batch] == [b"a"]
                break
        assert consumer.position(("t", 0)) == 1
        assert consumer.consumed_offsets()[TopicPartition("t", 0)].offset == 1


# ------------------------------------------------------------------ the change signal

CHANGES = ["add", "remove", "seek", "request_reset", "pause", "resume", "append"]


@pytest.mark.parametrize("change", CHANGES)
async def test_every_change_to_the_assignment_wakes_the_tasks_waiting_for_one(
        autojump_clock: Any, change: str) -> None:
    """The fetch tasks, the offset resolver and a waiting iteration sleep in
    ``wait_changed`` until something they act on changes (``_state.py``'s module
    doc): partitions added or revoked, a position set or forgotten, pause and resume,
    records buffered. Each wakes them at once."""
    tp = TopicPartition("t", 0)
    assignment = Assignment(1024)
    assignment.add([tp])
    assignment.seek(tp, 0)
    if change == "resume":
        assignment.pause([tp])
    state = assignment.partitions[tp]
    apply: dict[str, Callable[[], None]] = {
        "add": lambda: assignment.add([TopicPartition("t", 1)]),
        "remove": lambda: assignment.remove([tp]),
        "seek": lambda: assignment.seek(tp, 5),
        "request_reset": lambda: assignment.request_reset(tp, "earliest"),
        "pause": lambda: assignment.pause([tp]),
        "resume": lambda: assignment.resume([tp]),
        "append": lambda: assignment.append(state, Chunk(None, 3, 100, load=list)),
    }
    woken: list[float] = []

    async def waiter() -> None:
        await assignment.wait_changed()
        woken.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(1)
        apply[change]()
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    assert woken == [1.0]


def test_adding_a_partition_already_assigned_keeps_its_state() -> None:
    """Assigning partitions again that are assigned already (as Java's ``assign``
    keeps the positions of those it had) leaves their position and buffered
    records as they were; only the new ones start without a position."""
    tp, other = TopicPartition("t", 0), TopicPartition("t", 1)
    assignment = Assignment(1024)
    assignment.add([tp])
    assignment.seek(tp, 7)
    state = assignment.partitions[tp]
    assignment.append(state, Chunk(None, 9, 100, load=list))
    assignment.add([tp, other])
    assert assignment.partitions[tp] is state
    assert (state.position, state.fetch_offset, state.buffered_bytes) == (7, 9, 100)
    assert assignment.partitions[other].position is None
