"""Regression tests for sarama's producer bugs (each names its sarama issue) and our own.

Each test opens with the bug it guards against. All run on autojump_clock
against the FakeCluster and assert order, exactly one outcome per message,
and the virtual time the design promises.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.lowlevel

from pipeline import (
    BufferFullError,
    DeliveryTimeoutError,
    ProducerClosed,
    ProducerError,
    ProducerMessage,
)
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer, values_in_log
from .test_sarama_suite import outcomes, send_all, vals

pytestmark = pytest.mark.usefixtures("both_modes")


async def test_2619_no_reordering_when_a_pipelined_batch_fails(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """sarama #2619: with 5 requests in flight, batch 1 failed retriably while batch
    2 succeeded, so batch 2 was written first. Partition muting keeps one batch of
    a partition in flight, so batch 2 waits for batch 1's outcome."""
    fake.create_topic("t", 1, leaders=[0])
    fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
    async with open_fake_producer(
        fake, max_in_flight=5, max_batch_messages=10, retry_backoff_jitter=0
    ) as producer:
        deliveries = await send_all(producer, "t", vals("m", 100), partition=0)
        results = await outcomes(deliveries)
    assert values_in_log(fake, "t", 0) == vals("m", 100)
    assert [r.offset for r in results] == list(range(100))
    assert producer.statistics().double_settles == 0


async def test_2150_chaser_never_reaches_the_wire(fake: FakeCluster, autojump_clock: Any) -> None:
    """sarama #2150: after broker restarts the internal fin message was produced to
    Kafka as an empty record and reported as a success. Here control envelopes are
    separate types, so only user records can be in a batch."""
    fake.create_topic("t", 4, leaders=[0, 0, 1, 1])
    sent: list[bytes] = []
    async with open_fake_producer(fake, retry_backoff_jitter=0) as producer:
        deliveries = []
        for round_ in range(4):
            for p in range(4):
                batch = vals(f"r{round_}p{p}-", 10)
                sent += batch
                deliveries += await send_all(producer, "t", batch, partition=p)
            fake.stop_broker(round_ % 2)
            await trio.sleep(0.05)
            fake.restart_broker(round_ % 2)
        results = await outcomes(deliveries)
    assert all(not isinstance(r, ProducerError) for r in results)
    logged = [v for p in range(4) for v in values_in_log(fake, "t", p)]
    assert sorted(logged) == sorted(sent)  # nothing extra: no empty or control records
    for p in range(4):
        mine = [v for v in sent if b"p%d-" % p in v]
        assert values_in_log(fake, "t", p) == mine


async def test_2121_close_never_hangs_with_every_broker_down(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """sarama #2121 (and aiokafka #1101): Close blocked forever while retries went on.
    Here close drains for close_timeout, then fails what is left with ProducerClosed."""
    fake.create_topic("t", 2, leaders=[0, 1])
    async with open_fake_producer(fake, close_timeout=3.0) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        for node in range(3):
            fake.stop_broker(node, elect=False)
        deliveries = await send_all(producer, "t", vals("m", 10), partition=1)
        t0 = trio.current_time()
    assert trio.current_time() == t0 + 3.0
    results = await outcomes(deliveries)
    assert all(isinstance(r, ProducerError) and isinstance(r.cause, ProducerClosed) for r in results)
    assert producer.statistics().double_settles == 0


async def test_3645_close_during_endless_retries(fake: FakeCluster, autojump_clock: Any) -> None:
    """sarama #3645: a retry blocked handing off a batch at shutdown, so Close hung.
    Here a partition answered NOT_LEADER forever is abandoned at close_timeout."""
    fake.create_topic("t", 1, leaders=[0])
    fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_LEADER_OR_FOLLOWER, count=None)
    async with open_fake_producer(fake, close_timeout=2.0) as producer:
        deliveries = await send_all(producer, "t", vals("m", 5), partition=0)
        t0 = trio.current_time()
    assert trio.current_time() == t0 + 2.0
    results = await outcomes(deliveries)
    assert all(isinstance(r.cause, ProducerClosed) for r in results)


async def test_2378_every_message_of_a_failed_batch_gets_its_error(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """sarama #2378: a non-retriable error was reported for the first message of a
    batch only; the others never got an outcome and Close hung."""
    fake.create_topic("t", 1, leaders=[0])
    fake.fail_next(ApiKey.PRODUCE, ErrorCode.INVALID_RECORD, node_id=0)
    async with open_fake_producer(fake) as producer:
        await producer._core.cluster.partitions_for("t")
        deliveries = await send_all(producer, "t", vals("m", 10), partition=0)
        results = await outcomes(deliveries)
        later = await producer.send_and_wait("t", b"after", partition=0)
    assert all(isinstance(r, ProducerError) for r in results)
    assert {r.cause.code for r in results} == {ErrorCode.INVALID_RECORD}
    assert later.offset == 0
    assert values_in_log(fake, "t", 0) == [b"after"]


async def test_2133_connection_lost_with_slow_responses_pending(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """sarama #2133: closing a broker connection while responses were pending
    deadlocked (a callback blocked on the broker producer). Here responses are
    slow, the connection drops mid-way, and everything is still delivered once."""
    fake.create_topic("t", 3, leaders=[0, 0, 0])
    slow = fake.delay_responses(0.5, api_key=ApiKey.PRODUCE, node_id=0, before_apply=True)
    async with open_fake_producer(fake, retry_backoff_jitter=0) as producer:
        await producer._core.cluster.partitions_for("t")
        deliveries = []
        for i in range(30):
            deliveries.append(await producer.send("t", b"m%d" % i, partition=i % 3))
        await trio.sleep(0.2)
        fake.drop_connections(0)
        slow.remove()
        results = await outcomes(deliveries)
    assert all(not isinstance(r, ProducerError) for r in results)
    for p in range(3):
        assert values_in_log(fake, "t", p) == [b"m%d" % i for i in range(p, 30, 3)]


async def test_3689_partition_moves_while_its_batch_is_in_flight(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """sarama #3689 / the pipelining gap: a partition moved to another broker while a
    batch of it was in flight on the old one, and later messages overtook it or the
    partition stalled. Here the chaser waits for the in-flight batch; order holds."""
    fake.create_topic("t", 1, leaders=[0])
    fake.delay_responses(1.0, api_key=ApiKey.PRODUCE, node_id=0, before_apply=True, count=1)
    async with open_fake_producer(fake, retry_backoff_jitter=0) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        first = await producer.send("t", b"m0", partition=0)
        await trio.sleep(0.5)
        fake.move_leader("t", 0, to=1)
        rest = await send_all(producer, "t", vals("m", 4, start=1), partition=0)
        results = await outcomes([first, *rest])
        assert trio.current_time() == t0 + 1.125  # 1 s slow answer + 1 backoff
    assert [r.offset for r in results] == list(range(5))
    assert values_in_log(fake, "t", 0) == vals("m", 5)


async def test_1681_unbounded_retries_need_no_per_level_memory(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """sarama #1681: Retry.Max=MaxInt32 allocated retry state per possible level.
    Levels here live in a dict holding only the levels in use."""
    fake.create_topic("t", 1, leaders=[0])
    fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_LEADER_OR_FOLLOWER, count=3)
    async with open_fake_producer(fake, retries=2**31 - 1, retry_backoff_jitter=0) as producer:
        meta = await producer.send_and_wait("t", b"x", partition=0)
        pp = next(iter(producer._core._pps.values()))
        assert len(pp._levels) <= 1
    assert meta.offset == 0


async def test_intake_race_send_blocked_on_a_full_intake(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Our own bug (found by the double-settle counter): a send() blocked on a full
    intake was received by the dispatcher before send() registered it, so it was
    accepted twice, settled twice and one copy never settled."""
    fake.create_topic("t", 2, leaders=[0, 1])
    async with open_fake_producer(fake, channel_capacity=2) as producer:
        deliveries = [await producer.send("t", b"m%d" % i) for i in range(300)]
        results = await outcomes(deliveries)
    stats = producer.statistics()
    assert stats.accepted == 300 and stats.succeeded == 300
    assert stats.double_settles == 0 and stats.outstanding == 0
    assert all(not isinstance(r, ProducerError) for r in results)


async def test_delivery_timeout_bounds_every_outcome(fake: FakeCluster, autojump_clock: Any) -> None:
    """No message waits longer than delivery_timeout for its outcome, even when its
    partition has no leader at all (aiokafka #1101's endless send_and_wait)."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, delivery_timeout=20.0, request_timeout=5.0) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.stop_broker(0, elect=False)
        t0 = trio.current_time()
        deliveries = await send_all(producer, "t", vals("m", 5), partition=0)
        results = await outcomes(deliveries)
        assert trio.current_time() == t0 + 20.0
    assert all(isinstance(r.cause, DeliveryTimeoutError) for r in results)


async def test_concurrent_senders_share_the_open_intake_list(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Consecutive sends append to one open intake list that the dispatcher closes
    when it takes it. With five tasks sending at once, yielding at random points,
    and an intake of 2 lists, every message is accepted once, delivered once, and
    each task's messages stay in the order it sent them."""
    import random

    fake.create_topic("t", 1, leaders=[0])
    rng = random.Random(3)
    async with open_fake_producer(fake, channel_capacity=2) as producer:

        async def sender(name: str) -> None:
            for i in range(200):
                await producer.send("t", f"{name}-{i}".encode(), partition=0)
                if rng.random() < 0.1:
                    await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            for name in "abcde":
                nursery.start_soon(sender, name)
        await producer.flush()
    stats = producer.statistics()
    assert (stats.accepted, stats.succeeded, stats.double_settles) == (1000, 1000, 0)
    log = values_in_log(fake, "t", 0)
    assert len(log) == len(set(log)) == 1000
    for name in "abcde":
        mine = [v for v in log if v.startswith(name.encode() + b"-")]  # type: ignore[union-attr]
        assert mine == [f"{name}-{i}".encode() for i in range(200)]


async def test_close_fails_input_messages_never_accepted(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """sarama's Close drains what is on the input channel. Here a message whose
    ``producer.input.send()`` still waits for buffer space (the buffer is full
    and every broker is down) fails with ProducerClosed on ``errors``, its
    sender is released, later puts see the channel closed, and a flush waiting
    on them is released: nothing vanishes, nothing hangs."""
    fake.create_topic("t", 1, leaders=[0])
    flushed: list[float] = []
    refused: list[ProducerMessage] = []
    with trio.fail_after(30):  # virtual seconds: a lost FlushMark would hang
        async with trio.open_nursery() as nursery:
            async with open_fake_producer(fake, close_timeout=2.0, buffer_memory=1024,
                                          max_message_bytes=1024, channel_capacity=16,
                                          max_block=100.0) as producer:
                await producer.send_and_wait("t", b"warm")
                for node in range(3):
                    fake.stop_broker(node, elect=False)
                msgs = [ProducerMessage("t", b"%03d" % i + b"x" * 300) for i in range(7)]

                async def put_all() -> None:
                    for m in msgs:
                        try:
                            await producer.input.send(m)  # the buffer holds 2; the 3rd waits
                        except trio.ClosedResourceError:
                            refused.append(m)  # after the close: never accepted

                nursery.start_soon(put_all)
                await trio.sleep(0.5)
                assert producer.statistics().accepted == 1 + 2

                async def flush() -> None:
                    await producer.flush()
                    flushed.append(trio.current_time())

                async def collect() -> None:
                    errors.extend([e async for e in producer.errors])  # until closed at shutdown

                errors: list[ProducerError] = []
                nursery.start_soon(flush)
                nursery.start_soon(collect)
                await trio.sleep(1.0)
                assert not flushed  # still waiting on what is stuck
                t0 = trio.current_time()
    assert trio.current_time() == t0 + 2.0
    assert flushed == [t0 + 2.0]
    assert sorted(e.message.value for e in errors) == sorted(m.value for m in msgs[:3])
    assert all(isinstance(e.cause, ProducerClosed) for e in errors)
    assert all(m.done() for m in msgs[:3])
    assert refused == msgs[3:]
    stats = producer.statistics()
    assert (stats.double_settles, stats.outstanding) == (0, 0)


async def test_input_message_past_max_block_fails_alone(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A message on ``producer.input`` that waits for buffer space longer than
    max_block (its ``input.send()`` waits, as ``send()`` does) fails with
    BufferFullError on ``errors``; the producer goes on and delivers what comes
    after once the brokers are back."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, buffer_memory=1024, max_message_bytes=1024,
                                  max_block=5.0, delivery_timeout=120.0,
                                  return_successes=True) as producer:
        await producer.send_and_wait("t", b"warm")
        fake.stop_broker(0, elect=False)
        held = [ProducerMessage("t", b"h%d" % i + b"x" * 300) for i in range(2)]
        late = ProducerMessage("t", b"late" + b"x" * 300)
        for m in held:
            await producer.input.send(m)
        t0 = trio.current_time()
        await producer.input.send(late)  # waits max_block for buffer space, then fails it
        assert trio.current_time() == t0 + 5.0
        error = await producer.errors.receive()
        assert error.message is late and isinstance(error.cause, BufferFullError)
        fake.restart_broker(0)
        ok = [await producer.successes.receive() for _ in held]
        after = await producer.send_and_wait("t", b"after")
    assert ok == held and after.offset == 3
    assert values_in_log(fake, "t", 0) == [b"warm", *(m.value for m in held), b"after"]
