"""Keyed ``send()`` calls travel as columns too (``burst.py``, ``row_outcomes.py``).

A loop of ``await producer.send(topic, value, key=key)`` appends each key to the
open burst's key column; the topic producer splits the burst by the keys' Java
murmur2 partitions (as ``send_batch`` does), so one burst's rows are spread over
partitions, and each row's delivery finds its run through the burst's wire order.
These schedules check that every keyed row gets exactly the outcome the
per-message path gives it: its murmur2 partition, its offset in its partition's
send order, its key on the wire, its callback once, and its error naming it."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pipeline.producer._columnar.burst import RowDelivery
from pipeline.producer._errors import ProducerError
from pipeline.producer._stages.partitioner import murmur2
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer
from .test_send_rows import EVERY, LOOP, _kinds, columnar_next

P = 6


@pytest.fixture(autouse=True)
def _modes(both_modes: bool, await_path: str, send_path: str) -> bool:
    """Plain and idempotent, both await paths and both send paths (C and twin)."""
    return both_modes


def _partition_of(key: bytes) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % P


def _log(fake: FakeCluster, topic: str) -> dict[int, list[tuple[bytes | None, bytes | None]]]:
    return {p: [(e.record.key, e.record.value) for e in fake.log(topic, p)] for p in range(P)}


async def test_keyed_rows_land_on_their_murmur2_partition_in_send_order(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """LOOP keyed sends (50 keys, every 7th send keyless) after the loop is known
    columnar: every delivery is a row; each keyed row is on its key's murmur2
    partition; each partition's log holds its rows' (key, value) in send order;
    each row's offset, partition, key and awaited metadata match its place there,
    read in a shuffled order (the lazy row -> position map of row_outcomes.py)."""
    fake.create_topic("t", P)
    keys = [b"key-%d" % i for i in range(50)]
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        sent = []
        deliveries = []
        for i in range(LOOP):
            key = None if i % 7 == 3 else keys[i % 50]
            sent.append((key, b"v%d" % i))
            deliveries.append(await producer.send("t", b"v%d" % i, key=key))
        await producer.flush()
    assert set(_kinds(deliveries)) == {"row"}
    log = _log(fake, "t")
    assert sum(map(len, log.values())) == LOOP
    where = {entry: (p, offset) for p, entries in log.items()
             for offset, entry in enumerate(entries)}
    assert len(where) == LOOP  # (the values are distinct)
    for p, entries in log.items():  # send order within each partition
        assert entries == [e for e in sent if where[e][0] == p]
    order = list(range(LOOP))
    random.Random(7).shuffle(order)
    for i in order:
        d, (key, value) = deliveries[i], sent[i]
        p, offset = where[(key, value)]
        if key is not None:
            assert p == _partition_of(key)
        meta = await d
        assert (meta.partition, meta.offset) == (p, offset)
        assert (d.partition, d.offset, d.key, d.value, d.done()) == (p, offset, key, value, True)
        assert d.result() == meta == d.record_metadata()
        assert repr(d) == f"<Delivery t[{p}] key={key!r} ok offset={offset}>"
        assert (d.message.key, d.message.value, d.message.offset) == (key, value, offset)


async def test_keyed_rows_are_awaited_as_they_settle(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A loop that awaits each keyed row right after its burst was sent (so
    rows are looked up while their burst's runs are still settling, and the
    map is filled run by run): each gets its own partition and offset."""
    first: list[Any] = []
    fake.create_topic("t", P)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        got = []
        for burst in range(3):
            rows = [await producer.send("t", b"b%d-%d" % (burst, i), key=b"k%d" % (i % 11))
                    for i in range(EVERY // 2)]
            first = first if burst else rows
            for d in rows:
                got.append((d.key, d.value, await d))
        await producer.flush()
    # (later bursts may start as messages: a burst cut short by a schedule point
    # makes the next one per-message, the COLUMNS_MIN rule)
    assert all(type(d) is RowDelivery for d in first)
    log = _log(fake, "t")
    for key, value, meta in got:
        assert meta.partition == _partition_of(key)
        assert log[meta.partition][meta.offset] == (key, value)


async def test_keyed_rows_call_back_once_each_with_their_partition_and_offset(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """on_delivery on every other keyed row (the first burst's callbacks start
    mid-burst): each row with one hears once, with its row's partition and
    offset; rows of one partition hear in their send order."""
    fake.create_topic("t", P)
    heard: dict[bytes, list[Any]] = {}

    def hear(value: bytes) -> Any:
        return lambda meta, error: heard.setdefault(value, []).append((meta, error))

    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        deliveries = []
        for i in range(LOOP):
            value = b"v%d" % i
            fn = hear(value) if i % 2 else None
            deliveries.append(await producer.send("t", value, key=b"k%d" % (i % 13),
                                                  on_delivery=fn))
        await producer.flush()
    assert set(_kinds(deliveries)) == {"row"}
    assert len(heard) == LOOP // 2
    per_partition: dict[int, list[int]] = {}
    for d in deliveries[1::2]:
        [(meta, error)] = heard[d.value]
        assert error is None
        assert (meta.partition, meta.offset, meta.topic) == (d.partition, d.offset, "t")
        per_partition.setdefault(meta.partition, []).append(meta.offset)
    assert all(offsets == sorted(offsets) for offsets in per_partition.values())


async def test_keyed_rows_the_broker_rejects_fail_naming_their_value_and_key(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """retries=0, every Produce request after warm-up answered
    NOT_ENOUGH_REPLICAS: each keyed row fails once, its error (awaited and
    through its callback) names its own value and key."""
    from pipeline.protocol.api import ApiKey
    from pipeline.protocol.errors import ErrorCode

    fake.create_topic("t", P, leaders=[0] * P)
    errors: list[Any] = []
    async with open_fake_producer(fake, idempotent=False, retries=0) as producer:
        columnar_next(producer)
        for _ in range(40):
            fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        rows = [await producer.send("t", b"r%d" % i, key=b"k%d" % (i % 5),
                                    on_delivery=lambda m, e: errors.append(e))
                for i in range(200)]
        await producer.flush()
    assert set(_kinds(rows)) == {"row"}
    assert len(errors) == 200
    assert sorted(e.message.value for e in errors) == sorted(d.value for d in rows)
    for e in errors:
        assert e.message.key == b"k%d" % (int(e.message.value[1:]) % 5)
    for i, d in enumerate(rows):
        with pytest.raises(ProducerError, match="NOT_ENOUGH_REPLICAS") as info:
            await d
        assert (info.value.message.value, info.value.message.key) == (b"r%d" % i,
                                                                      b"k%d" % (i % 5))
        assert d.offset == -1 and d.partition == _partition_of(b"k%d" % (i % 5))


async def test_too_large_keyed_batches_are_halved_and_each_row_reports_its_offset(
    nursery: Any, autojump_clock: Any
) -> None:
    """KIP-126 on a keyed burst: ~40 keyed rows per partition over the topic's
    1200-byte limit are halved until each part fits (the halves keep their wire
    positions: RowRun.place); each row reports its own place in its partition's
    log, awaited in reverse."""
    fake = FakeCluster(brokers=1, seed=3, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("t", 3, configs={"max.message.bytes": "1200"})
    sent = [(b"k%d" % (i % 9), b"%03d:" % i + b"x" * 100) for i in range(120)]
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        rows = [await producer.send("t", v, key=k) for k, v in sent]
        results = [await d for d in reversed(rows)][::-1]
    assert set(_kinds(rows)) == {"row"}
    log = {p: [(e.record.key, e.record.value) for e in fake.log("t", p)] for p in range(3)}
    for (key, value), meta in zip(sent, results, strict=True):
        assert meta.partition == (murmur2(key) & 0x7FFFFFFF) % 3
        assert log[meta.partition][meta.offset] == (key, value)
    for p, entries in log.items():
        assert entries == [e for e in sent if (murmur2(e[0]) & 0x7FFFFFFF) % 3 == p]


async def test_str_keys_and_values_travel_as_utf8_rows(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``send(topic, json_text, key=user_id)`` with str key and value (the usual
    Python call): rows, not messages, each written as UTF-8, on the murmur2
    partition of its key's UTF-8 bytes (the per-message path's rule)."""
    fake.create_topic("t", P)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        rows = [await producer.send("t", f'{{"n": {i}, "é": 1}}', key=f"user-{i % 17}-ü")
                for i in range(500)]
        await producer.flush()
    assert set(_kinds(rows)) == {"row"}
    log = _log(fake, "t")
    for i, d in enumerate(rows):
        key, value = f"user-{i % 17}-ü".encode(), f'{{"n": {i}, "é": 1}}'.encode()
        assert (d.key, d.value, d.partition) == (key, value, _partition_of(key))
        assert log[d.partition][d.offset] == (key, value)


async def test_a_keyed_burst_cut_into_several_batches_per_partition(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """batch_bytes=2048: each partition's rows of one keyed burst are cut into
    several batches (runs), each with its own wire positions; every row still
    reports its own offset, and each partition's log is in send order."""
    fake.create_topic("t", 3)
    async with open_fake_producer(fake, batch_bytes=2048) as producer:
        columnar_next(producer)
        sent = [(b"k%d" % (i % 5), b"%04d:" % i + b"x" * 40) for i in range(600)]
        rows = [await producer.send("t", v, key=k) for k, v in sent]
        await producer.flush()
        runs = len(producer._ledger.outstanding)  # (all settled: 0)
    assert runs == 0 and set(_kinds(rows)) == {"row"}
    log = {p: [(e.record.key, e.record.value) for e in fake.log("t", p)] for p in range(3)}
    assert max(len(entries) for entries in log.values()) > 2048 // 45  # (several batches)
    for (key, value), d in zip(sent, rows, strict=True):
        assert d.partition == (murmur2(key) & 0x7FFFFFFF) % 3
        assert log[d.partition][d.offset] == (key, value)


async def test_one_key_and_keyless_rows_in_one_burst(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A burst whose rows have one key (all on that key's partition) or none
    (the sticky partition, which may be any): every row is written once, the
    keyed ones on their partition in send order. (No key maps to partition 0
    here, so the keyless rows' assignment is not skipped by a partition-0 test.)"""
    fake.create_topic("t", P)
    key = next(b"k%d" % i for i in range(100) if _partition_of(b"k%d" % i) == 4)
    async with open_fake_producer(fake) as producer:
        columnar_next(producer)
        sent = [(key if i % 2 else None, b"v%d" % i) for i in range(300)]
        rows = [await producer.send("t", v, key=k) for k, v in sent]
        await producer.flush()
    assert set(_kinds(rows)) == {"row"}
    log = _log(fake, "t")
    assert sorted(e[1] for entries in log.values() for e in entries) == sorted(v for _, v in sent)
    assert [e for e in log[4] if e[0] == key] == [e for e in sent if e[0] == key]
    for (k, v), d in zip(sent, rows, strict=True):
        assert log[d.partition][d.offset] == (k, v)


async def test_halves_of_a_keyed_run_keep_producer_id_0_and_their_sequences(
    nursery: Any, autojump_clock: Any
) -> None:
    """KIP-126 on an idempotent producer whose id is 0 (a new Kafka cluster's
    first): both halves are sealed with producer id 0, its epoch and their
    part of the run's sequence range, not as non-idempotent batches."""
    from .test_idempotence import sent_batches

    fake = FakeCluster(brokers=1, seed=3, auto_create_topics=False, first_producer_id=0)
    await nursery.start(fake.run)
    fake.create_topic("t", 1, configs={"max.message.bytes": "1200"})
    async with open_fake_producer(fake, idempotent=True) as producer:
        columnar_next(producer)
        rows = [await producer.send("t", b"%03d:" % i + b"x" * 100, key=b"k") for i in range(20)]
        await producer.flush()
    assert set(_kinds(rows)) == {"row"}
    batches = [b for b in sent_batches(fake, "t", 0)]
    assert [b[4] for b in batches] == [20, 10, 5, 5, 10, 5, 5]
    assert {(b[1], b[2]) for b in batches} == {(0, 0)}
    assert [b[3] for b in batches[-6:]] == [0, 0, 5, 10, 10, 15]
    assert [(await d).offset for d in rows] == list(range(20))


async def test_a_close_fails_the_halves_of_a_split_keyed_run_once(
    nursery: Any, autojump_clock: Any
) -> None:
    """A keyed run is split (KIP-126) and its halves are held by the broker when
    the producer is left by an error: the close fails each row once (the run the
    halves replaced is no longer one of its chunk's runs), every byte released."""
    import trio

    from pipeline.producer._errors import ProducerClosed
    from pipeline.protocol.api import ApiKey

    fake = FakeCluster(brokers=1, seed=3, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("t", 1, configs={"max.message.bytes": "1200"})
    produced = []
    gate = trio.Event()

    async def hold_after_the_first(ctx: Any) -> None:  # (the first is refused as too large)
        produced.append(ctx.time)
        if len(produced) > 1:
            await gate.wait()

    fake.control(ApiKey.PRODUCE, hold_after_the_first, sticky=True)
    rows: list[Any] = []
    with pytest.raises(RuntimeError, match="leave"):  # noqa: PT012
        async with open_fake_producer(fake, idempotent=False) as producer:
            await producer._core.cluster.partitions_for("t")
            columnar_next(producer)
            rows = [await producer.send("t", b"%03d:" % i + b"x" * 100, key=b"k")
                    for i in range(20)]
            for _ in range(100):  # the run was refused, split, and its halves sent
                if len(produced) >= 2:
                    break
                await trio.sleep(0.01)
            assert len(produced) >= 2, (produced, fake.log("t", 0))
            raise RuntimeError("leave")
    assert set(_kinds(rows)) == {"row"}
    for d in rows:
        with pytest.raises(ProducerError) as info:
            d.result()
        assert isinstance(info.value.cause, ProducerClosed)
    stats = producer.statistics()
    assert stats.outstanding == 0 and stats.buffered_bytes == 0
    assert (stats.accepted, stats.failed, stats.double_settles) == (20, 20, 0)
