"""The per-message fast paths keep the same meaning as the general ones.

``send()`` builds its message inline, shares a burst's delivery deadline and a
millisecond's timestamp; the dispatcher trusts a burst's single topic; the
topic producer assigns sticky runs by bisection; the batch encoder takes many
records at once. Each shortcut is checked here against what the general path
(or the plain definition) gives.
"""

from __future__ import annotations

import random
from itertools import pairwise
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.producer._intake import intake
from pipeline.producer._message import ProducerMessage
from pipeline.producer._outcomes.delivery import MessageDelivery
from pipeline.producer._stages.accumulator import MIN_RECORD_BYTES, fill
from pipeline.producer._stages.partitioner import DefaultPartitioner
from pipeline.producer._stages.topic_producer import TopicProducer
from pipeline.testing.fake_cluster import FakeCluster
from tests.scenarios.conftest import open_fake_producer, values_in_log


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    cluster = FakeCluster(brokers=1, seed=3, auto_create_topics=False)
    await nursery.start(cluster.run)
    cluster.create_topic("a", 1)
    cluster.create_topic("b", 1)
    return cluster


def _all_slots(cls: type) -> list[str]:
    return [name for klass in cls.__mro__ for name in getattr(klass, "__slots__", ())]


async def test_fast_send_sets_every_slot_and_returns_the_message(fake: FakeCluster) -> None:
    async with open_fake_producer(fake, timestamp_ms=None) as producer:
        delivery = await producer.send("a", b"v", key=b"k", metadata={"row": 1})
        assert type(delivery) is MessageDelivery and isinstance(delivery, ProducerMessage)
        for name in _all_slots(MessageDelivery):
            getattr(delivery, name)  # raises AttributeError for a slot never set
        assert delivery.message is delivery
        assert not delivery.done()
        meta = await delivery
        assert delivery.done()
        assert (meta.topic, meta.partition, meta.offset) == ("a", 0, 0)
        assert delivery.metadata == {"row": 1}
        assert delivery.result() == meta


async def test_a_burst_mixing_topics_is_split_by_topic(fake: FakeCluster) -> None:
    topic_a, topic_b = "a", "".join(["b"])  # an equal str that is not the same object
    async with open_fake_producer(fake, timestamp_ms=None) as producer:
        # No checkpoint between these sends: they all join one burst.
        sent = [await producer.send(topic_a if i % 3 else topic_b, b"%d" % i) for i in range(60)]
        await producer.flush()
    assert values_in_log(fake, "a", 0) == [b"%d" % i for i in range(60) if i % 3]
    assert values_in_log(fake, "b", 0) == [b"%d" % i for i in range(60) if not i % 3]
    assert all(d.result().topic == ("a" if i % 3 else "b") for i, d in enumerate(sent))


@pytest.mark.parametrize("columnar", [False, True], ids=["messages", "rows"])
async def test_timestamps_are_the_wall_clock_millisecond(
    fake: FakeCluster, monkeypatch: pytest.MonkeyPatch, columnar: bool
) -> None:
    """Messages, and the rows of a columnar burst (its first row stamped by
    ``current_ms``, the others inline): the same millisecond rules."""
    times = [1_700_000_000.0001, 1_700_000_000.0009, 1_700_000_000.001, 1_700_000_000.0019,
             1_700_000_000.5, 1_700_000_000.4999, 1_700_000_000.5015, 1_700_000_001.25]
    clock = iter(times)
    monkeypatch.setattr(intake, "_time", lambda: next(clock))
    async with open_fake_producer(fake, timestamp_ms=None) as producer:
        producer._intake._columns_next = columnar
        sent = [await producer.send("a", b"v") for _ in times]
        await producer.flush()
    assert {type(d).__name__ for d in sent} == {"RowDelivery" if columnar else "MessageDelivery"}
    # Within a millisecond the int is shared; a clock stepping back by less than
    # a millisecond (NTP) keeps the millisecond already handed out.
    expected = [1_700_000_000_000, 1_700_000_000_000, 1_700_000_000_001, 1_700_000_000_001,
                1_700_000_000_500, 1_700_000_000_500, 1_700_000_000_501, 1_700_000_001_250]
    assert [d.timestamp for d in sent] == expected
    assert sent[0].timestamp is sent[1].timestamp
    assert [e.batch.base_timestamp + e.record.timestamp_delta for e in fake.log("a", 0)] == expected


async def test_a_burst_shares_its_deadline_exactly(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_fake_producer(fake, timestamp_ms=None, delivery_timeout=30.0) as producer:
        start = trio.current_time()
        first = [await producer.send("a", b"x") for _ in range(5)]
        await trio.sleep(2.5)
        second = [await producer.send("a", b"y") for _ in range(5)]
        assert {m._deadline for m in first} == {start + 30.0}
        assert {m._deadline for m in second} == {start + 32.5}
        await producer.flush()


@pytest.mark.parametrize("put", ["send", "send_nowait"])
async def test_an_input_message_takes_its_deadline_as_it_enters_the_intake(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock, put: str
) -> None:
    """A message put on producer.input has the deadline of a send() made at that
    instant, however late the dispatcher takes it: the intake is a queue, so a
    send() queued behind it must not get the earlier deadline (else the
    partition's queue leaves deadline order and the later message expires late)."""
    async with open_fake_producer(fake, timestamp_ms=None, delivery_timeout=30.0) as producer:
        start = trio.current_time()
        msg = ProducerMessage("a", b"in")
        if put == "send":
            await producer.input.send(msg)
        else:
            producer.input.send_nowait(msg)
        autojump_clock.jump(4.0)  # the dispatcher has not run since: it is "stalled"
        after = await producer.send("a", b"behind")
        await producer.flush()
        assert msg._deadline == start + 30.0
        assert after._deadline == start + 34.0


async def test_a_message_is_sent_once(fake: FakeCluster) -> None:
    async with open_fake_producer(fake, timestamp_ms=None) as producer:
        first = await producer.send("a", b"once")
        meta = await first
        with pytest.raises(ValueError, match="already sent"):
            await producer.send_many([ProducerMessage("a", b"new"), first])
        msg = ProducerMessage("a", b"m")
        await producer.input.send(msg)
        await producer.flush()
        await producer.input.send(msg)  # again, through the channel
        err = await producer.errors.receive()
        assert isinstance(err.cause, ValueError) and "already sent" in str(err.cause)
        assert err.message is not msg and err.message.value == b"m"
        assert first.result() == meta and msg.offset == 1  # first outcomes untouched
        assert producer.statistics().double_settles == 0
    assert values_in_log(fake, "a", 0) == [b"once", b"m"]


def _topic_producer(batch_bytes: int, seed: int) -> TopicProducer:
    ctx: Any = SimpleNamespace(config=SimpleNamespace(batch_bytes=batch_bytes, channel_capacity=10), ledger=None,
                               cluster=None)
    return TopicProducer(ctx, "t", DefaultPartitioner(random.Random(seed)), None)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    bursts=st.lists(st.lists(st.integers(1, 900), min_size=0, max_size=60), min_size=1,
                    max_size=6),
    batch_bytes=st.integers(1, 3000),
    partitions=st.integers(1, 7),
    seed=st.integers(0, 2**16),
)
def test_sticky_runs_choose_what_the_per_message_loop_chooses(
    bursts: list[list[int]], batch_bytes: int, partitions: int, seed: int
) -> None:
    loop, runs = _topic_producer(batch_bytes, seed), _topic_producer(batch_bytes, seed)
    for sizes in bursts:
        a = [ProducerMessage("t", b"") for _ in sizes]
        b = [ProducerMessage("t", b"") for _ in sizes]
        for m1, m2, size in zip(a, b, sizes, strict=True):
            m1._size = m2._size = size
        by_loop = loop._assign(a, partitions, [])
        by_runs = runs._assign_sticky_run(b, partitions)
        assert [m.partition for m in a] == [m.partition for m in b]
        assert {p: len(g) for p, g in by_loop.items()} == {p: len(g) for p, g in by_runs.items()}
        assert (loop._sticky_partition, loop._sticky_bytes) == (
            runs._sticky_partition, runs._sticky_bytes)


def _fill_by_loop(sizes: list[int], cap: int, max_messages: int) -> tuple[int, int]:
    """The definition: take messages while they fit in cap bytes, at least one."""
    n = total = 0
    while n < min(max_messages, len(sizes)):
        if n and total + sizes[n] > cap:
            break
        total += sizes[n]
        n += 1
    return n, total


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(MIN_RECORD_BYTES, 3000), min_size=1, max_size=400),
    cap=st.integers(1, 40_000),
    max_messages=st.integers(1, 500),
)
def test_next_batch_is_what_the_per_message_loop_takes(
    sizes: list[int], cap: int, max_messages: int
) -> None:
    """The broker producer cuts an over-full accumulator with prefix sums and a
    bisection over a bounded window; the cut is the greedy loop's."""
    msgs = [ProducerMessage("t", b"") for _ in sizes]
    for msg, size in zip(msgs, sizes, strict=True):
        msg._size = size
    assert fill(msgs, cap, max_messages) == _fill_by_loop(sizes, cap, max_messages)


async def test_send_many_reserves_in_chunks_of_a_quarter_buffer(
    fake: FakeCluster, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """send_many reserves buffer space chunk by chunk (each the longest run within
    buffer_memory / 4, at least one message), so a call larger than the whole
    buffer still goes through, in order, with one group outcome."""
    reserved: list[int] = []
    async with open_fake_producer(fake, timestamp_ms=None, buffer_memory=4000,
                                  max_message_bytes=1500) as producer:
        ledger = producer._ledger
        real = ledger.try_reserve

        def spy(size: int) -> bool:  # reserve() retries it while it waits for space
            ok = real(size)
            if ok:
                reserved.append(size)
            return ok

        monkeypatch.setattr(ledger, "try_reserve", spy)
        overhead = producer._intake.prepare(ProducerMessage("a", b"v" * 100)) - 100
        half = 500 - overhead  # two of these fill a chunk exactly
        lengths = [half] * 4 + [300] * 7 + [1200] + [10] * 20
        values = [b"%02d" % i + b"v" * (n - 2) for i, n in enumerate(lengths)]
        sizes = [producer._intake.prepare(ProducerMessage("a", v)) for v in values]
        group = await producer.send_many([ProducerMessage("a", v) for v in values])
        result = await group
    assert (result.delivered, result.failed) == (len(values), 0)
    assert values_in_log(fake, "a", 0) == values
    expected, run = [], 0
    for size in sizes:  # the definition: greedy runs of at most 1000 bytes, >= 1 message
        if run and run + size > 1000:
            expected.append(run)
            run = 0
        run += size
    expected.append(run)
    assert reserved == expected and reserved[:2] == [1000, 1000] and max(sizes) > 1000


async def test_send_many_is_a_schedule_point(fake: FakeCluster) -> None:
    """Like trio's own async calls: a caller feeding lists in a loop lets the
    pipeline run between calls instead of filling the whole buffer first."""
    async with open_fake_producer(fake, timestamp_ms=None) as producer:
        with trio.testing.assert_checkpoints():
            group = await producer.send_many([ProducerMessage("a", b"x") for _ in range(3)])
        assert (await group).delivered == 3


async def test_a_send_loop_lets_other_tasks_run(fake: FakeCluster) -> None:
    """send() is a schedule point at least every _YIELD_EVERY calls, so a tight
    send loop never starves the pipeline or the rest of the program."""
    seen: list[int] = []
    async with open_fake_producer(fake, timestamp_ms=None) as producer:
        async with trio.open_nursery() as nursery:

            async def observe() -> None:
                while True:
                    seen.append(producer.statistics().accepted)
                    await trio.lowlevel.checkpoint()

            nursery.start_soon(observe)
            await trio.lowlevel.checkpoint()
            for _ in range(5 * intake._YIELD_EVERY):
                await producer.send("a", b"x")
            # trio runs a batch of ready tasks in random order: one checkpoint
            # here may let the observer run after this task cancels it, so
            # wait (bounded) until it has read the final count.
            with trio.fail_after(1):
                while not seen or seen[-1] != 5 * intake._YIELD_EVERY:
                    await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()
    steps = [b - a for a, b in pairwise(seen)]
    # trio runs each batch of ready tasks in random order, so the observer may
    # see two of the sender's runs between two of its own, never more.
    assert intake._YIELD_EVERY <= max(steps) <= 2 * intake._YIELD_EVERY
