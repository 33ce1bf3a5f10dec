"""The partition producer's watermark rules, driven step by step.

Some interleavings of the protocol last zero virtual time: a fresh message
arriving while the chaser is on its way back, a straggler bounced in the same
instant. A scenario on the FakeCluster cannot pin those (they depend on trio's
task order within one instant), so these tests drive one PartitionProducer
directly: each inbox item is handed to ``_handle`` in a chosen order, ``_tick``
sends, and stub broker producers record what reached them. Each docstring
names the rule and what breaks without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import trio

from pipeline.producer._errors import DeliveryTimeoutError
from pipeline.producer._message import FAILED, PENDING, ProducerMessage
from pipeline.producer._outcomes.ledger import Ledger
from pipeline.producer._stages.context import RetryErrors
from pipeline.producer._stages.envelopes import Fin, Handoff, TopicPartition
from pipeline.producer._stages.partition_producer import PartitionProducer, RetryList

TP = TopicPartition("t", 0)


class StubBroker:
    def __init__(self, node_id: int, capacity: int = 100) -> None:
        self.node_id = node_id
        self.inbox, self.received = trio.open_memory_channel[Any](capacity)

    def items(self) -> list[Any]:
        out = []
        while True:
            try:
                out.append(self.received.receive_nowait())
            except trio.WouldBlock:
                return out


@dataclass
class StubCore:
    """The partition producer's StageContext and its BrokerInboxes in one stub."""

    leader: int = 0
    brokers: dict[int, StubBroker] = field(default_factory=dict)
    ledger: Ledger = field(default_factory=lambda: Ledger(10**9, 1.0))
    config: Any = field(default_factory=lambda: type("C", (), {
        "request_timeout": 5.0, "delivery_timeout": 60.0, "channel_capacity": 10})())
    refreshes: int = 0
    idempotence: Any = None  # not idempotent
    retry_errors: RetryErrors = field(default_factory=lambda: RetryErrors(60.0))

    async def broker_producer(self, node: int) -> StubBroker:
        return self.brokers.setdefault(node, StubBroker(node))

    def backoff(self, level: int) -> float:
        return 0.0

    @property
    def cluster(self) -> Any:
        core = self

        class Metadata:
            def leader_for(self, topic: str, partition: int) -> int:
                return core.leader

        class Round:
            async def wait(self) -> None:
                pass

        class Cluster:
            metadata = Metadata()

            def queue_refresh(self, topics: Any) -> Round:
                core.refreshes += 1
                return Round()

        return Cluster()


def msgs(*names: str, level: int = 0, deadline: float = math.inf) -> list[ProducerMessage]:
    out = []
    for name in names:
        m = ProducerMessage("t", name.encode())
        m._level = level
        m._deadline = deadline
        out.append(m)
    return out


def values(batch: Any) -> list[bytes]:
    assert isinstance(batch, Handoff)
    return [m.value for m in batch.messages]  # type: ignore[union-attr]


async def attached(core: StubCore) -> PartitionProducer:
    """A partition producer attached to broker 0, as after its first message."""
    pp = PartitionProducer(core, TP, core)  # type: ignore[arg-type]
    pp._handle(msgs("first"))
    await pp._tick()
    assert pp.bp is core.brokers[0]
    assert [values(i) for i in core.brokers[0].items()] == [[b"first"]]
    return pp


def accept(core: StubCore, batch: list[ProducerMessage]) -> list[ProducerMessage]:
    for m in batch:
        m._size = 1
        core.ledger.accept(m, m._deadline)
    return batch


async def test_fresh_messages_wait_while_the_chaser_is_out() -> None:
    """Rule 2: while hwm > 0 (a chaser on its way back), new level-0 messages
    wait in their level's buffer. Sent at once to the new leader instead, n
    would be written before a, which was accepted earlier and is being retried.

    Steps: a comes back at level 1 -> raise, Fin(0) to broker 0. n arrives.
    The leader moves to broker 1 and the metadata is fresh, but n must wait.
    Fin(1) comes back: a then n go to broker 1, in that order."""
    core = StubCore()
    pp = await attached(core)
    (a,) = msgs("a", level=1)
    pp._handle(RetryList([a]))
    await pp._tick()
    assert core.brokers[0].items() == [Fin(TP, 0)]
    core.leader = 1
    pp._handle(msgs("n"))
    await pp._tick()  # the raise's metadata refresh has not completed yet...
    pp._metadata_fresh = True  # ...now it has: a may go, n may not
    await pp._tick()
    sent = core.brokers[1].items()
    assert [values(i) for i in sent] == [[b"a"]]
    pp._handle(RetryList([Fin(TP, 1)]))
    await pp._tick()
    assert [values(i) for i in core.brokers[1].items()] == [[b"n"]]
    assert pp.hwm == 0 and not pp._levels


async def test_stragglers_of_the_old_path_go_before_later_messages() -> None:
    """Rule 1: the messages gathered for the old broker producer in the pass
    that raised are sent to it ahead of the chaser (``_flush_out``), so they
    come back before it. Kept instead, they would go to the new leader ahead of
    the failed message, which is older.

    Steps: s is gathered for broker 0, then a comes back at level 1 in the
    same pass -> s and Fin(0) go to broker 0, in that order."""
    core = StubCore()
    pp = await attached(core)
    pp._handle(msgs("s"))
    (a,) = msgs("a", level=1)
    pp._handle(RetryList([a]))
    await pp._tick()
    items = core.brokers[0].items()
    assert [values(items[0]), items[1]] == [[b"s"], Fin(TP, 0)]
    # Broker 0 bounces s (level 1 now), then returns the chaser.
    (s,) = [m for m in items[0].messages]  # type: ignore[union-attr]
    s._level = 1
    pp._metadata_fresh = True
    core.leader = 1
    pp._handle(RetryList([s, Fin(TP, 1)]))
    await pp._tick()
    assert [values(i) for i in core.brokers[1].items()] == [[b"a", b"s"]]


async def test_a_message_below_hwm_waits_in_its_level() -> None:
    """Rule 2 for bounced messages: a straggler coming back below hwm (the
    watermark was raised above its level meanwhile) waits in its level's
    buffer and goes after the higher levels, top-down."""
    core = StubCore()
    pp = await attached(core)
    (a,) = msgs("a", level=2)
    pp._handle(RetryList([a]))
    await pp._tick()
    assert core.brokers[0].items() == [Fin(TP, 1)]
    (b,) = msgs("b", level=1)
    pp._handle(RetryList([b]))
    pp._handle(msgs("c"))
    core.leader = 1
    pp._metadata_fresh = True
    await pp._tick()
    assert [values(i) for i in core.brokers[1].items()] == [[b"a"]]
    pp._handle(RetryList([Fin(TP, 2)]))
    await pp._tick()
    assert [values(i) for i in core.brokers[1].items()] == [[b"b", b"c"]]


async def test_messages_held_back_expire_at_their_deadline(autojump_clock: Any) -> None:
    """A message waiting in a level's buffer counts for the wake-up time and
    fails with DeliveryTimeoutError once its deadline passes, even while the
    chaser is out; the others keep waiting."""
    core = StubCore()
    pp = await attached(core)
    (a,) = msgs("a", level=1)
    pp._handle(RetryList([a]))
    await pp._tick()
    now = trio.current_time()
    early, late = accept(core, msgs("early", deadline=now + 1)), accept(
        core, msgs("late", deadline=now + 5))
    pp._handle(early)
    pp._handle(late)
    assert pp._wake_at() == now + 1  # the buffered message's deadline
    await trio.sleep(1)
    await pp._tick()
    assert early[0]._state == FAILED and isinstance(early[0]._outcome, DeliveryTimeoutError)
    assert late[0]._state == PENDING
    assert pp._wake_at() == now + 5
    await trio.sleep(4)
    await pp._tick()  # the last one expires: its level's buffer is left empty
    assert late[0]._state == FAILED
    assert pp._wake_at() == math.inf


async def test_after_a_give_up_what_was_kept_goes_after_the_old_paths_stragglers() -> None:
    """Leaving a broker producer that gave up (``leader_changed``): what was
    gathered for it is kept and held back below the new watermark, so the
    stragglers it bounces (sent to it earlier, so older) go first.

    Steps: s was sent to broker 0; o is gathered; broker 0 gives up ->
    leave: Fin(0) to broker 0, o held back. Broker 0 bounces s (level 1) and
    returns the chaser; with fresh metadata naming broker 1: s, then o."""
    core = StubCore()
    pp = await attached(core)
    pp._handle(msgs("s"))
    await pp._tick()
    (sent,) = core.brokers[0].items()
    pp._handle(msgs("o"))
    pp.leader_changed()
    await pp._tick()
    assert core.brokers[0].items() == [Fin(TP, 0)]
    (s,) = sent.messages
    s._level = 1
    core.leader = 1
    pp._metadata_fresh = True
    pp._handle(RetryList([s, Fin(TP, 1)]))
    await pp._tick()
    assert [values(i) for i in core.brokers[1].items()] == [[b"s", b"o"]]


async def test_a_give_up_reported_after_we_left_needs_no_second_chaser() -> None:
    """The broker producer we just left can still give up on stragglers (sent
    with the chaser, already at the retry limit) before it returns the chaser:
    ``leader_changed`` then finds us detached, and leaving again would need a
    path we no longer have. The chaser already on its way ends that broker
    producer's retry state; nothing more is sent.

    Steps: s (level 1) is gathered for broker 0 when a comes back at level 2:
    s and Fin(1) go to broker 0. Broker 0 gives s up (leader_changed), then
    returns Fin(2); a goes to the leader."""
    core = StubCore()
    pp = await attached(core)
    pp._handle(msgs("s", level=1))
    (a,) = msgs("a", level=2)
    pp._handle(RetryList([a]))
    await pp._tick()
    assert [type(i) for i in core.brokers[0].items()] == [Handoff, Fin]
    pp.leader_changed()
    pp._metadata_fresh = True
    pp._handle(RetryList([Fin(TP, 2)]))
    await pp._tick()
    # a goes to the leader (broker 0 still), and no second chaser was sent.
    assert [values(i) for i in core.brokers[0].items()] == [[b"a"]]
    assert pp.bp is core.brokers[0] and pp.hwm == 0


async def test_a_full_broker_input_delays_the_chaser_but_never_drops_it(autojump_clock: Any) -> None:
    """The outbox goes out in order; when a broker producer's input is full the
    partition producer waits for room (the broker producer's intake never
    blocks, so it always comes). Dropping what does not fit would lose the
    chaser here, and the partition would wait for it forever.

    Steps: broker 0's input holds one item. s is gathered, then a comes back
    at level 1: s fills the input, the chaser waits until broker 0 takes s."""
    core = StubCore()
    core.brokers[0] = StubBroker(0, capacity=1)
    pp = await attached(core)
    pp._handle(msgs("s"))
    (a,) = msgs("a", level=1)
    pp._handle(RetryList([a]))
    got: list[Any] = []

    async def broker_intake() -> None:
        await trio.sleep(1)
        for _ in range(2):
            got.append(await core.brokers[0].received.receive())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(broker_intake)
        t0 = trio.current_time()
        await pp._tick()
        assert trio.current_time() == t0 + 1  # waited for room, then went on
    assert [values(got[0]), got[1]] == [[b"s"], Fin(TP, 0)]


async def test_a_retry_handed_over_while_the_main_loop_is_busy_is_not_lost(
    autojump_clock: Any,
) -> None:
    """The retry back-edge is a deque plus a wake-up. A retry handed over while
    the main loop is not waiting for its inbox (here: blocked on a full broker
    input inside ``_tick``) must still be handled in the next pass (``_woken``);
    otherwise it sits in the deque until some unrelated message arrives, and
    here none does: the chaser never goes out and the partition stalls.

    Steps: broker 0's input holds one item. a goes to broker 0, b waits for
    room; meanwhile c comes back at level 1. At t0 + 1 broker 0 takes a and b;
    then the partition producer raises for c and sends the chaser, at once."""
    core = StubCore()
    core.brokers[0] = StubBroker(0, capacity=1)
    pp = PartitionProducer(core, TP, core)  # type: ignore[arg-type]
    send = pp.inbox
    got: list[Any] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(pp.run)
        t0 = trio.current_time()
        await send.send(msgs("a"))
        await trio.sleep(0.1)
        await send.send(msgs("b"))
        await trio.sleep(0.1)  # b waits for room in broker 0's input
        (c,) = msgs("c", level=1)
        pp.retry([c])
        await trio.sleep_until(t0 + 1)
        with trio.fail_after(10):
            while len(got) < 3:
                got.append(await core.brokers[0].received.receive())
        assert trio.current_time() == t0 + 1
        nursery.cancel_scope.cancel()
    assert [values(got[0]), values(got[1]), got[2]] == [[b"a"], [b"b"], Fin(TP, 0)]
