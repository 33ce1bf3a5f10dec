"""The producer on the paths Apache Kafka takes, on the FakeCluster (which follows Kafka).

Each of these was first seen or checked on Apache Kafka 4.1 (tests/apache_kafka/
test_kafka_semantics.py runs the same situations there); here they are deterministic
regressions on ``autojump_clock``:

* recovery bumps the epoch on the client (no InitProducerId), and falls back to a new
  producer id when a broker refuses that epoch (as tansu does) and from then on;
* a request of the old epoch that reaches the broker after the recovery is fenced, never
  written behind newer messages (why the local bump, not a new id);
* MESSAGE_TOO_LARGE / RECORD_LIST_TOO_LARGE: a batch of several records is split and
  retried; a single too-large record fails alone, and nothing after it is lost (the
  sequence gap it leaves is closed by a new epoch);
* NOT_ENOUGH_REPLICAS is retried until ``delivery_timeout``, whose error names it, and
  production resumes once the ISR is whole again;
* a duplicate answered the way Kafka answers it keeps the records' own timestamps.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from pipeline import BrokerResponseError, DeliveryTimeoutError, ProducerError
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import produce as pm
from pipeline.protocol.records import decode_record_batches
from pipeline.testing.fake_cluster import DROP, ControlContext, FakeCluster

from .conftest import open_fake_producer, values_in_log
from .test_idempotence import idem_options, sent_batches
from .test_sarama_suite import outcomes, send_all, vals


def idem(producer: Any) -> Any:
    state = producer._core.idempotence
    assert state is not None
    return state


def init_requests(fake: FakeCluster) -> list[tuple[int, int]]:
    return [(r.request.producer_id, r.request.producer_epoch)
            for r in fake.requests_of(ApiKey.INIT_PRODUCER_ID)]


# -- recovery ------------------------------------------------------------------


async def test_recovery_bumps_the_epoch_on_the_client(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """An unexplained sequence gap: the producer bumps its own epoch (the Java client's
    KIP-360 path). No InitProducerId is sent for it (Kafka would answer a new id
    anyway); the same producer id goes on at epoch 1 from sequence 0."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **idem_options()) as producer:
        await outcomes(await send_all(producer, "t", vals("a", 3), partition=0))
        pid = idem(producer).producer_id
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0)
        await outcomes(await send_all(producer, "t", vals("gap", 1), partition=0))
        later = await outcomes(await send_all(producer, "t", vals("b", 3), partition=0))
        state = idem(producer)
        assert (state.bumps, state.new_ids, state.local_bumps) == (1, 0, True)
        assert (state.producer_id, state.producer_epoch) == (pid, 1)
    assert init_requests(fake) == [(-1, -1)]
    assert [r.offset for r in later] == [3, 4, 5]
    assert [(b[1], b[2], b[3]) for b in sent_batches(fake, "t", 0)][-1] == (pid, 1, 0)
    assert values_in_log(fake, "t", 0) == vals("a", 3) + vals("b", 3)


def refuse_bumped_epochs(ctx: ControlContext) -> pm.ProduceResponse | None:
    """tansu's answer to an epoch the producer bumped itself: PRODUCER_FENCED (90).
    (Its first epoch is always 0, so any epoch > 0 was bumped by the client.)"""
    request = ctx.request
    epochs = [decode_record_batches(p.records)[0].producer_epoch
              for t in request.topic_data for p in t.partition_data]
    if not any(e > 0 for e in epochs):
        return None
    return pm.ProduceResponse(responses=tuple(
        pm.TopicProduceResponse(name=t.name, partition_responses=tuple(
            pm.PartitionProduceResponse(index=p.index, error_code=ErrorCode.PRODUCER_FENCED,
                                        base_offset=-1, log_append_time_ms=-1,
                                        log_start_offset=-1)
            for p in t.partition_data))
        for t in request.topic_data))


async def test_refused_bump_falls_back_to_new_producer_ids(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A broker that fences a client-bumped epoch (tansu): the fenced batch was not
    written, so it is re-sent under a new producer id; later recoveries take a new id
    straight away. Every message once, in order."""
    fake.create_topic("t", 1, leaders=[0])
    fake.control(ApiKey.PRODUCE, refuse_bumped_epochs, sticky=True)
    async with open_fake_producer(fake, **idem_options()) as producer:
        first = await outcomes(await send_all(producer, "t", vals("a", 2), partition=0))
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0)
        gap = await outcomes(await send_all(producer, "t", vals("gap", 1), partition=0))
        second = await outcomes(await send_all(producer, "t", vals("b", 2), partition=0))
        state = idem(producer)
        assert (state.bumps, state.new_ids, state.local_bumps) == (1, 1, False)
        assert state.producer_epoch == 0
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0)
        await outcomes(await send_all(producer, "t", vals("gap2-", 1), partition=0))
        third = await outcomes(await send_all(producer, "t", vals("c", 2), partition=0))
        assert (state.bumps, state.new_ids) == (1, 2)
    assert all(isinstance(r, ProducerError) for r in gap)
    assert [r.offset for r in first + second + third] == list(range(6))
    assert values_in_log(fake, "t", 0) == vals("a", 2) + vals("b", 2) + vals("c", 2)
    assert init_requests(fake) == [(-1, -1)] * 3
    fenced = [b for b in sent_batches(fake, "t", 0) if b[2] == 1]
    assert len(fenced) == 1  # one batch tried the bumped epoch, then a new id


async def test_lost_answer_in_a_refused_epoch_is_not_a_lost_message(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """tansu again: the first batch of the self-bumped epoch loses its connection (fate
    unknown), its identical retry is fenced. A broker that refuses an epoch never wrote a
    batch of it, so the batch is re-stamped under the new producer id and delivered,
    not failed as "may or may not have been written"."""
    fake.create_topic("t", 1, leaders=[0])
    dropped: list[int] = []

    def drop_first_then_refuse(ctx: ControlContext) -> Any:
        if refuse_bumped_epochs(ctx) is None:
            return None
        if not dropped:
            dropped.append(1)
            return DROP  # the connection closes: no answer
        return refuse_bumped_epochs(ctx)

    fake.control(ApiKey.PRODUCE, drop_first_then_refuse, sticky=True)
    async with open_fake_producer(fake, **idem_options()) as producer:
        await producer.send_and_wait("t", b"a", partition=0)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0)
        await outcomes(await send_all(producer, "t", vals("gap", 1), partition=0))
        results = await outcomes(await send_all(producer, "t", vals("b", 2), partition=0))
        assert (idem(producer).bumps, idem(producer).new_ids) == (1, 1)
    assert dropped == [1]
    assert [r.offset for r in results] == [1, 2]
    assert values_in_log(fake, "t", 0) == [b"a", *vals("b", 2)]
    assert [b[2:] for b in sent_batches(fake, "t", 0)][-3:] == [(1, 0, 2), (1, 0, 2), (0, 0, 2)]


async def test_late_request_of_the_old_epoch_is_fenced(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A batch whose delivery timed out in flight reaches the broker only after the
    recovery (both its sends are held 30 s before being applied). Under the bumped
    epoch the broker fences it (INVALID_PRODUCER_EPOCH): it is never written behind
    the messages sent after it. (Under a new producer id, as InitProducerId would give,
    the old id's batch would be in sequence and land after them.)"""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(
        fake, **idem_options(delivery_timeout=12.0, request_timeout=10.0)
    ) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.delay_responses(30.0, api_key=ApiKey.PRODUCE, count=2, node_id=0,
                             before_apply=True)
        late = await outcomes(await send_all(producer, "t", [b"late"], partition=0))
        after = await outcomes(await send_all(producer, "t", vals("after", 3), partition=0))
        await trio.sleep(60)  # both held copies of "late" have reached the broker
        stats = (idem(producer).bumps, idem(producer).new_ids)
    assert isinstance(late[0].cause, DeliveryTimeoutError)
    assert "may or may not have been written" in str(late[0].cause)
    assert [r.offset for r in after] == [1, 2, 3]
    assert values_in_log(fake, "t", 0) == [b"warm", *vals("after", 3)]
    assert stats == (1, 0)
    # "late" sent twice in epoch 0 (seq 1), then "after" as one batch: epoch 1, seq 0
    assert [b[2:] for b in sent_batches(fake, "t", 0)] == [
        (0, 0, 1), (0, 1, 1), (0, 1, 1), (1, 0, 3)]


# -- size limits ---------------------------------------------------------------


@pytest.mark.parametrize(("idempotent", "retries"), [(False, None), (True, None), (False, 0),
                                                    (True, 1)],
                         ids=["plain", "idempotent", "plain-retries0", "idempotent-retries1"])
@pytest.mark.parametrize("limit", ["max.message.bytes", "segment.bytes"])
async def test_too_large_batch_is_split_and_delivered(
    nursery: trio.Nursery, autojump_clock: Any, idempotent: bool, retries: int | None,
    limit: str
) -> None:
    """KIP-126: a 40-record batch over the topic's limit (MESSAGE_TOO_LARGE, or
    RECORD_LIST_TOO_LARGE for segment.bytes) is halved until each part fits; every
    record arrives once, in order, at contiguous offsets, sequences without a gap.
    A split spends no retry (the Java client treats the halves "as if they are not
    even tried"): with retries=0, or 1 and two splits in a row, all is delivered."""
    fake = FakeCluster(brokers=1, seed=3, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("t", 1, configs={limit: "1200"})
    values = [b"%03d:" % i + b"x" * 100 for i in range(40)]
    options = idem_options(linger=5.0) if idempotent else {"linger": 5.0, "idempotent": False}
    if retries is not None:
        options["retries"] = retries
    async with open_fake_producer(fake, **options) as producer:
        deliveries = await send_all(producer, "t", values, partition=0)
        await producer.flush()
        results = await outcomes(deliveries)
    assert [getattr(r, "offset", r) for r in results] == list(range(40))
    assert values_in_log(fake, "t", 0) == values
    wire = sent_batches(fake, "t", 0)
    # 40 is too large, so is each 20; the 10s fit (40 x 106 bytes > 1200 > 10 x 106)
    assert [b[4] for b in wire] == [40, 20, 10, 10, 20, 10, 10]
    if idempotent:  # one epoch; each half keeps its place in the sequence range
        assert [b[2:4] for b in wire] == [(0, 0), (0, 0), (0, 0), (0, 10), (0, 20), (0, 20),
                                          (0, 30)]


@pytest.mark.parametrize("columnar", [False, True], ids=["messages", "send_batch"])
async def test_a_split_half_has_no_more_retries_than_its_batch(
    nursery: trio.Nursery, autojump_clock: Any, columnar: bool
) -> None:
    """retries=0: a 20-record batch over the limit is split (free), and the first half
    is refused once with a retriable error (NOT_ENOUGH_REPLICAS). It has no retry to
    spend: it fails with that error; the second half, which only waited, is written."""
    fake = FakeCluster(brokers=1, seed=3, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("t", 1, configs={"max.message.bytes": "1200"})
    values = [b"%03d:" % i + b"x" * 100 for i in range(20)]
    seen = []

    def refuse_the_first_half(ctx: ControlContext) -> pm.ProduceResponse | None:
        [topic] = ctx.request.topic_data
        [part] = topic.partition_data
        seen.append(len(decode_record_batches(part.records)[0].records))
        if seen != [20, 10]:
            return None
        return pm.ProduceResponse(responses=(pm.TopicProduceResponse(
            name=topic.name, partition_responses=(pm.PartitionProduceResponse(
                index=part.index, error_code=ErrorCode.NOT_ENOUGH_REPLICAS, base_offset=-1,
                log_append_time_ms=-1, log_start_offset=-1),)),))

    fake.control(ApiKey.PRODUCE, refuse_the_first_half, sticky=True)
    async with open_fake_producer(fake, linger=5.0, idempotent=False, retries=0) as producer:
        if columnar:
            group = await producer.send_batch("t", values, partitions=[0] * 20)
            await producer.flush()
            result = await group
            assert (result.delivered, result.failed) == (10, 10)
            causes = {e.cause.code for e in result.errors}
        else:
            deliveries = await send_all(producer, "t", values, partition=0)
            await producer.flush()
            results = await outcomes(deliveries)
            assert all(isinstance(r, ProducerError) for r in results[:10]), results[:10]
            causes = {r.cause.code for r in results[:10]}
            assert [r.offset for r in results[10:]] == list(range(10))
    assert causes == {ErrorCode.NOT_ENOUGH_REPLICAS}
    assert seen == [20, 10, 10]
    assert values_in_log(fake, "t", 0) == values[10:]


@pytest.mark.parametrize("limit", ["max.message.bytes", "segment.bytes"])
async def test_single_too_large_record_fails_alone(
    nursery: trio.Nursery, autojump_clock: Any, limit: str
) -> None:
    """One record over the topic's limit, pipelined between others (idempotent, 5 in
    flight): it fails with the broker's cause; the batches behind it (answered
    OUT_OF_ORDER meanwhile, the broker waits for its sequence) are re-sent in a new
    epoch and delivered; the other partition never notices."""
    fake = FakeCluster(brokers=1, seed=3, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("t", 2, configs={limit: "1200"})
    async with open_fake_producer(fake, **idem_options(max_batch_messages=1)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        fake.delay_responses(0.05, api_key=ApiKey.PRODUCE, count=1, before_apply=True)
        big = await producer.send("t", b"B" * 2000, partition=0)
        rest = await send_all(producer, "t", vals("s", 4), partition=0)
        other = await send_all(producer, "t", vals("o", 4), partition=1)
        results = await outcomes([big, *rest, *other])
        assert (idem(producer).bumps, idem(producer).new_ids) == (1, 0)
    code = (ErrorCode.MESSAGE_TOO_LARGE if limit == "max.message.bytes"
            else ErrorCode.RECORD_LIST_TOO_LARGE)
    assert isinstance(results[0], ProducerError)
    assert isinstance(results[0].cause, BrokerResponseError) and results[0].cause.code == code
    assert [r.offset for r in results[1:5]] == [1, 2, 3, 4]
    assert values_in_log(fake, "t", 0) == [b"warm", *vals("s", 4)]
    assert values_in_log(fake, "t", 1) == vals("o", 4)
    first_round = [b[3] for b in sent_batches(fake, "t", 0)][1:6]
    assert first_round == [1, 2, 3, 4, 5]  # big and four more, pipelined


# -- NOT_ENOUGH_REPLICAS -------------------------------------------------------


async def test_not_enough_replicas_until_delivery_timeout_then_recovery(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """RF=3, min.insync.replicas=3, a follower down: NOT_ENOUGH_REPLICAS is retried
    until delivery_timeout, whose error names it; once the follower is back, new
    messages are delivered, and a message sent while it was down gets through when it
    returns within the timeout."""
    fake.create_topic("t", 1, leaders=[0], configs={"min.insync.replicas": "3"})
    assert fake.partition("t", 0).replicas == (0, 1, 2)
    async with open_fake_producer(
        fake, **idem_options(delivery_timeout=15.0, retry_backoff_max=1.0)
    ) as producer:
        await producer.send_and_wait("t", b"before", partition=0)
        fake.stop_broker(2)
        t0 = trio.current_time()
        failed = await outcomes(await send_all(producer, "t", [b"never"], partition=0))
        assert trio.current_time() - t0 == pytest.approx(15.0)
        waiting = await producer.send("t", b"waits", partition=0)
        await trio.sleep(5)
        fake.restart_broker(2)
        meta = await waiting
        assert trio.current_time() - t0 < 15.0 + 5 + 1.5
        after = await producer.send_and_wait("t", b"after", partition=0)
    error = failed[0]
    assert isinstance(error, ProducerError) and isinstance(error.cause, DeliveryTimeoutError)
    assert "NOT_ENOUGH_REPLICAS" in str(error.cause)
    assert (meta.offset, after.offset) == (1, 2)
    assert values_in_log(fake, "t", 0) == [b"before", b"waits", b"after"]


# -- duplicates ----------------------------------------------------------------


async def test_duplicate_answer_keeps_the_records_timestamps(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The ack of a written batch is lost; its identical retry is a duplicate, which
    Kafka answers NONE with the original offset and the batch's max timestamp in
    log_append_time_ms (on a CreateTime topic). Each record keeps its own timestamp."""
    fake.create_topic("t", 1, leaders=[0])
    fake.drop_response_after_apply(ApiKey.PRODUCE, node_id=0)
    async with open_fake_producer(fake, **idem_options(linger=1.0)) as producer:
        deliveries = [await producer.send("t", b"v%d" % i, partition=0,
                                          timestamp=1_600_000_000_000 + i) for i in range(5)]
        results = await outcomes(deliveries)
    assert [(r.offset, r.timestamp) for r in results] == [
        (i, 1_600_000_000_000 + i) for i in range(5)]
    assert len(sent_batches(fake, "t", 0)) == 2
    assert values_in_log(fake, "t", 0) == vals("v", 5)
