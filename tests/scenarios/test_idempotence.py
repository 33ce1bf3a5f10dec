"""The idempotent producer against the FakeCluster, which checks sequences as Kafka does.

Each scenario asserts the exact log (every record once, in order), one outcome
per message, and what went over the wire: producer ids, epochs and base
sequences of every Produce request, read from the fake's request record.
"""

from __future__ import annotations

from typing import Any

import trio

from pipeline import DeliveryTimeoutError, ProducerError
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.init_producer_id import InitProducerIdResponse
from pipeline.protocol.records import decode_record_batches
from pipeline.testing.fake_cluster import ControlContext, FakeCluster

from .conftest import open_fake_producer, values_in_log
from .test_sarama_suite import outcomes, send_all, vals


def sent_batches(fake: FakeCluster, topic: str, partition: int) -> list[tuple[int, int, int, int, int]]:
    """(node, producer_id, epoch, base_sequence, records) of every batch sent for a partition."""
    out = []
    for rec in fake.requests_of(ApiKey.PRODUCE):
        for t in rec.request.topic_data:
            for p in t.partition_data:
                if t.name == topic and p.index == partition:
                    (batch,) = decode_record_batches(p.records)
                    out.append((rec.node_id, batch.producer_id, batch.producer_epoch,
                                batch.base_sequence, len(batch.records)))
    return out


def idem_options(**kw: Any) -> dict[str, Any]:
    options: dict[str, Any] = dict(idempotent=True, retry_backoff_jitter=0)
    options.update(kw)
    return options


async def test_ack_lost_after_write_is_answered_as_duplicate(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The write succeeded, the ack was lost: the identical retry is a duplicate of a
    cached batch, answered with the original offset; the log holds each record once."""
    fake.create_topic("t", 1, leaders=[0])
    fake.drop_response_after_apply(ApiKey.PRODUCE, node_id=0)
    async with open_fake_producer(fake, **idem_options()) as producer:
        results = await outcomes(await send_all(producer, "t", vals("m", 10), partition=0))
    assert [r.offset for r in results] == list(range(10))
    assert values_in_log(fake, "t", 0) == vals("m", 10)
    batches = sent_batches(fake, "t", 0)
    assert len(batches) == 2 and batches[0][1:] == batches[1][1:]  # re-sent identical
    assert producer.statistics().double_settles == 0


async def test_unexplained_sequence_gap_fails_that_batch_and_bumps_the_epoch(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """OUT_OF_ORDER_SEQUENCE_NUMBER that no earlier failure explains: that batch fails
    with a clear error, the epoch is bumped (KIP-360), later messages are delivered."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **idem_options()) as producer:
        first = await outcomes(await send_all(producer, "t", vals("a", 5), partition=0))
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0)
        gap = await outcomes(await send_all(producer, "t", vals("b", 5), partition=0))
        later = await outcomes(await send_all(producer, "t", vals("c", 5), partition=0))
        idem = producer._core.idempotence
        assert idem is not None and idem.bumps == 1 and idem.producer_epoch == 1
    assert all(isinstance(r, ProducerError) for r in gap)
    assert {r.cause.code for r in gap} == {ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER}
    assert [r.offset for r in first + later] == list(range(10))
    assert values_in_log(fake, "t", 0) == vals("a", 5) + vals("c", 5)
    epochs_and_seqs = [(b[2], b[3]) for b in sent_batches(fake, "t", 0)]
    assert epochs_and_seqs[0] == (0, 0) and epochs_and_seqs[-1] == (1, 0)


async def test_five_in_flight_first_fails_retriably(fake: FakeCluster, autojump_clock: Any) -> None:
    """5 batches of one partition in flight; the first fails retriably, the others are
    rejected as out of order (explained by the first), all are re-sent in sequence
    order: order kept, nothing duplicated."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **idem_options(max_batch_messages=10)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)  # the partition is confirmed
        fake.delay_responses(0.05, api_key=ApiKey.PRODUCE, count=1, before_apply=True)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0)
        before = len(fake.requests_of(ApiKey.PRODUCE))
        results = await outcomes(await send_all(producer, "t", vals("m", 50), partition=0))
    assert [r.offset for r in results] == list(range(1, 51))
    assert values_in_log(fake, "t", 0) == [b"warm", *vals("m", 50)]
    wire = sent_batches(fake, "t", 0)[1:]
    first_round = wire[:5]
    assert [b[3] for b in first_round] == [1, 11, 21, 31, 41]  # five pipelined batches
    assert len(fake.requests_of(ApiKey.PRODUCE)) - before == 10  # 5 attempts + 5 identical retries
    assert [b[3] for b in wire[5:]] == [1, 11, 21, 31, 41]


async def test_leader_move_with_batches_in_flight(fake: FakeCluster, autojump_clock: Any) -> None:
    """Batches in flight when the leader moves are re-sent identical (same producer id,
    epoch and base sequence) to the new leader, in order."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **idem_options(max_batch_messages=10)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.delay_responses(0.5, api_key=ApiKey.PRODUCE, count=1, node_id=0, before_apply=True)
        deliveries = await send_all(producer, "t", vals("m", 30), partition=0)
        await trio.sleep(0.1)
        fake.move_leader("t", 0, to=2)
        results = await outcomes(deliveries)
    assert [r.offset for r in results] == list(range(1, 31))
    assert values_in_log(fake, "t", 0) == [b"warm", *vals("m", 30)]
    on_old = [b[1:] for b in sent_batches(fake, "t", 0) if b[0] == 0][1:]
    on_new = [b[1:] for b in sent_batches(fake, "t", 0) if b[0] == 2]
    assert on_new == on_old  # identical pid, epoch, base sequence, size


async def test_broker_restart_losing_producer_state(nursery: trio.Nursery, autojump_clock: Any) -> None:
    """A restart that loses producer state: UNKNOWN_PRODUCER_ID (pre-2.5 Kafka rules),
    recovery with a bumped epoch, the rejected batch and later messages delivered."""
    fake = FakeCluster(brokers=3, seed=7, auto_create_topics=False, strict_unknown_producer=True)
    await nursery.start(fake.run)
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **idem_options()) as producer:
        first = await outcomes(await send_all(producer, "t", vals("a", 5), partition=0))
        fake.stop_broker(0, elect=False)
        fake.restart_broker(0, lose_producer_state=True)
        later = await outcomes(await send_all(producer, "t", vals("b", 5), partition=0))
        idem = producer._core.idempotence
        assert idem is not None and idem.bumps + idem.new_ids == 1
    assert all(not isinstance(r, ProducerError) for r in first + later)
    assert values_in_log(fake, "t", 0) == vals("a", 5) + vals("b", 5)
    codes = [b for b in sent_batches(fake, "t", 0)]
    assert codes[-1][2] == 1 and codes[-1][3] == 0  # epoch 1, sequence restarted


async def test_delivery_timeout_of_an_in_flight_batch(fake: FakeCluster, autojump_clock: Any) -> None:
    """A batch whose delivery times out in flight fails (fate unknown); the epoch is
    bumped and later messages are delivered; nothing is duplicated."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(
        fake, **idem_options(delivery_timeout=12.0, request_timeout=10.0, linger=0.0)
    ) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        # First attempt: applied, answer never comes (request timeout at 10 s);
        # the identical retry at 10.1 s hangs too, past the 12 s delivery deadline.
        fake.delay_responses(30.0, api_key=ApiKey.PRODUCE, count=2, node_id=0)
        t0 = trio.current_time()
        timed_out = await outcomes(await send_all(producer, "t", vals("a", 3), partition=0))
        assert trio.current_time() == t0 + 12.0
        later = await outcomes(await send_all(producer, "t", vals("b", 3), partition=0))
        idem = producer._core.idempotence
        assert idem is not None and idem.producer_epoch == 1
    assert all(isinstance(r.cause, DeliveryTimeoutError) for r in timed_out)
    assert all(not isinstance(r, ProducerError) for r in later)
    log = values_in_log(fake, "t", 0)
    assert log[:1] == [b"warm"] and log[-3:] == vals("b", 3)
    assert len(log) == len(set(log))  # the slow batch may be there, but once


async def test_epoch_exhaustion_gets_a_new_producer_id(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """sarama #2178: the int16 epoch ran out. At the last epoch (32767) a recovery
    takes a new producer id instead of bumping, and production carries on under it."""
    fake.create_topic("t", 1, leaders=[0])

    def last_epoch(ctx: ControlContext) -> InitProducerIdResponse:
        return InitProducerIdResponse(error_code=0, producer_id=4242, producer_epoch=32767)

    fake.control(ApiKey.INIT_PRODUCER_ID, last_epoch)
    async with open_fake_producer(fake, **idem_options()) as producer:
        await producer.send_and_wait("t", b"a", partition=0)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0)
        await outcomes([await producer.send("t", b"lost", partition=0)])
        meta = await producer.send_and_wait("t", b"b", partition=0)
        idem = producer._core.idempotence
        assert idem is not None and (idem.bumps, idem.new_ids) == (0, 1)
        assert idem.producer_id != 4242 and idem.producer_epoch == 0
    assert meta.offset == 1
    assert values_in_log(fake, "t", 0) == [b"a", b"b"]
    requests = fake.requests_of(ApiKey.INIT_PRODUCER_ID)
    assert [(r.request.producer_id, r.request.producer_epoch) for r in requests] == [(-1, -1), (-1, -1)]


# -- regressions ---------------------------------------------------------------


async def test_1661_failed_messages_burn_no_sequences(fake: FakeCluster, autojump_clock: Any) -> None:
    """sarama #1661: sequences were given to messages that then failed before being
    sent, leaving a gap: OUT_OF_ORDER_SEQUENCE_NUMBER forever. Sequences are taken
    only when a batch is sealed for a reachable leader."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(
        fake, **idem_options(delivery_timeout=20.0, request_timeout=5.0)
    ) as producer:
        await producer.send_and_wait("t", b"a", partition=0)
        fake.stop_broker(0, elect=False)
        dead = await outcomes(await send_all(producer, "t", vals("x", 5), partition=0))
        fake.restart_broker(0)
        meta = await producer.send_and_wait("t", b"b", partition=0)
        idem = producer._core.idempotence
        assert idem is not None and idem.bumps == 0 and idem.new_ids == 0
    assert all(isinstance(r.cause, DeliveryTimeoutError) for r in dead)
    assert meta.offset == 1
    assert [b[3] for b in sent_batches(fake, "t", 0)] == [0, 1]


async def test_3354_buffered_messages_get_sequences(fake: FakeCluster, autojump_clock: Any) -> None:
    """sarama #3354: messages buffered while a retry was under way were later sent
    without sequence numbers. Every batch on the wire carries the producer id and
    the partition's sequences form one gapless chain."""
    fake.create_topic("t", 1, leaders=[0])
    fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_LEADER_OR_FOLLOWER, node_id=0, count=2)
    async with open_fake_producer(fake, **idem_options(max_batch_messages=4)) as producer:
        results = await outcomes(await send_all(producer, "t", vals("m", 20), partition=0))
    assert [r.offset for r in results] == list(range(20))
    delivered = [b for b in sent_batches(fake, "t", 0)]
    assert all(b[1] >= 0 and b[3] >= 0 for b in delivered)
    chain = sorted({(b[3], b[4]) for b in delivered})
    assert [seq for seq, _ in chain] == [sum(n for _, n in chain[:i]) for i in range(len(chain))]


async def test_2469_idempotent_retries_respect_backoff(fake: FakeCluster, autojump_clock: Any) -> None:
    """sarama #2469: idempotent batch retries ignored the backoff and burned all
    retries in microseconds. Each retry also waits for a metadata refresh,
    and refresh rounds are spaced by the same retry_backoff; the first round
    here starts at once (the last one was long ago), so without the backoff
    the three retries would take 0 + 0.5 + 0.5 s, with it 3 x 0.5 s."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(
        fake, **idem_options(retry_backoff=0.5, retry_backoff_max=0.5)
    ) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_ENOUGH_REPLICAS, node_id=0, count=3)
        await trio.sleep(1.0)
        t0 = trio.current_time()
        meta = await producer.send_and_wait("t", b"x", partition=0)
        assert trio.current_time() == t0 + 3 * 0.5
    assert meta.offset == 1


async def test_franz_930_close_waits_for_the_request_on_the_wire(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """franz-go #930/#1217: an in-flight idempotent request abandoned on cancellation
    desynced sequences or lost data. Close after close_timeout still waits (bounded
    by request_timeout) for the answer, so the message gets its real outcome."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(
        fake, **idem_options(close_timeout=1.0, request_timeout=10.0)
    ) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.delay_responses(3.0, api_key=ApiKey.PRODUCE, count=1, node_id=0)
        delivery = await producer.send("t", b"slow", partition=0)
        with trio.move_on_after(0.5):  # a caller gives up waiting: nothing is abandoned
            await delivery
        t0 = trio.current_time()
    assert trio.current_time() == t0 + 2.5
    assert (await delivery).offset == 1
    assert values_in_log(fake, "t", 0) == [b"warm", b"slow"]


class _BreakNthProduceWrite(trio.abc.Stream):
    """Passes bytes through, but the n-th Produce frame's write raises, as a write to
    a connection the peer has just reset does."""

    def __init__(self, inner: trio.abc.Stream, counter: list[int], n: int) -> None:
        self.inner, self.counter, self.n = inner, counter, n

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if len(data) >= 6 and int.from_bytes(bytes(data[4:6]), "big") == ApiKey.PRODUCE:
            self.counter[0] += 1
            if self.counter[0] == self.n:
                await trio.lowlevel.checkpoint()
                raise trio.BrokenResourceError("connection reset by peer")
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_failed_write_behind_pending_requests_keeps_sequence_order(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """Found by the chaos test: when a write failed at once while earlier requests of
    the partition were still pending on the dying connection, its batch was bounced
    before theirs, the retries went out of sequence, and the broker's
    OUT_OF_ORDER_SEQUENCE_NUMBER was taken as unexplained (messages failed, new id).
    A failed write now waits its turn behind the requests before it."""
    fake.create_topic("t", 1, leaders=[0])
    counter = [0]

    async def connector(host: str, port: int) -> trio.abc.Stream:
        return _BreakNthProduceWrite(await fake.connector(host, port), counter, n=4)

    async with open_fake_producer(fake, connector=connector, **idem_options()) as producer:
        await producer.send_and_wait("t", b"A", partition=0)  # Produce 1: confirms the partition
        fake.delay_responses(1.0, api_key=ApiKey.PRODUCE, count=2, before_apply=True)  # hold 2 and 3
        deliveries = []
        for v in (b"B1", b"B2", b"B3"):  # Produce 2, 3, 4; the write of 4 fails
            deliveries.append(await producer.send("t", v, partition=0))
            await trio.sleep(0.01)
        results = await outcomes(deliveries)
        idem = producer._core.idempotence
        assert idem is not None and (idem.bumps, idem.new_ids) == (0, 0)
    assert all(not isinstance(r, ProducerError) for r in results)
    assert values_in_log(fake, "t", 0) == [b"A", b"B1", b"B2", b"B3"]
