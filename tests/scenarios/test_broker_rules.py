"""Broker producer rules found unpinned by ``make mutants`` (docs/testing.md, "Mutation testing").

Deterministic (FakeCluster, autojump_clock, no jitter); each docstring walks
through the schedule it needs, and the virtual times the protocol fixes are
asserted exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio

from pipeline.producer._stages.envelopes import TopicPartition
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.records import batch_size_for_record
from pipeline.testing.fake_cluster import FakeCluster

from .conftest import leaderless_after_warm, open_fake_producer, values_in_log
from .test_guards import exact, offsets
from .test_idempotence import sent_batches
from .test_sarama_suite import outcomes


async def test_each_produce_request_carries_request_timeout_and_is_counted(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A Produce request tells the broker how long to wait for the replicas:
    ``request_timeout`` in milliseconds (Java's ``request.timeout.ms`` /
    ``timeout_ms`` in the request), and ``statistics().requests_sent`` counts
    the requests, from 0.

    Schedule (request_timeout 2.5 s, linger 0): a, then b, each sent and
    awaited: two requests, each with timeout_ms 2500."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(request_timeout=2.5, delivery_timeout=5.0)) as producer:
        await producer.send_and_wait("t", b"a", partition=0)
        await producer.send_and_wait("t", b"b", partition=0)
        assert producer.statistics().requests_sent == 2
    assert [r.request.timeout_ms for r in fake.requests_of(ApiKey.PRODUCE)] == [2500, 2500]


async def test_an_idempotent_batch_out_of_retries_starts_a_new_epoch(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A sealed batch that fails for good after taking sequences (retries
    exhausted, ``_maybe_bounce``) starts a new epoch: the broker still waits for
    those sequences, so every later batch of the partition would be out of
    order (KIP-360; the Java client bumps the epoch too).

    Schedule (idempotent, retries=1, backoff 0.125 s, t[0] on broker 0,
    confirmed): t0: a is answered NOT_ENOUGH_REPLICAS, and again at its retry
    (t0 + 0.125): it fails, and the epoch goes to 1 at once (nothing else in
    flight). b, sent next, is written at once, at t0 + 0.125, with epoch 1 and
    sequence 0: the leader itself answered, so the give-up ends the
    partition's retry state in the broker producer (``_gave_up``) and b waits
    for no metadata round (with ``leader_changed`` there, b waited for the
    next round, 0.125 s later). Without the bump b carried sequence 2 after a
    gap: the broker answered OUT_OF_ORDER_SEQUENCE_NUMBER."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(idempotent=True, retries=1)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        for _ in range(2):
            fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        t0 = trio.current_time()
        a = await outcomes([await producer.send("t", b"a", partition=0)])
        b = await outcomes([await producer.send("t", b"b", partition=0)])
        assert trio.current_time() == t0 + 0.125
        idem = producer._core.idempotence
        assert idem is not None and idem.producer_epoch == 1
    assert offsets(a + b) == [ErrorCode.NOT_ENOUGH_REPLICAS, 1]
    assert [(x[2], x[3]) for x in sent_batches(fake, "t", 0)] == [(0, 0), (0, 1), (0, 1), (1, 0)]
    assert values_in_log(fake, "t", 0) == [b"warm", b"b"]



async def test_acks_1_waits_for_the_answer_and_acks_0_does_not(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``acks`` on the wire and in the outcome: with acks=1 the producer reads
    the broker's answer (the offset is known); with acks=0 no answer comes and
    being written is the outcome (no offset), and the producer must not wait
    for one.

    Schedule (plain producer): a0, a1 (one batch) with acks=1 get offsets 0, 1
    at t0; b0, b1 with acks=0 are settled at t0 without offsets, and are in
    the log."""
    fake.create_topic("t", 1, leaders=[0])
    for acks, value in ((1, b"a"), (0, b"b")):
        async with open_fake_producer(fake, **exact(idempotent=False, acks=acks)) as producer:
            await producer._core.cluster.partitions_for("t")
            t0 = trio.current_time()
            sent = [producer.send_nowait("t", value + b"%d" % i, partition=0) for i in range(2)]
            results = await outcomes(sent)
            assert trio.current_time() == t0
        for i, result in enumerate(results):
            if acks:
                assert result.offset == i and result.offset_known
            else:  # every message of the batch: no offset
                assert not result.offset_known and result.offset == -1
            assert result.timestamp == 1_700_000_000_000  # CreateTime: no LogAppendTime
    assert [r.request.acks for r in fake.requests_of(ApiKey.PRODUCE)] == [1, 0]
    assert values_in_log(fake, "t", 0) == [b"a0", b"a1", b"b0", b"b1"]


async def test_duplicate_sequence_number_counts_as_written_without_an_offset(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """tansu answers a re-sent batch it already has with
    DUPLICATE_SEQUENCE_NUMBER (46) and no offset (Kafka answers NONE with the
    original offset): with idempotence the batch was written, so its messages
    succeed, with no offset and their own CreateTime, and the partition counts
    as confirmed in the current epoch, and delivered in the statistics.

    Schedule (idempotent, t[0] on broker 0): t0: the answer to m is 46: m
    succeeds at t0, offset unknown (-1), timestamp its CreateTime."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(idempotent=True)) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.DUPLICATE_SEQUENCE_NUMBER, node_id=0)
        t0 = trio.current_time()
        (result,) = await outcomes([await producer.send("t", b"m", partition=0)])
        assert trio.current_time() == t0
        idem = producer._core.idempotence
        assert idem is not None and {tp.partition for tp in idem.confirmed} == {0}
        assert producer.statistics().topics["t"].partitions[0].delivered_messages == 1
    assert not result.offset_known and result.offset == -1
    assert result.timestamp == 1_700_000_000_000


@pytest.mark.parametrize(("count", "batches"), [(4, [4, 2, 2]), (2, [2, 1, 1])])
async def test_a_too_large_batch_is_split_into_halves_by_bytes(
    fake: FakeCluster, autojump_clock: Any, count: int, batches: list[int]
) -> None:
    """KIP-126 split (``_handle_partition``): a batch the broker refuses as too
    large goes back as two batches, the first holding the longest run of its
    messages within half its bytes (never all of them), the second the rest,
    in order.

    Schedule (plain producer, t[0] on broker 0): t0: ``count`` messages of equal
    size go in one batch, answered MESSAGE_TOO_LARGE: re-sent as two halves,
    all written in order."""
    fake.create_topic("t", 1, leaders=[0])
    values = [b"m%d" % i + b"-" * 50 for i in range(count)]
    async with open_fake_producer(fake, **exact(idempotent=False)) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.MESSAGE_TOO_LARGE, node_id=0)
        results = await outcomes([producer.send_nowait("t", v, partition=0) for v in values])
    assert offsets(results) == list(range(count))
    assert [x[4] for x in sent_batches(fake, "t", 0)] == batches
    assert values_in_log(fake, "t", 0) == values


async def test_an_error_after_append_makes_the_fate_unknown(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A retriable error that may come after the write
    (NOT_ENOUGH_REPLICAS_AFTER_APPEND and the others of ``MAYBE_WRITTEN``)
    leaves the batch's fate unknown: after an epoch bump it is not re-stamped
    (a re-stamped copy would be a duplicate) but fails as "may or may not have
    been written", like a batch whose answer was lost
    (``test_a_batch_of_unknown_fate_is_not_restamped_after_a_bump``).

    Schedule (idempotent; t[0] on broker 0, t[1] on broker 1, both confirmed):
    t0: a (t[0]) is written but answered NOT_ENOUGH_REPLICAS_AFTER_APPEND; b
    (t[1]) gets an OUT_OF_ORDER_SEQUENCE_NUMBER nothing explains: the epoch is
    bumped. a's retry comes after the bump: it fails, and the log holds a once."""
    from pipeline import ProducerError

    fake.create_topic("t", 2, leaders=[0, 1])
    async with open_fake_producer(fake, **exact(idempotent=True)) as producer:
        await producer.send_and_wait("t", b"warm0", partition=0)
        await producer.send_and_wait("t", b"warm1", partition=1)
        fake.fail_after_apply(ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND, node_id=0)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=1)
        a = await producer.send("t", b"a", partition=0)
        b = await producer.send("t", b"b", partition=1)
        results = await outcomes([a, b])
        idem = producer._core.idempotence
        assert idem is not None and idem.producer_epoch == 1
    assert isinstance(results[0], ProducerError) and "may or may not" in str(results[0].cause)
    assert offsets(results[1:]) == [ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER]
    assert values_in_log(fake, "t", 0) == [b"warm0", b"a"]


async def test_a_plain_batch_timing_out_in_flight_fails_once(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Delivery timeout of a batch in flight without idempotence
    (``BrokerProducer._expire``): its messages fail at their deadline with the
    fate unknown; no epoch to bump, and the late answer only unmutes.

    Schedule (plain producer, delivery_timeout and request_timeout 5 s): t[1]'s
    only replica, broker 1, is stopped without an election. t0: m is sent and
    waits for a leader. t0 + 1.0625: broker 1 is back; at the round of t0 +
    1.125 m is sent, answered 4.5 s late (written). At t0 + 5, in flight, m
    fails: delivery timeout, "may or may not have been written"."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 2, leaders=[0, 1])
    options = exact(idempotent=False, delivery_timeout=5.0, request_timeout=5.0)
    async with open_fake_producer(fake, **options) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.stop_broker(1, elect=False)
        await producer._core.cluster.refresh(force=True)
        fake.delay_responses(4.5, api_key=ApiKey.PRODUCE, node_id=1, count=1)
        t0 = trio.current_time()
        m = producer.send_nowait("t", b"m", partition=1)
        await trio.sleep(1.0625)
        fake.restart_broker(1)
        (result,) = await outcomes([m])
        assert trio.current_time() == t0 + 5.0
        await trio.sleep(1.0)
    assert isinstance(result.cause, DeliveryTimeoutError)
    assert "may or may not have been written" in str(result.cause)
    assert values_in_log(fake, "t", 1) == [b"m"]


async def test_a_batch_in_flight_expires_at_its_own_deadline_not_its_requests(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Delivery timeout in flight is per batch (the Java client's Sender expires
    in-flight batches one by one): a batch sharing a request with an older one
    is not failed at the older one's deadline.

    Schedule (plain producer, linger 1 s, delivery_timeout 5 s, request_timeout
    4 s): t[2]'s only replica, broker 2, is stopped without an election. t0: x
    is sent to t[2] and waits for a leader. t0 + 3: t[2]'s leadership moves to
    broker 1, and m is sent to t[1] (broker 1), whose next Produce answer comes
    2.5 s late. x reaches broker 1's queue at the metadata round of that
    instant, its linger (from t0) over: one request carries x and m (every
    partition with something queued goes along) at once. x's deadline is t0 +
    5: it fails then, in flight; m's is t0 + 8: it is written, answered at t0
    + 5.5.
    Bug (fixed): the whole request expired at its earliest deadline, so m
    failed at t0 + 5, after 2 s, as "may or may not have been written"."""
    from pipeline.producer._errors import DeliveryTimeoutError

    from .test_accumulator_rules import request_contents

    fake.create_topic("t", 3, leaders=[0, 1, 2])
    options = exact(idempotent=False, linger=1.0, delivery_timeout=5.0, request_timeout=4.0)
    async with open_fake_producer(fake, **options) as producer:
        t0 = await leaderless_after_warm(fake, producer, warm_partition=1)
        x = producer.send_nowait("t", b"x", partition=2)
        await trio.sleep(3.0)
        fake.move_leader("t", 2, to=1)
        fake.delay_responses(2.5, api_key=ApiKey.PRODUCE, node_id=1, count=1)
        m = producer.send_nowait("t", b"m", partition=1)
        (x_result,) = await outcomes([x])
        assert trio.current_time() == t0 + 5.0
        (m_result,) = await outcomes([m])
        assert trio.current_time() == t0 + 5.5
    assert isinstance(x_result.cause, DeliveryTimeoutError)
    assert "may or may not have been written" in str(x_result.cause)
    assert offsets([m_result]) == [1]
    assert request_contents(fake, "t")[1:] == [{1: [b"m"], 2: [b"x"]}]
    assert values_in_log(fake, "t", 1) == [b"warm", b"m"]


async def test_a_bounced_backlog_leaves_no_bytes_behind(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A bounce sends a retrying partition's loose messages back and its queue
    counts 0 bytes after it (``_maybe_bounce``): when they return to the same
    broker producer, they are judged by their own bytes again.

    Schedule (plain, linger 1 s, backoff 0.125 s, batch_bytes = the size of b
    + 1, t[0] on broker 0): t0: a is sent; at its linger, t0 + 1, it goes and
    is answered NOT_ENOUGH_REPLICAS 0.5 s late. t0 + 1.25: b waits behind it
    (muted). t0 + 1.5: a fails: a and b go back; after the backoff (t0 + 1.625)
    both return to broker 0's producer, a sealed, b loose: a is re-sent and
    written at once; b, one byte short of a batch, waits for its linger
    (counted from its acceptance): written at t0 + 2.25. A queue still
    counting b's bytes from before the bounce (not reset, or reset to 1) made
    b a full batch, sent at t0 + 1.625."""
    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=False, linger=1.0,
                    batch_bytes=batch_size_for_record(None, b"b") + 1)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        fake.delay_responses(0.5, api_key=ApiKey.PRODUCE, node_id=0, count=1)
        t0 = trio.current_time()
        a = producer.send_nowait("t", b"a", partition=0)
        await trio.sleep(1.25)
        b = producer.send_nowait("t", b"b", partition=0)
        results = await outcomes([a])
        assert trio.current_time() == t0 + 1.625
        results += await outcomes([b])
        assert trio.current_time() == t0 + 2.25
    assert offsets(results) == [0, 1]
    assert [r.time - t0 for r in fake.requests_of(ApiKey.PRODUCE)[-3:]] == [1.0, 1.625, 2.25]


async def test_a_success_clears_the_partitions_last_retry_error(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A partition's last retry error (what a delivery timeout names as "last
    error") holds only until a batch of it succeeds: a later timeout with no
    retry since must not blame an error already recovered from.

    Schedule (plain, one message per batch, delivery_timeout 5 s,
    request_timeout 4 s, backoff 0.125 s, t[0] on broker 0): t0: a is answered
    NOT_ENOUGH_REPLICAS, retried and written at t0 + 0.125. Then b and c are
    sent; broker 0 answers each 3 s late: b at t0 + 3.125, and c, sent then,
    would be answered at t0 + 6.125, but its deadline is t0 + 5.125: it fails
    then, in flight, with no "last error". Kept after a's success, the
    NOT_ENOUGH_REPLICAS was named as c's last error."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=False, max_batch_messages=1, delivery_timeout=5.0,
                    request_timeout=4.0)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        t0 = trio.current_time()
        a = await outcomes([producer.send_nowait("t", b"a", partition=0)])
        assert trio.current_time() == t0 + 0.125
        fake.delay_responses(3.0, api_key=ApiKey.PRODUCE, node_id=0, count=2)
        b, c = producer.send_nowait("t", b"b", partition=0), producer.send_nowait("t", b"c", partition=0)
        results = a + await outcomes([b])
        assert trio.current_time() == t0 + 3.125
        (c_result,) = await outcomes([c])
        assert trio.current_time() == t0 + 5.125
        await trio.sleep(1.0)
    assert offsets(results) == [0, 1]
    assert isinstance(c_result.cause, DeliveryTimeoutError)
    assert "may or may not have been written" in str(c_result.cause)
    assert "last error" not in str(c_result.cause)
    assert values_in_log(fake, "t", 0) == [b"a", b"b", b"c"]


async def test_a_stalled_connect_is_cut_short_at_the_delivery_deadline(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Connecting to a broker (its handshake may take up to request_timeout)
    does not hold up a delivery deadline of what waits for that connection:
    ``_send_one`` gives up the connect at the deadline, the message fails
    then, and the flusher goes on.

    Schedule (plain, delivery_timeout and request_timeout 5 s): t[2]'s only
    replica, broker 2, is stopped without an election. t0: m is sent to t[2]
    and waits for a leader. t0 + 3: the leadership moves to broker 1, which
    the producer has not connected to yet and whose ApiVersions answers come
    4 s late (a broker that accepts the connection and stalls). At the
    metadata round of t0 + 3 m reaches broker 1's producer, which starts
    connecting; m's deadline, t0 + 5, cuts the connect short: m fails then,
    "never acknowledged". n, sent to t[1] (broker 1) at t0 + 5, starts a new
    connect, through at t0 + 9: n is written then."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 3, leaders=[0, 1, 2])
    options = exact(idempotent=False, delivery_timeout=5.0, request_timeout=5.0)
    async with open_fake_producer(fake, **options) as producer:
        t0 = await leaderless_after_warm(fake, producer, warm_partition=0)
        m = producer.send_nowait("t", b"m", partition=2)
        await trio.sleep(3.0)
        fake.move_leader("t", 2, to=1)
        fake.delay_responses(4.0, api_key=ApiKey.API_VERSIONS, node_id=1)
        (m_result,) = await outcomes([m])
        assert trio.current_time() == t0 + 5.0
        n = await outcomes([producer.send_nowait("t", b"n", partition=1)])
        assert trio.current_time() == t0 + 9.0
    handshakes = [q.time - t0 for q in fake.requests_of(ApiKey.API_VERSIONS, node_id=1)]
    assert handshakes == [3.0, 5.0]
    assert isinstance(m_result.cause, DeliveryTimeoutError)
    assert "never acknowledged" in str(m_result.cause)
    assert offsets(n) == [0]


async def test_a_message_arriving_during_a_connect_fails_at_its_own_deadline(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The connect wait ends at the earliest deadline of what waits for it, also of a
    message that arrives while it runs (``_waiting``, moved by ``_poke_flusher``):
    the wait does not hold that message until the deadline of what was there first.

    Schedule (plain, delivery_timeout and request_timeout 5 s): t[2]'s only replica,
    broker 2, is stopped without an election. t0: m is sent to t[2] and waits for a
    leader (deadline t0 + 5). t0 + 1: a is sent to t[1], whose leader, broker 1, the
    producer has not connected to; broker 1 answers ApiVersions 6 s late, so broker
    1's producer waits for the connect until a's deadline, t0 + 6. t0 + 3: t[2]'s
    leadership moves to broker 1; m joins that wait. m fails at t0 + 5, a at t0 + 6
    (with the wait's end left at t0 + 6, m failed then too)."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 3, leaders=[0, 1, 2])
    options = exact(idempotent=False, delivery_timeout=5.0, request_timeout=5.0)
    async with open_fake_producer(fake, **options) as producer:
        t0 = await leaderless_after_warm(fake, producer, warm_partition=0)
        m = producer.send_nowait("t", b"m", partition=2)
        await trio.sleep(1.0)
        fake.delay_responses(6.0, api_key=ApiKey.API_VERSIONS, node_id=1)
        a = producer.send_nowait("t", b"a", partition=1)
        await trio.sleep(2.0)
        fake.move_leader("t", 2, to=1)
        (m_result,) = await outcomes([m])
        assert trio.current_time() == t0 + 5.0
        (a_result,) = await outcomes([a])
        assert trio.current_time() == t0 + 6.0
    assert [q.time - t0 for q in fake.requests_of(ApiKey.API_VERSIONS, node_id=1)][:1] == [1.0]
    for result in (m_result, a_result):
        assert isinstance(result.cause, DeliveryTimeoutError)
        assert "never acknowledged" in str(result.cause)


async def test_arrivals_during_a_slow_connect_do_not_cut_it_short(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """An arrival moves the end of the connect wait to the earliest delivery deadline
    only: not to a linger deadline, which would cut the handshake short again and again
    while records keep coming, so the connection would never be made.

    Schedule (plain, linger 0.05 s, delivery_timeout 5 s): broker 1 answers ApiVersions
    1 s late. From t0 a record to t[1] every 0.1 s: the first starts the connect at the
    end of its linger, which completes 1 s later; every record is written, none fails."""
    fake.create_topic("t", 2, leaders=[0, 1])
    options = exact(idempotent=False, linger=0.05, delivery_timeout=5.0, request_timeout=2.0)
    async with open_fake_producer(fake, **options) as producer:
        await outcomes([producer.send_nowait("t", b"warm", partition=0)])
        fake.delay_responses(1.0, api_key=ApiKey.API_VERSIONS, node_id=1)
        t0 = trio.current_time()
        sent = []
        for i in range(15):
            sent.append(producer.send_nowait("t", b"%d" % i, partition=1))
            await trio.sleep(0.1)
        results = await outcomes(sent)
    # one handshake, begun when the first record's linger ended
    assert [q.time - t0 for q in fake.requests_of(ApiKey.API_VERSIONS, node_id=1)] == [
        pytest.approx(0.05)]
    assert offsets(results) == list(range(15))
    assert values_in_log(fake, "t", 1) == [b"%d" % i for i in range(15)]


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_batch_waiting_for_a_request_slot_expires_at_its_deadline(
    fake: FakeCluster, autojump_clock: Any, idempotent: bool
) -> None:
    """The connection's request slots are shared: a metadata request holding the only
    one (max_in_flight 1) holds up the Produce request behind it. That wait ends at the
    first delivery deadline of what the request carries: the batch goes back to its
    queue, unwritten, and expires there, at its deadline, not when the slot frees.

    Schedule (plain, delivery_timeout 1 s, request_timeout 0.95 s, one broker, warm):
    t0: a is sent, answered 0.6 s late. t0 + 0.3: m is sent (deadline t0 + 1.3) and
    waits behind a. t0 + 0.5: a metadata round asks broker 0, on the same connection:
    it waits for a's slot, gets it at t0 + 0.6 and is answered 0.9 s later. m, drained
    at t0 + 0.6, waits for the slot: it fails at t0 + 1.3, "never acknowledged" (never
    written); n, sent once the slot is free, is written (with idempotence, after the
    new epoch that m's unwritten sequences call for: the unwritten batch is off the
    wire's count, so the recovery does not wait for it)."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=idempotent, max_in_flight=1, delivery_timeout=1.0,
                    request_timeout=0.95)
    async with open_fake_producer(fake, **options) as producer:
        await outcomes([producer.send_nowait("t", b"warm", partition=0)])
        fake.delay_responses(0.6, api_key=ApiKey.PRODUCE, node_id=0, count=1)
        fake.delay_responses(0.9, api_key=ApiKey.METADATA, node_id=0, count=1,
                             before_apply=True)
        t0 = trio.current_time()
        a = producer.send_nowait("t", b"a", partition=0)
        await trio.sleep(0.3)
        m = producer.send_nowait("t", b"m", partition=0)
        await trio.sleep(0.2)
        producer._core.cluster.request_refresh(["t"])
        (m_result,) = await outcomes([m])
        assert trio.current_time() == t0 + 1.3
        results = await outcomes([a])
        await trio.sleep(0.5)
        results += await outcomes([producer.send_nowait("t", b"n", partition=0)])
        [bp] = producer._core.broker_producers()
        assert [part.in_flight for part in bp._parts.values()] == [0]
    assert isinstance(m_result.cause, DeliveryTimeoutError)
    assert "never acknowledged" in str(m_result.cause)
    assert offsets(results) == [1, 2]
    assert values_in_log(fake, "t", 0) == [b"warm", b"a", b"n"]


async def test_a_wait_for_a_request_slot_ends_at_an_in_flight_batchs_deadline(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The wait for a connection's request slot ends at the next delivery deadline of
    anything in the broker producer, not only of what it drained: a batch in flight
    whose deadline comes meanwhile expires then (in-flight expiry runs in the flusher,
    which the wait holds), and the drained request goes back and waits again.

    Schedule (idempotent, max_in_flight 2, delivery and request timeouts 1 s, one
    broker serving one request at a time, warm): t0: x and y (t[0]) go in two requests,
    answered 0.3 s and 0.6 s after they are served (t0 + 0.3, t0 + 0.9); a (t[0],
    deadline t0 + 1.05) is sent at t0 + 0.05. A metadata round asked at t0 + 0.1 takes
    the slot x frees; a, drained then, is written at t0 + 0.9 with y's slot. The broker
    serves the metadata request next and answers it 0.35 s later, at t0 + 1.25. n
    (t[1]) is sent at t0 + 0.95 and waits for a slot. a fails at its deadline,
    t0 + 1.05, "still in flight", and n waits again (a wait ending only at n's own
    deadline or a free slot let a expire at t0 + 1.25, late)."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 2, leaders=[0, 0])
    options = exact(idempotent=True, max_in_flight=2, max_batch_messages=1,
                    delivery_timeout=1.0, request_timeout=1.0)
    async with open_fake_producer(fake, **options) as producer:
        await outcomes([producer.send_nowait("t", b"warm", partition=p) for p in (0, 1)])
        for seconds in (0.3, 0.6, 0.2):
            fake.delay_responses(seconds, api_key=ApiKey.PRODUCE, node_id=0, count=1)
        fake.delay_responses(0.35, api_key=ApiKey.METADATA, node_id=0, count=1,
                             before_apply=True)
        t0 = trio.current_time()
        first = [producer.send_nowait("t", v, partition=0) for v in (b"x", b"y")]
        await trio.sleep(0.05)
        a = producer.send_nowait("t", b"a", partition=0)
        await trio.sleep(0.05)
        producer._core.cluster.request_refresh(["t"])
        await trio.sleep(0.85)
        n = producer.send_nowait("t", b"n", partition=1)
        (a_result,) = await outcomes([a])
        assert trio.current_time() == t0 + 1.05
        results = await outcomes([*first, n])
    assert isinstance(a_result.cause, DeliveryTimeoutError)
    assert "still in flight" in str(a_result.cause)
    assert offsets(results) == [1, 2, 1]
    assert values_in_log(fake, "t", 0) == [b"warm", b"x", b"y", b"a"]


async def test_an_unreachable_broker_bounces_only_partitions_with_something_to_send(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """When its broker cannot be reached, a broker producer sends back what
    waits in its queues (``_send_one``), partition by partition; a partition
    with nothing queued is left alone, not marked retrying: its next message
    goes straight out once the broker is back.

    Schedule (plain, backoff 0.125 s, t[0] and t[1] on broker 1, both written
    once): broker 1 stops without an election. t0: a (t[0]) finds the broker
    unreachable: a goes back to its partition producer, which waits for a
    leader. t0 + 1: broker 1 is back, leader of both again; a is written then.
    t0 + 2: b (t[1]) is written at once. Marking the idle t[1] retrying too
    (the check forced True, or ``or``) bounced b once more: written at
    t0 + 2.125, after a backoff. Since a give-up with nothing sent back tells
    the partition producer (``_gave_up``), that mutant made t[1]'s partition
    producer leave its broker producer instead: asserted at t0 + 0.5."""
    fake.create_topic("t", 2, leaders=[1, 1])
    async with open_fake_producer(fake, **exact(idempotent=False)) as producer:
        await producer.send_and_wait("t", b"w0", partition=0)
        await producer.send_and_wait("t", b"w1", partition=1)
        fake.stop_broker(1, elect=False)
        t0 = trio.current_time()
        a = producer.send_nowait("t", b"a", partition=0)
        await trio.sleep(0.5)
        idle = producer._core.retry_sink(TopicPartition("t", 1))
        assert idle.bp is not None and idle.hwm == 0  # never told to leave
        await trio.sleep(0.5)
        fake.restart_broker(1)
        results = await outcomes([a])
        assert trio.current_time() == t0 + 1.0
        await trio.sleep(1.0)
        results += await outcomes([producer.send_nowait("t", b"b", partition=1)])
        assert trio.current_time() == t0 + 2.0
    assert offsets(results) == [1, 1]
    assert [q.time - t0 for q in fake.requests_of(ApiKey.PRODUCE)[2:]] == [1.0, 2.0]


async def test_a_partition_left_out_of_a_response_is_retried(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A Produce answer that says nothing about one of the request's
    partitions (Kafka always answers each; a broken broker or proxy might
    not) leaves that batch's fate open: it goes back and is retried, like a
    retriable error, instead of being taken for written or crashing the
    broker producer.

    Schedule (plain, backoff 0.125 s, t[0] on broker 0): t0: the answer to m's
    request lists no partition (m was not written); m goes back and is
    re-sent after the backoff: written at t0 + 0.125, once."""
    from pipeline.protocol.messages.produce import ProduceResponse

    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(idempotent=False)) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.control(ApiKey.PRODUCE, lambda ctx: ProduceResponse(responses=()))
        t0 = trio.current_time()
        with trio.fail_after(10):  # a batch neither settled nor retried is lost: no hang
            results = await outcomes([producer.send_nowait("t", b"m", partition=0)])
        assert trio.current_time() == t0 + 0.125
    assert offsets(results) == [0]
    assert [q.time - t0 for q in fake.requests_of(ApiKey.PRODUCE)] == [0.0, 0.125]
    assert values_in_log(fake, "t", 0) == [b"m"]


async def test_a_batch_out_of_retries_leaves_no_last_error_behind(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The partition's last retry error names what sent messages back for a
    retry; a batch that fails for good (retries exhausted) is not retried, so
    it sets none: a later timeout must not blame it.

    Schedule (plain, retries=0, linger 1 s, delivery_timeout 5 s,
    request_timeout 4 s, t[0] on broker 0): t0: a is sent; at t0 + 1 it is
    answered NOT_LEADER_OR_FOLLOWER and fails with it; the leader may have
    moved, so the partition producer re-attaches after a metadata round,
    answered 1.5 s late (t0 + 2.5). c, sent at t0 + 1, waits for that, its
    linger over by then: it goes at t0 + 2.5 and is answered 5 s late; its
    deadline, t0 + 6, comes before its request timeout (t0 + 6.5): it fails
    then, in flight, with no "last error". Setting it on exhaustion too (the
    ``again`` check forced True) named NOT_LEADER_OR_FOLLOWER."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=False, retries=0, linger=1.0, delivery_timeout=5.0,
                    request_timeout=4.0)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_LEADER_OR_FOLLOWER, node_id=0)
        fake.delay_responses(1.5, api_key=ApiKey.METADATA, count=1)
        t0 = trio.current_time()
        results = await outcomes([producer.send_nowait("t", b"a", partition=0)])
        assert trio.current_time() == t0 + 1.0
        fake.delay_responses(5.0, api_key=ApiKey.PRODUCE, node_id=0, count=1)
        (c_result,) = await outcomes([producer.send_nowait("t", b"c", partition=0)])
        assert trio.current_time() == t0 + 6.0
        await trio.sleep(2.0)
    assert offsets(results) == [ErrorCode.NOT_LEADER_OR_FOLLOWER]
    assert [q.time - t0 for q in fake.requests_of(ApiKey.PRODUCE)] == [1.0, 2.5]
    assert isinstance(c_result.cause, DeliveryTimeoutError)
    assert "may or may not have been written" in str(c_result.cause)
    assert "last error" not in str(c_result.cause)
    assert values_in_log(fake, "t", 0) == [b"c"]


@pytest.mark.parametrize("moved", [True, False], ids=["not-leader", "not-enough-replicas"])
async def test_a_not_leader_answer_asks_for_metadata_at_once(
    fake: FakeCluster, autojump_clock: Any, moved: bool
) -> None:
    """After NOT_LEADER_OR_FOLLOWER (and the other codes that say the leader
    may have moved) the broker producer asks for a metadata refresh as soon
    as the answer comes, as the Java client does, not only when the
    partition's batches go back; after other retriable errors it does not.

    Schedule (idempotent, one message per batch, t[0] on broker 0, confirmed;
    every metadata round goes to broker 0): t0: a and b are sent in two
    requests; broker 0 handles b only 1 s later (its connection is busy
    meanwhile). not-leader: the leadership moved to broker 1 before t0: a is
    answered NOT_LEADER at t0 and the refresh is asked then; its Metadata
    request waits behind b and is served at t0 + 1; b's NOT_LEADER at t0 + 1
    sends both back, and the partition producer's own refresh takes a second
    round, at t0 + 1.125: both are written on broker 1 then.
    not-enough-replicas: a is answered NOT_ENOUGH_REPLICAS: no refresh; b is
    answered OUT_OF_ORDER at t0 + 1 (a is missing), both go back, and the
    partition producer's refresh is the only round, at t0 + 1."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(idempotent=True, max_batch_messages=1)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        await trio.sleep(10.0)  # past the spacing of metadata rounds
        produces: list[float] = []

        async def second_handled_late(ctx: Any) -> Any:
            produces.append(ctx.time)
            if len(produces) == 2:
                await trio.sleep(1.0)
            return None

        fake.control(ApiKey.PRODUCE, second_handled_late, sticky=True, node_id=0)
        if moved:
            fake.move_leader("t", 0, to=1)
        else:
            fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        t0 = trio.current_time()
        results = await outcomes([producer.send_nowait("t", v, partition=0) for v in (b"a", b"b")])
        assert trio.current_time() == t0 + 1.125
    assert offsets(results) == [1, 2]
    rounds = [q.time - t0 for q in fake.requests_of(ApiKey.METADATA) if q.time >= t0]
    assert rounds == ([1.0, 1.125] if moved else [1.0])
    assert values_in_log(fake, "t", 0) == [b"warm", b"a", b"b"]


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
async def test_a_first_answer_equal_to_the_max_timestamp_is_a_log_append_time(
    fake: FakeCluster, autojump_clock: Any, idempotent: bool
) -> None:
    """Only the answer to a re-sent idempotent batch can be a duplicate's
    echo of its max timestamp (``unless_duplicate_echo``); the answer to a
    batch's first send is the broker's LogAppendTime even when it equals the
    batch's max timestamp (a LogAppendTime topic whose clock reads that
    millisecond), and every record reports it.

    Schedule (t[0] on broker 0, a LogAppendTime broker whose clock reads T + 1;
    linger 1 s): t0: a (CreateTime T) and b (T + 1) go in one batch at t0 + 1,
    answered LogAppendTime T + 1: both report T + 1. Taking every answer for
    a possible echo (the check forced True, or its ``and`` as ``or``) reported
    a's own T."""
    from .test_ledger_rules import answer_with_log_append_time

    stamp = 1_600_000_000_000
    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=idempotent, linger=1.0)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        fake.control(ApiKey.PRODUCE, answer_with_log_append_time(stamp + 1))
        t0 = trio.current_time()
        results = await outcomes([producer.send_nowait("t", v, partition=0, timestamp=stamp + i)
                                  for i, v in enumerate((b"a", b"b"))])
        assert trio.current_time() == t0 + 1.0
    assert [(r.offset, r.timestamp) for r in results] == [(7, stamp + 1), (8, stamp + 1)]


async def test_with_acks_0_each_batch_unmutes_its_partition(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """With acks=0 no answer comes: a batch leaves the wire as soon as it is
    written (``_settled`` in the acks=0 path), so its partition, muted while
    it was in flight (one batch at a time without idempotence), sends the
    next one.

    Schedule (plain, acks=0, t[0] on broker 0): t0: a is sent and settled
    (written, no offset); then b, sent the same instant, is written too. Not
    unmuting after a left b queued for good (it failed at close)."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(idempotent=False, acks=0)) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        with trio.fail_after(10):
            results = await outcomes([producer.send_nowait("t", b"a", partition=0)])
            results += await outcomes([producer.send_nowait("t", b"b", partition=0)])
        assert trio.current_time() == t0
    assert [r.offset_known for r in results] == [False, False]
    assert values_in_log(fake, "t", 0) == [b"a", b"b"]


async def test_the_batches_of_a_request_expire_each_at_its_own_deadline(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """After one batch of a request expires in flight, the flusher still
    wakes for the next one's deadline (the flight's deadline becomes the
    earliest of the batches left).

    Schedule (plain, delivery_timeout and request_timeout 5 s): t[1] and
    t[2]'s only replica, broker 2, is stopped without an election. t0: x is
    sent to t[2]; t0 + 0.5: y to t[1]; both wait for a leader. t0 + 3: both
    move to broker 1, whose next Produce answer comes 4 s late; one request
    carries x and y. x fails at its deadline, t0 + 5; y at its own, t0 +
    5.5, both in flight. Without the flight's new deadline y waited for the
    answer and was taken as written at t0 + 7 or later."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 3, leaders=[0, 2, 2])
    options = exact(idempotent=False, delivery_timeout=5.0, request_timeout=5.0)
    async with open_fake_producer(fake, **options) as producer:
        t0 = await leaderless_after_warm(fake, producer, warm_partition=0)
        x = producer.send_nowait("t", b"x", partition=2)
        await trio.sleep(0.5)
        y = producer.send_nowait("t", b"y", partition=1)
        await trio.sleep(2.5)
        fake.move_leader("t", 1, to=1)
        fake.move_leader("t", 2, to=1)
        fake.delay_responses(4.0, api_key=ApiKey.PRODUCE, node_id=1, count=1)
        (x_result,) = await outcomes([x])
        assert trio.current_time() == t0 + 5.0
        (y_result,) = await outcomes([y])
        assert trio.current_time() == t0 + 5.5
        await trio.sleep(3.0)
    assert isinstance(x_result.cause, DeliveryTimeoutError)
    assert isinstance(y_result.cause, DeliveryTimeoutError)
    assert "may or may not have been written" in str(y_result.cause)


async def test_an_acks_0_batch_that_expires_while_its_request_is_written_fails_once(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """With acks=0 a batch is settled as written when its request has been
    written (the responder's acks=0 path), unless it expired in flight
    meanwhile: then its messages already failed ("may or may not have been
    written") and must not be settled a second time.

    Schedule (plain, acks=0, delivery_timeout 1 s, request_timeout 0.5 s, t[0]
    on broker 0): t0: m is drained and its request written; writing it takes
    1 s (``jump_before_step``: the flusher's first step inside ``conn.send``
    runs 1 s later, as a write to a socket that applies back-pressure
    returns late; the in-memory fake never does). Back from the write, the
    flusher expires m in flight at t0 + 1, before the responder sees the
    request. Settling it as written too counted a double settle."""
    from pipeline.producer._errors import DeliveryTimeoutError

    from .time_passes import jump_before_step, named

    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=False, acks=0, delivery_timeout=1.0, request_timeout=0.5)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        core = producer._core

        def writing_the_first_request(task: Any) -> bool:
            # (drained, so in flight, and not written yet: requests_sent counts writes)
            bps = core.broker_producers()
            return named(task, "BrokerProducer._flusher") and any(
                bp.requests_sent == 0 and any(p.in_flight for p in bp._parts.values())
                for bp in bps)

        t0 = trio.current_time()
        with jump_before_step(autojump_clock, 1.0, writing_the_first_request) as jump:
            (result,) = await outcomes([producer.send_nowait("t", b"m", partition=0)])
        assert jump.jumped_at == t0
        assert trio.current_time() == t0 + 1.0
    assert producer.statistics().double_settles == 0
    assert isinstance(result.cause, DeliveryTimeoutError)
    assert "may or may not have been written" in str(result.cause)
    assert values_in_log(fake, "t", 0) == [b"m"]


async def _m_read_at_its_deadline(producer: Any, clock: Any, t0: float, read_at: float,
                                  after_send: Any = None) -> tuple[Any, Any]:
    """Send m to t[0]; the responder's step that reads m's answer (or its failure), at
    t0 + ``read_at``, runs late, at m's deadline t0 + 5 (the clock jumps right before
    it: the real-clock order); then send n. ``after_send`` runs between m's send and
    its outcome. Returns m's and n's outcomes."""
    from .time_passes import jump_before_step, named

    def reading_m(task: Any) -> bool:
        return named(task, "BrokerProducer._responder") and trio.current_time() == t0 + read_at

    with jump_before_step(clock, 5.0 - read_at, reading_m) as jump:
        m = producer.send_nowait("t", b"m", partition=0)
        if after_send is not None:
            after_send()
        with trio.fail_after(10):
            (result,) = await outcomes([m])
    assert jump.jumped_at == t0 + read_at
    assert trio.current_time() == t0 + 5.0
    (n_result,) = await outcomes([producer.send_nowait("t", b"n", partition=0)])
    return result, n_result


async def test_a_batch_found_expired_when_its_answer_is_read_fails_then(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A failed batch that goes back (``_maybe_bounce``) but is past its
    delivery deadline fails there, "never acknowledged", naming the error.

    On virtual time the flusher always expires a batch first: it wakes by its
    own timer at the deadline, and the run loop fires every timer of an
    instant before the tasks that events wake then (the responder). On a
    real clock time passes while tasks run, and the responder, woken by an
    answer read just before the deadline, can run after it, before the
    flusher's timer fired: ``jump_before_step`` reproduces that.

    Schedule (plain, delivery_timeout 5 s, request_timeout 4 s, t[0] on
    broker 0): t0: m is sent; its request is answered NOT_ENOUGH_REPLICAS
    3.75 s late; the responder's step that reads the answer runs 1.25 s
    later, at m's deadline, t0 + 5: m fails then, with that error, and is
    not in the log. Without failing what expired there (or with the
    branch skipped), m never got an outcome.

    Nothing went back, and the leader itself answered: the broker producer
    ends the partition's retry state there (``_gave_up``), so n, sent after
    m's outcome, is written at once, at t0 + 5, on its first attempt. (It
    stayed retrying before: n went back once, without being sent, and was
    written after one backoff, at t0 + 5.125.) For an answer that says the
    leader may be gone, see the next test."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=False, delivery_timeout=5.0, request_timeout=4.0)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        fake.delay_responses(3.75, api_key=ApiKey.PRODUCE, node_id=0, count=1)
        result, n_result = await _m_read_at_its_deadline(producer, autojump_clock, t0, 3.75)
        assert trio.current_time() == t0 + 5.0
    assert isinstance(result.cause, DeliveryTimeoutError)
    assert "never acknowledged; last error: NOT_ENOUGH_REPLICAS" in str(result.cause)
    assert offsets([n_result]) == [0]
    assert [q.time - t0 for q in fake.requests_of(ApiKey.PRODUCE)] == [0.0, 5.0]
    assert values_in_log(fake, "t", 0) == [b"n"]


async def test_an_unanswered_batch_found_expired_when_its_request_fails_may_have_been_written(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A batch whose request got no answer and that its bounce finds past its
    deadline (the real-clock order of the test before) fails saying it may or
    may not have been written, as a batch expiring in flight does: the broker
    may have applied it. ("never acknowledged" was true, but hid that.)

    Schedule (plain, delivery_timeout 5 s, request_timeout 4 s, t[0] on
    broker 0): t0: m is sent and broker 0 never answers; the request times out
    at t0 + 4 and the responder's step that reads the failure runs 1 s later,
    at m's deadline, t0 + 5: m fails then, "may or may not have been
    written; last error: ... no response ...". Nothing went back and no
    answer came: the partition producer is told (``leader_changed``), and n,
    sent then, is written on its first attempt, at t0 + 5 (the metadata round
    it waits for is answered at once)."""
    from pipeline.producer._errors import DeliveryTimeoutError
    from pipeline.testing.fake_cluster import NO_RESPONSE

    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=False, delivery_timeout=5.0, request_timeout=4.0)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        fake.control(ApiKey.PRODUCE, lambda ctx: NO_RESPONSE, node_id=0)
        result, n_result = await _m_read_at_its_deadline(producer, autojump_clock, t0, 4.0)
        assert trio.current_time() == t0 + 5.0
    assert isinstance(result.cause, DeliveryTimeoutError)
    message = str(result.cause)
    assert "no clear answer, so it may or may not have been written; last error:" in message
    assert "no response" in message and "never acknowledged" not in message
    assert offsets([n_result]) == [0]  # (this broker did not apply m)
    assert [q.time - t0 for q in fake.requests_of(ApiKey.PRODUCE)] == [0.0, 5.0]


async def test_a_give_up_that_may_have_lost_the_leader_sends_the_next_message_to_the_new_one(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """When everything a broker producer held for a partition failed there and
    nothing went back, and the error says the leader may have moved, the
    partition producer is told (``leader_changed``): it leaves with a chaser
    and sends the next message to the leader that fresh metadata names, on
    its first attempt, with none of its retries spent.

    Schedule (plain, retries=1, delivery_timeout 5 s, request_timeout 4 s,
    backoff 0.125 s, t[0] on broker 0; the real-clock order of the test
    before): t0: m is sent; the leader moves to broker 1; broker 0 answers
    m NOT_LEADER_OR_FOLLOWER 3.75 s late and the responder reads it at m's
    deadline, t0 + 5: m fails, nothing goes back. n, sent then, goes to
    broker 1 at t0 + 5 (the metadata round asked for at the answer is in by
    then), is answered NOT_ENOUGH_REPLICAS once and written at its retry, t0
    + 5.125. Before: nobody was told, n went to broker 0's producer, was sent
    back unsent (a backoff, and its one retry level spent), reached broker 1
    at t0 + 5.125, and failed there with NOT_ENOUGH_REPLICAS, out of retries."""
    from pipeline.producer._errors import DeliveryTimeoutError

    fake.create_topic("t", 1, leaders=[0])
    options = exact(idempotent=False, retries=1, delivery_timeout=5.0, request_timeout=4.0)
    async with open_fake_producer(fake, **options) as producer:
        await producer._core.cluster.partitions_for("t")
        t0 = trio.current_time()
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_LEADER_OR_FOLLOWER, node_id=0)
        fake.delay_responses(3.75, api_key=ApiKey.PRODUCE, node_id=0, count=1)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=1)
        # m still goes to broker 0 after the move: the cached leader
        result, n_result = await _m_read_at_its_deadline(
            producer, autojump_clock, t0, 3.75, lambda: fake.move_leader("t", 0, to=1))
        assert trio.current_time() == t0 + 5.125
    assert isinstance(result.cause, DeliveryTimeoutError)
    # NOT_LEADER may come after the append (MAYBE_WRITTEN): m's fate is unknown.
    assert "may or may not have been written; last error: NOT_LEADER_OR_FOLLOWER" in str(
        result.cause)
    assert offsets([n_result]) == [0]
    assert [(q.node_id, q.time - t0) for q in fake.requests_of(ApiKey.PRODUCE)] == [
        (0, 0.0), (1, 5.0), (1, 5.125)]
    assert values_in_log(fake, "t", 0) == [b"n"]


class _FlusherSteps(trio.abc.Instrument):
    """Counts the steps (scheduler passes) of every broker producer's flusher."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("BrokerProducer._flusher"):
            self.steps += 1


@contextmanager
def _counting_flusher_steps() -> Iterator[_FlusherSteps]:
    counter = _FlusherSteps()
    trio.lowlevel.add_instrument(counter)
    try:
        yield counter
    finally:
        trio.lowlevel.remove_instrument(counter)


async def test_the_flusher_wakes_only_when_an_arrival_or_an_answer_changes_its_wait(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The intake and the responder wake the flusher only when what arrived or
    was answered makes something ready now or brings its wake-up time forward
    (``_poke_flusher``): an arrival into a partition already lingering, or an
    answer with nothing queued, leaves it asleep.

    Schedule (plain producer, linger 1 s, t[0] on broker 0): t0: m0 is sent
    into an empty queue: the flusher wakes once, to wait for m0's linger. m1 ..
    m19 follow 1 ms apart: each joins the lingering batch, no wake-up. At t0 +
    1 the flusher sends the batch; its answer leaves nothing queued: no
    wake-up. Waking on every arrival took 19 more steps, on every answer one
    more (the warm-up's, already in the first millisecond)."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(idempotent=False, linger=1.0)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        with _counting_flusher_steps() as counter:
            t0 = trio.current_time()
            sent = [producer.send_nowait("t", b"m0", partition=0)]
            await trio.sleep(0.001)
            assert counter.steps == 1  # the arrival into an empty queue
            for i in range(1, 20):
                sent.append(producer.send_nowait("t", b"m%d" % i, partition=0))
                await trio.sleep(0.001)
            assert counter.steps == 1  # 19 arrivals into a lingering batch
            results = await outcomes(sent)
            assert trio.current_time() == t0 + 1.0
            await trio.sleep(0.5)
            # + 3 at t0 + 1: the linger wake-up and the request's writing (the
            # stream's send yields); none for the answer.
            assert counter.steps == 4
    assert offsets(results) == list(range(1, 21))
    assert len(fake.requests_of(ApiKey.PRODUCE)) == 2  # warm, then one batch of 20


async def test_what_a_full_request_left_behind_waits_unsealed_for_the_slot(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """What a request had no room for waits unsealed while the only request slot is
    taken: what arrives meanwhile for the same partition joins its batch, and one batch
    goes out once the answer frees the slot.

    Schedule (plain, max_in_flight 1, linger 0, t[0] and t[1] on broker 0; a fills a
    request, b and c fit one batch): a (t[0]) and b (t[1]) arrive together; a's request
    takes the slot, answered 0.5 s late; c (t[1]) arrives 0.125 s later; at t0 + 0.5 one
    batch carries b and c. Counting the taken slot as free sealed b alone, to wait for
    the slot, and c went in a batch of its own."""
    fake.create_topic("t", 2, leaders=[0, 0])
    big = b"a" * 200
    full = batch_size_for_record(None, big)  # a request, a message, a batch
    assert 2 * batch_size_for_record(None, b"b") <= full
    options = exact(idempotent=False, max_in_flight=1, linger=0.0, max_request_bytes=full,
                    max_message_bytes=full, batch_bytes=full)
    async with open_fake_producer(fake, **options) as producer:
        await producer.send_and_wait("t", b"w", partition=0)
        fake.delay_responses(0.5, api_key=ApiKey.PRODUCE, node_id=0, count=1)
        t0 = trio.current_time()
        sent = [producer.send_nowait("t", big, partition=0),
                producer.send_nowait("t", b"b", partition=1)]
        await trio.sleep(0.125)
        sent.append(producer.send_nowait("t", b"c", partition=1))
        results = await outcomes(sent)
        assert trio.current_time() == t0 + 0.5
    assert offsets(results) == [1, 0, 1]
    assert [records for *_, records in sent_batches(fake, "t", 1)] == [2]


async def test_the_flusher_sleeps_through_an_arrival_it_has_no_slot_for(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """An arrival the flusher could send only through a request slot that is
    taken does not wake it (``_poke_flusher``): it waits for the answer that
    frees the slot, not for the arrival.

    Schedule (plain, max_in_flight 1, linger 1 s, batch_bytes = one record of
    b, t[0] and t[1] on broker 0): t0: w is flushed to t[0], answered 0.5 s
    late: the one slot is taken. t0 + 0.25: b (t[1]), a full batch, arrives:
    no flusher step until the answer at t0 + 0.5, which frees the slot and
    sends b. Counting a taken last slot as free, or the linger deadlines while
    no slot is free, woke the flusher for b."""
    fake.create_topic("t", 2, leaders=[0, 0])
    options = exact(idempotent=False, max_in_flight=1, linger=1.0,
                    batch_bytes=batch_size_for_record(None, b"b"))
    async with open_fake_producer(fake, **options) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.delay_responses(0.5, api_key=ApiKey.PRODUCE, node_id=0, count=1)
        with _counting_flusher_steps() as counter:
            t0 = trio.current_time()
            w = producer.send_nowait("t", b"w", partition=0)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(producer.flush)
                await trio.sleep(0.25)
                before = counter.steps
                b = producer.send_nowait("t", b"b", partition=1)
                await trio.sleep(0.125)
                assert counter.steps == before  # a full batch, but no free slot
            results = await outcomes([w, b])
            assert trio.current_time() == t0 + 0.5
    assert offsets(results) == [1, 0]


async def test_an_answer_that_leaves_the_flushers_wait_as_it_was_does_not_wake_it(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """An answer that frees a slot while the flusher waits for a linger
    deadline, with a slot free already, leaves its wake-up time as it was: no
    flusher step (``_poke_flusher``'s ``>=``: the same time is no reason).

    Schedule (plain, max_in_flight 2, linger 1 s, batch_bytes = one record of
    100 bytes, t[0] and t[1] on broker 0): t0: w (t[0], 100 bytes, a full
    batch) is written at once and answered 0.5 s late. t0 + 0.125: m (t[1], one
    byte) arrives and lingers until t0 + 1.125, one slot still free. w's answer
    at t0 + 0.5 changes nothing the flusher waits for: no step from t0 + 0.25
    to t0 + 1. m is written at t0 + 1.125."""
    fake.create_topic("t", 2, leaders=[0, 0])
    big = b"w" * 100
    options = exact(idempotent=False, max_in_flight=2, linger=1.0,
                    batch_bytes=batch_size_for_record(None, big))
    async with open_fake_producer(fake, **options) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.delay_responses(0.5, api_key=ApiKey.PRODUCE, node_id=0, count=1)
        with _counting_flusher_steps() as counter:
            t0 = trio.current_time()
            w = producer.send_nowait("t", big, partition=0)
            await trio.sleep(0.125)
            m = producer.send_nowait("t", b"m", partition=1)
            await trio.sleep(0.125)
            before = counter.steps
            (w_result,) = await outcomes([w])
            assert trio.current_time() == t0 + 0.5
            await trio.sleep(0.5)
            assert counter.steps == before  # the answer changed nothing it waits for
            (m_result,) = await outcomes([m])
            assert trio.current_time() == t0 + 1.125
    assert offsets([w_result, m_result]) == [1, 0]
