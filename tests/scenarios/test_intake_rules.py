"""Intake rules (``Intake.send`` and its helpers) found unpinned by ``make mutants``
(docs/testing.md, "Mutation testing").

Deterministic (FakeCluster, autojump_clock, exact virtual times); each
docstring walks through the schedule it needs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from pipeline import ProducerClosed, ProducerError
from pipeline.producer._api import Producer
from pipeline.producer._intake import intake as intake_module
from pipeline.protocol.api import ApiKey
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import open_fake_producer, values_in_log

# Long enough that nothing times out while a test holds the pipeline.
PATIENT = dict(request_timeout=100.0, delivery_timeout=300.0)


async def block_dispatcher(
    fake: FakeCluster, producer: Producer, stall: float, leader: int = 0
) -> float:
    """Leave the dispatcher stuck (and the intake unread) until t0 + 0.125 +
    ``stall``; returns t0 (the caller is at t0 + 1.5 then).

    With ``channel_capacity=1``, right after a warm-up send: topic "u" (led
    by ``leader``) is created after the producer started, and the next
    Metadata answer is ``stall`` s late. t0: a to u: the dispatcher starts u's topic producer,
    which asks for u's partition count with [a] (the request leaves at t0 +
    0.125: refreshes are paced by retry_backoff after the warm-up's). t0 + 0.5:
    b fills u's inbox (one list). t0 + 1: c: the dispatcher takes it and waits
    for room in u's inbox; it reads the intake no more until u's metadata
    arrives at t0 + 0.125 + ``stall``."""
    fake.create_topic("u", 1, leaders=[leader])
    fake.delay_responses(stall, api_key=ApiKey.METADATA, count=1)
    t0 = trio.current_time()
    before = producer.statistics().outstanding
    for value in (b"a", b"b", b"c"):
        await producer.send("u", value)
        await trio.sleep(0.5)
    assert producer.statistics().outstanding == before + 3
    return t0


async def waits_in_a_full_intake_until_cancelled(
    fake: FakeCluster, producer: Producer, entry: Callable[[], Awaitable[object]]
) -> float:
    """The shared middle of the cancelled-before-acceptance schedules
    (``channel_capacity=1``, after a warm-up send): the dispatcher is stuck
    until t0 + 10.125 (``block_dispatcher``); t0 + 1.5: r on
    ``producer.input`` fills the intake; ``entry()`` waits for room until its
    caller's deadline, t0 + 2.5. Asserts it was cancelled then and left no
    trace (accepted, outstanding and buffered bytes as before it); returns t0."""
    from pipeline import ProducerMessage

    t0 = await block_dispatcher(fake, producer, 10.0)
    producer.input.send_nowait(ProducerMessage("u", b"r"))
    before = producer.statistics()
    with trio.move_on_after(1.0) as scope:
        await entry()
    assert scope.cancelled_caught and trio.current_time() == t0 + 2.5
    after = producer.statistics()
    assert (after.accepted, after.outstanding, after.buffered_bytes) == (
        before.accepted, before.outstanding, before.buffered_bytes)
    return t0


async def test_a_send_cancelled_while_the_intake_is_full_leaves_no_trace(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A ``send()`` that must wait for room in the intake (``_accept_alone``'s
    ``channel.send``) and is cancelled there was never accepted: its message
    leaves the ledger (``unaccept``: no id, no bytes, no outcome), and the
    caller sees the cancellation, not an error of ours.

    Schedule (channel_capacity 1): the dispatcher is stuck from t0 + 1 to t0 +
    10.125 (``block_dispatcher``); t0 + 1.5: r on ``producer.input`` fills the
    intake (and ends the burst); d's ``send()`` waits for room until its
    caller's deadline, t0 + 2.5. Then nothing of d is left; at t0 + 10.125 a, b, c
    and r are written and flush() returns;
    d never is."""

    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, channel_capacity=1, idempotent=False,
                                  **PATIENT) as producer:
        await producer.send_and_wait("t", b"warm")
        t0 = await waits_in_a_full_intake_until_cancelled(
            fake, producer, lambda: producer.send("u", b"d"))
        await producer.flush()
        assert trio.current_time() == t0 + 10.125
        assert producer.statistics().double_settles == 0
    assert values_in_log(fake, "u", 0) == [b"a", b"b", b"c", b"r"]


async def test_a_send_waiting_for_room_in_the_intake_at_close_gets_its_outcome(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A ``send()`` waiting for room in the intake when the producer closes:
    its message was accepted (it has an id and its bytes), so the close ends
    the wait (``Dispatcher.leftovers`` drains its inbox, which lets the waiting
    list in) and fails it with ``ProducerClosed`` like every other message
    still outstanding; the call returns its Delivery then, not before, and
    the intake's close never reaches it (it is no longer waiting).

    Schedule (channel_capacity 1, close_timeout 2): the dispatcher is stuck
    from t0 + 1 to t0 + 10.125; t0 + 1.5: r on ``producer.input`` fills the intake;
    d's ``send()`` waits. t0 + 2: the block is left: flush() waits for a, b, c
    and d until t0 + 4, then everything outstanding fails; d's ``send()``
    returns at t0 + 4 with d failed by ProducerClosed."""
    from pipeline import ProducerMessage

    fake.create_topic("t", 1, leaders=[0])
    returned: list[tuple[float, Any]] = []
    async with trio.open_nursery() as nursery:
        async with open_fake_producer(fake, channel_capacity=1, idempotent=False,
                                      close_timeout=2.0, **PATIENT) as producer:
            await producer.send_and_wait("t", b"warm")
            t0 = await block_dispatcher(fake, producer, 10.0)
            producer.input.send_nowait(ProducerMessage("u", b"r"))

            async def sender() -> None:
                d = await producer.send("u", b"d")
                returned.append((trio.current_time(), d))

            nursery.start_soon(sender)
            await trio.sleep(0.5)
            assert not returned
    ((at, d),) = returned
    assert at == t0 + 4.0
    with pytest.raises(ProducerError) as info:
        await d
    assert isinstance(info.value.cause, ProducerClosed)
    stats = producer.statistics()
    assert (stats.double_settles, stats.outstanding, stats.buffered_bytes) == (0, 0, 0)
    assert values_in_log(fake, "u", 0) == []


async def test_a_send_waiting_for_buffer_space_at_close_accepts_nothing(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A ``send()`` waiting for buffer memory when the producer closes gets the
    space the close frees (failing what was buffered releases it), but must not
    accept its message then: the intake is closing. It raises ProducerClosed
    ("while this call waited for buffer space"), gives the bytes back and
    leaves no trace. (The schedule explorer found the crash this guards:
    ``tests/explore/regressions/send-waiting-when-closed.json``.)

    Schedule (Produce stalled, buffer_memory = 2 messages, close_timeout 2):
    t0: m0, m1 fill the buffer; d's ``send()`` waits. t0 + 1: the block is left;
    flush() gives up at t0 + 3, m0 and m1 fail, their bytes free d's wait,
    which raises ProducerClosed at t0 + 3."""
    from .test_bad_input import stall_produce
    from .test_ledger_rules import buffered_size

    fake.create_topic("t", 1, leaders=[0])
    value = b"m" * 100
    size = await buffered_size(fake, value)
    gate = stall_produce(fake)
    raised: list[tuple[float, BaseException]] = []
    async with trio.open_nursery() as nursery:
        async with open_fake_producer(fake, buffer_memory=2 * size, max_message_bytes=2 * size,
                                      max_block=100.0, close_timeout=2.0, idempotent=False,
                                      **PATIENT) as producer:
            await producer._core.cluster.partitions_for("t")
            producer.send_nowait("t", value, partition=0)
            producer.send_nowait("t", value, partition=0)
            t0 = trio.current_time()

            async def sender() -> None:
                try:
                    await producer.send("t", value, partition=0)
                except ProducerClosed as exc:
                    raised.append((trio.current_time(), exc))

            nursery.start_soon(sender)
            await trio.sleep(1.0)
    gate.set()
    ((at, exc),) = raised
    assert at == t0 + 3.0
    assert "waited for buffer space" in str(exc)
    stats = producer.statistics()
    assert (stats.accepted, stats.failed, stats.outstanding) == (2, 2, 0)
    assert (stats.buffered_bytes, stats.double_settles) == (0, 0)


async def test_a_tight_loop_of_sends_is_a_checkpoint_every_yield_every_calls(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``send()`` of a message (here: each round's sends are messages, as a
    loop's are until a burst of ``COLUMNS_MIN`` was taken) is a schedule and
    cancellation point once every ``_YIELD_EVERY / _MESSAGE_COST`` (E, 512)
    calls, before it accepts: a tight loop neither starves the pipeline nor pays
    a checkpoint per message, and the call that sees a cancellation accepted
    nothing. (Rows count 1 each: test_hot_path's loop.)

    Schedule: a loop of sends inside an already cancelled scope: call 1 opens
    the burst (``_accept_alone``, not counted), calls 2..E+1 join it, the next
    raises Cancelled (E + 1 accepted). A second such loop again accepts E + 1:
    the count starts over after each checkpoint. Nothing else waits (the buffer
    and the intake have room)."""
    every = intake_module._YIELD_EVERY // intake_module._MESSAGE_COST
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake) as producer:
        await producer._core.cluster.partitions_for("t")
        for round_ in (1, 2):
            sent = 0
            producer._intake._columns_next = False  # (messages, not rows: see above)
            with trio.CancelScope() as scope:
                scope.cancel()
                for _ in range(every + 100):
                    await producer.send("t", b"m", partition=0)
                    sent += 1
            assert sent == every + 1
            assert producer.statistics().accepted == (every + 1) * round_
        await producer.flush()
        assert producer.statistics().double_settles == 0
    assert len(values_in_log(fake, "t", 0)) == 2 * (every + 1)


@pytest.mark.parametrize(("key", "value"), [(None, b"v"), (b"k", b"v" * 100),
                                            (b"k" * 64, b"v" * 8192)])
async def test_send_builds_the_message_the_slow_path_builds(
    fake: FakeCluster, autojump_clock: Any, key: bytes | None, value: bytes
) -> None:
    """``send()``'s common case inlines ``Delivery.__init__`` and
    ``normalize`` (bytes value, optional bytes key, no other option): the
    message it accepts has every field the slow path gives the same input
    (CreateTime from the injected clock, offset -1, retry level 0, pending,
    no outcome, no sink, the same size), apart from the id and deadline that
    acceptance sets.

    Schedule: one ``send()`` on an idle producer, compared at once (no
    checkpoint: nothing has touched it yet) with ``Delivery(...)`` normalized
    by ``Intake.prepare``."""
    from pipeline.producer._outcomes.delivery import MessageDelivery

    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake) as producer:
        await producer._core.cluster.partitions_for("t")
        fast = await producer.send("t", value, key=key, metadata={"row": 1})
        slow = MessageDelivery("t", value, key, None, None, None, {"row": 1})
        producer._intake.prepare(slow)
        slots = [name for klass in MessageDelivery.__mro__ for name in getattr(klass, "__slots__", ())]
        fields = [name for name in slots if name not in ("_id", "_deadline")]
        assert {name: getattr(fast, name) for name in fields} == {
            name: getattr(slow, name) for name in fields}
        assert fast.timestamp == 1_700_000_000_000 and fast.offset == -1
        await fast


async def test_a_burst_whose_first_topic_does_not_come_back_is_split_by_topic(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A burst (consecutive ``send()`` calls sharing one list in the intake)
    is known to have one topic only while every message has the first one's
    topic object (``Intake.send`` clears ``_burst_topic`` at the first other
    topic); then the dispatcher sorts the list by topic.

    Schedule: send(b: "1") opens the burst, send(a: "2") joins it, with no
    checkpoint between: "1" is written to b and "2" to a."""
    fake.create_topic("a", 1, leaders=[0])
    fake.create_topic("b", 1, leaders=[0])
    async with open_fake_producer(fake) as producer:
        await producer._core.cluster.partitions_for("a")
        await producer._core.cluster.partitions_for("b")
        sent = [await producer.send("b", b"1"), await producer.send("a", b"2")]
        await producer.flush()
        assert producer.statistics().double_settles == 0
    assert values_in_log(fake, "a", 0) == [b"2"] and values_in_log(fake, "b", 0) == [b"1"]
    assert [d.result().topic for d in sent] == ["b", "a"]


async def test_a_send_many_chunk_after_a_burst_is_split_by_topic(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``Intake.close_burst`` vouches for one topic only for the open burst it
    closes: another list the dispatcher takes (a ``send_many`` chunk) is
    sorted by topic, even while ``_burst_topic`` still names the last burst's
    topic.

    Schedule: send(a: "1") opens a burst of topic a, which the dispatcher
    takes; then send_many([b: "2", a: "3"]) puts one chunk with both topics:
    "1" and "3" are written to a, "2" to b."""
    from pipeline import ProducerMessage

    fake.create_topic("a", 1, leaders=[0])
    fake.create_topic("b", 1, leaders=[0])
    async with open_fake_producer(fake) as producer:
        await producer._core.cluster.partitions_for("a")
        await producer._core.cluster.partitions_for("b")
        await producer.send("a", b"1")
        await trio.testing.wait_all_tasks_blocked()  # the dispatcher took the burst
        group = await producer.send_many([ProducerMessage("b", b"2"), ProducerMessage("a", b"3")])
        result = await group
        assert (result.delivered, result.failed) == (2, 0)
        assert producer.statistics().double_settles == 0
    assert values_in_log(fake, "a", 0) == [b"1", b"3"] and values_in_log(fake, "b", 0) == [b"2"]


async def test_send_nowait_joins_the_open_burst_even_when_the_intake_is_full(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``send_nowait()`` (``Intake._enqueue_nowait``) appends to the open burst
    instead of putting a list of its own on the intake: consecutive calls cost
    one intake slot together, so they fit an intake of one slot.

    Schedule (channel_capacity 1, idle dispatcher): m0 opens the burst (the
    waiting dispatcher gets the list at once), m1..m4 join it; all five are
    accepted without an error and written in that order. With a list per call
    the third would find the intake full (BufferFullError)."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, channel_capacity=1) as producer:
        await producer._core.cluster.partitions_for("t")
        sent = [producer.send_nowait("t", b"m%d" % i, partition=0) for i in range(5)]
        for d in sent:
            await d
        assert producer.statistics().double_settles == 0
    assert values_in_log(fake, "t", 0) == [b"m%d" % i for i in range(5)]


async def test_send_nowait_refuses_a_message_when_the_intake_is_full(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """With no open burst and the intake full, ``send_nowait()`` cannot enqueue
    its message: it refuses it (BufferFullError naming the intake and
    channel_capacity) and leaves no trace; it never returns a message that is
    on no channel.

    Schedule (channel_capacity 1, idle dispatcher): r0 on ``producer.input``
    goes to the waiting dispatcher, r1 fills the intake (each ends the burst);
    then m's ``send_nowait()`` raises, with nothing accepted. Once the
    dispatcher took r1 (all tasks blocked again), m2 is accepted."""
    from pipeline import BufferFullError, ProducerMessage

    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, channel_capacity=1) as producer:
        await producer._core.cluster.partitions_for("t")
        before = producer.statistics()
        producer.input.send_nowait(ProducerMessage("t", b"r0", partition=0))
        producer.input.send_nowait(ProducerMessage("t", b"r1", partition=0))
        with pytest.raises(BufferFullError, match=r"intake is full.*channel_capacity=1"):
            producer.send_nowait("t", b"m", partition=0)
        after = producer.statistics()
        assert (after.accepted, after.outstanding) == (before.accepted, before.outstanding)
        await trio.testing.wait_all_tasks_blocked()  # the dispatcher took r1
        await producer.send_nowait("t", b"m2", partition=0)
        await producer.flush()
        assert producer.statistics().double_settles == 0
    assert values_in_log(fake, "t", 0) == [b"r0", b"r1", b"m2"]


async def test_a_send_that_waited_for_buffer_space_gets_its_whole_delivery_timeout(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``delivery_timeout`` counts from acceptance: a ``send()`` that waited for
    buffer memory (up to ``max_block``, which Java does not count into
    delivery.timeout.ms either) gets its deadline when it is accepted, not when
    the call began nor the last burst's.

    Schedule (plain producer, buffer_memory = 2 messages, delivery_timeout and
    request_timeout 5 s): t0: m0, m1 to t[0] (broker 0 answers 1 s late) fill
    the buffer; d to t[1] waits. t0 + 1: m0, m1 are written, d is accepted
    (deadline t0 + 6) and sent; broker 1 answers 4.5 s late, at t0 + 5.5: d is
    written. With the deadline taken before the wait (t0 + 5), d expired in
    flight at t0 + 5."""
    from .test_ledger_rules import buffered_size

    fake.create_topic("t", 2, leaders=[0, 1])
    value = b"m" * 100
    size = await buffered_size(fake, value)
    async with open_fake_producer(fake, buffer_memory=2 * size, max_message_bytes=2 * size,
                                  max_block=100.0, idempotent=False, delivery_timeout=5.0,
                                  request_timeout=5.0) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.delay_responses(1.0, api_key=ApiKey.PRODUCE, node_id=0, count=1)
        fake.delay_responses(4.5, api_key=ApiKey.PRODUCE, node_id=1, count=1)
        t0 = trio.current_time()
        held = [producer.send_nowait("t", value, partition=0) for _ in range(2)]
        d = await producer.send("t", value, partition=1)
        assert trio.current_time() == t0 + 1.0 and all(m.done() for m in held)
        meta = await d
        assert trio.current_time() == t0 + 5.5 and meta.offset == 0
        assert producer.statistics().double_settles == 0


async def test_messages_joining_a_burst_share_its_deadline(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A message that joins the open burst takes the burst's delivery deadline
    (``_enqueue_nowait``), as a record appended to an open batch expires with
    the batch in the Java client: a burst's messages share one deadline
    whichever entry point added them, so queue order stays deadline order.
    Time can pass while a burst is open when the dispatcher is stuck.

    Schedule (plain producer, channel_capacity 1, delivery_timeout 20 s): the
    dispatcher is stuck until t0 + 10.125 (``block_dispatcher``; u's only
    replica, broker 2, stops at t0 + 1.5 without an election). t0 + 1.5: m1's
    ``send_nowait()`` opens a burst (deadline t0 + 21.5); t0 + 2.5: m2's joins
    it. Nothing can be written, and m1 and m2 both fail at t0 + 21.5 (m2 on
    its own deadline would fail at t0 + 22.5)."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 1, leaders=[1])
    failed_at: dict[bytes, tuple[float, Any]] = {}

    def on_delivery(metadata: Any, error: Any) -> None:
        failed_at[error.message.value] = (trio.current_time(), error.cause)

    async with open_fake_producer(fake, channel_capacity=1, idempotent=False,
                                  delivery_timeout=20.0, request_timeout=5.0) as producer:
        await producer.send_and_wait("t", b"warm")
        t0 = await block_dispatcher(fake, producer, 10.0, leader=2)
        fake.stop_broker(2, elect=False)
        producer.send_nowait("u", b"m1", on_delivery=on_delivery)
        await trio.sleep(1.0)
        producer.send_nowait("u", b"m2", on_delivery=on_delivery)
        with trio.fail_after(60):
            await producer.flush()
        assert producer.statistics().double_settles == 0
    assert {value: at - t0 for value, (at, _) in failed_at.items()} == {b"m1": 21.5, b"m2": 21.5}
    assert all(isinstance(cause, DeliveryTimeoutError) for _, cause in failed_at.values())


@pytest.mark.parametrize("call", ["send_many", "send_many rows", "send_batch"])
async def test_a_bulk_call_that_waits_for_nothing_is_still_a_schedule_point(
    fake: FakeCluster, autojump_clock: Any, call: str
) -> None:
    """``send_many`` and ``send_batch`` are checkpoints, as trio's async calls are,
    even when the buffer and the intake have room (no wait at all): a task that feeds
    them lists in a loop lets the pipeline run between calls instead of filling the
    whole buffer first (the final ``cancel_shielded_checkpoint``)."""
    from pipeline import ProducerMessage
    from pipeline.producer._columnar.burst import COLUMNS_MIN

    fake.create_topic("t", 1, leaders=[0])
    n = COLUMNS_MIN + 8 if call == "send_many rows" else 2
    async with open_fake_producer(fake, idempotent=False, **PATIENT) as producer:
        await producer.send_and_wait("t", b"warm")
        msgs = [ProducerMessage("t", b"m%d" % i) for i in range(n)]
        with trio.testing.assert_checkpoints():
            if call == "send_batch":
                group = await producer.send_batch("t", [m.value for m in msgs])
            else:
                group = await producer.send_many(msgs)
        result = await group
        assert (result.delivered, result.failed) == (n, 0)
