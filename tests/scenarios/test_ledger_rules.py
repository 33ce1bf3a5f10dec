"""Ledger rules found unpinned by ``make mutants`` (docs/testing.md, "Mutation testing").

Deterministic (FakeCluster, autojump_clock); each docstring walks through the
schedule it needs.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from pipeline import BufferFullError
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer, values_in_log
from .test_bad_input import PATIENT, stall_produce


async def buffered_size(fake: FakeCluster, value: bytes) -> int:
    """The bytes one message of ``value`` holds in the buffer (measured by a probe
    producer while Produce is stalled, so nothing is released)."""
    gate = stall_produce(fake)
    async with open_fake_producer(fake, **PATIENT) as probe:
        await probe._core.cluster.partitions_for("t")
        probe.send_nowait("t", value, partition=0)
        size: int = probe.statistics().buffered_bytes
        gate.set()
    return size


@pytest.mark.parametrize("entry", ["send", "send_nowait"])
async def test_a_buffer_filled_to_the_byte_accepts_its_last_message(
    fake: FakeCluster, autojump_clock: Any, entry: str
) -> None:
    """``buffer_memory`` is a bound, not a strict one: messages whose sizes add
    up to exactly ``buffer_memory`` are all accepted (``Ledger.admit`` for
    ``send()``, ``try_reserve`` for ``send_nowait()``); one byte more is not.

    Schedule (Produce stalled, so nothing is released): the size s of m is
    measured; with buffer_memory = 2 s, m0 and m1 are accepted and m2 is
    refused at once (send_nowait) or after max_block (send)."""
    fake.create_topic("t", 1)
    value = b"m" * 100
    size = await buffered_size(fake, value)
    gate = stall_produce(fake)
    async with open_fake_producer(fake, buffer_memory=2 * size, max_message_bytes=2 * size,
                                  max_block=1.0, **PATIENT) as producer:
        await producer._core.cluster.partitions_for("t")

        async def one() -> None:
            if entry == "send":
                await producer.send("t", value, partition=0)
            else:
                producer.send_nowait("t", value, partition=0)

        await one()
        await one()
        assert producer.statistics().buffered_bytes == 2 * size
        with pytest.raises(BufferFullError):
            await one()
        assert producer.statistics().accepted == 2
        gate.set()


async def test_every_sender_waiting_for_buffer_space_is_woken(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Senders blocked on a full buffer (``Ledger.reserve``) share one wake-up
    event, created by the first of them: when space is freed, every one of
    them looks again; none is left waiting for an event nobody sets.

    Schedule (Produce stalled, buffer_memory = 2 messages, max_block 10 s): m0
    and m1 fill the buffer; two tasks send m2 and m3 and wait. At t0 + 1 the
    broker answers: both get their space and are accepted at t0 + 1, well
    before max_block. With a fresh event per waiter, the first waiter slept
    until max_block and failed with BufferFullError."""
    fake.create_topic("t", 1)
    value = b"m" * 100
    size = await buffered_size(fake, value)
    gate = stall_produce(fake)
    async with open_fake_producer(fake, buffer_memory=2 * size, max_message_bytes=2 * size,
                                  max_block=10.0, **PATIENT) as producer:
        await producer._core.cluster.partitions_for("t")
        producer.send_nowait("t", value, partition=0)
        producer.send_nowait("t", value, partition=0)
        t0 = trio.current_time()
        accepted_at: list[float] = []

        async def sender() -> None:
            await producer.send("t", value, partition=0)
            accepted_at.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sender)
            nursery.start_soon(sender)
            await trio.sleep(1.0)
            gate.set()
        assert accepted_at == [t0 + 1.0, t0 + 1.0]
        assert producer.statistics().accepted == 4


async def test_flush_waits_only_for_what_was_sent_before_it(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``flush()`` waits for the messages accepted before it was called (up to
    ``Ledger.last_accepted_id``, as the Java client's flush), not for ones
    sent while it waits.

    Schedule (plain producer; t[0] on broker 0 answering 1 s late, t[1] on
    broker 1 answering 3 s late): t0: m0 to t[0], then flush() starts. t0 +
    0.5: m1 to t[1]. flush() returns at t0 + 1, when m0 is written; m1 is
    written at t0 + 3.5."""
    from pipeline.protocol.api import ApiKey

    fake.create_topic("t", 2, leaders=[0, 1])
    async with open_fake_producer(fake, idempotent=False, **PATIENT) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.delay_responses(1.0, api_key=ApiKey.PRODUCE, node_id=0, count=1)
        fake.delay_responses(3.0, api_key=ApiKey.PRODUCE, node_id=1, count=1)
        t0 = trio.current_time()
        m0 = producer.send_nowait("t", b"m0", partition=0)
        flushed_at: list[float] = []

        async def flush() -> None:
            await producer.flush()
            flushed_at.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(flush)
            await trio.sleep(0.5)
            m1 = producer.send_nowait("t", b"m1", partition=1)
        assert flushed_at == [t0 + 1.0]
        assert m0.done() and not m1.done()
        await m1
        assert trio.current_time() == t0 + 3.5


def answer_with_log_append_time(append_time: int) -> Any:
    """A broker that stamps LogAppendTime ``append_time`` and puts the batch at offset 7."""
    from pipeline.protocol.messages import produce as pm

    def answer(ctx: Any) -> Any:
        return pm.ProduceResponse(responses=tuple(
            pm.TopicProduceResponse(name=t.name, partition_responses=tuple(
                pm.PartitionProduceResponse(index=p.index, error_code=0, base_offset=7,
                                            log_append_time_ms=append_time, log_start_offset=0)
                for p in t.partition_data))
            for t in ctx.request.topic_data))

    return answer


async def test_on_delivery_gets_the_offset_and_the_timestamp_the_broker_gave(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``on_delivery`` callbacks (the ledger's inlined ``OnDelivery`` branch)
    get each message's offset (offset_known) and its timestamp: its own
    CreateTime, or the broker's LogAppendTime when the broker gives one.

    Schedule (plain producer): a0, a1 (one batch) are written at offsets 0, 1
    with CreateTime; then the broker answers b0, b1's batch with base offset 7
    and LogAppendTime 1234: their callbacks get 7, 8 and 1234; then the same with
    LogAppendTime 0."""
    from pipeline.protocol.api import ApiKey

    fake.create_topic("t", 1, leaders=[0])
    seen: list[tuple[int, int, bool]] = []

    def on_delivery(metadata: Any, error: Any) -> None:
        assert error is None
        seen.append((metadata.offset, metadata.timestamp, metadata.offset_known))

    async with open_fake_producer(fake, idempotent=False) as producer:
        await producer._core.cluster.partitions_for("t")
        first = [producer.send_nowait("t", b"a%d" % i, partition=0, on_delivery=on_delivery)
                 for i in range(2)]
        for m in first:
            await m
        for append_time in (1234, 0):  # 0 is a LogAppendTime too (-1 is none)
            fake.control(ApiKey.PRODUCE, answer_with_log_append_time(append_time))
            later = [producer.send_nowait("t", b"b", partition=0, on_delivery=on_delivery)
                     for _ in range(2)]
            for m in later:
                await m
    create_time = 1_700_000_000_000
    assert seen == [(0, create_time, True), (1, create_time, True),
                    (7, 1234, True), (8, 1234, True), (7, 0, True), (8, 0, True)]


async def test_channel_mode_without_return_successes_reports_only_errors(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Messages sent on ``producer.input`` report their outcome on the channels:
    failures always, successes only with ``return_successes``. Without it a
    success is settled at once: its bytes are released (a reported outcome
    keeps them until the user takes it, for backpressure).

    Schedule (return_successes False): m0, m1 go in on ``producer.input`` and
    are written; the buffer is empty again, nothing waits on the channels."""
    from pipeline import ProducerMessage

    fake.create_topic("t", 1)
    async with open_fake_producer(fake, **PATIENT) as producer:
        msgs = [ProducerMessage("t", b"m%d" % i) for i in range(2)]
        for m in msgs:
            await producer.input.send(m)
        await producer.flush()
        stats = producer.statistics()
        assert stats.succeeded == 2 and stats.buffered_bytes == 0
        assert len(producer._ledger.reports) == 0


async def test_send_many_counts_failures_in_its_group(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A ``send_many`` call's group counts every outcome: a failed message is
    counted as failed (with its error kept) and the group completes.

    Schedule (plain producer, retries=0): the first Produce request is answered
    NOT_ENOUGH_REPLICAS: the call's two messages (one batch) fail, and the
    group reports 0 delivered, 2 failed."""
    from pipeline import ProducerMessage
    from pipeline.protocol.api import ApiKey
    from pipeline.protocol.errors import ErrorCode

    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, idempotent=False, retries=0) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        group = await producer.send_many([ProducerMessage("t", b"m%d" % i, partition=0)
                                          for i in range(2)])
        with trio.fail_after(10):
            result = await group
    assert (result.delivered, result.failed) == (0, 2)
    assert len(result.errors) == 2


async def test_a_failed_message_with_on_delivery_wakes_its_waiter_and_counts_a_raising_callback(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A message sent with ``on_delivery`` that fails (``Ledger._call_back``):
    the callback gets the error once, whoever awaits the message is woken, and
    a callback that raises is counted (``statistics().callback_errors``), not
    let into the pipeline.

    Schedule (plain producer, retries=0): the Produce request is answered
    NOT_ENOUGH_REPLICAS: m fails at t0; its callback raises; ``await m`` returns
    at t0 with the error."""
    from pipeline import ProducerError
    from pipeline.protocol.api import ApiKey
    from pipeline.protocol.errors import ErrorCode

    fake.create_topic("t", 1, leaders=[0])
    errors: list[Any] = []

    def on_delivery(metadata: Any, error: Any) -> None:
        errors.append(error)
        raise RuntimeError("the user's callback is broken")

    async with open_fake_producer(fake, idempotent=False, retries=0) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        t0 = trio.current_time()
        m = producer.send_nowait("t", b"m", partition=0, on_delivery=on_delivery)
        with trio.fail_after(10), pytest.raises(ProducerError):
            await m
        assert trio.current_time() == t0
        assert producer.statistics().callback_errors == 1
    assert len(errors) == 1 and isinstance(errors[0], ProducerError)


@pytest.mark.parametrize("append_time", [1234, 0])
async def test_an_awaited_message_gets_the_log_append_time(
    fake: FakeCluster, autojump_clock: Any, append_time: int
) -> None:
    """A message awaited (or reported on the channels) gets the broker's
    LogAppendTime as its timestamp before anyone hears of its outcome; 0 is a
    LogAppendTime too (-1 is none).

    Schedule (plain producer): the broker answers m0, m1's batch with base
    offset 7 and the LogAppendTime: both report it, at offsets 7, 8."""
    from pipeline.protocol.api import ApiKey

    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, idempotent=False) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.control(ApiKey.PRODUCE, answer_with_log_append_time(append_time))
        sent = [producer.send_nowait("t", b"m%d" % i, partition=0) for i in range(2)]
        results = [await m for m in sent]
    assert [(r.offset, r.timestamp) for r in results] == [(7, append_time), (8, append_time)]


async def test_a_send_many_cancelled_before_acceptance_can_be_sent_again(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``send_many()`` cancelled while its chunk waits for room in the intake
    was never accepted: ``Ledger.unaccept`` gives each message back (no id,
    not counted as accepted, its bytes released), so the caller may send the
    same ``ProducerMessage`` objects again (a message with an id is refused as
    reused).

    Schedule (plain producer, channel_capacity 1): the dispatcher is stuck
    until t0 + 10.125 (``block_dispatcher``); t0 + 1.5: r on ``producer.input``
    fills the intake; send_many([m1, m2]) waits until its caller's deadline at
    t0 + 2.5: nothing of it is left. At t0 + 10.125 the rest is written; then
    send_many([m1, m2]) again: both are written after r."""
    from pipeline import ProducerMessage

    from .test_intake_rules import waits_in_a_full_intake_until_cancelled

    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, channel_capacity=1, idempotent=False,
                                  **PATIENT) as producer:
        await producer.send_and_wait("t", b"warm")
        msgs = [ProducerMessage("u", b"m1"), ProducerMessage("u", b"m2")]
        t0 = await waits_in_a_full_intake_until_cancelled(
            fake, producer, lambda: producer.send_many(msgs))
        assert [(m._id, m._sink) for m in msgs] == [(0, None), (0, None)]  # as before the call
        await producer.flush()
        assert trio.current_time() == t0 + 10.125
        result = await (await producer.send_many(msgs))
        assert (result.delivered, result.failed) == (2, 0)
        assert producer.statistics().double_settles == 0
    assert values_in_log(fake, "u", 0) == [b"a", b"b", b"c", b"r", b"m1", b"m2"]


async def test_a_send_many_of_rows_cancelled_before_acceptance_can_be_sent_again(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The same on ``send_many``'s columnar path (``COLUMNS_MIN`` plain messages or
    more: one ``RowChunk`` whose run waits for room in the intake): cancelled there,
    ``Ledger.unaccept_rows`` gives back the chunk's rows and bytes (its bound, its
    packed copy, what its messages hold) and ``unaccept`` each message's id, so the
    same objects are sent again, once each.

    Schedule (plain producer, channel_capacity 1): as above, send_many of m0..m99
    waits from t0 + 1.5 until its caller's deadline at t0 + 2.5; at t0 + 10.125 the
    rest is written; send_many of m0..m99 again: all written after r, in order."""
    from pipeline import ProducerMessage
    from pipeline.producer._columnar.burst import COLUMNS_MIN

    from .test_intake_rules import waits_in_a_full_intake_until_cancelled

    n = max(100, COLUMNS_MIN)
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, channel_capacity=1, idempotent=False,
                                  **PATIENT) as producer:
        await producer.send_and_wait("t", b"warm")
        msgs = [ProducerMessage("u", b"m%d" % i) for i in range(n)]
        t0 = await waits_in_a_full_intake_until_cancelled(
            fake, producer, lambda: producer.send_many(msgs))
        assert not any(m._id for m in msgs)
        await producer.flush()
        assert trio.current_time() == t0 + 10.125
        result = await (await producer.send_many(msgs))
        assert (result.delivered, result.failed) == (n, 0)
        assert producer.statistics().double_settles == 0
        assert producer.statistics().buffered_bytes == 0
    assert values_in_log(fake, "u", 0) == [b"a", b"b", b"c", b"r"] + [
        b"m%d" % i for i in range(n)]


@pytest.mark.parametrize("path", ["messages", "rows"])
async def test_a_send_many_cancelled_after_its_first_chunk_keeps_that_chunk_in_its_group(
    fake: FakeCluster, autojump_clock: Any, path: str
) -> None:
    """A ``send_many()`` cut into chunks and cancelled while a later chunk waits for
    room in the intake: the chunks already accepted stay accepted, and the call's group
    forgets the rest (``DeliveryGroup.forget``), so it counts exactly the accepted
    messages and completes when they settle; the rest were never accepted.

    Schedule (plain producer, channel_capacity 1, buffer_memory 1,000: chunks of a few
    messages): the dispatcher is stuck until t0 + 10.125 (``block_dispatcher``); t0 +
    1.5: send_many's first chunk fills the intake, its second waits until the caller's
    deadline at t0 + 2.5. Then the first chunk's messages are the group's, and are
    written at t0 + 10.125; no other message of the call is."""
    from pipeline import ProducerMessage
    from pipeline.producer._columnar.burst import COLUMNS_MIN
    from pipeline.producer._columnar.rows import RowChunk

    from .test_intake_rules import block_dispatcher

    n = COLUMNS_MIN + 8 if path == "rows" else 12
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, channel_capacity=1, idempotent=False,
                                  buffer_memory=1000, max_message_bytes=500,
                                  **PATIENT) as producer:
        await producer.send_and_wait("t", b"warm")
        t0 = await block_dispatcher(fake, producer, 10.0)
        msgs = [ProducerMessage("u", b"m%d" % i) for i in range(n)]
        with trio.move_on_after(1.0) as scope:
            await producer.send_many(msgs)
        assert scope.cancelled_caught and trio.current_time() == t0 + 2.5
        accepted = [m for m in msgs if m._id]
        if path == "rows":
            (chunk,) = [e for e in producer._ledger.outstanding.values()
                        if type(e) is RowChunk and e.group is not None]
            group, accepted = chunk.group, chunk.messages
        else:
            group = accepted[0]._sink
        assert 0 < len(accepted) < n and accepted == msgs[:len(accepted)]
        assert (group.total, group.pending) == (len(accepted), len(accepted))
        await producer.flush()
        assert group.done() and group.delivered == len(accepted)
    assert values_in_log(fake, "u", 0) == [b"a", b"b", b"c"] + [m.value for m in accepted]


def _group_of(producer: Any, accepted: list[Any], path: str) -> Any:
    """The ``DeliveryGroup`` of a ``send_many`` call's ``accepted`` messages."""
    from pipeline.producer._columnar.rows import RowChunk

    if path == "messages":
        return accepted[0]._sink
    (group,) = {e.group for e in producer._ledger.outstanding.values()
                if type(e) is RowChunk and e.group is not None}
    return group


@pytest.mark.parametrize("path", ["messages", "rows"])
async def test_a_send_many_cancelled_waiting_for_buffer_space_keeps_its_accepted_chunks(
    fake: FakeCluster, autojump_clock: Any, path: str
) -> None:
    """A ``send_many()`` cut into chunks and cancelled while a later chunk waits for
    buffer space (``Ledger.reserve``, not the intake): the group forgets the messages
    from that chunk on (``_reserve_chunk``'s ``rest``), so it counts exactly the chunks
    accepted before it and completes when they settle.

    Schedule (plain producer, buffer_memory 1,000, Produce stalled until t0 + 5): a
    500-byte message fills half the buffer; send_many's first chunks take most of the
    rest, a later one waits for space until the caller's deadline at t0 + 1. Then the
    accepted messages (at least one chunk, not all) are the group's; they are written
    once Produce is answered, and no other message of the call is."""
    from pipeline import ProducerMessage
    from pipeline.producer._columnar.burst import COLUMNS_MIN

    from .test_bad_input import stall_produce

    n = COLUMNS_MIN + 8 if path == "rows" else 12
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, idempotent=False, buffer_memory=1000,
                                  max_message_bytes=600, **PATIENT) as producer:
        await producer.send_and_wait("t", b"warm")
        gate = stall_produce(fake)
        await producer.send("t", b"f" * 420)
        msgs = [ProducerMessage("t", b"m%d" % i) for i in range(n)]
        t0 = trio.current_time()
        with trio.move_on_after(1.0) as scope:
            await producer.send_many(msgs)
        assert scope.cancelled_caught and trio.current_time() == t0 + 1.0
        accepted = [m for m in msgs if m._id]
        assert 0 < len(accepted) < n and accepted == msgs[:len(accepted)]
        group = _group_of(producer, accepted, path)
        assert (group.total, group.pending) == (len(accepted), len(accepted))
        gate.set()
        await producer.flush()
        assert group.done() and group.delivered == len(accepted)
    assert values_in_log(fake, "t", 0) == [b"warm", b"f" * 420] + [m.value for m in accepted]


@pytest.mark.parametrize("path", ["messages", "rows"])
async def test_a_send_many_waiting_for_room_in_the_intake_at_close_fails_its_chunk_and_refuses_the_rest(
    fake: FakeCluster, autojump_clock: Any, path: str
) -> None:
    """A ``send_many()`` whose second chunk waits for room in the intake when the
    producer closes: the close drains the intake before it closes it
    (``Dispatcher.leftovers``), so the waiting chunk gets in, and the close fails it
    with everything outstanding (``ProducerClosed``); the call then refuses the rest
    with ``ProducerClosed`` ("waited for room in the intake"), never a channel error,
    and nothing of the rest was accepted.

    Schedule (plain producer, channel_capacity 1, buffer_memory 1,000, close_timeout
    2): the dispatcher is stuck until t0 + 10.125 (``block_dispatcher``); t0 + 1.5:
    the first chunk fills the intake, the second waits; t0 + 2: the close begins;
    t0 + 4 its flush gives up: the first two chunks fail, the call raises."""
    from pipeline import ProducerClosed, ProducerMessage
    from pipeline.producer._columnar.burst import COLUMNS_MIN

    from .test_intake_rules import block_dispatcher

    n = COLUMNS_MIN + 8 if path == "rows" else 12
    fake.create_topic("t", 1, leaders=[0])
    msgs = [ProducerMessage("u", b"m%d" % i) for i in range(n)]
    raised: list[tuple[float, BaseException]] = []
    async with trio.open_nursery() as nursery:
        async with open_fake_producer(fake, channel_capacity=1, idempotent=False,
                                      buffer_memory=1000, max_message_bytes=500,
                                      **{**PATIENT, "close_timeout": 2.0}) as producer:
            await producer.send_and_wait("t", b"warm")
            t0 = await block_dispatcher(fake, producer, 10.0)

            async def sender() -> None:
                try:
                    await producer.send_many(msgs)
                except Exception as exc:
                    raised.append((trio.current_time(), exc))

            nursery.start_soon(sender)
            await trio.sleep(0.5)
            assert not raised
    ((at, exc),) = raised
    assert at == t0 + 4.0
    assert type(exc) is ProducerClosed and "waited for room in the intake" in str(exc)
    accepted = [m for m in msgs if m._id]
    assert 0 < len(accepted) < n and accepted == msgs[:len(accepted)]
    if path == "messages":
        group = accepted[0]._sink
        assert (group.total, group.failed, group.pending) == (len(accepted), len(accepted), 0)
    stats = producer.statistics()
    assert (stats.failed, stats.outstanding, stats.buffered_bytes) == (3 + len(accepted), 0, 0)
    assert stats.double_settles == 0
    assert values_in_log(fake, "u", 0) == []


async def test_a_send_batch_cancelled_before_acceptance_leaves_no_trace(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``send_batch()`` cancelled while its chunk (one ``RowRun``) waits for room
    in the intake: ``Ledger.unaccept_rows`` takes the chunk's rows out of the
    accepted count and gives back every byte it reserved (the rows' bound and
    their packed copies).

    Schedule (plain producer, channel_capacity 1): as in the send_many test
    above, send_batch("u", [x, y]) waits from t0 + 1.5 until its caller's
    deadline at t0 + 2.5: accepted, outstanding and buffered bytes are back to
    what they were; x and y are never written."""
    from .test_intake_rules import waits_in_a_full_intake_until_cancelled

    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, channel_capacity=1, idempotent=False,
                                  **PATIENT) as producer:
        await producer.send_and_wait("t", b"warm")
        await waits_in_a_full_intake_until_cancelled(
            fake, producer, lambda: producer.send_batch("u", [b"x", b"y"]))
        await producer.flush()
        assert producer.statistics().double_settles == 0
    assert values_in_log(fake, "u", 0) == [b"a", b"b", b"c", b"r"]


async def test_an_input_message_fixed_before_the_dispatcher_takes_it_counts_its_bytes(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A message put on ``producer.input`` while invalid is enqueued without a
    reservation (the dispatcher fails it, onto ``producer.errors``). If the
    caller fixes it before the dispatcher takes it, the dispatcher accepts it
    and counts its bytes at once, over ``buffer_memory`` if need be
    (``Ledger.reserve_over``: the dispatcher never waits); they are released
    when it is settled, like any other message's.

    Schedule (Produce stalled): m (value 5, not bytes) is put on
    ``producer.input``; before any checkpoint its value becomes b"fixed". Once
    the dispatcher ran, m's bytes are counted; the broker answers: m is
    written and the buffer is empty again."""
    from pipeline import ProducerMessage

    from .test_bad_input import stall_produce

    fake.create_topic("t", 1, leaders=[0])
    gate = stall_produce(fake)
    async with open_fake_producer(fake, idempotent=False, **PATIENT) as producer:
        await producer._core.cluster.partitions_for("t")
        m = ProducerMessage("t", 5)  # type: ignore[arg-type]
        producer.input.send_nowait(m)
        m.value = b"fixed"
        await trio.testing.wait_all_tasks_blocked()
        stats = producer.statistics()
        assert stats.accepted == 1 and stats.buffered_bytes == m._size > 0
        gate.set()
        await producer.flush()
        stats = producer.statistics()
        assert (stats.succeeded, stats.buffered_bytes, stats.double_settles) == (1, 0, 0)
    assert values_in_log(fake, "t", 0) == [b"fixed"]


async def test_a_send_batch_chunk_larger_than_the_buffer_passes_an_empty_buffer(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A ``send_batch`` chunk reserves its rows' bound plus the packed copies
    of a Python list, which can exceed ``buffer_memory`` for a single row near
    ``max_message_bytes`` (which may equal ``buffer_memory``). Such a chunk
    could never fit: ``Ledger.try_reserve`` lets it through when nothing is
    buffered (the buffer goes over by that one chunk) instead of making it
    wait ``max_block`` for space that cannot come.

    Schedule (buffer_memory = max_message_bytes = 4096, max_block 5 s): t0:
    send_batch of one 4000-byte value (about 8,100 bytes reserved) returns at
    t0 and the row is written."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, buffer_memory=4096, max_message_bytes=4096,
                                  max_block=5.0) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        group = await producer.send_batch("t", [b"v" * 4000])
        assert trio.current_time() == t0
        result = await group
        assert (result.delivered, result.failed) == (1, 0)
        assert producer.statistics().double_settles == 0
    assert values_in_log(fake, "t", 0) == [b"v" * 4000]


async def test_outcomes_nobody_reads_are_counted_lost_at_close_and_release_their_bytes(
    fake: FakeCluster, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Channel-mode outcomes (``producer.input`` with ``return_successes``) are
    handed over by the ``Reporter`` task, which blocks while the user does not
    read; each outcome's bytes stay reserved until it is handed over. At
    close (``Reporter.close``) what fits in the channel is handed over without
    waiting, the rest is counted lost (one warning), every byte is released,
    and both channels end, so a late reader gets what was handed over and
    then the end.

    Schedule (channel_capacity 1, return_successes): m0, m1, m2 on
    ``producer.input`` are written at t0; nobody reads ``successes``: m0 fills
    its channel, the Reporter waits to hand over m1, m2 waits in the ledger
    (two messages' bytes still reserved). The block is left: the pipeline is
    cancelled and ``Reporter.close`` runs before the Reporter task sees it:
    no room for m2 (lost, released); then the task's send of m1 fails (lost,
    released: this was the bug, m1's bytes stayed counted forever). A reader
    then gets m0 and the end of the channel."""
    from pipeline import ProducerMessage

    fake.create_topic("t", 1, leaders=[0])
    msgs = [ProducerMessage("t", b"m%d" % i) for i in range(3)]
    async with open_fake_producer(fake, channel_capacity=1, return_successes=True,
                                  **PATIENT) as producer:
        await producer._core.cluster.partitions_for("t")
        for m in msgs:
            await producer.input.send(m)
        await producer.flush()
        await trio.testing.wait_all_tasks_blocked()
        stats = producer.statistics()
        assert stats.succeeded == 3
        assert stats.buffered_bytes == msgs[1]._size + msgs[2]._size
    stats = producer.statistics()
    assert (stats.buffered_bytes, stats.double_settles) == (0, 0)
    with trio.fail_after(1):
        handed = [m async for m in producer.successes]
    assert handed == msgs[:1]
    lost = [int(r.getMessage().split()[0]) for r in caplog.records
            if "could not be handed over" in r.getMessage()]
    assert sum(lost) == 2


async def test_a_send_batch_group_keeps_at_most_ten_errors(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A ``send_batch`` call's group counts every failed row but keeps at most
    ``MAX_ERRORS_KEPT`` (10) errors (one per failed run of rows): a call of a
    million failing rows must not hold a million errors.

    Schedule (plain producer, retries=0): send_batch of 12 rows, one per
    partition of a 12-partition topic (12 runs), and every Produce answered
    NOT_ENOUGH_REPLICAS: the group reports 12 failed and keeps 10 errors."""
    from pipeline.protocol.api import ApiKey
    from pipeline.protocol.errors import ErrorCode

    fake.create_topic("t", 12, leaders=[0] * 12)
    async with open_fake_producer(fake, idempotent=False, retries=0) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, count=None)
        group = await producer.send_batch("t", [b"r%d" % i for i in range(12)],
                                          partitions=list(range(12)))
        with trio.fail_after(10):
            result = await group
        assert (result.delivered, result.failed, len(result.errors)) == (0, 12, 10)
        assert producer.statistics().double_settles == 0


async def test_an_awaited_message_whose_on_delivery_raises_is_still_delivered(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A message sent with ``on_delivery`` that someone also awaits (its sink
    becomes an ``OnDelivery``, ``succeed``'s branch for it): when it is
    written, the callback runs once with the metadata; if it raises, that is
    counted (``statistics().callback_errors``) and logged, and the waiter
    still gets the metadata.

    Schedule (plain producer): m is sent with a raising callback and awaited
    at t0; it is written at t0: ``await m`` returns offset 0 at t0, the
    callback ran once, callback_errors is 1."""
    fake.create_topic("t", 1, leaders=[0])
    seen: list[Any] = []

    def on_delivery(metadata: Any, error: Any) -> None:
        seen.append((metadata.offset, error))
        raise RuntimeError("the user's callback is broken")

    async with open_fake_producer(fake, idempotent=False) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        m = producer.send_nowait("t", b"m", partition=0, on_delivery=on_delivery)
        with trio.fail_after(10):
            meta = await m
        assert meta.offset == 0 and trio.current_time() == t0
        stats = producer.statistics()
        assert (stats.callback_errors, stats.double_settles) == (1, 0)
    assert seen == [(0, None)]


async def test_a_close_counts_the_rows_of_a_send_batch_it_fails(
    fake: FakeCluster, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A close that fails what is still outstanding counts rows, not ledger
    entries: a ``send_batch`` chunk is one entry for all its rows
    (``fail_all_outstanding`` adds its pending rows), and the warning says how
    many messages were not delivered.

    Schedule (Produce stalled, close_timeout 1): send_batch of 3 rows and one
    send(), then the block is left: after close_timeout the close fails 4
    messages and warns "producer closed with 4 undelivered messages", its report of
    them: they are not also reported as failures nobody read."""
    from .test_bad_input import stall_produce

    fake.create_topic("t", 1, leaders=[0])
    gate = stall_produce(fake)
    async with open_fake_producer(fake, idempotent=False, request_timeout=100.0,
                                  delivery_timeout=300.0, close_timeout=1.0) as producer:
        await producer._core.cluster.partitions_for("t")
        group = await producer.send_batch("t", [b"x", b"y", b"z"], partitions=[0, 0, 0])
        await producer.send("t", b"m", partition=0)
    gate.set()
    result = await group
    assert (result.delivered, result.failed) == (0, 3)
    warned = [r.getMessage() for r in caplog.records if "undelivered" in r.getMessage()]
    assert warned == ["producer closed with 4 undelivered messages"]
    assert not [r for r in caplog.records if "nobody read their outcome" in r.getMessage()]


async def test_a_close_after_every_outcome_was_read_warns_of_no_lost_outcome(
    fake: FakeCluster, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``Reporter.close`` warns only when an outcome could not be handed over:
    a channel-mode producer whose outcomes were all read closes without that
    warning.

    Schedule (return_successes): m0, m1 on ``producer.input`` are written and
    both successes are read; the block is left: no "could not be handed over"
    warning."""
    from pipeline import ProducerMessage

    fake.create_topic("t", 1, leaders=[0])
    msgs = [ProducerMessage("t", b"m%d" % i) for i in range(2)]
    async with open_fake_producer(fake, return_successes=True) as producer:
        for m in msgs:
            await producer.input.send(m)
        with trio.fail_after(10):
            assert [await producer.successes.receive() for _ in msgs] == msgs
        assert producer.statistics().double_settles == 0
    assert not [r for r in caplog.records if "could not be handed over" in r.getMessage()]



async def test_an_outcome_whose_hand_over_is_cancelled_before_close_is_handed_over_by_close(
    fake: FakeCluster, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """When the Reporter task sees its cancellation *before* ``close()`` ran
    (the producer's block is cancelled from outside while the user's task is
    busy in a shielded section, so the pipeline's tasks see it first), an
    outcome whose hand-over was cut short goes back to the front of the
    queue, and ``close()`` hands it over if there is room by then; the
    cancellation ends the block without any other error, and every byte is
    released.

    Schedule (channel_capacity 1, return_successes): m0, m1 on
    ``producer.input`` are written at t0; nobody reads: m0 fills the channel,
    the Reporter waits to hand over m1. The block's enclosing scope is
    cancelled; the user's task sleeps 1 s shielded, during which the
    Reporter's send of m1 is cancelled (m1 goes back to the queue), then
    takes m0. The block ends; close() hands m1 over (room for one), nothing
    is lost. Without putting m1 back it was neither handed over nor released
    (its bytes stayed counted); counting it lost in the Reporter (``_closed``
    True from the start, or its check forced) lost it although room came;
    without ``_closed`` set at all the cancellation became an
    AttributeError."""
    from pipeline import ProducerMessage

    fake.create_topic("t", 1, leaders=[0])
    msgs = [ProducerMessage("t", b"m%d" % i) for i in range(2)]
    with trio.CancelScope() as outer:
        async with open_fake_producer(fake, channel_capacity=1, return_successes=True,
                                      **PATIENT) as producer:
            await producer._core.cluster.partitions_for("t")
            for m in msgs:
                await producer.input.send(m)
            await producer.flush()
            await trio.testing.wait_all_tasks_blocked()
            assert producer.statistics().buffered_bytes == msgs[1]._size
            outer.cancel()
            with trio.CancelScope(shield=True):
                await trio.sleep(1.0)
                handed = [producer.successes.receive_nowait()]
    assert outer.cancelled_caught
    stats = producer.statistics()
    assert (stats.buffered_bytes, stats.double_settles) == (0, 0)
    with trio.fail_after(1):
        handed += [m async for m in producer.successes]
    assert handed == msgs
    assert not [r for r in caplog.records if "could not be handed over" in r.getMessage()]
