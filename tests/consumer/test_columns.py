"""``batches(columns=True)``: the list form's records as columns, with the list form's
positions, commits and errors (FakeCluster, virtual time).

Scenarios read the same records once as lists (``batches()``) and once as columns,
and require the columns, read cell by cell, to be the lists' records field by field,
partition by partition.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
import trio

from pipeline import open_producer
from pipeline.consumer import (
    ConsumedColumns,
    ConsumedRecord,
    ConsumerClosedError,
    ConsumerError,
    MaxPollIntervalExceededError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
    TopicPartition,
)
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import HalfRandom, open_fake_consumer, produce

T = 1_700_000_000_000


def arrow_rows(columns: ConsumedColumns) -> list[ConsumedRecord]:
    """The records ``to_arrow()`` holds, read back through pyarrow."""
    batch = columns.to_arrow()
    assert batch.num_rows == len(columns)
    got = batch.to_pydict()
    stamps = batch.column("timestamp").cast(pa.int64()).to_pylist()
    return [ConsumedRecord(*row) for row in zip(
        got["topic"], got["partition"], got["offset"], stamps, got["key"], got["value"],
        [tuple((e["key"], e["value"]) for e in h) for h in got["headers"]],
        got["leader_epoch"], strict=True)]


def cells(columns: ConsumedColumns) -> list[ConsumedRecord]:
    """The records the columns hold, read cell by cell (not through ``records()``)."""
    return [ConsumedRecord(columns.topic, columns.partition, columns.offsets[i],
                           columns.timestamps[i], columns.keys[i], columns.values[i],
                           columns.headers[i], columns.leader_epochs[i])
            for i in range(len(columns))]


async def runs(consumer: Any, n: int, *, columns: bool, max_records: int | None = None
               ) -> list[list[ConsumedRecord]]:
    """The first runs ``batches()`` hands out, up to ``n`` records, as record lists."""
    out: list[list[ConsumedRecord]] = []
    got = 0
    with trio.fail_after(120):
        async for batch in consumer.batches(max_records, columns=columns):
            if columns:
                assert isinstance(batch, ConsumedColumns)
                rows = cells(batch)
                assert batch.records() == rows
                assert arrow_rows(batch) == rows
                assert batch.values.to_pylist() == [r.value for r in rows]
                assert (batch.topic, batch.partition) == (rows[0].topic, rows[0].partition)
                out.append(rows)
            else:
                out.append(batch)
            got += len(out[-1])
            if got >= n:
                break
    return out


def by_partition(runs: list[list[ConsumedRecord]]) -> dict[int, list[ConsumedRecord]]:
    """Each partition's records in the order handed out (runs of different partitions
    interleave as fetches complete, which timing decides)."""
    out: dict[int, list[ConsumedRecord]] = {}
    for run in runs:
        assert len({r.partition for r in run}) == 1  # one partition's run
        out.setdefault(run[0].partition, []).extend(run)
    return out


async def write_mixed(fake: FakeCluster, topic: str, compression: str) -> int:
    """Records with headers, null keys and null values, some in multi-record batches."""
    async with open_producer(fake.bootstrap, connector=fake.connector, linger=0.05,
                             compression=compression, retry_backoff_jitter=0,
                             rng=HalfRandom(2)) as producer:
        deliveries = []
        for i in range(40):
            key = None if i % 3 == 0 else b"k%d" % (i % 5)
            value = None if i % 7 == 0 else b"v%d" % i * (i % 4 + 1)
            headers = [("n", b"%d" % i), ("null", None), ("", b"")] if i % 2 else None
            deliveries.append(await producer.send(topic, value, key=key, headers=headers,
                                                  partition=i % 2, timestamp=T + i))
        for d in deliveries:
            await d
    return 40


@pytest.mark.parametrize("compression", ["none", "gzip", "zstd"])
async def test_columns_are_the_list_forms_records_field_by_field(
        fake: FakeCluster, autojump_clock: Any, compression: str) -> None:
    fake.create_topic("t", 2)
    n = await write_mixed(fake, "t", compression)
    got = {}
    for columns in (False, True):
        async with open_fake_consumer(fake, group_id=f"g-{columns}", topics=["t"]) as consumer:
            got[columns] = await runs(consumer, n, columns=columns, max_records=7)
            assert consumer.position(("t", 0)) == 20 and consumer.position(("t", 1)) == 20
    assert by_partition(got[True]) == by_partition(got[False])
    records = [r for run in got[True] for r in run]
    assert sorted((r.partition, r.offset) for r in records) == [
        (p, o) for p in range(2) for o in range(20)]
    assert any(r.key is None for r in records) and any(r.value is None for r in records)
    assert any(r.headers == (("n", b"1"), ("null", None), ("", b"")) for r in records)
    assert all(len(run) <= 7 for run in got[True])


async def test_read_committed_columns_skip_aborted_transactions_and_markers(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    async with open_producer(fake.bootstrap, connector=fake.connector, linger=0.0,
                             transactional_id="tx", retry_backoff_jitter=0,
                             rng=HalfRandom(3)) as producer:
        for outcome in ("commit", "abort", "commit"):
            await producer.begin_transaction()
            for i in range(3):
                await producer.send("t", b"%s-%d" % (outcome.encode(), i), partition=0)
            if outcome == "commit":
                await producer.commit_transaction()
            else:
                await producer.flush()  # the records are in the log when it aborts
                await producer.abort_transaction()
    await produce(fake, "t", [b"plain"], partition=0)
    got = {}
    for columns in (False, True):
        async with open_fake_consumer(fake, group_id=f"g-{columns}", topics=["t"],
                                      isolation_level="read_committed") as consumer:
            got[columns] = await runs(consumer, 7, columns=columns)
            # 3 committed + marker, 3 aborted + marker, 3 committed + marker, 1 plain
            assert consumer.position(("t", 0)) == 13
    assert got[True] == got[False]
    values = [r.value for run in got[True] for r in run]
    assert values == [b"commit-0", b"commit-1", b"commit-2"] * 2 + [b"plain"]


async def test_a_seek_mid_stream_and_positions_after_each_column_batch(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"%d" % i for i in range(10)], partition=0)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        batches = consumer.batches(max_records=3, columns=True)
        with trio.fail_after(60):
            first = await batches.__anext__()
            assert first.offsets.tolist() == [0, 1, 2] and consumer.position(("t", 0)) == 3
            second = await batches.__anext__()
            assert second.offsets.tolist() == [3, 4, 5] and consumer.position(("t", 0)) == 6
            await consumer.seek(("t", 0), 1)  # buffered records dropped; read again from 1
            again = await batches.__anext__()
            assert again.offsets.tolist() == [1, 2, 3]
            assert [bytes(v or b"") for v in again.values] == [b"1", b"2", b"3"]
            assert consumer.position(("t", 0)) == 4
            # the record form goes on from the same position, in the same chunk
            record = await consumer.__anext__()
            assert record.offset == 4 and consumer.position(("t", 0)) == 5
            rest = await batches.__anext__()
            assert rest.offsets.tolist() == [5, 6, 7] and consumer.position(("t", 0)) == 8


async def test_columns_after_records_of_the_same_chunk(fake: FakeCluster, autojump_clock: Any) -> None:
    """A chunk decoded as rows is handed out as columns from where the rows stopped."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"%d" % i for i in range(6)], partition=0)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        with trio.fail_after(60):
            first = await consumer.__anext__()
            while consumer.position(("t", 0)) != 1 or first.offset != 0:
                first = await consumer.__anext__()
            rest = await runs(consumer, 5, columns=True)
        assert [r.offset for run in rest for r in run] == [1, 2, 3, 4, 5]
        assert [r.value for run in rest for r in run] == [b"1", b"2", b"3", b"4", b"5"]
        assert consumer.position(("t", 0)) == 6


async def test_commit_after_a_column_batch_commits_what_was_handed_out(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"%d" % i for i in range(10)], partition=0)
    async with open_fake_consumer(fake, group_id="g", topics=["t"],
                                  enable_auto_commit=False) as consumer:
        batches = consumer.batches(max_records=4, columns=True)
        with trio.fail_after(60):
            batch = await batches.__anext__()
        assert batch.offsets.tolist() == [0, 1, 2, 3]
        await consumer.commit()
        assert fake.committed("g", "t", 0) == 4
        committed = await consumer.committed([("t", 0)])
        entry = committed[TopicPartition("t", 0)]
        assert entry is not None and entry.offset == 4
        assert entry.leader_epoch == batch.leader_epochs[3]
    # a restart goes on after what was committed
    async with open_fake_consumer(fake, group_id="g", topics=["t"],
                                  enable_auto_commit=False) as consumer:
        again = await runs(consumer, 6, columns=True)
        assert [r.offset for run in again for r in run] == list(range(4, 10))


async def test_a_rebalance_mid_stream_hands_every_record_out_and_commits_the_end(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """Two members reading columns, the second joining mid-stream (cooperative-sticky,
    auto-commit): every record is handed out, re-deliveries only of what was not
    committed at the revoke, and the group's commits end at the log end."""
    fake.create_topic("t", 4)
    for p in range(4):
        await produce(fake, "t", [b"%d-%d" % (p, i) for i in range(10)], partition=p)
    seen: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}
    assigned: dict[str, frozenset[TopicPartition]] = {}

    async def member(name: str, started: trio.Event, stop: trio.Event) -> None:
        async with open_fake_consumer(fake, group_id="g", topics=["t"], client_id=name,
                                      partition_assignment_strategy="cooperative-sticky",
                                      max_poll_records=3) as consumer:
            started.set()
            batches: AsyncIterator[ConsumedColumns] = consumer.batches(columns=True)
            async with trio.open_nursery() as nursery:
                async def read() -> None:
                    async for batch in batches:
                        seen[name].extend((batch.partition, o) for o in batch.offsets.tolist())
                        assert cells(batch) == batch.records()
                        assigned[name] = consumer.assignment()
                        # (3 records a second: the first member is still reading when the
                        # rebalance that lets the second in completes, a few heartbeats on)
                        await trio.sleep(1.0)
                nursery.start_soon(read)
                await stop.wait()
                nursery.cancel_scope.cancel()

    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        a_started, b_started = trio.Event(), trio.Event()
        nursery.start_soon(member, "a", a_started, stop)
        with trio.fail_after(120):
            while len(seen["a"]) < 6:  # noqa: ASYNC110
                await trio.sleep(0.05)
            nursery.start_soon(member, "b", b_started, stop)
            while not (seen["b"] and len(set(seen["a"]) | set(seen["b"])) == 40):  # noqa: ASYNC110
                await trio.sleep(0.05)
            await trio.sleep(10)  # an auto-commit interval
        stop.set()
    everything = set(seen["a"]) | set(seen["b"])
    assert everything == {(p, o) for p in range(4) for o in range(10)}
    for name in ("a", "b"):  # per member, each partition in offset order
        for p in range(4):
            mine = [o for q, o in seen[name] if q == p]
            assert mine == sorted(mine)
    assert assigned["a"] and assigned["b"] and not assigned["a"] & assigned["b"]
    assert all(fake.committed("g", "t", p) == 10 for p in range(4))


# ------------------------------------------------------------------ errors


async def test_out_of_range_without_a_reset_policy_is_raised_by_the_column_form(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"a"], partition=0)
    async with open_fake_consumer(fake, partitions=[("t", 0)], auto_offset_reset="none") as consumer:
        await consumer.seek(("t", 0), 50)
        with pytest.raises(OffsetOutOfRangeError, match=r"offset 50 is out of range"):
            await runs(consumer, 1, columns=True)


async def test_no_position_without_a_reset_policy_is_raised_by_the_column_form(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    async with open_fake_consumer(fake, topics=["t"], auto_offset_reset="none") as consumer:
        with pytest.raises(NoOffsetForPartitionError, match=r"t\[0\]"):
            await runs(consumer, 1, columns=True)


async def test_a_corrupt_batch_fails_the_column_form_naming_the_partition(
        fake: FakeCluster, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch whose records do not decode (its CRC checked out) is a ConsumerError
    naming the partition and the way on, in either form."""
    from pipeline.consumer import _decode

    fake.create_topic("t", 1)
    await produce(fake, "t", [b"a"], partition=0)

    def broken(*args: Any, **kwargs: Any) -> Any:
        from pipeline.protocol.batch_format import CorruptRecordError
        raise CorruptRecordError("batch at offset 0: bad record length")

    monkeypatch.setattr(_decode, "decode_record_columns", broken)
    monkeypatch.setattr(_decode, "decode_rows", broken)
    for columns in (True, False):
        async with open_fake_consumer(fake, topics=["t"]) as consumer:
            with pytest.raises(ConsumerError, match=r"t\[0\] at offset 0: corrupt record "
                                                    r"batch .*bad record length.*seek past it"):
                await runs(consumer, 1, columns=columns)


async def test_max_poll_interval_is_raised_by_the_column_form_and_iterating_rejoins(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"%d" % i for i in range(5)], partition=0)
    async with open_fake_consumer(fake, group_id="g", topics=["t"], max_poll_interval=10.0,
                                  enable_auto_commit=False) as consumer:
        batches = consumer.batches(max_records=1, columns=True)
        with trio.fail_after(60):
            await batches.__anext__()
        await trio.sleep(15)  # processing, not iterating
        assert consumer.state == "unjoined"
        with pytest.raises(MaxPollIntervalExceededError, match="max_poll_interval"):
            await batches.__anext__()
        with trio.fail_after(60):
            again = await consumer.batches(columns=True).__anext__()
        assert consumer.state == "stable" and len(again) >= 1


async def test_a_closed_consumer_refuses_the_column_form(fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        pass
    with pytest.raises(ConsumerClosedError):
        await consumer.batches(columns=True).__anext__()


async def test_deserializers_and_interceptors_refuse_the_column_form(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    async with open_fake_consumer(fake, topics=["t"], value_deserializer="str") as consumer:
        with pytest.raises(ValueError, match=r"columns=True\).*value_deserializer"):
            consumer.batches(columns=True)
        with pytest.raises(ValueError, match=r"get_columns\(\).*value_deserializer"):
            await consumer.get_columns()


async def test_get_columns_hands_out_one_run_and_advances_the_position(
        fake: FakeCluster, autojump_clock: Any) -> None:
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"%d" % i for i in range(5)], partition=0)
    async with open_fake_consumer(fake, topics=["t"]) as consumer:
        with trio.fail_after(60):
            first = await consumer.get_columns(3)
            assert first.offsets.tolist() == [0, 1, 2] and consumer.position(("t", 0)) == 3
            rest = await consumer.get_columns()
        assert rest.offsets.tolist() == [3, 4] and consumer.position(("t", 0)) == 5


def test_to_arrow_of_records_packed_as_columns_and_of_none() -> None:
    """Columns packed from records (header rows with a validity bitmap, int32 offsets)
    convert as the decoded ones do; so does a batch of no rows."""
    records = [ConsumedRecord("t", 1, 10 + i, T + i, None if i % 3 == 0 else b"k%d" % i,
                              None if i % 4 == 1 else b"v" * i,
                              (("a", b"1"), ("b", None)) if i % 2 else (), i % 2)
               for i in range(11)]
    columns = ConsumedColumns.of_records("t", 1, records)
    assert arrow_rows(columns) == records
    assert arrow_rows(columns.slice(3, 9)) == records[3:9]
    empty = ConsumedColumns.of_records("t", 1, [])
    assert arrow_rows(empty) == []
    assert empty.to_arrow().schema == columns.to_arrow().schema


async def test_a_rebalance_callback_error_is_raised_by_the_column_form(
        fake: FakeCluster, autojump_clock: Any) -> None:
    """A callback runs inside the application's iteration, so its error comes out of
    the column iteration as out of the list one; the change still took effect."""
    fake.create_topic("t", 1)
    await produce(fake, "t", [b"a"], partition=0)

    def refuse(consumer: Any, partitions: frozenset[TopicPartition]) -> None:
        raise RuntimeError(f"assigned {sorted(partitions)}")

    async with open_fake_consumer(fake, group_id="g", topics=["t"],
                                  on_assigned=refuse) as consumer:
        expected = r"assigned \[TopicPartition\(topic='t', partition=0\)\]"
        with trio.fail_after(60), pytest.raises(RuntimeError, match=expected):
            await consumer.batches(columns=True).__anext__()
        assert consumer.assignment() == {TopicPartition("t", 0)}
        again = await runs(consumer, 1, columns=True)
        assert [r.value for run in again for r in run] == [b"a"]
