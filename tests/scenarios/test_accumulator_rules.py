"""The accumulator's byte accounting, each rule pinned by the schedule that needs it.

Found by ``make mutants`` (docs/testing.md, "Mutation testing"): these rules survived every other
test. Deterministic (FakeCluster, autojump_clock, no jitter); each docstring
walks through the schedule, and the virtual times the protocol fixes are
asserted exactly.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.records import batch_size_for_record, decode_record_batches
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import leaderless_after_warm, livelock_guard, open_fake_producer, values_in_log
from .test_guards import exact, offsets
from .test_sarama_suite import outcomes


def request_contents(fake: FakeCluster, topic: str) -> list[dict[int, list[bytes | None]]]:
    """Per Produce request: partition -> the values of the batch it carried."""
    out = []
    for rec in fake.requests_of(ApiKey.PRODUCE):
        carried: dict[int, list[bytes | None]] = {}
        for t in rec.request.topic_data:
            for p in t.partition_data:
                if t.name == topic:
                    (batch,) = decode_record_batches(p.records)
                    carried[p.index] = [r.value for r in batch.records]
        out.append(carried)
    return out


def request_records_bytes(fake: FakeCluster) -> list[int]:
    """Per Produce request: the bytes of the record batches it carried."""
    return [sum(len(p.records) for t in rec.request.topic_data for p in t.partition_data)
            for rec in fake.requests_of(ApiKey.PRODUCE)]


async def test_the_rest_of_a_split_backlog_waits_for_its_linger(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """After a batch takes only the front of a partition's backlog (``fill``),
    the partition's byte count drops by exactly what was taken: what stays is
    judged by its own bytes, and waits for its linger unless it fills a batch.

    Schedule (linger 5 s, batch_bytes = two 100-byte records, one batch in
    flight per partition): t0: x0, x1, x2 reach the broker producer together;
    three records are more than a batch, so a batch goes at once: x0, x1 are
    written at t0. x2 alone is not a full batch: it goes at its linger, t0 + 5
    (its linger counts from its acceptance at t0). Counting the
    taken bytes twice, or not subtracting them, made x2 look like a full batch:
    it was written at t0."""
    value = b"x" * 100
    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=False, linger=5.0,
                    batch_bytes=2 * batch_size_for_record(None, value))
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        sent = [producer.send_nowait("t", value[:-1] + b"%d" % i, partition=0) for i in range(3)]
        front = await outcomes(sent[:2])
        assert trio.current_time() == t0
        rest = await outcomes(sent[2:])
        assert trio.current_time() == t0 + 5.0
    assert offsets(front + rest) == [0, 1, 2]
    assert [len(r) for r in request_contents(fake, "t")] == [1, 1]


async def test_a_request_shares_max_request_bytes_between_partitions(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``drain`` fills one Produce request partition by partition within
    ``max_request_bytes``: each batch taken uses up its bytes of the budget,
    and a partition whose first message does not fit what is left waits for
    the next request (the Java client's ``RecordAccumulator.drain``), whole.

    Schedule (linger 1 s, max_request_bytes = max_message_bytes = batch_bytes =
    R, t[0] and t[1] both on broker 0): t0: three messages of 0.3 R each are
    sent to each partition. At t0 + 1 the linger is over: the first request
    carries one partition's three (0.9 R); the other's first message does not
    fit the 0.1 R left, so its three go together in a second request, the
    same instant.
    Without the budget's decrement all six rode in the first request (1.8 R).
    Bug (issue 12, fixed): the second partition got one message anyway (``fill`` takes at
    least one): a request of 4,917 bytes with max_request_bytes 4,096, and
    the other two waited a second linger, to t0 + 2."""
    request_bytes = 4096
    values = {p: [b"%d-%d" % (p, i) + b"-" * (request_bytes * 3 // 10) for i in range(3)]
              for p in (0, 1)}
    fake.create_topic("t", 2, leaders=[0, 0])
    options = exact(idempotent=False, linger=1.0, max_request_bytes=request_bytes,
                    max_message_bytes=request_bytes, batch_bytes=request_bytes)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        sent = [producer.send_nowait("t", v, partition=p) for p in (0, 1) for v in values[p]]
        results = await outcomes(sent)
        assert trio.current_time() == t0 + 1.0
    assert offsets(results) == [0, 1, 2, 0, 1, 2]
    # Which partition goes first depends on which reached the broker producer first.
    assert sorted(request_contents(fake, "t"), key=min) == [{0: values[0]}, {1: values[1]}]
    assert max(request_records_bytes(fake)) <= request_bytes
    assert values_in_log(fake, "t", 0) == values[0]
    assert values_in_log(fake, "t", 1) == values[1]


async def test_a_request_takes_a_batch_that_fills_it_to_the_byte(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The budget's bound is inclusive: a partition whose batch needs exactly
    the bytes a request has left still rides in it.

    Schedule (linger 1 s, max_request_bytes = max_message_bytes = batch_bytes =
    R, t[0] and t[1] on broker 0): t0: x, of a (batch upper bound) bytes, to
    t[0]; y, of exactly R - a, to t[1]. At t0 + 1 one request carries both.
    Leaving out a batch that fills the request to the byte (``>=`` for ``>``)
    sent y in a second request."""
    request_bytes = 4096
    x = b"x" * 1000
    y = b"y" * (request_bytes - batch_size_for_record(None, x) - 86)
    assert batch_size_for_record(None, x) + batch_size_for_record(None, y) == request_bytes
    fake.create_topic("t", 2, leaders=[0, 0])
    options = exact(idempotent=False, linger=1.0, max_request_bytes=request_bytes,
                    max_message_bytes=request_bytes, batch_bytes=request_bytes)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        results = await outcomes([producer.send_nowait("t", x, partition=0),
                                  producer.send_nowait("t", y, partition=1)])
        assert trio.current_time() == t0 + 1.0
    assert offsets(results) == [0, 0]
    assert request_contents(fake, "t") == [{0: [x], 1: [y]}]


@pytest.mark.parametrize("fits", [False, True], ids=["does-not-fit", "fits"])
async def test_a_retried_batch_that_does_not_fit_the_request_waits_for_the_next(
    fake: FakeCluster, autojump_clock: Any, fits: bool
) -> None:
    """A retried (sealed) batch is re-sent byte for byte, so it cannot be cut
    to what a request has left: when it does not fit, it waits for the next
    request, like a loose message.

    Schedule (plain, linger 1 s, backoff 0.125 s, max_request_bytes =
    max_message_bytes = batch_bytes = R, t[0] and t[1] on broker 0): w to t[0]
    and flushed first, so that t[0] comes first in the broker producer's
    queues. t0: s (0.6 R) to t[1]; at t0 + 1 it is sent and answered
    NOT_ENOUGH_REPLICAS; it goes back to its partition producer and returns
    sealed after the backoff, at t0 + 1.125. Meanwhile, at t0 + 1.0625, m (0.6
    R) joined t[0]'s queue (its linger not over). The retried s makes the
    broker producer ready: the request takes t[0]'s m first (0.6 R); s does
    not fit the 0.4 R left and goes alone in the next request, the same
    instant. Before the fix both rode in one request of 1.2 R. With m of
    exactly the bytes s leaves of R (``fits``), s rides along with it: ending
    the request at any retried batch, or at one filling it to the byte, sent
    s alone."""
    request_bytes = 4096
    big = request_bytes * 6 // 10
    s, m = b"s" * big, b"m" * big
    if fits:
        m = b"m" * (request_bytes - batch_size_for_record(None, s) - 2)
        while batch_size_for_record(None, m) > request_bytes - batch_size_for_record(None, s):
            m = m[:-1]
        assert batch_size_for_record(None, m) + batch_size_for_record(None, s) == request_bytes
    fake.create_topic("t", 2, leaders=[0, 0])
    options = exact(idempotent=False, linger=1.0, max_request_bytes=request_bytes,
                    max_message_bytes=request_bytes, batch_bytes=request_bytes)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        sent = [producer.send_nowait("t", b"w", partition=0)]
        await producer.flush()
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, topic="t", partition=1)
        t0 = trio.current_time()
        sent.append(producer.send_nowait("t", s, partition=1))
        await trio.sleep(1.0625)
        sent.append(producer.send_nowait("t", m, partition=0))
        results = await outcomes(sent)
        assert trio.current_time() == t0 + 1.125
    assert offsets(results) == [0, 0, 1]
    retried = [{0: [m], 1: [s]}] if fits else [{0: [m]}, {1: [s]}]
    assert request_contents(fake, "t") == [{0: [b"w"]}, {1: [s]}, *retried]
    assert max(request_records_bytes(fake)) <= request_bytes


async def test_a_backlog_one_byte_short_of_a_batch_waits_for_its_linger(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Readiness to the byte: a partition's backlog is a full batch at exactly
    ``batch_bytes`` (``test_a_full_batch_does_not_wait_for_linger``); one byte
    less is not, and waits for its linger. A new partition queue counts 0
    bytes, and so does one whose whole backlog was just taken.

    Schedule (linger 5 s, batch_bytes = the size of x + 1): t0: x is sent, one
    byte short of a full batch: written at t0 + 5. Then w is sent and flushed
    (the whole backlog taken at once), and y, the size of x, waits its linger
    again: written 5 s after it was sent. A queue counting from 1 byte, at
    the start or after a take, made x or y full: written at once."""
    value = b"x" * 100
    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=False, linger=5.0,
                    batch_bytes=batch_size_for_record(None, value) + 1)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        x = await outcomes([producer.send_nowait("t", value, partition=0)])
        assert trio.current_time() == t0 + 5.0
        w = producer.send_nowait("t", b"w", partition=0)
        await producer.flush()
        y = await outcomes([w, producer.send_nowait("t", value, partition=0)])
        assert trio.current_time() == t0 + 10.0
    assert offsets(x + y) == [0, 1, 2]


async def test_a_request_leaves_out_a_muted_partition(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``drain`` takes nothing of a partition that may not send now
    (``sendable``): another partition's readiness must not carry it along.

    Schedule (plain producer: one batch in flight per partition; one message
    per batch; t[0] and t[1] on broker 0, which answers the first request 1 s
    late): t0: b and m go to t[0]: b is sent, m waits behind it. t0 + 0.5: n
    goes to t[1], and its request carries n alone; m follows once b is
    answered, at t0 + 1. Without the check in drain, m rode along with n."""
    fake.create_topic("t", 2, leaders=[0, 0])
    options = exact(idempotent=False, max_batch_messages=1)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.delay_responses(1.0, api_key=ApiKey.PRODUCE, count=1)
        t0 = trio.current_time()
        sent = [producer.send_nowait("t", v, partition=0) for v in (b"b", b"m")]
        await trio.sleep(0.5)
        sent.append(producer.send_nowait("t", b"n", partition=1))
        results = await outcomes(sent)
        assert trio.current_time() == t0 + 1.0
    assert offsets(results) == [0, 1, 0]
    assert request_contents(fake, "t") == [{0: [b"b"]}, {1: [b"n"]}, {0: [b"m"]}]


async def test_a_queued_message_expires_at_its_deadline_while_no_slot_is_free(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A broker producer wakes at the delivery deadline of what waits in its
    accumulator (``next_wake``), even without a free request slot: a message
    that spent its time elsewhere first can expire while it waits.

    Schedule (plain producer, max_in_flight 1 per broker, delivery_timeout and
    request_timeout 5 s): t[2]'s only replica, broker 2, is stopped without an
    election. t0: m is sent to t[2] and waits for a leader. t0 + 2.5: b is sent
    to t[1] (broker 1), which answers 4 s late: the one request slot to broker
    1 is taken until t0 + 6.5. t0 + 3: t[2]'s leadership moves to broker 1; at
    the next metadata round (t0 + 3.125) m reaches broker 1's queue and waits
    for the slot. Its deadline is t0 + 5: it fails then, exactly; b is written
    at t0 + 6.5. Without the deadline in next_wake, m failed at t0 + 6.5."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 3, leaders=[0, 1, 2])
    options = exact(idempotent=False, max_in_flight=1, delivery_timeout=5.0,
                    request_timeout=5.0)
    async with open_fake_producer(fake, **options) as producer:
        t0 = await leaderless_after_warm(fake, producer, warm_partition=1)
        m = producer.send_nowait("t", b"m", partition=2)
        await trio.sleep(2.5)
        fake.delay_responses(4.0, api_key=ApiKey.PRODUCE, node_id=1, count=1)
        b = producer.send_nowait("t", b"b", partition=1)
        await trio.sleep(0.5)
        fake.move_leader("t", 2, to=1)
        (m_result,) = await outcomes([m])
        assert trio.current_time() == t0 + 5.0
        (b_result,) = await outcomes([b])
        assert trio.current_time() == t0 + 6.5
    assert isinstance(m_result.cause, DeliveryTimeoutError)
    assert "never acknowledged" in str(m_result.cause)
    assert offsets([b_result]) == [1]


async def retried_m_expires_while_b_holds_the_slot(
    fake: FakeCluster, producer: Any
) -> tuple[Any, Any]:
    """The schedule of the test below (also run with idempotence in
    test_epoch_rules), from a producer on topic "t" (3 partitions, leaders 0,
    1, 2; max_in_flight 1, delivery_timeout and request_timeout 5 s) up to b's
    outcome, asserting its two instants; returns m's and b's outcomes."""
    t0 = await leaderless_after_warm(fake, producer, warm_partition=1)
    fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=1)
    m = producer.send_nowait("t", b"m", partition=2)
    await trio.sleep(3.0625)
    fake.move_leader("t", 2, to=1)
    await trio.sleep(0.125)
    fake.delay_responses(4.0, api_key=ApiKey.PRODUCE, node_id=1, count=1)
    b = producer.send_nowait("t", b"b", partition=1)
    (m_result,) = await outcomes([m])
    assert trio.current_time() == t0 + 5.0
    (b_result,) = await outcomes([b])
    assert trio.current_time() == t0 + 7.1875
    return m_result, b_result


async def test_a_retried_batch_expires_at_its_deadline_while_no_slot_is_free(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """As above for a retried batch waiting in the accumulator (``next_wake``
    covers the sealed batches too).

    Schedule (plain producer, max_in_flight 1 per broker, delivery_timeout and
    request_timeout 5 s): t[2]'s only replica, broker 2, is stopped without an
    election. t0: m is sent to t[2] and waits for a leader. t0 + 3.0625: t[2]
    moves to broker 1; at the round of t0 + 3.125 m is sent there and answered
    NOT_ENOUGH_REPLICAS: it comes back for a retry (backoff 0.125 s).
    t0 + 3.1875: b is sent to t[1] on broker 1, answered 4 s late, taking the
    one request slot. t0 + 3.25: m's batch is back in broker 1's queue, waiting
    for the slot; its deadline is t0 + 5: it fails then, exactly. b is written
    at t0 + 7.1875."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 3, leaders=[0, 1, 2])
    options = exact(idempotent=False, max_in_flight=1, delivery_timeout=5.0,
                    request_timeout=5.0)
    async with open_fake_producer(fake, **options) as producer:
        m_result, b_result = await retried_m_expires_while_b_holds_the_slot(fake, producer)
    assert isinstance(m_result.cause, DeliveryTimeoutError)
    assert "NOT_ENOUGH_REPLICAS" in str(m_result.cause)
    assert offsets([b_result]) == [1]
    assert len(fake.requests_of(ApiKey.PRODUCE, node_id=1)) == 3  # warm, m, b


async def test_a_request_whose_budget_is_used_up_takes_no_other_partition(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``drain`` stops once a request's ``max_request_bytes`` are used up: a
    further partition's first message does not fit the 0 bytes left, and
    waits for the next request.

    Schedule (max_in_flight 1 per broker, max_request_bytes = max_message_bytes
    = batch_bytes = R, t[0], t[1], t[2] on broker 0): t0: one message of exactly
    R bytes (its batch upper bound) to each partition. The first to reach the
    broker producer goes at once and is answered 1 s late, holding the one
    request slot; the other two wait. At t0 + 1 the slot is free: the next
    request carries one of them (the budget is exactly 0 after it), the last
    follows in its own request, the same instant. Going on at a budget of 0
    (the bug fixed in ``drain``: a partition always got one message) put
    those two in one request of 2 R."""
    request_bytes = 4096
    value = b"x" * 4010
    assert batch_size_for_record(None, value) == request_bytes
    fake.create_topic("t", 3, leaders=[0, 0, 0])
    options = exact(idempotent=False, max_in_flight=1, max_request_bytes=request_bytes,
                    max_message_bytes=request_bytes, batch_bytes=request_bytes)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.delay_responses(1.0, api_key=ApiKey.PRODUCE, count=1)
        t0 = trio.current_time()
        sent = [producer.send_nowait("t", value, partition=p) for p in range(3)]
        results = await outcomes(sent)
        assert trio.current_time() == t0 + 1.0
    assert offsets(results) == [0, 0, 0]
    assert [len(r) for r in request_contents(fake, "t")] == [1, 1, 1]


async def test_messages_queued_before_a_row_run_are_batched_by_size(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A partition queue holding ``send()`` messages and then a ``send_batch``
    run (``_take_loose``'s run path): the messages before the run are taken by
    size like any backlog (``fill``), and what stays counts only its own bytes
    and waits for its linger (counted from its acceptance); the run is sealed
    alone.

    Schedule (plain producer, linger 5 s, batch_bytes = two 100-byte records;
    t[0] on broker 0, which answers the first request 1 s late): t0: w is sent
    and held in flight until t0 + 1, when flush() returns. Then x0, x1, x2 are
    accepted, and 0.5 s later a run of two small rows: the backlog is more
    than a batch, x0, x1 go at t0 + 1. x2 and the run are less than a batch:
    x2 goes at its linger, t0 + 6; the run, the backlog then, at its own
    linger from its acceptance: t0 + 6.5. (Counting it from the take of x2
    wrote it at t0 + 11; keeping the linger start of x2's batch, at t0 + 6.)"""
    value = b"x" * 100
    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=False, linger=5.0,
                    batch_bytes=2 * batch_size_for_record(None, value))
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.delay_responses(1.0, api_key=ApiKey.PRODUCE, count=1)
        t0 = trio.current_time()
        w = producer.send_nowait("t", b"w", partition=0)
        await producer.flush()  # w leaves now, despite the linger
        xs = [producer.send_nowait("t", value[:-1] + b"%d" % i, partition=0) for i in range(3)]
        await trio.sleep(0.5)
        run = await producer.send_batch("t", [b"r0", b"r1"], partitions=[0, 0])
        front = await outcomes([w, *xs[:2]])
        rest = await outcomes(xs[2:])
        assert trio.current_time() == t0 + 6.0
        await run
        assert trio.current_time() == t0 + 6.5
    assert offsets(front + rest) == [0, 1, 2, 3]
    assert [len(r[0]) for r in request_contents(fake, "t")] == [1, 2, 1, 2]
    assert [r.time - t0 for r in fake.requests_of(ApiKey.PRODUCE)] == [0.0, 1.0, 6.0, 6.5]
    assert values_in_log(fake, "t", 0)[-2:] == [b"r0", b"r1"]


async def test_a_backlog_of_batches_queued_before_a_row_run_is_cut_by_size(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Messages queued ahead of a ``send_batch`` run, more than a batch of them, while
    the only request slot is busy: once it frees, they go in batches of ``batch_bytes``
    (``fill``), not as one; the run follows alone at its linger, and nothing stays
    counted in the queue.

    Schedule (plain producer, one request in flight, linger 5 s, batch_bytes = two
    100-byte records, the first answer 1 s late): t0: w leaves (a flush) and holds the
    slot until t0 + 1; x0..x3 and then a run of two rows are queued meanwhile. At
    t0 + 1: [x0, x1], then [x2, x3] (each a full batch, so ready); the run at t0 + 5.25,
    its linger from its acceptance."""
    value = b"x" * 100
    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=False, linger=5.0, max_in_flight=1,
                    batch_bytes=2 * batch_size_for_record(None, value))
    async with open_fake_producer(fake, **options) as producer, \
            trio.open_nursery() as nursery:
        await producer._core.cluster.partitions_for("t")
        fake.delay_responses(1.0, api_key=ApiKey.PRODUCE, count=1)
        t0 = trio.current_time()
        w = producer.send_nowait("t", b"w", partition=0)
        nursery.start_soon(producer.flush)  # w leaves now, despite the linger
        await trio.sleep(0.125)
        xs = [producer.send_nowait("t", value[:-1] + b"%d" % i, partition=0) for i in range(4)]
        await trio.sleep(0.125)
        run = await producer.send_batch("t", [b"r0", b"r1"], partitions=[0, 0])
        await outcomes([w, *xs])
        assert trio.current_time() == t0 + 1.0
        await run
        assert trio.current_time() == t0 + 5.25
        part = producer.statistics().topics["t"].partitions[0]
        assert (part.queued_messages, part.queued_bytes) == (0, 0)
    assert [r[0] for r in request_contents(fake, "t")] == [
        [b"w"], [value[:-1] + b"0", value[:-1] + b"1"], [value[:-1] + b"2", value[:-1] + b"3"],
        [b"r0", b"r1"]]
    assert [r.time - t0 for r in fake.requests_of(ApiKey.PRODUCE)] == [0.0, 1.0, 1.0, 5.25]


async def test_after_an_expiry_the_queue_counts_no_bytes_of_it(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """When messages of a partition queue expire there (``Accumulator.expire``),
    the queue stops counting their bytes: a message arriving later is judged
    by its own size, and waits for its linger.

    Schedule (plain producer, linger 2 s, delivery_timeout 5 s, request_timeout
    3 s, batch_bytes = the size of a and b together): t[1]'s only replica,
    broker 1, is stopped without an election. t0: a is sent and waits for a
    leader. t0 + 2.4375: broker 1 is back, its first ApiVersions answer 4 s
    late; at the metadata round of t0 + 2.5 a reaches broker 1's queue, its
    linger over: the flusher waits for the connection, a wait cut at a's
    deadline: a expires there at t0 + 5. t0 + 5.25: b is sent: alone it is
    half a batch, so it is written at its linger, t0 + 7.25. Still counting a's
    bytes made b a full batch, ready at once."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 2, leaders=[0, 1])
    options = exact(idempotent=False, linger=2.0, delivery_timeout=5.0, request_timeout=3.0,
                    batch_bytes=2 * batch_size_for_record(None, b"a"))
    async with open_fake_producer(fake, **options) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.stop_broker(1, elect=False)
        await producer._core.cluster.refresh(force=True)
        t0 = trio.current_time()
        a = producer.send_nowait("t", b"a", partition=1)
        await trio.sleep(2.4375)
        fake.restart_broker(1)
        fake.delay_responses(4.0, api_key=ApiKey.API_VERSIONS, node_id=1, count=1)
        (a_result,) = await outcomes([a])
        assert trio.current_time() == t0 + 5.0
        await trio.sleep(0.25)
        b_result = await outcomes([producer.send_nowait("t", b"b", partition=1)])
        assert trio.current_time() == t0 + 7.25
    assert isinstance(a_result.cause, DeliveryTimeoutError)
    assert offsets(b_result) == [0]


async def test_what_outlives_an_expiry_in_the_queue_keeps_its_linger(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """An expiry that fails the front of a partition's queue but not all of
    it (``Accumulator.expire``) leaves the rest its linger deadline: it goes
    as soon as a request slot is free.

    Schedule (plain producer, max_in_flight 1 per broker, linger 0,
    delivery_timeout and request_timeout 5 s): t[2]'s only replica, broker 2,
    is stopped without an election. t0: m is sent to t[2] and waits for a
    leader. t0 + 2.5: b is sent to t[1] (broker 1), answered 4 s late: the one
    request slot to broker 1 is taken until t0 + 6.5. t0 + 3: t[2]'s
    leadership moves to broker 1; m reaches broker 1's queue at the metadata
    round of t0 + 3.125. t0 + 4: n joins it. At t0 + 5 m fails (its
    deadline); n stays. At t0 + 6.5 the slot is free: b is written and n goes
    at once. Losing the linger deadline of what stays (the ``not alive``
    check forced True) left n waiting until its own deadline, t0 + 9."""
    fake.create_topic("t", 3, leaders=[0, 1, 2])
    options = exact(idempotent=False, max_in_flight=1, delivery_timeout=5.0,
                    request_timeout=5.0)
    async with open_fake_producer(fake, **options) as producer:
        t0 = await leaderless_after_warm(fake, producer, warm_partition=1)
        m = producer.send_nowait("t", b"m", partition=2)
        await trio.sleep(2.5)
        fake.delay_responses(4.0, api_key=ApiKey.PRODUCE, node_id=1, count=1)
        b = producer.send_nowait("t", b"b", partition=1)
        await trio.sleep(0.5)
        fake.move_leader("t", 2, to=1)
        await trio.sleep(1.0)
        n = producer.send_nowait("t", b"n", partition=2)
        results = await outcomes([m])
        assert trio.current_time() == t0 + 5.0
        results += await outcomes([b, n])
        assert trio.current_time() == t0 + 6.5
    assert offsets(results[1:]) == [1, 0]
    assert values_in_log(fake, "t", 2) == [b"n"]


async def test_a_backlog_that_does_not_fit_the_rest_of_a_request_sends_what_fits(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A partition whose first message fits what a request has left, but not
    its whole backlog, sends the front that fits; the rest waits for its own
    linger, counted from the acceptance of its first message
    (``test_the_rest_of_a_split_backlog_waits_for_its_linger``).

    Schedule (linger 1 s, max_request_bytes = max_message_bytes = batch_bytes =
    R, t[0] and t[1] on broker 0): w is sent to t[0] and flushed first, so
    that t[0] comes first in the broker producer's queues. t0: two messages of
    0.3 R to t[0], one to t[1]; t0 + 0.5: two more to t[1]. At t0 + 1 the
    request takes t[0]'s two (0.6 R) and t[1]'s first (0.3 R of the 0.4 R
    left); t[1]'s other two go at their linger, t0 + 1.5. Taking t[1]'s whole
    backlog because it fits a batch (the budget check flipped) overshot the
    request; keeping the linger start of the batch taken sent the rest at
    t0 + 1; counting it from the take, at t0 + 2."""
    request_bytes = 4096
    values = {p: [b"%d-%d" % (p, i) + b"-" * (request_bytes * 3 // 10) for i in range(3)]
              for p in (0, 1)}
    fake.create_topic("t", 2, leaders=[0, 0])
    options = exact(idempotent=False, linger=1.0, max_request_bytes=request_bytes,
                    max_message_bytes=request_bytes, batch_bytes=request_bytes)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        warm = producer.send_nowait("t", b"w", partition=0)
        await producer.flush()
        t0 = trio.current_time()
        sent = [producer.send_nowait("t", v, partition=0) for v in values[0][:2]]
        sent += [producer.send_nowait("t", values[1][0], partition=1)]
        await trio.sleep(0.5)
        sent += [producer.send_nowait("t", v, partition=1) for v in values[1][1:]]
        results = await outcomes(sent[:3])
        assert trio.current_time() == t0 + 1.0
        results += await outcomes(sent[3:])
        assert trio.current_time() == t0 + 1.5
    assert offsets(await outcomes([warm]) + results) == [0, 1, 2, 0, 1, 2]
    assert request_contents(fake, "t")[1:] == [
        {0: values[0][:2], 1: values[1][:1]}, {1: values[1][1:]}]
    assert max(request_records_bytes(fake)) <= request_bytes


async def test_a_message_that_did_not_wait_lingers_from_now_exactly(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A batch's linger counts from its first message's acceptance, found as
    its deadline minus ``delivery_timeout``; for a message that reached the
    broker producer in the instant it was accepted that is now itself, not
    the subtraction's rounding of it (``Accumulator._linger_from``).

    Schedule (plain, linger 0.005 s, delivery_timeout 120 s; times that are
    not dyadic): t0 = 0.1 s after the warm-up: m is sent and reaches its queue
    at once; it is written at t0 + 0.005 exactly. From (t0 + 120) - 120, which
    is not t0 in binary floating point, it was written a hair earlier."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(idempotent=False, linger=0.005,
                                                 delivery_timeout=120.0)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        await trio.sleep(0.1)
        t0 = trio.current_time()
        assert (t0 + 120.0) - 120.0 != t0  # (the rounding this test is about)
        await outcomes([producer.send_nowait("t", b"m", partition=0)])
        assert trio.current_time() == t0 + 0.005
        assert fake.requests_of(ApiKey.PRODUCE)[-1].time == t0 + 0.005


async def test_a_linger_ends_the_timer_slack_early(
    fake: FakeCluster, autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On trio's real clock a batch is due ``TIMER_SLACK`` (0.5 ms) before its
    linger ends: a timed wake-up there ends 0 to ~1.15 ms late (epoll's whole-ms
    timeouts are rounded up), so the linger's end is rounded to the nearest ms
    instead of up. The flusher's timer and its readiness check use the same
    due time (``Accumulator._linger_due``).

    Schedule (plain, linger 5 ms, the slack forced to 0.5 ms on the virtual
    clock): t0: m is sent; it is written at t0 + 4.5 ms exactly. Without the
    slack it waited until t0 + 5 ms; with the slack in the timer alone the
    flusher woke at t0 + 4.5 ms, found nothing due, and woke again at once
    without end (virtual time stood still)."""
    from pipeline.producer._stages import accumulator

    monkeypatch.setattr(accumulator, "timer_slack", lambda: 0.0005)
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(idempotent=False, linger=0.005)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        await trio.sleep(0.125)
        t0 = trio.current_time()
        with livelock_guard():
            await outcomes([producer.send_nowait("t", b"m", partition=0)])
        assert fake.requests_of(ApiKey.PRODUCE)[-1].time == t0 + 0.0045
        assert trio.current_time() == t0 + 0.0045


def test_the_timer_slack_is_only_for_the_real_clock() -> None:
    """``timer_slack`` is ``TIMER_SLACK`` on trio's real clock, where a timed
    wake-up is up to a whole ms late, and 0 on a virtual one (MockClock, as the
    explorer's and every scenario's), where each linger ends exactly on time."""
    import sys

    from trio.testing import MockClock

    from pipeline.producer._stages.accumulator import TIMER_SLACK, timer_slack

    async def slack() -> float:
        return timer_slack()

    assert TIMER_SLACK == (0.0005 if sys.platform.startswith(("linux", "win32")) else 0.0)
    assert trio.run(slack) == TIMER_SLACK
    assert trio.run(slack, clock=MockClock(autojump_threshold=0)) == 0.0
    assert trio.run(slack, clock=MockClock()) == 0.0
