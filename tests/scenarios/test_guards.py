"""The ordering protocol's guards, each pinned by the schedule that needs it.

Every test here is deterministic (FakeCluster, autojump_clock, HalfRandom so
every jittered backoff is exact) and its docstring walks through the schedule
step by step; where the protocol fixes a virtual time, the test asserts it
exactly. docs/architecture.md ("Guards and the schedules that need them")
maps each guard to its test.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from pipeline import ProducerError
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import produce as pm
from pipeline.protocol.records import decode_record_batches
from pipeline.testing.fake_cluster import ControlContext, FakeCluster

from .conftest import HalfRandom, livelock_guard, open_fake_producer, values_in_log
from .test_sarama_suite import outcomes, send_all, vals

PRODUCE, METADATA = 0, 3


def exact(**overrides: Any) -> dict[str, Any]:
    """Options with dyadic durations (exact in binary floating point) and no jitter."""
    options: dict[str, Any] = dict(
        retry_backoff=0.125, retry_backoff_max=0.125, retry_backoff_jitter=0, rng=HalfRandom(1)
    )
    options.update(overrides)
    return options


async def test_retries_disabled_transient_error_does_not_kill_the_partition(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Bug (found writing these tests): with retries=0, one retriable error left the
    broker producer's retry state for the partition set for good. The exhausted
    batch failed (right), the leader was re-resolved (still broker 0, so the
    partition producer stayed attached), and every later message of the
    partition was bounced and failed at once with the stale cause, forever.

    Schedule: leader 0 answers NOT_ENOUGH_REPLICAS once (t=0): a0..a2 fail. At
    t=1 b0..b2 are sent: they must be written (offsets 0..2), at t=1 exactly
    (nothing is retried, nothing waits)."""
    fake.create_topic("t", 1, leaders=[0])
    fake.fail_next(PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
    async with open_fake_producer(fake, **exact(retries=0, idempotent=False)) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        first = await outcomes(await send_all(producer, "t", vals("a", 3), partition=0))
        assert trio.current_time() == t0
        await trio.sleep(1.0)
        second = await outcomes(await send_all(producer, "t", vals("b", 3), partition=0))
        assert trio.current_time() == t0 + 1.0
    assert all(isinstance(r, ProducerError) for r in first)
    assert {r.cause.code for r in first} == {ErrorCode.NOT_ENOUGH_REPLICAS}
    assert [r.offset for r in second] == [0, 1, 2]
    assert values_in_log(fake, "t", 0) == vals("b", 3)


async def test_reattach_waits_for_metadata_fresher_than_the_failure(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Guard: a partition producer re-attaches only once a metadata refresh that
    started after the failure has completed (``_metadata_fresh`` in ``_tick``).

    Schedule (retries=1, backoff 0.125 s, Metadata answered 1 s late):
    1. t0: the leader of t[0] moves 0 -> 1; m is sent to broker 0, which answers
       NOT_LEADER_OR_FOLLOWER. m comes back at level 1; the partition producer
       raises its watermark, sends its chaser to broker 0 (back at once) and
       asks for a refresh.
    2. t0 + 0.5: the backoff is over and n arrives, but the refresh is still
       out. Re-attaching now would use the cached (stale) leader 0: a second
       NOT_LEADER, and with retries=1 m would fail although broker 1 was ready.
    3. Broker 0's error queued a metadata round at once; the refresh the
       partition producer waits for must start after it asked, and it asks (in
       the same instant, ``Cluster.queue_refresh``) before the refresher starts
       that round, so it waits for that one, answered 1 s later. Only then, at
       t0 + 1 exactly, does the partition producer attach to broker 1: m and n
       are written, in order. (Through the old loopback the partition producer
       asked later, after that round had started, so it waited for the next one,
       0.125 s of refresh spacing plus 1 s later: t0 + 2.125.)
    """
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(retries=1)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        await trio.sleep(1.0)  # past the refresh spacing: the next round starts at once
        fake.delay_responses(1.0, api_key=METADATA)
        fake.move_leader("t", 0, to=1)
        t0 = trio.current_time()
        m = await producer.send("t", b"m", partition=0)
        await trio.sleep(0.5)
        n = await producer.send("t", b"n", partition=0)
        results = await outcomes([m, n])
        assert trio.current_time() == t0 + 1.0
    assert [r.offset for r in results] == [1, 2]
    assert values_in_log(fake, "t", 0) == [b"warm", b"m", b"n"]
    produce = [r.node_id for r in fake.requests_of(PRODUCE)]
    # warm, m refused by the old leader, then at the new one m (its sealed batch,
    # re-sent as it was) and n.
    assert produce == [0, 0, 1, 1]


# Key and value lengths around every varint width of a zigzag length prefix
# (1 byte below 64, 2 below 8192, 3 below 2**20, 4 below 2**27).
_LENGTHS = [None, 0, 1, 63, 64, 100, 8191, 8192, 70_000, 2**20 - 1, 2**20]


async def test_every_entry_point_sizes_a_message_as_batch_size_for_record(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Guard: ``send()`` inlines the size bound of the common call (bytes value,
    optional bytes key) instead of calling ``batch_size_for_record``; ``normalize``
    inlines it for every other header-less message. The bound decides
    ``MessageTooLargeError``, buffer memory and batch cuts, so every entry point
    must compute the same number as ``batch_size_for_record`` (Java's
    ``estimateSizeInBytesUpperBound``: exact varint widths for the key and value
    lengths). A bound a few bytes too high refuses messages the broker would
    take; a few bytes too low lets through batches the broker refuses."""
    from pipeline import ProducerMessage
    from pipeline.protocol.records import batch_size_for_record

    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(
        fake, **exact(max_message_bytes=4 * 2**20, max_request_bytes=8 * 2**20, buffer_memory=64 * 2**20)
    ) as producer:
        for klen in (None, 0, 63, 64, 8192):
            for vlen in _LENGTHS:
                key = None if klen is None else b"k" * klen
                value = None if vlen is None else b"v" * vlen
                want = batch_size_for_record(key, value)
                sizes = []
                if value is not None:
                    sizes.append((await producer.send("t", value, key=key))._size)  # inlined path
                sizes.append((await producer.send("t", value, key=key, partition=0))._size)
                sizes.append(producer.send_nowait("t", value, key=key)._size)
                many = [ProducerMessage("t", value, key)]
                await producer.send_many(many)
                sizes.append(many[0]._size)
                assert set(sizes) == {want}, (klen, vlen, sizes, want)
                await producer.flush()  # keep the buffer small


@pytest.mark.parametrize(("klen", "vlen"), [(None, 100), (3, 8191), (64, 9000), (None, 63)])
async def test_size_limit_is_exact_at_the_boundary(
    fake: FakeCluster, autojump_clock: Any, klen: int | None, vlen: int
) -> None:
    """With ``max_message_bytes`` equal to a message's bound it is accepted by
    ``send()`` (inlined path) and written by a broker whose max.message.bytes is
    the same number (the bound is never below the real batch); one byte less and
    every entry point refuses it with MessageTooLargeError."""
    from pipeline import MessageTooLargeError, ProducerMessage
    from pipeline.protocol.records import batch_size_for_record

    key = None if klen is None else b"k" * klen
    value = b"v" * vlen
    bound = batch_size_for_record(key, value)
    fake.create_topic("t", 1, leaders=[0], configs={"max.message.bytes": str(bound)})
    async with open_fake_producer(fake, **exact(max_message_bytes=bound)) as producer:
        meta = await producer.send_and_wait("t", value, key=key)
    assert meta.offset == 0
    async with open_fake_producer(fake, **exact(max_message_bytes=bound - 1)) as producer:
        with pytest.raises(MessageTooLargeError, match=f"message of {bound} bytes"):
            await producer.send("t", value, key=key)
        with pytest.raises(MessageTooLargeError, match=f"message of {bound} bytes"):
            await producer.send("t", value, key=key, partition=0)
        with pytest.raises(MessageTooLargeError, match=f"message of {bound} bytes"):
            producer.send_nowait("t", value, key=key)
        with pytest.raises(MessageTooLargeError, match=f"message of {bound} bytes"):
            await producer.send_many([ProducerMessage("t", value, key)])
        assert producer.statistics().accepted == 0
    assert values_in_log(fake, "t", 0) == [value]


def offsets(results: list[Any]) -> list[Any]:
    """Offsets, or the error's cause code for a failed message (readable diffs)."""
    return [
        r.offset if not isinstance(r, ProducerError) else getattr(r.cause, "code", r.cause)
        for r in results
    ]


async def test_retries_disabled_leader_ping_pong(fake: FakeCluster, autojump_clock: Any) -> None:
    """With retries=0 a NOT_LEADER fails the batch; the partition producer leaves
    the old leader's broker producer with a chaser (which ends that broker
    producer's retry state for the partition) and re-attaches to the new leader
    once fresh metadata names it. The leader then moves back: the first broker
    producer must serve the partition again, not go on failing it with the
    error of the first move (sarama #294, leader ping-pong).

    Schedule: leader 0 -> 1: a fails at broker 0; b (t0 + 1) is written at
    broker 1 at once. Leader 1 -> 0: c fails at broker 1; d (t0 + 2) is written
    at broker 0 at once."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(retries=0, idempotent=False)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        t0 = trio.current_time()
        fake.move_leader("t", 0, to=1)
        a = await outcomes([await producer.send("t", b"a", partition=0)])
        await trio.sleep_until(t0 + 1)
        b = await outcomes([await producer.send("t", b"b", partition=0)])
        assert trio.current_time() == t0 + 1
        fake.move_leader("t", 0, to=0)
        c = await outcomes([await producer.send("t", b"c", partition=0)])
        await trio.sleep_until(t0 + 2)
        d = await outcomes([await producer.send("t", b"d", partition=0)])
        assert trio.current_time() == t0 + 2
    not_leader = ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert offsets(a + b + c + d) == [not_leader, 1, not_leader, 2]
    assert values_in_log(fake, "t", 0) == [b"warm", b"b", b"d"]
    assert [r.node_id for r in fake.requests_of(PRODUCE)] == [0, 0, 1, 1, 0]


async def test_exhausted_batch_leaves_no_retry_state_behind(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """retries=1: a batch fails twice at broker 0 (NOT_ENOUGH_REPLICAS, no leader
    move) and is failed for good. Broker 0 bounced nothing, so no chaser would
    have come: its retry state for the partition used to stay, and the next
    message was bounced once without being sent (a retry burnt, a backoff
    waited) before the chaser of that bounce cleared it. Now the give-up ends
    that state (the leader answered: in the broker producer, ``_gave_up``;
    for an error that says the leader may be gone the partition producer
    leaves with a chaser instead), and the next message goes out the moment
    it is sent, on its first attempt.

    Schedule: t0: a sent, fails; t0 + 0.125 (backoff): a re-sent, fails: a is
    failed. t0 + 1: b sent and written at t0 + 1 exactly, in one request."""
    fake.create_topic("t", 1, leaders=[0])
    fake.fail_next(PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0, count=2)
    async with open_fake_producer(fake, **exact(retries=1)) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        a = await outcomes([await producer.send("t", b"a", partition=0)])
        assert trio.current_time() == t0 + 0.125
        await trio.sleep_until(t0 + 1)
        before = len(fake.requests_of(PRODUCE))
        b = await outcomes([await producer.send("t", b"b", partition=0)])
        assert trio.current_time() == t0 + 1
        assert len(fake.requests_of(PRODUCE)) == before + 1
    assert offsets(a + b) == [ErrorCode.NOT_ENOUGH_REPLICAS, 0]
    assert values_in_log(fake, "t", 0) == [b"b"]


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
async def test_waiting_behind_a_failed_batch_spends_no_retry(
    fake: FakeCluster, autojump_clock: Any, idempotent: bool
) -> None:
    """retries=1. A retry level is not a retry spent: what only waited behind a
    failed batch goes back a level up, but was never sent. Counting levels as
    retries, b failed on its first error with its retry unspent (found while
    making a KIP-126 split spend no retry; the Java client counts a batch's own
    attempts).

    Schedule (max_in_flight=1): t0: a goes out; its answer (NOT_ENOUGH_REPLICAS)
    is held 1 s. t0 + 0.25: b is sent and waits behind a. t0 + 1: a fails and
    goes back with b behind it (b a level up, untried). t0 + 1.125 (backoff): a
    written; b sent, refused once (its first error), re-sent at t0 + 1.25 and
    written."""
    refused: set[bytes] = set()

    async def refuse_first_try(ctx: ControlContext) -> pm.ProduceResponse | None:
        [topic] = ctx.request.topic_data
        [part] = topic.partition_data
        first = decode_record_batches(part.records)[0].records[0].value
        if first in refused:
            return None
        refused.add(first)
        if first == b"a":
            await trio.sleep(1.0)
        return pm.ProduceResponse(responses=(pm.TopicProduceResponse(
            name=topic.name, partition_responses=(pm.PartitionProduceResponse(
                index=part.index, error_code=ErrorCode.NOT_ENOUGH_REPLICAS, base_offset=-1,
                log_append_time_ms=-1, log_start_offset=-1),)),))

    fake.create_topic("t", 1, leaders=[0])
    options = exact(retries=1, max_in_flight=1, idempotent=idempotent)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        if idempotent:
            await producer.send_and_wait("t", b"w", partition=0)
        fake.control(PRODUCE, refuse_first_try, sticky=True, node_id=0)
        t0 = trio.current_time()
        a = await producer.send("t", b"a", partition=0)
        await trio.sleep(0.25)
        b = await producer.send("t", b"b", partition=0)
        results = await outcomes([a, b])
        elapsed = trio.current_time() - t0
    assert all(not isinstance(r, ProducerError) for r in results), results
    assert elapsed == 1.25
    assert [v for v in values_in_log(fake, "t", 0) if v != b"w"] == [b"a", b"b"]
    assert refused == {b"a", b"b"}


async def test_each_retry_backs_off_twice_as_long(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The retry backoff grows with each retry of the same batch (KIP-580: initial x
    2^(n-1), capped at retry_backoff_max); the retry level is what counts them, so a
    level must rise by exactly one per bounce.

    Schedule (backoff 0.125 s, max 1 s, no jitter): a fails three times
    (NOT_ENOUGH_REPLICAS) and is re-sent after 0.125, 0.25 and 0.5 s: written at
    t0 + 0.875 exactly."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(retry_backoff_max=1.0)) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.fail_next(PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0, count=3)
        t0 = trio.current_time()
        meta = await producer.send_and_wait("t", b"a", partition=0)
        assert trio.current_time() - t0 == 0.875
    assert meta.offset == 0
    assert len(fake.requests_of(PRODUCE)) == 4


async def test_a_batch_arriving_after_its_partitions_bounce_goes_back_too(
    fake: FakeCluster, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker producer's intake and responder are two tasks. A batch of a
    partition can reach the intake after the responder bounced that partition
    and before the partition producer heard of it: the partition is retrying,
    nothing of it is in flight, and nothing else will bounce it. ``_accept``
    sends it back at once; left queued, it would sit there until the chaser
    came, and the chaser would find the partition not drained.

    Schedule (plain, retries on, backoff 0.125 s): t0: A goes out; it is refused
    (NOT_ENOUGH_REPLICAS) at t0 + 1. B is sent at that instant, one scheduling
    step later, so it is on its way to the broker producer while the responder
    bounces A. Both go back, A first, and are written in order at t0 + 1.125."""
    from pipeline.producer._stages.broker_producer import BrokerProducer
    from pipeline.producer._stages.envelopes import Handoff

    late_arrivals: list[float] = []
    accept = BrokerProducer._accept

    def watched(self: BrokerProducer, item: Any) -> None:
        part = self._acc.queue(item.tp)
        if isinstance(item, Handoff) and part.retrying is not None and not part.in_flight:
            late_arrivals.append(trio.current_time())
        accept(self, item)

    monkeypatch.setattr(BrokerProducer, "_accept", watched)
    refused: list[bool] = []

    async def refuse_the_first_a_second_late(ctx: ControlContext) -> pm.ProduceResponse | None:
        if refused:
            return None
        refused.append(True)
        await trio.sleep(1.0)
        [topic] = ctx.request.topic_data
        [part] = topic.partition_data
        return pm.ProduceResponse(responses=(pm.TopicProduceResponse(
            name=topic.name, partition_responses=(pm.PartitionProduceResponse(
                index=part.index, error_code=ErrorCode.NOT_ENOUGH_REPLICAS, base_offset=-1,
                log_append_time_ms=-1, log_start_offset=-1),)),))

    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(idempotent=False, linger=0)) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.control(PRODUCE, refuse_the_first_a_second_late, sticky=True, node_id=0)
        t0 = trio.current_time()
        a = producer.send_nowait("t", b"A", partition=0)
        await trio.sleep_until(t0 + 1.0)
        await trio.lowlevel.checkpoint()  # B leaves as the refusal comes in
        b = producer.send_nowait("t", b"B", partition=0)
        results = await outcomes([a, b])
        elapsed = trio.current_time() - t0
    assert late_arrivals == [t0 + 1.0], "the schedule no longer reaches the race"
    assert offsets(results) == [0, 1]
    assert elapsed == 1.125
    assert values_in_log(fake, "t", 0) == [b"A", b"B"]


async def test_flusher_waits_for_a_free_request_slot_without_spinning(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Bug (found by a random schedule): with every request slot of a connection
    taken (max_in_flight) and another partition's messages ready to go, the
    broker producer's flusher woke at their (past) linger deadline, found no
    free slot, and looped: a busy loop until a response came (in real time a
    CPU spinning; on autojump_clock virtual time stopped and the run hung).

    Schedule (max_in_flight=1, two partitions on broker 0): t0: a (t[0]) goes
    out; its answer takes 1 s. b (t[1]) is ready at once but waits for the
    slot, without running in the meantime. t0 + 1: a's answer; b goes out and
    is answered at once."""
    fake.create_topic("t", 2, leaders=[0, 0])
    async with open_fake_producer(fake, **exact(max_in_flight=1)) as producer:
        await producer._core.cluster.partitions_for("t")
        with livelock_guard():
            fake.delay_responses(1.0, api_key=PRODUCE, count=1)
            t0 = trio.current_time()
            a = await producer.send("t", b"a", partition=0)
            await trio.sleep(0.25)
            b = await producer.send("t", b"b", partition=1)
            results = await outcomes([a, b])
            assert trio.current_time() == t0 + 1.0
    assert offsets(results) == [0, 0]


async def test_retries_disabled_next_message_waits_for_the_new_leader(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Guard: ``leader_changed`` asks for a metadata refresh of its own, so the
    partition producer re-attaches only once metadata fresher than the failure
    is in, not as soon as its chaser is back.

    Schedule (retries=0, Metadata answered 1 s late): t0: the leader moves
    0 -> 1 and a fails at broker 0 (NOT_LEADER, no retry). b is sent right
    after: re-attaching at once would send it to the stale leader 0 and fail it
    too. It waits for the refresh instead: ``leader_changed`` asks in the same
    step as broker 0's error queues a round, before that round starts, so
    both wait for it; it is answered at t0 + 1, and b is written at broker 1
    then."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(retries=0, idempotent=False)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        await trio.sleep(1.0)
        fake.delay_responses(1.0, api_key=METADATA)
        fake.move_leader("t", 0, to=1)
        t0 = trio.current_time()
        a = await outcomes([await producer.send("t", b"a", partition=0)])
        assert trio.current_time() == t0
        b = await outcomes([await producer.send("t", b"b", partition=0)])
        assert trio.current_time() == t0 + 1
    assert offsets(a + b) == [ErrorCode.NOT_LEADER_OR_FOLLOWER, 1]
    assert [r.node_id for r in fake.requests_of(PRODUCE)] == [0, 0, 1]


async def test_retries_disabled_no_backoff_after_a_give_up(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """When a broker producer gives up on a partition (retries=0 here) with an
    error that says the leader may have moved, the partition producer leaves
    it (``leader_changed``) without backing off: nothing is retried, so the
    next message waits only for fresh metadata, never for retry_backoff.

    Schedule (retry_backoff 1 s, instant metadata, the last refresh long ago):
    t0: a fails at broker 0 (NOT_LEADER_OR_FOLLOWER, given up at once; the
    leader stays 0); b is sent right after and written at t0 exactly (the
    refresh round starts at once). With NOT_ENOUGH_REPLICAS the partition
    producer would not leave at all (``_gave_up``): the test would prove
    nothing about the backoff."""
    fake.create_topic("t", 1, leaders=[0])
    options = exact(retries=0, idempotent=False, retry_backoff=1.0, retry_backoff_max=1.0)
    async with open_fake_producer(fake, **options) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        await trio.sleep(5.0)
        fake.fail_next(PRODUCE, ErrorCode.NOT_LEADER_OR_FOLLOWER, node_id=0)
        metadata_before = len(fake.requests_of(METADATA))
        t0 = trio.current_time()
        a = await outcomes([await producer.send("t", b"a", partition=0)])
        b = await outcomes([await producer.send("t", b"b", partition=0)])
        assert trio.current_time() == t0
        assert len(fake.requests_of(METADATA)) > metadata_before  # it did leave
    assert offsets(a + b) == [ErrorCode.NOT_LEADER_OR_FOLLOWER, 1]


async def test_flush_sends_at_once_and_linger_holds_otherwise(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``flush()`` ignores linger (the Java client's flush semantics), and only
    while it runs (``FlushState.depth > 0`` in the broker producer's readiness).

    Schedule (linger 5 s): t0: a is sent and flushed: written at t0. Then b is
    sent without a flush: it waits its linger and is written at t0 + 5."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(linger=5.0)) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        a = await producer.send("t", b"a", partition=0)
        await producer.flush()
        assert a.done() and trio.current_time() == t0
        b = await producer.send("t", b"b", partition=0)
        results = await outcomes([a, b])
        assert trio.current_time() == t0 + 5.0
    assert offsets(results) == [0, 1]


async def test_a_full_batch_does_not_wait_for_linger(fake: FakeCluster, autojump_clock: Any) -> None:
    """Linger holds a partition's messages only until a batch is full: at
    ``max_batch_messages`` messages, or at ``batch_bytes`` bytes (a message of
    exactly that size fills it), the batch goes at once.

    Schedule (linger 5 s, max_batch_messages 2, batch_bytes = the size of x):
    t0: m0, m1 are written at t0 (two messages); x alone is written at t0 (its
    bytes); y, smaller, waits for its linger: t0 + 5."""
    from pipeline.protocol.records import batch_size_for_record

    x_value = b"x" * 100
    fake.create_topic("t", 2, leaders=[0, 0])
    options = exact(linger=5.0, max_batch_messages=2,
                    batch_bytes=batch_size_for_record(None, x_value))
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        pair = await outcomes([await producer.send("t", b"m%d" % i, partition=0) for i in range(2)])
        assert trio.current_time() == t0
        x = await outcomes([await producer.send("t", x_value, partition=1)])
        assert trio.current_time() == t0
        y = await outcomes([await producer.send("t", b"y", partition=1)])
        assert trio.current_time() == t0 + 5.0
    assert offsets(pair + x + y) == [0, 1, 0, 1]


async def test_a_batch_of_unknown_fate_is_not_restamped_after_a_bump(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Restamp rule: after an epoch bump, a batch waiting for its retry is
    re-stamped (new epoch, sequence from 0) only if it was definitely not
    written. One whose answer was lost may be in the log: re-stamped, the
    broker would take it again (a new epoch starts a new sequence space), so
    it fails instead, with its fate unknown.

    Schedule (idempotent; t[0] on broker 0, t[1] on broker 1, both confirmed):
    t0: a (t[0]) is written but its answer is lost (the connection drops);
    b (t[1]) gets an OUT_OF_ORDER_SEQUENCE_NUMBER nothing explains: it fails
    and the epoch is bumped. a's retry comes after the bump: it fails, and the
    log holds a once."""
    from pipeline import ProducerError

    fake.create_topic("t", 2, leaders=[0, 1])
    async with open_fake_producer(fake, **exact(idempotent=True)) as producer:
        await producer.send_and_wait("t", b"warm0", partition=0)
        await producer.send_and_wait("t", b"warm1", partition=1)
        fake.drop_response_after_apply(PRODUCE, node_id=0)
        fake.fail_next(PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=1)
        a = await producer.send("t", b"a", partition=0)
        b = await producer.send("t", b"b", partition=1)
        results = await outcomes([a, b])
        idem = producer._core.idempotence
        assert idem is not None and idem.producer_epoch == 1
    assert isinstance(results[0], ProducerError) and "may or may not" in str(results[0].cause)
    assert offsets(results[1:]) == [ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER]
    assert values_in_log(fake, "t", 0) == [b"warm0", b"a"]
