"""Idempotence and muting rules found unpinned by ``make mutants`` (docs/testing.md, "Mutation testing").

Deterministic (FakeCluster, autojump_clock, no jitter); each docstring walks
through the schedule it needs, and the virtual times the protocol fixes are
asserted exactly.
"""

from __future__ import annotations

from typing import Any

import trio

from pipeline.producer._stages.envelopes import TopicPartition
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import leaderless_after_warm, open_fake_producer, values_in_log
from .test_guards import exact, offsets
from .test_idempotence import sent_batches
from .test_sarama_suite import outcomes


async def _p_a_then_b_failing_a(
    fake: FakeCluster, producer: Any, *, b_late: float
) -> tuple[float, list[Any]]:
    """The shared start of two schedules (one message per batch, t[0]): at t0,
    p and a are sent, b at t0 + 0.5; the first Produce (p) is answered 2 s
    late, the next one (a) NOT_ENOUGH_REPLICAS, the third (b) ``b_late`` s
    late. Returns t0 and the three deliveries, at t0 + 1."""
    produces: list[float] = []

    async def third_answered_late(ctx: Any) -> Any:
        produces.append(ctx.time)
        if len(produces) == 3:
            await trio.sleep(b_late)
        return None

    fake.control(ApiKey.PRODUCE, third_answered_late, sticky=True)
    fake.delay_responses(2.0, api_key=ApiKey.PRODUCE, count=1)
    t0 = trio.current_time()
    sent = [producer.send_nowait("t", v, partition=0) for v in (b"p", b"a")]
    await trio.sleep(0.5)
    sent.append(producer.send_nowait("t", b"b", partition=0))
    await trio.sleep(0.5)
    fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
    return t0, sent


async def test_nothing_is_sealed_while_an_epoch_bump_waits_for_the_wire_to_drain(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Sealing pauses from a bump request until the new epoch is in place
    (``Idempotence.paused`` in ``Accumulator.ready``): a batch sealed in between
    would carry the old epoch and the next old sequence, then be written
    beside the new epoch's sequence 0 (the old doc's open survivor).

    Schedule (idempotent; t[0], t[1], t[2] on brokers 0, 1, 2, all confirmed;
    broker 1 answers Produce 1 s late): t0: s goes to t[1] and stays in flight
    until t0 + 1. a (t[0]) gets an OUT_OF_ORDER_SEQUENCE_NUMBER nothing
    explains: it fails and a bump is requested, which waits for s. m (t[2]) is
    sent right after: it is sealed only once the bump is done, at t0 + 1, with
    epoch 1 and sequence 0, and written then."""
    fake.create_topic("t", 3, leaders=[0, 1, 2])
    async with open_fake_producer(fake, **exact(idempotent=True)) as producer:
        for p in range(3):
            await producer.send_and_wait("t", b"warm%d" % p, partition=p)
        fake.delay_responses(1.0, api_key=ApiKey.PRODUCE, node_id=1)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0)
        t0 = trio.current_time()
        s = await producer.send("t", b"s", partition=1)
        a = await outcomes([await producer.send("t", b"a", partition=0)])
        assert trio.current_time() == t0
        m = await outcomes([await producer.send("t", b"m", partition=2)])
        assert trio.current_time() == t0 + 1.0
        await outcomes([s])
        idem = producer._core.idempotence
        assert idem is not None and idem.producer_epoch == 1
    assert offsets(a + m) == [ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, 1]
    assert [(b[2], b[3]) for b in sent_batches(fake, "t", 2)] == [(0, 0), (1, 0)]
    assert values_in_log(fake, "t", 2) == [b"warm2", b"m"]


async def test_a_retrying_partition_sends_nothing_more_until_its_batches_went_back(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Muting (``Accumulator.sendable``): once a batch of a partition failed
    retriably, nothing more of that partition leaves its broker producer,
    even with request slots free (idempotent, confirmed: up to 5 in flight),
    until every batch in flight is back and all of it went to the partition
    producer to be retried in order.

    Schedule (idempotent, one message per batch, t[0] on broker 0, confirmed):
    t0: b1 and b2 are sent; b1 is held 0.05 s and answered NOT_ENOUGH_REPLICAS,
    b2 (read at t0 + 0.05, out of order behind b1) is answered at t0 + 1.05.
    t0 + 0.5: m arrives: the partition is retrying, so m waits. At t0 + 1.05
    b1, b2 and m go back, and after the retry backoff (0.125 s) they are
    re-sent in order at t0 + 1.175 (sequences 1, 2, 3). A broker producer that
    kept sending sent m at t0 + 0.5 too, with sequence 3 behind the gap: one
    Produce request more."""
    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=True, max_batch_messages=1)
    async with open_fake_producer(fake, **options) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        before = len(fake.requests_of(ApiKey.PRODUCE))
        fake.delay_responses(0.05, api_key=ApiKey.PRODUCE, count=1, before_apply=True)
        fake.delay_responses(1.0, api_key=ApiKey.PRODUCE, count=1, before_apply=True)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        t0 = trio.current_time()
        sent = [producer.send_nowait("t", v, partition=0) for v in (b"b1", b"b2")]
        await trio.sleep(0.5)
        sent.append(producer.send_nowait("t", b"m", partition=0))
        results = await outcomes(sent)
        assert round(trio.current_time() - t0, 9) == 1.175
    assert offsets(results) == [1, 2, 3]
    requests = fake.requests_of(ApiKey.PRODUCE)[before:]
    # Arrival times (the connection is busy while a delayed request is held) and
    # the base sequence of each batch sent, after the warm-up's sequence 0.
    assert [round(r.time - t0, 9) for r in requests] == [0.0, 0.05, 1.175, 1.175, 1.175]
    assert [b[3] for b in sent_batches(fake, "t", 0)][1:] == [1, 2, 1, 2, 3]
    assert values_in_log(fake, "t", 0) == [b"warm", b"b1", b"b2", b"m"]


async def test_a_restamped_batch_is_the_new_epochs_batch(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Restamp (``Accumulator.restamp``): a batch that certainly was not written
    is re-sent after an epoch bump under the new epoch from sequence 0, and the
    batch object says so too (its producer id, epoch and base sequence), so
    its success confirms the partition in the new epoch (pipelining resumes)
    and a later failure of it is judged as the current epoch's.

    Schedule (idempotent; t[0] on broker 0, t[1] on broker 1, both confirmed):
    t0: a (t[0]) is answered NOT_ENOUGH_REPLICAS (not written) and waits for
    its retry backoff; b (t[1]) gets an OUT_OF_ORDER_SEQUENCE_NUMBER nothing
    explains: it fails and the epoch is bumped at once (nothing in flight).
    At t0 + 0.125 a is re-sent re-stamped (epoch 1, sequence 0) and written:
    t[0] is confirmed in epoch 1. With the batch keeping its old epoch, t[0]
    stayed unconfirmed (one batch in flight at a time, for good)."""
    fake.create_topic("t", 2, leaders=[0, 1])
    async with open_fake_producer(fake, **exact(idempotent=True)) as producer:
        await producer.send_and_wait("t", b"warm0", partition=0)
        await producer.send_and_wait("t", b"warm1", partition=1)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=1)
        t0 = trio.current_time()
        a = producer.send_nowait("t", b"a", partition=0)
        b = producer.send_nowait("t", b"b", partition=1)
        results = await outcomes([a, b])
        assert trio.current_time() == t0 + 0.125
        idem = producer._core.idempotence
        assert idem is not None and idem.producer_epoch == 1
        assert {tp.partition for tp in idem.confirmed} == {0}
    assert offsets(results) == [1, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER]
    assert [(b[2], b[3]) for b in sent_batches(fake, "t", 0)] == [(0, 0), (0, 1), (1, 0)]
    assert values_in_log(fake, "t", 0) == [b"warm0", b"a"]


async def test_a_duplicate_answer_to_producer_id_0_keeps_the_records_timestamps(
    autojump_clock: Any,
) -> None:
    """Producer id 0 is a real id (a new Kafka cluster hands it out first): the
    answer to its re-sent batch is read as a duplicate's echo like any other
    id's (``producer_id >= 0`` in ``_handle_partition``). Kafka answers a
    duplicate NONE with the cached batch's max timestamp in
    ``log_append_time_ms``, also on a CreateTime topic; taken for a
    LogAppendTime it would give every record that one timestamp.

    Schedule (idempotent, producer id 0, linger 1 s, t[0] on broker 0,
    CreateTime topic): t0: v0..v2 with timestamps T, T + 1, T + 2. At t0 + 1
    their batch is written, but the connection closes instead of the answer;
    the batch goes back (fate unknown) and, after the backoff, is re-sent
    identical at t0 + 1.125: the fake answers it as Kafka does, NONE, offset 0,
    log_append_time_ms T + 2. Each record reports its own timestamp; with the
    check for ids > 0 only, all three reported T + 2."""
    async with FakeCluster.serve(brokers=1, seed=7, auto_create_topics=False,
                                 first_producer_id=0) as fake:
        fake.create_topic("t", 1, leaders=[0])
        fake.drop_response_after_apply(ApiKey.PRODUCE, node_id=0)
        stamp = 1_600_000_000_000
        async with open_fake_producer(fake, **exact(idempotent=True, linger=1.0)) as producer:
            await producer._core.cluster.partitions_for("t")
            t0 = trio.current_time()
            sent = [producer.send_nowait("t", b"v%d" % i, partition=0, timestamp=stamp + i)
                    for i in range(3)]
            results = await outcomes(sent)
            assert trio.current_time() == t0 + 1.125
            idem = producer._core.idempotence
            assert idem is not None and idem.producer_id == 0
        assert [(r.offset, r.timestamp) for r in results] == [(i, stamp + i) for i in range(3)]
        assert [x[1:] for x in sent_batches(fake, "t", 0)] == [(0, 0, 0, 3), (0, 0, 0, 3)]
        assert values_in_log(fake, "t", 0) == [b"v0", b"v1", b"v2"]


async def _p_late_then_a_unanswered(fake: FakeCluster, producer: Any) -> tuple[float, list[Any]]:
    """The shared start of two schedules (idempotent, one message per batch, t[0] on
    broker 0): at t0, p and a are sent; p is answered 2 s late, a waits behind it (one
    batch in flight until the partition is confirmed), goes at t0 + 2 and is never
    answered. Returns t0 and the two deliveries, at once."""
    from pipeline.testing.fake_cluster import NO_RESPONSE

    await producer._core.cluster.partitions_for("t")
    produces: list[float] = []

    def second_goes_unanswered(ctx: Any) -> Any:
        produces.append(ctx.time)
        return NO_RESPONSE if len(produces) == 2 else None

    fake.control(ApiKey.PRODUCE, second_goes_unanswered, sticky=True)
    fake.delay_responses(2.0, api_key=ApiKey.PRODUCE, count=1)
    t0 = trio.current_time()
    return t0, [producer.send_nowait("t", v, partition=0) for v in (b"p", b"a")]


async def test_a_batch_expiring_in_flight_explains_the_gap_behind_it(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """With idempotence, a batch that times out in flight may or may not have
    taken its sequence: the partition is marked retrying, so a later batch
    answered OUT_OF_ORDER_SEQUENCE_NUMBER (the gap it left) goes back and is
    re-sent in the new epoch, not failed as an unexplained gap.

    Schedule (idempotent, one message per batch, delivery_timeout 5 s,
    request_timeout 4 s, t[0] on broker 0): t0: p (sequence 0) is answered
    2 s late; a (sequence 1) waits behind it (one batch in flight until the
    partition is confirmed) and is sent at t0 + 2, when broker 0 takes it and
    never answers. t0 + 2.5: b (sequence 2) is sent: the broker answers
    OUT_OF_ORDER_SEQUENCE_NUMBER (1 is missing). t0 + 5: a's deadline: it
    fails in flight, and a new epoch is requested. t0 + 6: a's request times
    out and the connection closes; b's answer is read: explained by a, b goes
    back and is written at t0 + 6.125 with epoch 1, sequence 0. Without the
    retrying mark, b failed with OUT_OF_ORDER_SEQUENCE_NUMBER."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=True, max_batch_messages=1, delivery_timeout=5.0,
                    request_timeout=4.0)
    async with open_fake_producer(fake, **options) as producer:
        t0, sent = await _p_late_then_a_unanswered(fake, producer)
        await trio.sleep(2.5)
        sent.append(producer.send_nowait("t", b"b", partition=0))
        results = await outcomes(sent[:2])
        assert trio.current_time() == t0 + 5.0
        results += await outcomes(sent[2:])
        assert trio.current_time() == t0 + 6.125
    assert offsets(results[:1] + results[2:]) == [0, 1]
    assert isinstance(results[1].cause, DeliveryTimeoutError)
    assert [x[2:4] for x in sent_batches(fake, "t", 0)] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert values_in_log(fake, "t", 0) == [b"p", b"b"]


async def test_a_failed_batch_waiting_for_its_partitions_flights_expires_on_time(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A batch that failed retriably goes back only once none of its
    partition's batches is in flight (``_maybe_bounce``); while it waits for
    them it still fails at its delivery deadline, naming the error that sent
    it back.

    Schedule (idempotent, one message per batch, delivery_timeout 5 s,
    request_timeout 4 s, t[0] on broker 0): t0: p and a are sent, b at t0 +
    0.5; p (sequence 0) is answered 2 s late, a and b wait behind it (one
    batch in flight until the partition is confirmed) and go at t0 + 2: a is
    answered NOT_ENOUGH_REPLICAS at once, b 3.75 s late. a waits for b; at
    its deadline, t0 + 5, a fails, "never acknowledged; last error:
    NOT_ENOUGH_REPLICAS" (the flusher wakes for it: nothing else is due
    then); b fails in flight at its own, t0 + 5.5. c, sent after, is written
    in the new epoch at t0 + 5.875, once b's answer drained the wire. Bug
    (fixed): a failed only when b's answer came, at t0 + 5.75."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=True, max_batch_messages=1, delivery_timeout=5.0,
                    request_timeout=4.0)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        t0, sent = await _p_a_then_b_failing_a(fake, producer, b_late=3.75)
        results = await outcomes(sent[:1])
        assert trio.current_time() == t0 + 2.0
        results += await outcomes(sent[1:2])
        assert trio.current_time() == t0 + 5.0
        results += await outcomes(sent[2:])
        assert trio.current_time() == t0 + 5.5
        results += await outcomes([producer.send_nowait("t", b"c", partition=0)])
        assert trio.current_time() == t0 + 5.875
    assert offsets(results[:1] + results[3:]) == [0, 1]
    a, b = results[1].cause, results[2].cause
    assert isinstance(a, DeliveryTimeoutError) and isinstance(b, DeliveryTimeoutError)
    assert "never acknowledged; last error: NOT_ENOUGH_REPLICAS" in str(a)
    assert "may or may not have been written" in str(b)
    assert [x[2:4] for x in sent_batches(fake, "t", 0)] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert values_in_log(fake, "t", 0) == [b"p", b"c"]


async def test_a_failed_batch_expires_at_its_own_deadline_before_its_partitions_flights(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """As above, but b is sent 0.5 s after a, so a's deadline (t0 + 5) comes before
    anything else the flusher waits for: b's in-flight deadline and its answer are at
    t0 + 5.5. The flusher must wake for the failed batch's own deadline
    (``_next_wake``), or a fails half a second late, with b.

    Schedule (as above): t0: p and a; t0 + 0.5: b. p answered at t0 + 2; a and b go
    then, a is refused at once (NOT_ENOUGH_REPLICAS) and waits for b, answered 3.5 s
    late. t0 + 3: c, to partition 1 on the same broker, makes the flusher work out
    its wait again (else it keeps the wait it took while a was in flight, which ends
    at a's deadline anyway). a fails at t0 + 5 exactly; b at t0 + 5.5."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 2, leaders=[0, 0])
    options = exact(idempotent=True, max_batch_messages=1, delivery_timeout=5.0,
                    request_timeout=4.0)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        t0, sent = await _p_a_then_b_failing_a(fake, producer, b_late=3.5)
        results = await outcomes(sent[:1])
        assert trio.current_time() == t0 + 2.0
        await trio.sleep_until(t0 + 3.0)
        c = producer.send_nowait("t", b"c", partition=1)
        results += await outcomes(sent[1:2])
        a_failed_at = trio.current_time() - t0
        results += await outcomes(sent[2:])
        b_failed_at = trio.current_time() - t0
        results += await outcomes([c])
    assert (a_failed_at, b_failed_at) == (5.0, 5.5)
    assert offsets(results[:1] + results[3:]) == [0, 0]
    a, b = results[1].cause, results[2].cause
    assert isinstance(a, DeliveryTimeoutError) and isinstance(b, DeliveryTimeoutError)
    assert "never acknowledged; last error: NOT_ENOUGH_REPLICAS" in str(a)


async def test_a_retried_batch_expiring_in_the_queue_starts_a_new_epoch(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """With idempotence, a retried batch that expires while it waits in the
    accumulator (``Accumulator.expire``) took sequences the broker never
    wrote: the next batch of the partition must not follow them, so a new
    epoch starts (as for a batch out of retries).

    Schedule (the one of test_a_retried_batch_expires_at_its_deadline_while_
    no_slot_is_free, idempotent: max_in_flight 1 per broker, delivery_timeout
    and request_timeout 5 s): t[2] waits for a leader from t0; m goes to
    broker 1 at t0 + 3.125 and is answered NOT_ENOUGH_REPLICAS; b (t[1])
    then holds broker 1's one request slot until t0 + 7.1875; m's retried
    batch expires in the queue at t0 + 5. n, sent to t[2] after b is written,
    goes with epoch 1, sequence 0. Without the bump it carried epoch 0,
    sequence 1: a gap the broker never saw 0 of."""
    from pipeline.producer._errors import DeliveryTimeoutError

    from .test_accumulator_rules import retried_m_expires_while_b_holds_the_slot

    fake.create_topic("t", 3, leaders=[0, 1, 2])
    options = exact(idempotent=True, max_in_flight=1, delivery_timeout=5.0,
                    request_timeout=5.0)
    async with open_fake_producer(fake, **options) as producer:
        m_result, b_result = await retried_m_expires_while_b_holds_the_slot(fake, producer)
        results = [b_result]
        results += await outcomes([producer.send_nowait("t", b"n", partition=2)])
        idem = producer._core.idempotence
        assert idem is not None and idem.producer_epoch == 1
    assert isinstance(m_result.cause, DeliveryTimeoutError)
    assert offsets(results) == [1, 0]
    assert [x[2:4] for x in sent_batches(fake, "t", 2)] == [(0, 0), (1, 0)]
    assert values_in_log(fake, "t", 2) == [b"n"]


async def test_after_an_unexplained_gap_the_batches_behind_it_go_to_the_new_epoch(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """An OUT_OF_ORDER_SEQUENCE_NUMBER nothing explains fails its batch and
    starts a new epoch; the partition is then retrying, so the batches of it
    already in flight behind it, answered OUT_OF_ORDER too (the gap is still
    there), are explained by it: they go back and are re-sent in the new
    epoch, not failed one by one.

    Schedule (idempotent, one message per batch, backoff 0.125 s, t[0] on
    broker 0, confirmed): t0: a (sequence 1) and b (sequence 2) are sent in
    two requests; a is answered OUT_OF_ORDER_SEQUENCE_NUMBER: it fails; b is
    answered OUT_OF_ORDER (1 is missing) and goes back; after the bump it is
    written at t0 + 0.125 with epoch 1, sequence 0. Without the retrying mark,
    b failed as a second unexplained gap."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(idempotent=True, max_batch_messages=1)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0)
        t0 = trio.current_time()
        results = await outcomes([producer.send_nowait("t", v, partition=0) for v in (b"a", b"b")])
        assert trio.current_time() == t0 + 0.125
    assert offsets(results) == [ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, 1]
    assert [x[2:4] for x in sent_batches(fake, "t", 0)] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert values_in_log(fake, "t", 0) == [b"warm", b"b"]


async def test_a_failed_batch_expiring_while_it_waits_starts_a_new_epoch(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A failed batch that expires while it waits for its partition's other
    batches in flight took sequences the broker never wrote: a new epoch
    starts, and the batch behind it (answered OUT_OF_ORDER, the gap) is
    re-sent in it.

    Schedule (idempotent, one message per batch, delivery_timeout 5 s,
    request_timeout 4 s, t[0] on broker 0): t0: p and a are sent, b at
    t0 + 0.5; p is answered 2 s late, a and b go at t0 + 2: a is answered
    NOT_ENOUGH_REPLICAS at once, b OUT_OF_ORDER 3.25 s late. a fails at its
    deadline, t0 + 5, and a bump is requested; at t0 + 5.25 b goes back and
    is written in epoch 1, sequence 0, at t0 + 5.375. Without the bump b was
    re-sent with sequence 2 after the gap until its own deadline."""
    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=True, max_batch_messages=1, delivery_timeout=5.0,
                    request_timeout=4.0)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        t0, sent = await _p_a_then_b_failing_a(fake, producer, b_late=3.25)
        results = await outcomes(sent)
        assert trio.current_time() == t0 + 5.375
    assert offsets(results[:1] + results[2:]) == [0, 1]
    assert "last error: NOT_ENOUGH_REPLICAS" in str(results[1].cause)
    assert [x[2:4] for x in sent_batches(fake, "t", 0)] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert values_in_log(fake, "t", 0) == [b"p", b"b"]


async def test_nothing_is_sealed_under_the_old_id_while_a_new_one_is_awaited(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A broker producer that found a batch ready, then waited for its
    connection, must not seal it if a recovery began meanwhile: it would carry
    the old producer id, go out after the recovery's wait for the wire to
    drain, and be answered once the new id is in place (epoch 0 again, so the
    old epoch-only check counted it as the new id's first acknowledged batch).
    Found reading idempotence.py for ``make mutants``.

    Schedule (idempotent; t[0] on broker 0, t[1] on broker 1, whose first
    ApiVersions answer comes 0.5 s late; InitProducerId answered 1 s late):
    t0: s (t[1]) waits for broker 1's connection. t0 + 0.25: a (t[0]) is
    fenced (INVALID_PRODUCER_EPOCH): a new producer id is asked for at once
    (nothing in flight), answered at t0 + 1.25. t0 + 0.5: the connection is up,
    but sealing is paused: s waits, and goes out at t0 + 1.25 as the new id
    1001's sequence 0, as does a."""
    fake.create_topic("t", 2, leaders=[0, 1])
    async with open_fake_producer(fake, **exact(idempotent=True)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        idem = producer._core.idempotence
        assert idem is not None
        t0 = trio.current_time()
        fake.delay_responses(0.5, api_key=ApiKey.API_VERSIONS, node_id=1, count=1)
        fake.delay_responses(1.0, api_key=ApiKey.INIT_PRODUCER_ID, count=1)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.INVALID_PRODUCER_EPOCH, node_id=0)
        s = producer.send_nowait("t", b"s", partition=1)
        await trio.sleep(0.25)
        a = producer.send_nowait("t", b"a", partition=0)
        assert [m.offset for m in await outcomes([s, a])] == [0, 1]
        assert trio.current_time() == t0 + 1.25
        assert (idem.producer_id, idem.producer_epoch) == (1001, 0)
        assert sent_batches(fake, "t", 1) == [(1, 1001, 0, 0, 1)]
        assert sent_batches(fake, "t", 0)[1:] == [(0, 1000, 0, 1, 1), (0, 1001, 0, 0, 1)]
        assert [r.time - t0 for r in fake.requests_of(ApiKey.PRODUCE)][1:] == [0.25, 1.25, 1.25]
        assert idem.confirmed == {TopicPartition("t", 0), TopicPartition("t", 1)}
    assert producer.statistics().double_settles == 0


async def _leaderless_then_on_broker_1(
    fake: FakeCluster, producer: Any, *, b_after: float, hook: Any
) -> tuple[float, Any, Any]:
    """The shared start of two schedules (idempotent, one message per batch,
    delivery_timeout 5 s, request_timeout 4 s, t[2] confirmed on broker 2):
    broker 2 stops without an election; at t0 a is sent to t[2], b at t0 +
    ``b_after``; both wait for a leader. At t0 + 3 ``hook`` answers broker
    1's Produce requests and t[2] moves to broker 1: a and b go there at the
    metadata round of that instant, in two requests (pipelined: confirmed).
    Returns t0, a and b at t0 + 3."""
    t0 = await leaderless_after_warm(fake, producer, warm_partition=2)
    a = producer.send_nowait("t", b"a", partition=2)
    await trio.sleep(b_after)
    b = producer.send_nowait("t", b"b", partition=2)
    await trio.sleep(3.0 - b_after)
    fake.control(ApiKey.PRODUCE, hook, sticky=True, node_id=1)
    fake.move_leader("t", 2, to=1)
    return t0, a, b


async def test_a_batch_expiring_in_flight_explains_its_partitions_later_gap(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A batch that expires in flight (``_expire``) marks *its own* partition
    retrying: its sequences may or may not be written, so a later batch of
    that partition answered OUT_OF_ORDER_SEQUENCE_NUMBER is explained by it
    and goes back, to be re-sent in the new epoch (not failed as an
    unexplained gap).

    Schedule (``_leaderless_then_on_broker_1``, b at t0 + 2.5): broker 1
    never answers a's request (seq 1, not applied) and answers b's (seq 2)
    OUT_OF_ORDER at once. q, sent to t[1] at t0 + 3.5, makes t[1] the
    partition broker 1's producer saw last. a fails in flight at its
    deadline, t0 + 5; its request times out at t0 + 7 (sent at t0 + 3,
    request_timeout 4 s), then b's answer is read: b goes back and is
    written at t0 + 7.125 (one backoff) with epoch 1, sequence 0. (q's
    answer came at once; it is read after theirs, at t0 + 7.) With the partition looked up wrongly (the
    last partition of the loop before, t[1]), b failed with
    OUT_OF_ORDER_SEQUENCE_NUMBER."""
    from pipeline.producer._errors import DeliveryTimeoutError
    from pipeline.testing.fake_cluster import NO_RESPONSE

    fake.create_topic("t", 3, leaders=[0, 1, 2])
    options = exact(idempotent=True, max_batch_messages=1, delivery_timeout=5.0,
                    request_timeout=4.0)
    produces: list[float] = []

    async def first_lost(ctx: Any) -> Any:
        produces.append(ctx.time)
        return NO_RESPONSE if len(produces) == 1 else None

    async with open_fake_producer(fake, **options) as producer:
        t0, a, b = await _leaderless_then_on_broker_1(fake, producer, b_after=2.5, hook=first_lost)
        await trio.sleep(0.5)
        q = producer.send_nowait("t", b"q", partition=1)
        (a_result,) = await outcomes([a])
        assert trio.current_time() == t0 + 5.0
        results = await outcomes([b, q])
        assert trio.current_time() == t0 + 7.125
    assert produces == [t0 + 3.0, t0 + 3.0, t0 + 3.5, t0 + 7.125]
    assert isinstance(a_result.cause, DeliveryTimeoutError)
    assert "may or may not have been written" in str(a_result.cause)
    assert offsets(results) == [1, 0]
    assert [x[1:4] for x in sent_batches(fake, "t", 2)] == [
        (1000, 0, 0), (1000, 0, 1), (1000, 0, 2), (1000, 1, 0)]
    assert values_in_log(fake, "t", 2) == [b"warm", b"b"]


async def test_an_in_flight_expiry_keeps_the_error_its_partition_is_retrying_for(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A batch expiring in flight marks its partition retrying only if
    nothing else did: an earlier failure's cause stays the one what waits
    behind it is sent back with, and later delivery timeouts name it.

    Schedule (``_leaderless_then_on_broker_1``, b at t0 + 1): broker 1
    answers a's request NOT_ENOUGH_REPLICAS at once (t[2] retrying with that
    cause; a waits for b) and never answers b's. c, sent at t0 + 3.5, waits
    behind them. a fails at its deadline, t0 + 5 (last error
    NOT_ENOUGH_REPLICAS); b in flight at its own, t0 + 6. At t0 + 6.5 broker
    1 stops without an election: b's request fails, c goes back to its
    partition producer, which finds no leader; c fails at its deadline, t0 +
    8.5, "last error: NOT_ENOUGH_REPLICAS". With the cause replaced at b's
    expiry, c named "an earlier batch timed out"."""
    from pipeline.producer._errors import DeliveryTimeoutError
    from pipeline.testing.fake_cluster import NO_RESPONSE

    fake.create_topic("t", 3, leaders=[0, 1, 2])
    options = exact(idempotent=True, max_batch_messages=1, delivery_timeout=5.0,
                    request_timeout=4.0)
    fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=1)
    produces: list[float] = []

    async def second_lost(ctx: Any) -> Any:
        produces.append(ctx.time)
        return NO_RESPONSE if len(produces) == 2 else None

    async with open_fake_producer(fake, **options) as producer:
        t0, a, b = await _leaderless_then_on_broker_1(fake, producer, b_after=1.0, hook=second_lost)
        await trio.sleep(0.5)
        c = producer.send_nowait("t", b"c", partition=2)
        results = await outcomes([a])
        assert trio.current_time() == t0 + 5.0
        results += await outcomes([b])
        assert trio.current_time() == t0 + 6.0
        await trio.sleep(0.5)
        fake.stop_broker(1, elect=False)
        results += await outcomes([c])
        assert trio.current_time() == t0 + 8.5
    assert produces == [t0 + 3.0, t0 + 3.0]
    assert all(isinstance(r.cause, DeliveryTimeoutError) for r in results)
    a_error, b_error, c_error = (str(r.cause) for r in results)
    assert "never acknowledged; last error: NOT_ENOUGH_REPLICAS" in a_error
    assert "may or may not have been written" in b_error
    assert "never acknowledged; last error: NOT_ENOUGH_REPLICAS" in c_error
    assert values_in_log(fake, "t", 2) == [b"warm"]


async def test_a_refused_idempotent_batch_does_not_hold_up_the_next_message(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """With idempotence, a batch the leader refuses for good (INVALID_RECORD:
    a record-level error) marks its partition retrying, so that later batches
    in flight answered OUT_OF_ORDER are explained and come back. When none is
    (nothing of the partition in flight or waiting), that state ends in the
    broker producer (``_gave_up``): nothing moved and nothing is left to keep
    in order, so the next message goes at once, as in the Java client, which
    unmutes the partition and bumps the epoch.

    Schedule (idempotent, t[0] on broker 0, confirmed): t0: a is answered
    INVALID_RECORD and fails; the epoch goes to 1. b, sent then, is written at
    t0 with epoch 1, sequence 0, on its first attempt and with no metadata
    round asked for. Before: the partition stayed retrying, b was sent back
    unsent and written after one backoff, at t0 + 0.125."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(idempotent=True)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        await trio.sleep(1.0)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.INVALID_RECORD, node_id=0)
        metadata_before = len(fake.requests_of(ApiKey.METADATA))
        t0 = trio.current_time()
        a = await outcomes([await producer.send("t", b"a", partition=0)])
        b = await outcomes([await producer.send("t", b"b", partition=0)])
        assert trio.current_time() == t0
        assert len(fake.requests_of(ApiKey.METADATA)) == metadata_before
    assert offsets(a + b) == [ErrorCode.INVALID_RECORD, 1]
    assert [x[2:4] for x in sent_batches(fake, "t", 0)] == [(0, 0), (0, 1), (1, 0)]
    assert values_in_log(fake, "t", 0) == [b"warm", b"b"]


async def test_an_in_flight_expiry_with_nothing_left_sends_the_next_message_to_the_new_leader(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """With idempotence, a batch expiring in flight marks its partition
    retrying. If nothing else of the partition is there when its request
    ends, nothing goes back; no answer came, so the leader may be gone: the
    partition producer is told (``leader_changed``), leaves with a chaser and
    re-attaches to the leader fresh metadata names.

    Schedule (idempotent, one message per batch, delivery_timeout 5 s,
    request_timeout 4 s, t[0] on broker 0): t0: p and a are sent; p is
    answered 2 s late, a waits behind it (one batch in flight until the
    partition is confirmed), goes at t0 + 2 and is never answered. t0 + 5: a
    fails in flight. t0 + 5.5: the leader moves to broker 1. t0 + 6: a's
    request times out. n, sent at t0 + 6.5, is written at broker 1 at once
    with epoch 1, sequence 0. Before: nobody was told; n went to broker 0's
    producer, which sent it back unsent, and reached broker 1 one backoff
    later, at t0 + 6.625."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=True, max_batch_messages=1, delivery_timeout=5.0,
                    request_timeout=4.0)
    async with open_fake_producer(fake, **options) as producer:
        t0, sent = await _p_late_then_a_unanswered(fake, producer)
        results = await outcomes(sent)
        assert trio.current_time() == t0 + 5.0
        await trio.sleep(0.5)
        fake.move_leader("t", 0, to=1)
        await trio.sleep(1.0)
        results += await outcomes([producer.send_nowait("t", b"n", partition=0)])
        assert trio.current_time() == t0 + 6.5
    assert offsets(results[:1] + results[2:]) == [0, 1]
    assert isinstance(results[1].cause, DeliveryTimeoutError)
    assert [(q.node_id, q.time - t0) for q in fake.requests_of(ApiKey.PRODUCE)] == [
        (0, 0.0), (0, 2.0), (1, 6.5)]
    assert [x[2:4] for x in sent_batches(fake, "t", 0)] == [(0, 0), (0, 1), (1, 0)]
    assert values_in_log(fake, "t", 0) == [b"p", b"n"]


async def test_a_batch_its_leader_left_out_of_the_answer_is_not_resent_in_a_new_epoch(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A partition left out of a Produce answer may have been written: its batch's
    fate is unknown, as when the answer is lost. If the producer then starts a new
    epoch, a copy re-stamped with the new epoch's sequence 0 would be written beside
    the first (the broker cannot recognise it), so the batch fails instead, saying it
    may have been written.

    Schedule (idempotent, one message per batch, t[0] and t[1] both on broker 0,
    confirmed): a (t[0]) and b (t[1]) go in one request; broker 0 answers a
    OUT_OF_ORDER_SEQUENCE_NUMBER, unapplied (an unexplained gap: a new epoch), and
    appends b but leaves t[1] out of its answer. b is written once; its outcome says
    it may or may not have been written. Without the fate mark, b was re-sent in
    epoch 1 and written twice."""
    fake.create_topic("t", 2, leaders=[0, 0])
    async with open_fake_producer(fake, **exact(idempotent=True, max_batch_messages=1,
                                                linger=0.01)) as producer:
        for p in (0, 1):
            await producer.send_and_wait("t", b"warm", partition=p)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0,
                       topic="t", partition=0)
        fake.omit_after_apply(topic="t", partition=1)
        results = await outcomes([producer.send_nowait("t", b"a", partition=0),
                                  producer.send_nowait("t", b"b", partition=1)])
        idem = producer._core.idempotence
        assert idem is not None and idem.producer_epoch == 1
    assert values_in_log(fake, "t", 1) == [b"warm", b"b"]
    assert offsets(results)[0] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "may or may not have been written" in str(results[1].cause)
