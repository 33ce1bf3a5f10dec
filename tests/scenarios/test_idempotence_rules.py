"""Idempotence rules found unpinned by ``make mutants`` (docs/testing.md, "Mutation testing"):
obtaining the producer id, the epoch's limit, and which fence or failure
starts which kind of recovery (``pipeline/producer/_stages/idempotence.py``).

Deterministic (FakeCluster, autojump_clock, no jitter); each docstring walks
through the schedule it needs, and the virtual times the protocol fixes are
asserted exactly. Every producer's ``double_settles == 0`` is checked by the
autouse fixture of ``conftest.py`` and asserted here where the test reads the
statistics anyway.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

from pipeline import DeliveryTimeoutError
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.init_producer_id import InitProducerIdResponse
from pipeline.testing.fake_cluster import ControlContext, FakeCluster

from .conftest import open_fake_producer, values_in_log
from .test_guards import exact, offsets
from .test_idempotence import sent_batches
from .test_kafka_semantics import refuse_bumped_epochs
from .test_sarama_suite import outcomes


def init_times(fake: FakeCluster) -> list[float]:
    return [r.time for r in fake.requests_of(ApiKey.INIT_PRODUCER_ID)]


def answer_init(producer_id: int, producer_epoch: int) -> Any:
    """A one-shot InitProducerId hook answering NONE with the given id and epoch."""

    def hook(ctx: ControlContext) -> InitProducerIdResponse:
        return InitProducerIdResponse(
            error_code=0, producer_id=producer_id, producer_epoch=producer_epoch
        )

    return hook


async def test_init_producer_id_is_retried_with_growing_backoff(
    fake: FakeCluster, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The first producer id is retried until a broker gives one
    (``_obtain_id``), each retry after the producer's retry backoff for that
    attempt (1, 2, 3: exponential, so a wrong attempt count shows), and the
    log says what the broker answered. Every request asks for a new id
    (-1/-1) and carries ``transaction_timeout_ms`` = delivery_timeout in ms.

    Schedule (retry_backoff 0.125 s, retry_backoff_max 1 s, delivery_timeout
    60 s): InitProducerId at t0 is answered COORDINATOR_NOT_AVAILABLE, again
    at t0 + 0.125 and t0 + 0.375; the fourth, at t0 + 0.875, gets an id, and
    the producer opens then; its first batch carries that id, epoch 0."""
    fake.create_topic("t", 1, leaders=[0])
    fake.fail_next(ApiKey.INIT_PRODUCER_ID, ErrorCode.COORDINATOR_NOT_AVAILABLE, count=3)
    caplog.set_level(logging.INFO, logger="pipeline.producer")
    async with open_fake_producer(
        fake, **exact(idempotent=True, retry_backoff_max=1.0, delivery_timeout=60.0)
    ) as producer:
        (t0, *later) = init_times(fake)
        assert [t - t0 for t in later] == [0.125, 0.375, 0.875]
        assert trio.current_time() == t0 + 0.875
        await producer.send_and_wait("t", b"a", partition=0)
        idem = producer._core.idempotence
        assert idem is not None and (idem.producer_epoch, idem.new_ids) == (0, 0)
        assert producer.statistics().double_settles == 0
    requests = [r.request for r in fake.requests_of(ApiKey.INIT_PRODUCER_ID)]
    assert [(r.producer_id, r.producer_epoch) for r in requests] == [(-1, -1)] * 4
    assert [r.transaction_timeout_ms for r in requests] == [60_000] * 4
    assert [b[1:4] for b in sent_batches(fake, "t", 0)] == [(idem.producer_id, 0, 0)]
    failures = [r.getMessage() for r in caplog.records if "InitProducerId failed" in r.getMessage()]
    assert len(failures) == 3
    assert all("COORDINATOR_NOT_AVAILABLE" in m for m in failures)


async def test_an_init_producer_id_answer_without_an_id_is_retried(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A broker that answers InitProducerId with NONE but producer id -1 (no
    idempotence at that version) gave no id: the producer retries (after
    retry_backoff) rather than send batches under id -1, which a broker would
    take as a plain producer's (no sequence checks, duplicates on retry).

    Schedule (retry_backoff 0.125 s): t0: the first answer is NONE, -1/-1;
    t0 + 0.125: a real id. The batch carries that id."""
    fake.create_topic("t", 1, leaders=[0])
    fake.control(ApiKey.INIT_PRODUCER_ID, answer_init(-1, -1))
    async with open_fake_producer(fake, **exact(idempotent=True)) as producer:
        (t0, t1) = init_times(fake)
        assert t1 == t0 + 0.125
        await producer.send_and_wait("t", b"a", partition=0)
        idem = producer._core.idempotence
        assert idem is not None and idem.producer_id >= 0
    ((pid, epoch, seq),) = [b[1:4] for b in sent_batches(fake, "t", 0)]
    assert (pid, epoch, seq) == (idem.producer_id, 0, 0)


async def test_producer_id_0_is_a_producer_id(fake: FakeCluster, autojump_clock: Any) -> None:
    """Kafka's producer ids start at 0 (``ProducerIdManager``'s first block):
    an InitProducerId answer with id 0 is a valid id, taken at once (only a
    negative id means "no id").

    Schedule: InitProducerId answers id 0, epoch 0: one request (no retry),
    and the batch goes out as producer 0, epoch 0, sequence 0."""
    fake.create_topic("t", 1, leaders=[0])
    fake.control(ApiKey.INIT_PRODUCER_ID, answer_init(0, 0))
    async with open_fake_producer(fake, **exact(idempotent=True)) as producer:
        meta = await producer.send_and_wait("t", b"a", partition=0)
        assert len(init_times(fake)) == 1
        idem = producer._core.idempotence
        assert idem is not None and (idem.producer_id, idem.producer_epoch) == (0, 0)
    assert meta.offset == 0
    assert [b[1:4] for b in sent_batches(fake, "t", 0)] == [(0, 0, 0)]


async def test_the_last_epoch_but_one_is_still_bumped(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """The epoch is an int16: 32767 is the last one a batch can carry
    (``MAX_EPOCH``). A producer at epoch 32766 still bumps locally to 32767;
    only from 32767 does a recovery take a new producer id (sarama #2178's
    limit, not one earlier).

    Schedule (idempotent, t[0] on broker 0): InitProducerId gives id 4242 at
    epoch 32766. a is written; b gets an unexplained
    OUT_OF_ORDER_SEQUENCE_NUMBER: bump to 32767 (same id, no InitProducerId);
    c is written at 32767, sequence 0. d's unexplained gap then needs a new
    id: InitProducerId is asked again, e goes out as the new id, epoch 0."""
    fake.create_topic("t", 1, leaders=[0])
    fake.control(ApiKey.INIT_PRODUCER_ID, answer_init(4242, 32766))
    async with open_fake_producer(fake, **exact(idempotent=True)) as producer:
        await producer.send_and_wait("t", b"a", partition=0)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0)
        b = await outcomes([await producer.send("t", b"b", partition=0)])
        c = await outcomes([await producer.send("t", b"c", partition=0)])
        idem = producer._core.idempotence
        assert idem is not None
        assert (idem.producer_id, idem.producer_epoch, idem.bumps, idem.new_ids) == (
            4242, 32767, 1, 0
        )
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0)
        d = await outcomes([await producer.send("t", b"d", partition=0)])
        e = await outcomes([await producer.send("t", b"e", partition=0)])
        assert (idem.producer_epoch, idem.bumps, idem.new_ids) == (0, 1, 1)
        new_id = idem.producer_id
        assert producer.statistics().double_settles == 0
    assert offsets(b + c + d + e) == [
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, 1, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, 2
    ]
    assert len(fake.requests_of(ApiKey.INIT_PRODUCER_ID)) == 2
    assert [b[1:4] for b in sent_batches(fake, "t", 0)] == [
        (4242, 32766, 0), (4242, 32766, 1), (4242, 32767, 0), (4242, 32767, 1), (new_id, 0, 0)
    ]
    assert values_in_log(fake, "t", 0) == [b"a", b"c", b"e"]


async def test_fenced_ids_are_replaced_and_later_recoveries_still_bump(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """A broker fencing an epoch it got from InitProducerId (INVALID_PRODUCER_EPOCH:
    another producer took the id) makes that id unusable: the recovery takes a
    new id (``_need_new_id``), and so on for the next one. That says nothing
    against bumping epochs locally, which is only given up when a broker
    refused an epoch the producer bumped itself (``_bumped_locally``, tansu):
    a later recovery bumps the newest id's epoch without InitProducerId
    (``local_bumps`` stays on).

    Schedule (idempotent, t[0] on broker 0, confirmed by a): b is answered
    INVALID_PRODUCER_EPOCH (not written): InitProducerId gives id X, b is
    re-stamped and written as X, epoch 0, sequence 0. c is fenced the same way
    (X came from a recovery's InitProducerId, not a local bump): id Y, c
    written as Y/0/0. d then gets an unexplained OUT_OF_ORDER_SEQUENCE_NUMBER:
    Y's epoch is bumped to 1 locally, and e is written as Y, epoch 1,
    sequence 0."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(idempotent=True)) as producer:
        await producer.send_and_wait("t", b"a", partition=0)
        idem = producer._core.idempotence
        assert idem is not None
        ids = [idem.producer_id]
        for value in (b"b", b"c"):
            fake.fail_next(ApiKey.PRODUCE, ErrorCode.INVALID_PRODUCER_EPOCH, node_id=0)
            assert offsets(await outcomes([await producer.send("t", value, partition=0)])) == [
                len(ids)
            ]
            assert idem.producer_id not in ids
            ids.append(idem.producer_id)
            assert (idem.producer_epoch, idem.bumps, idem.local_bumps) == (0, 0, True)
        first, x, y = ids
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0)
        d = await outcomes([await producer.send("t", b"d", partition=0)])
        e = await outcomes([await producer.send("t", b"e", partition=0)])
        assert (idem.producer_id, idem.producer_epoch) == (y, 1)
        assert (idem.bumps, idem.new_ids, idem.local_bumps) == (1, 2, True)
        assert producer.statistics().double_settles == 0
    assert offsets(d + e) == [ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, 3]
    assert len(fake.requests_of(ApiKey.INIT_PRODUCER_ID)) == 3
    assert [b[1:4] for b in sent_batches(fake, "t", 0)] == [
        (first, 0, 0), (first, 0, 1), (x, 0, 0), (x, 0, 1), (y, 0, 0), (y, 0, 1), (y, 1, 0)
    ]
    assert values_in_log(fake, "t", 0) == [b"a", b"b", b"c", b"e"]


async def test_an_old_epochs_batch_failing_after_the_bump_starts_no_new_one(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``batch_failed`` of a batch sealed under an epoch that a recovery
    already replaced starts nothing: the new epoch's sequences start at 0 on
    every partition, so the old batch's gap no longer matters, and another
    bump would only cost a pause (and an epoch).

    Schedule (idempotent, delivery_timeout 2 s, t[0] on broker 0, t[1] on
    broker 1, both confirmed): t0: a (t[0], epoch 0, sequence 1) is answered
    NOT_LEADER_OR_FOLLOWER and waits for its retry; at t0 + 0.0625 broker 0
    stops (t[0] has no leader), so a is never re-sent. b (t[1]) gets an
    unexplained OUT_OF_ORDER_SEQUENCE_NUMBER: nothing is in flight, the epoch
    goes to 1 at once. a expires at t0 + 2 (epoch 0: no bump); c (t[1]) is
    then written with epoch 1, sequence 0."""
    fake.create_topic("t", 2, leaders=[0, 1])
    async with open_fake_producer(
        fake, **exact(idempotent=True, delivery_timeout=2.0, request_timeout=1.0)
    ) as producer:
        for p in range(2):
            await producer.send_and_wait("t", b"warm%d" % p, partition=p)
        idem = producer._core.idempotence
        assert idem is not None
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.NOT_LEADER_OR_FOLLOWER, node_id=0)
        t0 = trio.current_time()
        a = await producer.send("t", b"a", partition=0)
        await trio.sleep(0.0625)
        fake.stop_broker(0, elect=False)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=1)
        b = await outcomes([await producer.send("t", b"b", partition=1)])
        await trio.testing.wait_all_tasks_blocked()
        assert trio.current_time() == t0 + 0.0625
        assert (idem.producer_epoch, idem.bumps) == (1, 1)
        (a_result,) = await outcomes([a])
        assert trio.current_time() == t0 + 2.0
        c = await outcomes([await producer.send("t", b"c", partition=1)])
        assert (idem.producer_epoch, idem.bumps, idem.new_ids) == (1, 1, 0)
        assert producer.statistics().double_settles == 0
    assert isinstance(a_result.cause, DeliveryTimeoutError)
    assert offsets(b + c) == [ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, 1]
    assert [b[2:4] for b in sent_batches(fake, "t", 0)] == [(0, 0), (0, 1)]
    assert [b[2:4] for b in sent_batches(fake, "t", 1)] == [(0, 0), (0, 1), (1, 0)]
    assert values_in_log(fake, "t", 1) == [b"warm1", b"c"]


async def test_a_recovery_logs_one_warning_with_its_first_cause(
    fake: FakeCluster, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``request_bump`` logs a warning when it starts a recovery, not for each
    further cause of the same one (one response can fail many partitions):
    the log names the first cause.

    Schedule (idempotent, t[0] and t[1] both on broker 0, confirmed): a (t[0])
    and b (t[1]) go in one request at t0, answered OUT_OF_ORDER_SEQUENCE_NUMBER
    for both: two unexplained gaps, one recovery (epoch 1), one warning naming
    t[0]'s gap. c, sent after, is written with epoch 1."""
    fake.create_topic("t", 2, leaders=[0, 0])
    caplog.set_level(logging.WARNING, logger="pipeline.producer")
    async with open_fake_producer(fake, **exact(idempotent=True)) as producer:
        for p in range(2):
            await producer.send_and_wait("t", b"warm%d" % p, partition=p)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0)
        before = len(fake.requests_of(ApiKey.PRODUCE))
        t0 = trio.current_time()
        ab = [producer.send_nowait("t", b"a", partition=0), producer.send_nowait("t", b"b", partition=1)]
        failed = await outcomes(ab)
        assert trio.current_time() == t0
        assert len(fake.requests_of(ApiKey.PRODUCE)) == before + 1  # one request
        c = await outcomes([await producer.send("t", b"c", partition=0)])
        idem = producer._core.idempotence
        assert idem is not None and (idem.producer_epoch, idem.bumps) == (1, 1)
    assert offsets(failed + c) == [ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER] * 2 + [1]
    warnings = [r.getMessage() for r in caplog.records if "starting a new epoch" in r.getMessage()]
    assert len(warnings) == 1
    assert "OUT_OF_ORDER_SEQUENCE_NUMBER" in warnings[0] and "partition=0" in warnings[0]


async def test_a_refused_local_bump_is_logged_once(
    fake: FakeCluster, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """When a broker first refuses an epoch the producer bumped itself (tansu's
    PRODUCER_FENCED), the producer warns once that it recovers with new
    producer ids from now on; the same refusal for more partitions of that
    epoch (one response can hold many) adds no warning.

    Schedule (idempotent, t[0], t[1], t[2] all on broker 0, confirmed; the
    broker refuses every batch of an epoch > 0): g (t[0]) gets an unexplained
    OUT_OF_ORDER_SEQUENCE_NUMBER: local bump to epoch 1. a (t[1]) and b (t[2])
    go in one request at epoch 1, both refused: one warning, one new id
    (epoch 0), under which a and b are re-sent and written."""
    fake.create_topic("t", 3, leaders=[0, 0, 0])
    fake.control(ApiKey.PRODUCE, refuse_bumped_epochs, sticky=True)
    caplog.set_level(logging.WARNING, logger="pipeline.producer")
    async with open_fake_producer(fake, **exact(idempotent=True)) as producer:
        for p in range(3):
            await producer.send_and_wait("t", b"warm%d" % p, partition=p)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, node_id=0)
        await outcomes([await producer.send("t", b"g", partition=0)])
        await trio.testing.wait_all_tasks_blocked()
        idem = producer._core.idempotence
        assert idem is not None and (idem.producer_epoch, idem.bumps) == (1, 1)
        before = len(fake.requests_of(ApiKey.PRODUCE))
        ab = await outcomes([producer.send_nowait("t", b"a", partition=1),
                             producer.send_nowait("t", b"b", partition=2)])
        assert (idem.producer_epoch, idem.bumps, idem.new_ids, idem.local_bumps) == (0, 1, 1, False)
        assert producer.statistics().double_settles == 0
    assert offsets(ab) == [1, 1]
    refused = fake.requests_of(ApiKey.PRODUCE)[before]
    assert sorted(p.index for t in refused.request.topic_data for p in t.partition_data) == [1, 2]
    warnings = [r.getMessage() for r in caplog.records if "refused the epoch" in r.getMessage()]
    assert len(warnings) == 1 and "PRODUCER_FENCED" in warnings[0]


async def test_a_fence_of_an_epoch_already_replaced_is_ignored(
    fake: FakeCluster, autojump_clock: Any
) -> None:
    """``epoch_fenced`` for an epoch that is no longer the current one does
    nothing: the recovery that replaced it is done, and the fenced batch is
    re-sent under the new id like any bounced batch. Another new id would only
    cost an InitProducerId and a pause.

    The broker producers no longer produce this call: a recovery waits for the
    wire to drain and nothing is sealed while it runs (the old way round, a
    batch sealed under the old id after a connection wait, was the bug
    ``test_epoch_rules.py::test_nothing_is_sealed_under_the_old_id_while_a_new_one_is_awaited``
    pins), so it is called here directly, as a late answer for the old id would.

    Schedule (idempotent, t[0] on broker 0): t0: a is answered
    INVALID_PRODUCER_EPOCH: a recovery with a new id (InitProducerId at t0,
    answered at once), a re-sent under it. Then the old id's fence arrives
    again: ignored (no pause, no InitProducerId, the id stays) for 1 s."""
    fake.create_topic("t", 1, leaders=[0])
    async with open_fake_producer(fake, **exact(idempotent=True)) as producer:
        await producer.send_and_wait("t", b"warm", partition=0)
        idem = producer._core.idempotence
        assert idem is not None
        old = (idem.producer_id, idem.producer_epoch)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.INVALID_PRODUCER_EPOCH, node_id=0)
        t0 = trio.current_time()
        assert (await producer.send_and_wait("t", b"a", partition=0)).offset == 1
        assert (idem.new_ids, idem.bumps) == (1, 0)
        new = (idem.producer_id, idem.producer_epoch)
        assert new != old
        idem.epoch_fenced(*old, ErrorCode.INVALID_PRODUCER_EPOCH)
        assert not idem.paused
        await trio.sleep(1)
        assert (idem.new_ids, idem.bumps) == (1, 0)
        assert (idem.producer_id, idem.producer_epoch) == new
        assert [r.time - t0 for r in fake.requests_of(ApiKey.INIT_PRODUCER_ID)][1:] == [0]
        assert (await producer.send_and_wait("t", b"b", partition=0)).offset == 2
        assert producer.statistics().double_settles == 0
    assert [b[1:4] for b in sent_batches(fake, "t", 0)][1:] == [
        (old[0], 0, 1), (new[0], 0, 0), (new[0], 0, 1)]
    assert values_in_log(fake, "t", 0) == [b"warm", b"a", b"b"]
