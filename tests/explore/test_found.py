"""Bugs the schedule explorer found, each as a plain scenario that names it.

The shrunk schedules themselves are replayed by test_regressions.py; these
are the same bugs written out by hand, on autojump_clock against the
FakeCluster, so that each reads as what went wrong.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import trio

from pipeline import ProducerClosed, ProducerError, ProducerMessage
from pipeline.producer._api import open_producer
from pipeline.protocol.errors import ErrorCode
from pipeline.testing.fake_cluster import ControlContext, FakeCluster

PRODUCE = 0


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeCluster:
    cluster = FakeCluster(brokers=2, seed=5, auto_create_topics=False, max_message_bytes=600)
    await nursery.start(cluster.run)
    cluster.create_topic("t", 2, leaders=[0, 0])
    return cluster


def producer(fake: FakeCluster, **options: Any) -> Any:
    base: dict[str, Any] = dict(
        linger=0.0, retry_backoff=0.1, retry_backoff_jitter=0.0, request_timeout=5.0,
        delivery_timeout=60.0, close_timeout=10.0, max_message_bytes=600,
        rng=random.Random(1), timestamp_ms=lambda: 1_700_000_000_000,
    )
    base.update(options)
    return open_producer(fake.bootstrap, connector=fake.connector, **base)


def log(fake: FakeCluster, partition: int = 0) -> list[bytes | None]:
    return [e.record.value for e in fake.log("t", partition)]


@pytest.mark.parametrize("idempotent", [False, True])
@pytest.mark.parametrize("middle", ["send_many", "input"])
async def test_one_task_send_then_other_entry_then_send_keeps_order(
    fake: FakeCluster, autojump_clock: Any, idempotent: bool, middle: str
) -> None:
    """send(a); send_many([b]) (or producer.input.send(b)); send(c), all from one
    task without a pause: c joined a's open burst, a list already queued ahead
    of b, and was written before b (b even after the next round's a)."""
    expected: list[bytes] = []
    async with producer(fake, idempotent=idempotent) as p:
        for r in range(20):
            await p.send("t", b"a%d" % r, partition=0)
            b = ProducerMessage("t", b"b%d" % r, partition=0)
            if middle == "send_many":
                await p.send_many([b])
            else:
                await p.input.send(b)
            await p.send("t", b"c%d" % r, partition=0)
            expected += [b"a%d" % r, b"b%d" % r, b"c%d" % r]
        await p.flush()
    assert log(fake) == expected
    assert p.statistics().double_settles == 0


async def test_batches_never_exceed_max_message_bytes(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """batch_bytes above max_message_bytes (the broker's limit on a whole batch):
    a burst of small messages was sealed as one batch the broker refused with
    MESSAGE_TOO_LARGE, failing every message although each one fits."""
    async with producer(fake, idempotent=False, batch_bytes=4 * 600, linger=0.05) as p:
        deliveries = [await p.send("t", b"%03d" % i + b"x" * 100, partition=0) for i in range(20)]
        offsets = [(await d).offset for d in deliveries]
    assert offsets == list(range(20))
    assert all(len(r.request.topic_data[0].partition_data[0].records) <= 600
               for r in fake.requests_of(PRODUCE))


async def test_send_waiting_for_space_when_the_producer_closes(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A send() blocked on a full buffer while the producer closed got space
    from the close, registered its message and then hit the closed intake:
    trio.ClosedResourceError reached the caller and the message stayed
    outstanding forever. It now raises ProducerClosed and leaves no trace."""
    gate = trio.Event()

    async def hold(ctx: ControlContext) -> None:
        await gate.wait()

    fake.control(PRODUCE, hold, sticky=True)
    raised: list[BaseException] = []
    async with trio.open_nursery() as nursery:
        async with producer(fake, idempotent=False, buffer_memory=1200, close_timeout=1.0,
                            max_block=30.0) as p:
            first = await p.send("t", b"x" * 500, partition=0)
            second = await p.send("t", b"y" * 500, partition=0)

            async def blocked() -> None:
                try:
                    await p.send("t", b"z" * 500, partition=0)
                except ProducerClosed as exc:
                    raised.append(exc)

            nursery.start_soon(blocked)
            await trio.sleep(0.5)
        gate.set()
    assert [type(e) for e in raised] == [ProducerClosed]
    for d in (first, second):
        with pytest.raises(ProducerError):
            await d
    stats = p.statistics()
    assert (stats.accepted, stats.outstanding, stats.buffered_bytes) == (2, 0, 0)


async def test_idempotent_fatal_error_does_not_fail_the_next_batch(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A non-retriable answer (here INVALID_RECORD) failed an idempotent batch; its
    sequences never reached the broker, so the partition's next batch was
    answered OUT_OF_ORDER_SEQUENCE_NUMBER and failed too, although nothing was
    wrong with it. Now the failure bumps the epoch and the next batch goes."""
    fake.fail_next(PRODUCE, ErrorCode.INVALID_RECORD, topic="t", partition=0)
    async with producer(fake, idempotent=True) as p:
        with pytest.raises(ProducerError, match="INVALID_RECORD"):
            await p.send_and_wait("t", b"refused", partition=0)
        meta = await p.send_and_wait("t", b"next", partition=0)
    assert meta.offset == 0
    assert log(fake) == [b"next"]
    assert p._core.idempotence is not None and p._core.idempotence.bumps == 1


async def test_input_and_send_share_a_small_buffer_without_stalling(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """producer.input messages got their buffer bytes in the dispatcher, in intake
    order; with send() from another task queued behind one of them holding the
    bytes it waited for, the whole intake stalled for max_block and the input
    message failed with BufferFullError on a healthy cluster."""
    async with trio.open_nursery() as nursery:
        async with producer(fake, idempotent=False, buffer_memory=1200, max_block=5.0,
                            linger=0.0) as p:
            errors: list[ProducerError] = []

            async def drain() -> None:
                errors.extend([e async for e in p.errors])

            nursery.start_soon(drain)
            t0 = trio.current_time()
            inputs = [ProducerMessage("t", b"i%d-" % i + b"x" * 480, partition=0)
                      for i in range(4)]
            async with trio.open_nursery() as senders:
                async def put() -> None:
                    for m in inputs:
                        await p.input.send(m)

                async def send() -> None:
                    for i in range(4):
                        await p.send("t", b"s%d-" % i + b"x" * 480, partition=0)

                senders.start_soon(put)
                senders.start_soon(send)
            await p.flush()
            assert trio.current_time() - t0 < 1.0  # no max_block stall
    assert errors == []
    assert all(m.done() and m.offset >= 0 for m in inputs)
    assert len(log(fake)) == 8


async def test_input_message_handed_over_as_the_producer_closes_gets_an_outcome(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The dispatcher, idle, is handed a producer.input message in the instant the
    producer closes (here: the block is left by an exception right after
    input.send_nowait, so nothing yields in between). The close failed what was
    outstanding, and only then did the dispatcher run once more and accept the
    message, which was never settled. It now fails with ProducerClosed."""

    class Leave(Exception):
        pass

    m = ProducerMessage("t", b"last", partition=0)
    with pytest.raises(Leave):  # noqa: PT012
        async with producer(fake, idempotent=False) as p:
            await p.send_and_wait("t", b"first", partition=0)
            await trio.sleep(0.1)  # the dispatcher waits on the intake
            p.input.send_nowait(m)  # handed straight to the waiting dispatcher
            raise Leave
    assert m.done() and isinstance(m._outcome, ProducerClosed)
    stats = p.statistics()
    assert (stats.outstanding, stats.double_settles) == (0, 0)


async def test_retries_zero_fails_only_what_was_sent(fake: FakeCluster, autojump_clock: Any) -> None:
    """retries=0, the leader moved unseen (stale metadata): the first message goes
    to the old leader and fails with NOT_LEADER_OR_FOLLOWER, as it must. The
    second, sent right behind it, waited in the broker producer (one batch in
    flight per partition) and was never on the wire, yet it went back with the
    failed batch and failed as out of retries, with the first one's cause. Now
    only a batch that was sent spends a retry; the second goes to the new leader
    (explorer seed 300086)."""
    async with producer(fake, idempotent=False, retries=0, metadata_max_age=300.0,
                        max_batch_messages=1) as p:
        await p.send_and_wait("t", b"warm", partition=1)  # metadata: both led by 0
        fake.move_leader("t", 0, to=1)
        first = await p.send("t", b"first", partition=0)
        second = await p.send("t", b"second", partition=0)
        with pytest.raises(ProducerError, match="NOT_LEADER_OR_FOLLOWER"):
            await first
        assert (await second).offset == 0
    assert log(fake) == [b"second"]
