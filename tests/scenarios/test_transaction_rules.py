"""The transactional producer's rules, one each: what every call raises in every state,
the argument checks of ``send_offsets_to_transaction``, the classification of the
coordinator's errors, the abort's drain, EndTxn's bound and shield, the epoch after an
EndTxn, and the transaction version a producer speaks.

Most run a producer against the fake cluster on virtual time (``test_transactions.py``
has the end-to-end schedules); a few drive ``TransactionManager`` alone, where the rule
is one of the state machine's and no schedule reaches it more directly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

from pipeline import (
    ProducerConfig,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionStateError,
    TransactionTimedOutError,
)
from pipeline.producer._errors import (
    BrokerResponseError,
    DeliveryTimeoutError,
    ProducerError,
    TransactionFatalError,
)
from pipeline.producer._stages.envelopes import TopicPartition
from pipeline.producer._stages.transactions import GroupMetadata, State, TransactionManager
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import produce as pm
from pipeline.testing.fake.state import MAX_EPOCH
from pipeline.testing.fake_cluster import FakeCluster
from tests.scenarios.conftest import open_fake_producer
from tests.scenarios.test_transactions import committed_values

TID = "rules-writer"


def txn_options(**overrides: Any) -> dict[str, Any]:
    return {"transactional_id": TID, "idempotent": True, **overrides}


Serve = Callable[..., Awaitable[FakeCluster]]


@pytest.fixture
def serve(nursery: trio.Nursery) -> Serve:
    """``await serve(version, **options)``: a fake cluster with topic "t" (3 partitions)
    and the given finalized transaction.version, running until the test ends."""
    async def start(version: int = 2, **kwargs: Any) -> FakeCluster:
        fake = FakeCluster(brokers=3, seed=4, transaction_version=version,
                           auto_create_topics=False, **kwargs)
        await nursery.start(fake.run)
        fake.create_topic("t", 3)
        return fake
    return start


def away_from_coordinator(fake: FakeCluster) -> tuple[int, int]:
    """A partition of "t" and its leader, which is not the transaction coordinator (so a
    Produce held at the leader does not hold the coordinator's connection)."""
    coordinator = fake.coordinator(TID)
    for p in range(3):
        if fake.leader("t", p) != coordinator:
            return p, fake.leader("t", p)
    raise AssertionError("every partition is led by the coordinator")


# ------------------------------------------------- the state machine on its own


class _Idem:
    producer_id, producer_epoch, paused = 7, 3, False

    def restart(self, pid: int, epoch: int) -> None:
        self.producer_id, self.producer_epoch, self.paused = pid, epoch, False

    async def wait_drained(self) -> None:
        pass


class _NoConnections:
    def open_connections(self) -> list[Any]:
        return []


class _Coordinator:
    """Records AddPartitionsToTxn instead of sending it."""

    version = 0

    def __init__(self) -> None:
        self.added: list[list[TopicPartition]] = []

    async def add_partitions(self, tps: list[TopicPartition], pid: int, epoch: int) -> None:
        self.added.append(list(tps))


def bare_manager() -> TransactionManager:
    config = ProducerConfig(transactional_id=TID, idempotent=True)
    return TransactionManager(config, _NoConnections(), _Idem(),  # type: ignore[arg-type]
                              lambda attempt: 0.1, purge=lambda error: None,
                              wake=lambda: None, records_failed=lambda: 0)


async def test_fatal_holds_in_any_state_and_keeps_its_first_cause() -> None:
    """The stages may call ``fatal`` at any time (a broker fencing the epoch), before any
    transaction too; later errors (fatal or abortable) never replace the first cause."""
    txn = bare_manager()  # on_state left as it comes: the manager works without one
    txn.initialized()
    first = ProducerFencedError("fenced first")
    txn.fatal(first)
    txn.fatal(TransactionFatalError("second"))
    txn.abortable(TransactionAbortableError("late"))
    assert txn.state == State.FATAL and txn.error is first
    with pytest.raises(ProducerFencedError) as caught:
        txn.begin()
    assert caught.value is first
    assert txn.refusal() is first


async def test_an_abortable_error_outside_a_transaction_changes_nothing() -> None:
    """A record of an ended transaction failing late must not poison the next one."""
    txn = bare_manager()
    txn.initialized()
    txn.abortable(TransactionAbortableError("late"))
    assert txn.state == State.READY and txn.error is None
    txn.begin()
    assert txn.state == State.IN_TRANSACTION


async def test_without_a_live_connection_the_version_is_1_and_flush_must_be_set() -> None:
    """No connection tells the cluster's transaction.version: the protocol every broker
    speaks (v1). A commit before the producer set ``flush`` fails loudly."""
    txn = bare_manager()
    txn.initialized()
    txn.begin()
    assert txn.version == 1
    with pytest.raises(BaseExceptionGroup) as caught:  # (raised in commit's nursery)
        await txn.commit()
    assert caught.group_contains(RuntimeError, match="flush was not set", depth=None)


async def test_the_adder_adds_nothing_once_the_transaction_cannot_commit(
        autojump_clock: trio.testing.MockClock) -> None:
    """v1: a partition waiting to be added when the transaction became abortable is not
    added any more (the abort ends the transaction; adding would only extend it)."""
    txn = bare_manager()
    coord = _Coordinator()
    txn._coord = coord  # type: ignore[assignment]
    txn.initialized()
    txn.begin()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(txn.run_adder)
        assert txn.partition_ready(TopicPartition("t", 0)) is False
        txn.abortable(TransactionAbortableError("a record failed"))
        await trio.sleep(1.0)
        assert coord.added == []
        txn.state = State.IN_TRANSACTION  # (as a fresh transaction would be)
        txn._add_wanted.set()
        await trio.sleep(1.0)
        assert coord.added == [[TopicPartition("t", 0)]]
        nursery.cancel_scope.cancel()


# ------------------------------------------------------- what each call raises


async def test_in_an_abortable_transaction_calls_raise_its_error_and_begin_says_abort(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve()
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.TOPIC_AUTHORIZATION_FAILED, topic="t")
        await producer.send("t", b"bad", partition=0)
        with pytest.raises(TransactionAbortableError) as first:
            await producer.commit_transaction()
        with pytest.raises(TransactionAbortableError) as again:
            await producer.commit_transaction()
        assert again.value is first.value
        with pytest.raises(TransactionAbortableError) as offsets:
            await producer.send_offsets_to_transaction({("in", 0): 1}, "g")
        assert offsets.value is first.value
        with pytest.raises(TransactionStateError,
                           match=r"cannot begin a transaction: the transaction must be "
                                 r"aborted first \(abort_transaction\(\)\)"):
            await producer.begin_transaction()
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send("t", b"next", partition=0)
    assert await committed_values(fake) == [b"next"]


async def test_calls_with_no_transaction_open_are_told_to_begin_one(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve()
    async with open_fake_producer(fake, **txn_options()) as producer:
        with pytest.raises(TransactionStateError,
                           match="cannot send offsets to the transaction: no transaction is open"):
            await producer.send_offsets_to_transaction({("in", 0): 1}, "g")
        with pytest.raises(TransactionStateError,
                           match="cannot abort the transaction: no transaction is open"):
            await producer.abort_transaction()
    assert fake.requests_of(ApiKey.TXN_OFFSET_COMMIT) == []
    assert fake.requests_of(ApiKey.END_TXN) == []


async def test_while_an_abort_drains_sends_are_refused_and_it_waits_for_the_wire(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """The abort refuses records at once (ABORTING) and sends EndTxn only when no Produce
    of the transaction is in flight any more: a write landing after the abort marker
    would belong to no transaction."""
    fake = await serve()
    async with open_fake_producer(fake, **txn_options()) as producer:
        p, leader = away_from_coordinator(fake)
        await producer.begin_transaction()
        fake.delay_responses(2.0, api_key=ApiKey.PRODUCE, node_id=leader, count=1,
                             before_apply=True)
        held = await producer.send("t", b"held", partition=p)
        await trio.sleep(0.5)  # the Produce is on the wire
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer.abort_transaction)
            await trio.sleep(0.5)
            with pytest.raises(TransactionStateError, match="while the transaction aborts"):
                await producer.send("t", b"refused", partition=p)
            with pytest.raises(TransactionStateError,
                               match="cannot commit the transaction: the transaction is "
                                     "being aborted"):
                await producer.commit_transaction()
        assert trio.current_time() - start >= 1.5  # the held Produce was answered first
        assert held.done()
        (end,) = fake.requests_of(ApiKey.END_TXN)
        assert end.request.committed is False
    assert await committed_values(fake) == []


async def test_an_abort_fails_held_records_at_once(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """Records lingering in a stage fail with TransactionAbortedError the moment the
    abort starts; nothing of them is sent."""
    fake = await serve()
    async with open_fake_producer(fake, **txn_options(linger=5.0)) as producer:
        await producer.begin_transaction()
        held = [await producer.send("t", b"x%d" % i, partition=i % 3) for i in range(6)]
        await trio.sleep(0.5)  # every record reached its partition's stage (metadata came)
        start = trio.current_time()
        await producer.abort_transaction()
        assert trio.current_time() - start < 0.05
        for d in held:
            with pytest.raises(ProducerError) as failed:
                await d
            assert isinstance(failed.value.cause, TransactionAbortedError)
    assert fake.requests_of(ApiKey.PRODUCE) == []


async def test_an_abort_also_fails_records_still_on_their_way_to_a_stage(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """Records accepted just before the abort may still be on their way to their stage
    when it starts (here the producer's first metadata of the topic is due only after
    its retry backoff) and then wait there (their partition has no leader): the drain
    fails them once they arrive, not at their delivery timeout."""
    fake = await serve()
    p, leader = away_from_coordinator(fake)
    fake.stop_broker(leader, elect=False)
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        held = [await producer.send("t", b"x%d" % i, partition=p) for i in range(3)]
        start = trio.current_time()
        await producer.abort_transaction()
        assert trio.current_time() - start < 1.0
        for d in held:
            with pytest.raises(ProducerError) as failed:
                await d
            assert isinstance(failed.value.cause, TransactionAbortedError)
    assert fake.requests_of(ApiKey.PRODUCE) == []


def three_roles(fake: FakeCluster) -> tuple[int, int, int]:
    """Partitions of "t": one led by the transaction coordinator, and two led by the
    other two brokers (so each can be stopped or slowed without the others)."""
    coordinator = fake.coordinator(TID)
    by_leader = {fake.leader("t", p): p for p in range(3)}
    assert len(by_leader) == 3, "each broker leads one partition of t"
    others = sorted(node for node in by_leader if node != coordinator)
    return by_leader[coordinator], by_leader[others[0]], by_leader[others[1]]


@pytest.mark.parametrize("version", [2, 1], ids=["v2", "v1"])
@pytest.mark.parametrize("code", [ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED])
async def test_a_fenced_batch_fails_the_rest_of_its_transaction_at_once(
        serve: Serve, autojump_clock: trio.testing.MockClock, code: ErrorCode,
        version: int) -> None:
    """A broker refuses a batch's epoch: that batch fails at once with the transaction's
    error (INVALID_PRODUCER_EPOCH: abortable; PRODUCER_FENCED: fatal), and so does the
    rest of the transaction: a record waiting for its partition's leader, one whose
    Produce is on the wire (its late answer changes nothing), none of them retried or
    held until its delivery_timeout (60 s here). An abortable transaction aborts and
    the producer goes on, on every partition: the refused batch's sequences were never
    written, so under v1 (EndTxn keeps the epoch) the abort bumps the epoch, or the
    refused partition's next batch would be out of order."""
    fake = await serve(version)
    fenced_p, parked_p, wire_p = three_roles(fake)
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        for p in range(3):  # metadata, connections, every partition in the transaction
            await producer.send("t", b"first", partition=p)
        await producer.flush()
        stopped = fake.leader("t", parked_p)
        fake.stop_broker(stopped, elect=False)
        parked = await producer.send("t", b"parked", partition=parked_p)
        fake.delay_responses(4.0, api_key=ApiKey.PRODUCE, node_id=fake.leader("t", wire_p),
                             count=1)
        on_wire = await producer.send("t", b"on the wire", partition=wire_p)
        await trio.sleep(0.5)  # parked waits for a leader; on_wire's answer is due at 4.5
        fake.fail_next(ApiKey.PRODUCE, code, topic="t", partition=fenced_p)
        refused = await producer.send("t", b"refused", partition=fenced_p)
        start = trio.current_time()
        with trio.fail_after(1.0), pytest.raises(ProducerError) as first:
            await refused
        error = first.value.cause
        expected = (TransactionAbortableError if code == ErrorCode.INVALID_PRODUCER_EPOCH
                    else ProducerFencedError)
        assert type(error) is expected and error.code == code
        for d in (parked, on_wire):
            with pytest.raises(ProducerError) as failed:
                await d
            assert failed.value.cause is error
        assert trio.current_time() - start < 0.1
        with pytest.raises(expected) as commit:
            await producer.commit_transaction()
        assert commit.value is error
        fake.restart_broker(stopped)
        if code == ErrorCode.PRODUCER_FENCED:
            for call in (producer.abort_transaction, producer.begin_transaction):
                with pytest.raises(ProducerFencedError) as again:
                    await call()
                assert again.value is error
            return
        await producer.abort_transaction()
        async with producer.transaction():
            for p in (fenced_p, parked_p):
                await producer.send("t", b"next", partition=p)
    assert await committed_values(fake) == [b"next", b"next"]


async def test_each_refused_batch_of_an_answer_fails_with_its_own_cause(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """One Produce answer refuses two batches of the transaction: v[0] for good
    (TOPIC_AUTHORIZATION_FAILED: the transaction becomes abortable, it lost its record
    order), then v[1] for its epoch. Each record fails with what its own partition was
    answered: v[1] with the epoch's TransactionAbortableError (INVALID_PRODUCER_EPOCH),
    not with the error the transaction already had."""
    fake = await serve()
    fake.create_topic("v", 2, leaders=[0, 0])  # one leader: one request carries both

    def answer(ctx: Any) -> pm.ProduceResponse | None:
        codes = {0: ErrorCode.TOPIC_AUTHORIZATION_FAILED, 1: ErrorCode.INVALID_PRODUCER_EPOCH}
        parts = [p.index for t in ctx.request.topic_data for p in t.partition_data]
        if sorted(parts) != [0, 1]:
            return None
        return pm.ProduceResponse(responses=tuple(
            pm.TopicProduceResponse(name=t.name, partition_responses=tuple(
                pm.PartitionProduceResponse(index=p.index, error_code=codes[p.index],
                                            base_offset=-1, log_append_time_ms=-1,
                                            log_start_offset=-1)
                for p in t.partition_data))
            for t in ctx.request.topic_data))

    async with open_fake_producer(fake, **txn_options(linger=0.5)) as producer:
        await producer.begin_transaction()
        for p in (0, 1):  # (the broker producer's queues, in this order: v[0] is answered first)
            await producer.send_and_wait("v", b"warm", partition=p)
        fake.control(ApiKey.PRODUCE, answer)
        a = await producer.send("v", b"a", partition=0)
        b = await producer.send("v", b"b", partition=1)
        with pytest.raises(ProducerError) as failed_a:
            await a
        with pytest.raises(ProducerError) as failed_b:
            await b
        assert isinstance(failed_a.value.cause, BrokerResponseError)
        assert failed_a.value.cause.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        cause_b = failed_b.value.cause
        assert isinstance(cause_b, TransactionAbortableError)
        assert cause_b.code == ErrorCode.INVALID_PRODUCER_EPOCH
        with pytest.raises(TransactionAbortableError, match="lost its record order"):
            await producer.commit_transaction()
        await producer.abort_transaction()


async def test_a_commit_stops_waiting_once_the_transaction_failed(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """A commit waits for every record of the transaction to have its outcome, but not
    once the transaction cannot commit: it raises the transaction's error then, though
    a record is still on its way to its stage (its topic's metadata is held back 30 s;
    the record fails when it gets there)."""
    fake = await serve()
    fake.create_topic("u", 1)
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        await producer.send("t", b"first", partition=0)
        await producer.flush()
        slow = fake.delay_responses(30.0, api_key=ApiKey.METADATA)
        waiting = await producer.send("u", b"waiting", partition=0)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.INVALID_PRODUCER_EPOCH, topic="t", partition=0)
        await producer.send("t", b"refused", partition=0)
        start = trio.current_time()
        with pytest.raises(TransactionAbortableError, match="INVALID_PRODUCER_EPOCH"):
            await producer.commit_transaction()
        assert trio.current_time() - start < 0.1
        assert not waiting.done()
        slow.remove()
        with pytest.raises(ProducerError) as failed:
            await waiting
        assert isinstance(failed.value.cause, TransactionAbortableError)
        await producer.abort_transaction()


class HeldInbox:
    """Stands in for a stage's inbox: keeps what is handed to it until ``release``,
    so a test chooses when it arrives (trio alone may deliver it either side of an
    event of the same instant)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.items: list[Any] = []

    def send_nowait(self, item: Any) -> None:
        self.items.append(item)

    async def send(self, item: Any) -> None:
        self.items.append(item)

    def release(self) -> None:
        for item in self.items:
            self.real.send_nowait(item)


async def test_records_reaching_a_stage_after_the_transaction_failed_fail_there(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """Records accepted before the transaction failed may still be between two stages
    when its records are failed: each stage fails them when they arrive, instead of
    holding them (sealing is paused after a fenced epoch) until their delivery_timeout.
    Here one is on its way to a broker producer (its partition producer is attached),
    one to a partition producer that waits for a leader."""
    fake = await serve()
    fenced_p, leaderless_p, attached_p = three_roles(fake)
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        for p in range(3):
            await producer.send("t", b"first", partition=p)
        await producer.flush()
        core = producer._core
        stopped = fake.leader("t", leaderless_p)
        fake.stop_broker(stopped, elect=False)
        waiting = await producer.send("t", b"parked", partition=leaderless_p)
        await trio.sleep(0.5)  # its partition producer left the stopped broker
        pp = core._pps[TopicPartition("t", leaderless_p)]
        assert pp.bp is None
        to_pp = pp.inbox = HeldInbox(pp.inbox)  # type: ignore[assignment]
        bp = core._bps[fake.leader("t", attached_p)]
        to_bp = bp.inbox = HeldInbox(bp.inbox)  # type: ignore[assignment]
        late = [await producer.send("t", b"late", partition=p)
                for p in (leaderless_p, attached_p)]
        await trio.sleep(0.01)
        assert to_pp.items and to_bp.items  # each on its way, held there
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.INVALID_PRODUCER_EPOCH, topic="t",
                       partition=fenced_p)
        refused = await producer.send("t", b"refused", partition=fenced_p)
        with pytest.raises(ProducerError) as first:
            await refused
        with pytest.raises(ProducerError):
            await waiting  # (failed by the purge)
        start = trio.current_time()
        produced = len(fake.requests_of(ApiKey.PRODUCE))
        to_pp.release()
        to_bp.release()
        pp.inbox, bp.inbox = to_pp.real, to_bp.real
        for d in late:
            with pytest.raises(ProducerError) as failed:
                await d
            assert failed.value.cause is first.value.cause
        assert trio.current_time() - start < 0.1
        assert len(fake.requests_of(ApiKey.PRODUCE)) == produced
        fake.restart_broker(stopped)
        await producer.abort_transaction()


async def test_a_record_that_expired_unsent_stops_the_commit_and_keeps_its_cause(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """A record that failed without the transaction being told (it expired before it was
    ever sent: no sequence problem) still stops the commit: it would be missing from a
    committed transaction. After an earlier abort the record's outcome is its own cause,
    not the abort's error."""
    options = txn_options(delivery_timeout=10.0)
    fake = await serve()
    async with open_fake_producer(fake, **options) as producer:
        p, leader = away_from_coordinator(fake)
        await producer.begin_transaction()
        await producer.send("t", b"aborted", partition=p)
        await producer.abort_transaction()
        fake.stop_broker(leader, elect=False)
        await producer.begin_transaction()
        lost = await producer.send("t", b"lost", partition=p)
        with pytest.raises(TransactionAbortableError,
                           match=r"1 record\(s\) of the transaction were not delivered"):
            await producer.commit_transaction()
        with pytest.raises(ProducerError) as failed:
            await lost
        assert isinstance(failed.value.cause, DeliveryTimeoutError)
        await producer.abort_transaction()


# ------------------------------------------------------------------------- offsets


async def test_offsets_keys_and_values_are_checked_with_clear_errors(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    class Key:  # what another client's TopicPartition looks like (attributes)
        topic, partition = "in", 2

    fake = await serve()
    async with open_fake_producer(fake, **txn_options()) as producer:
        async with producer.transaction():
            for bad in [("in", -1), ("in", "0"), (5, 0), ("in", 0, 1), "in-0", ("in",)]:
                with pytest.raises(TypeError,
                                   match=r"offsets keys must be \(topic, partition\) pairs"):
                    await producer.send_offsets_to_transaction({bad: 1}, "g")
            with pytest.raises(ValueError, match="the group id is empty"):
                await producer.send_offsets_to_transaction({("in", 0): 1}, "")
            with pytest.raises(ValueError, match=r"offset for in\[0\] must be an int >= 0"):
                await producer.send_offsets_to_transaction({("in", 0): True}, "g")
            assert fake.requests_of(ApiKey.TXN_OFFSET_COMMIT) == []
            await producer.send_offsets_to_transaction({("in", 0): 0, Key(): 4}, "g")
    assert fake.offsets.fetch("g", ("in", 0)).offset == 0  # type: ignore[union-attr]
    assert fake.offsets.fetch("g", ("in", 2)).offset == 4  # type: ignore[union-attr]


async def test_no_offsets_send_nothing(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve(version=1)
    async with open_fake_producer(fake, **txn_options()) as producer:
        async with producer.transaction():
            await producer.send_offsets_to_transaction({}, "g")
    for api in (ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.TXN_OFFSET_COMMIT, ApiKey.END_TXN):
        assert fake.requests_of(api) == []


@pytest.mark.parametrize("version", [1, 2])
async def test_a_group_is_added_to_a_v1_transaction_once(
        serve: Serve, version: int, autojump_clock: trio.testing.MockClock) -> None:
    """v1: AddOffsetsToTxn once per group and transaction, before its first
    TxnOffsetCommit; v2: never (TxnOffsetCommit v5 adds the group itself). A transaction
    of offsets alone commits them."""
    fake = await serve(version)
    async with open_fake_producer(fake, **txn_options()) as producer:
        async with producer.transaction():
            await producer.send_offsets_to_transaction({("in", 0): 1}, "a")
            await producer.send_offsets_to_transaction({("in", 0): 2}, "a")
            await producer.send_offsets_to_transaction({("in", 1): 3}, GroupMetadata("b"))
        async with producer.transaction():
            await producer.send_offsets_to_transaction({("in", 0): 5}, "a")
    added = [r.request.group_id for r in fake.requests_of(ApiKey.ADD_OFFSETS_TO_TXN)]
    assert added == (["a", "b", "a"] if version == 1 else [])
    assert fake.offsets.fetch("a", ("in", 0)).offset == 5  # type: ignore[union-attr]
    assert fake.offsets.fetch("b", ("in", 1)).offset == 3  # type: ignore[union-attr]


REFUSALS = [(ApiKey.TXN_OFFSET_COMMIT, 2, ErrorCode.GROUP_AUTHORIZATION_FAILED),
            (ApiKey.ADD_PARTITIONS_TO_TXN, 1, ErrorCode.TOPIC_AUTHORIZATION_FAILED)]


@pytest.mark.parametrize(("api", "version", "denied"), REFUSALS,
                         ids=["offset-commit", "v1-partition-addition"])
@pytest.mark.parametrize("fenced", [False, True], ids=["abortable", "fenced"])
async def test_a_refused_addition_makes_the_transaction_abortable_or_the_producer_fatal(
        serve: Serve, autojump_clock: trio.testing.MockClock, api: ApiKey, version: int,
        denied: ErrorCode, fenced: bool) -> None:
    """The coordinator refuses what joins the transaction (its offsets, or under v1 a
    partition): a refusal no retry changes (authorization) makes the transaction
    abortable, so the commit raises that same error and an abort goes on; a fence makes
    the producer fatal, so abort and begin raise the same error. Either is raised at
    once (not after the records' delivery timeout), naming the request and the code."""
    offsets = api == ApiKey.TXN_OFFSET_COMMIT
    code = ErrorCode.PRODUCER_FENCED if fenced else denied
    fake = await serve(version)
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        fake.fail_next(api, code)
        start = trio.current_time()
        if offsets:
            meet = partial(producer.send_offsets_to_transaction, {("in", 0): 1}, "g")
        else:
            await producer.send("t", b"x", partition=0)
            meet = producer.commit_transaction
        with pytest.raises(ProducerFencedError if fenced else TransactionAbortableError) as e:
            await meet()
        assert trio.current_time() - start < 1.0
        assert code.name in str(e.value)
        assert ("TxnOffsetCommit" if offsets else "AddPartitionsToTxn") in str(e.value)
        later = ((producer.abort_transaction, producer.begin_transaction) if fenced
                 else (producer.commit_transaction,))
        for call in later:
            with pytest.raises(type(e.value)) as again:
                await call()
            assert again.value is e.value
        if fenced:
            return
        await producer.abort_transaction()
        async with producer.transaction():
            if offsets:
                await producer.send_offsets_to_transaction({("in", 0): 2}, "g")
            else:
                await producer.send("t", b"y", partition=0)
    if offsets:
        assert fake.offsets.fetch("g", ("in", 0)).offset == 2  # type: ignore[union-attr]
    else:
        assert await committed_values(fake) == [b"y"]


async def test_an_abort_raises_the_fence_the_addition_it_waited_for_met(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """v1: an abort waits for the AddPartitionsToTxn on the wire (if applied, the
    coordinator's transaction is open and must be ended). When the coordinator refuses
    it as fenced (another producer of the id initialised meanwhile), the abort raises
    ProducerFencedError and the producer stays fenced: it does not return as if it had
    ended the transaction."""
    fake = await serve(version=1)
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        fake.delay_responses(1.0, api_key=ApiKey.ADD_PARTITIONS_TO_TXN, count=1,
                             before_apply=True)
        producer.send_nowait("t", b"x", partition=0)
        await trio.sleep(0.5)  # its AddPartitionsToTxn is on the wire (from t + 0.125)
        async with open_fake_producer(fake, **txn_options()):  # takes the id over
            with pytest.raises(ProducerFencedError) as e:
                await producer.abort_transaction()
            assert "AddPartitionsToTxn" in str(e.value)
            with pytest.raises(ProducerFencedError):
                await producer.begin_transaction()
    assert not fake.requests_of(ApiKey.END_TXN)


@pytest.mark.parametrize("version", [1, 2])
async def test_offsets_refused_after_the_coordinators_timeout_abort_are_abortable(
        serve: Serve, autojump_clock: trio.testing.MockClock, version: int) -> None:
    """The coordinator aborts a transaction open longer than transaction_timeout and
    bumps the epoch; its offsets are then refused (v2: TxnOffsetCommit answered
    INVALID_PRODUCER_EPOCH; v1: AddOffsetsToTxn answered PRODUCER_FENCED). No other
    producer took the id over: that is TransactionTimedOutError, abortable, not a fence
    (a commit raises it again); the abort takes the producer on, and it goes on."""
    fake = await serve(version=version)
    async with open_fake_producer(fake, **txn_options(transaction_timeout=1.0)) as producer:
        await producer.begin_transaction()
        await producer.send("t", b"x", partition=0)
        await trio.sleep(3.0)  # the coordinator's timeout aborts it
        with pytest.raises(TransactionTimedOutError) as e:
            await producer.send_offsets_to_transaction({("in", 0): 1}, "g")
        fenced = e.value.__cause__
        assert isinstance(fenced, ProducerFencedError) and fenced.code is not None
        assert fenced.code.name == ("INVALID_PRODUCER_EPOCH" if version == 2
                                    else "PRODUCER_FENCED")
        assert f"its offsets were answered {fenced.code.name}" in str(e.value)
        with pytest.raises(TransactionTimedOutError) as again:
            await producer.commit_transaction()
        assert again.value is e.value
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send_offsets_to_transaction({("in", 0): 2}, "g")
    assert fake.offsets.fetch("g", ("in", 0)).offset == 2  # type: ignore[union-attr]


# ------------------------------------------------- v1: adding partitions


async def test_v1_adds_each_partition_once(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve(version=1)
    async with open_fake_producer(fake, **txn_options()) as producer:
        async with producer.transaction():
            await producer.send("t", b"a", partition=0)
            await producer.flush()
            await producer.send("t", b"b", partition=1)
            await producer.flush()
            await producer.send("t", b"c", partition=0)
    added = [[(t.name, p) for t in r.request.v3_and_below_topics for p in t.partitions]
             for r in fake.requests_of(ApiKey.ADD_PARTITIONS_TO_TXN)]
    assert added == [[("t", 0)], [("t", 1)]]


# --------------------------------------------------------------- choosing the version


async def test_a_cluster_without_the_transaction_version_feature_gets_v1(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve(version=0)
    async with open_fake_producer(fake, **txn_options()) as producer:
        async with producer.transaction():
            await producer.send("t", b"x", partition=0)
        assert producer._txn is not None and producer._txn.version == 1
    assert fake.requests_of(ApiKey.ADD_PARTITIONS_TO_TXN)
    assert max(r.api_version for r in fake.requests_of(ApiKey.PRODUCE)) <= 11
    assert await committed_values(fake) == [b"x"]


# ------------------------------------------------------------ cancelling a commit


async def test_a_commit_cancelled_during_its_flush_leaves_the_transaction_open(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """A commit cancelled while it flushes sent no EndTxn: the transaction is still open,
    so the caller may send more and commit again, and a transaction() block cancelled in
    its commit aborts it (the producer is ready afterwards, not stuck committing)."""
    fake = await serve()
    async with open_fake_producer(fake, **txn_options()) as producer:
        txn = producer._txn
        assert txn is not None
        p, leader = away_from_coordinator(fake)
        await producer.begin_transaction()
        fake.delay_responses(2.0, api_key=ApiKey.PRODUCE, node_id=leader, count=1)
        await producer.send("t", b"slow", partition=p)
        with trio.move_on_after(0.5) as cancelled:
            await producer.commit_transaction()
        assert cancelled.cancelled_caught
        assert txn.state == State.IN_TRANSACTION
        assert fake.requests_of(ApiKey.END_TXN) == []
        await producer.send("t", b"more", partition=p)
        await producer.commit_transaction()
        with trio.move_on_after(0.5) as cancelled:
            async with producer.transaction():
                fake.delay_responses(2.0, api_key=ApiKey.PRODUCE, node_id=leader, count=1)
                await producer.send("t", b"cancelled", partition=p)
        assert cancelled.cancelled_caught
        assert txn.state == State.READY
        assert [r.request.committed for r in fake.requests_of(ApiKey.END_TXN)] == [True, False]
    assert await committed_values(fake) == [b"slow", b"more"]


@pytest.mark.parametrize("code", [ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED],
                         ids=["abortable", "fatal"])
async def test_a_commit_cancelled_as_its_transaction_fails_does_not_reopen_it(
        serve: Serve, autojump_clock: trio.testing.MockClock, code: ErrorCode) -> None:
    """The caller's cancellation can end a commit's flush in the very step the
    transaction fails (here the refused record's on_delivery callback cancels the
    commit, before the commit's own watch for the failure runs). The transaction stays
    failed with its error (abortable, or the producer fatal): it is not reopened, so
    sends are still refused with that error, and only an abort (abortable) goes on."""
    fake = await serve()
    async with open_fake_producer(fake, **txn_options()) as producer:
        txn = producer._txn
        assert txn is not None
        await producer.begin_transaction()
        await producer.send_and_wait("t", b"first", partition=0)  # (metadata, connection)
        fake.fail_next(ApiKey.PRODUCE, code, topic="t", partition=0)
        errors: list[BaseException | None] = []
        with trio.CancelScope() as scope:
            def cancel_the_commit(metadata: Any, error: BaseException | None) -> None:
                errors.append(error)
                scope.cancel()

            await producer.send("t", b"refused", partition=0, on_delivery=cancel_the_commit)
            await producer.commit_transaction()
        assert scope.cancelled_caught
        (failed,) = errors
        assert isinstance(failed, ProducerError)
        cause = failed.cause
        fatal = code == ErrorCode.PRODUCER_FENCED
        assert isinstance(cause, ProducerFencedError if fatal else TransactionAbortableError)
        assert txn.state == (State.FATAL if fatal else State.ABORTABLE)
        assert txn.error is cause
        with pytest.raises(type(cause)) as refused:
            await producer.send("t", b"refused too", partition=0)
        assert refused.value is cause
        if fatal:
            with pytest.raises(ProducerFencedError) as again:
                await producer.begin_transaction()
            assert again.value is cause
            return
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send("t", b"next", partition=0)
    assert await committed_values(fake) == [b"next"]


# ------------------------------------------------------------------------- EndTxn


async def test_an_end_txn_that_never_answers_is_bounded_and_fatal(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    options = txn_options(transaction_timeout=20.0)
    fake = await serve()
    async with open_fake_producer(fake, **options) as producer:
        await producer.begin_transaction()
        await producer.send("t", b"x", partition=0)
        await producer.flush()  # (written: the coordinator has a transaction to end)
        fake.delay_responses(1000.0, api_key=ApiKey.END_TXN)
        start = trio.current_time()
        with pytest.raises(TransactionFatalError,
                           match=r"EndTxn \(abort\) got no answer within transaction_timeout "
                                 r"\+ request_timeout = 25\.0s") as e:
            await producer.abort_transaction()
        assert trio.current_time() - start == pytest.approx(25.0, abs=0.5)
        with pytest.raises(TransactionFatalError) as again:
            await producer.begin_transaction()
        assert again.value is e.value
        fake.clear_faults()


async def test_a_cancelled_commit_still_ends_its_transaction(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """EndTxn is shielded: cancelling the caller while it is on the wire leaves the
    transaction committed and the producer ready, not stuck in COMMITTING."""
    fake = await serve()
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        await producer.send("t", b"x", partition=0)
        await producer.flush()
        fake.delay_responses(1.0, api_key=ApiKey.END_TXN, count=1)
        with trio.move_on_after(0.5):
            await producer.commit_transaction()
        assert producer._txn is not None and producer._txn.state == State.READY
        assert fake.transaction(TID).state == "CompleteCommit"
        async with producer.transaction():
            await producer.send("t", b"y", partition=0)
    assert await committed_values(fake) == [b"x", b"y"]


async def sequence_problem(fake: FakeCluster, producer: Any) -> None:
    """v1: a sequence problem in the open transaction (it becomes abortable and sealing
    pauses until the abort bumps the epoch)."""
    await producer.begin_transaction()
    fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, topic="t")
    await producer.send("t", b"x", partition=0)
    with pytest.raises(TransactionAbortableError):
        await producer.commit_transaction()


@pytest.mark.parametrize("case", ["sequence-problem", "refused-epoch", "bump-cancelled"])
async def test_v1_an_abort_after_a_sequence_error_bumps_the_epoch(
        serve: Serve, autojump_clock: trio.testing.MockClock, case: str) -> None:
    """v1's EndTxn keeps the epoch, so after a sequence problem in the transaction the
    abort bumps it (InitProducerId) and the partitions start again at sequence 0.
    ``refused-epoch``: a lone batch answered INVALID_PRODUCER_EPOCH (nothing else of the
    transaction in flight or sealed: its sequences were never written) is such a problem.
    ``bump-cancelled``: the bump is shielded, so cancelling the abort while
    InitProducerId is on the wire still leaves the producer ready on the new epoch."""
    fake = await serve(version=1)
    async with open_fake_producer(fake, **txn_options()) as producer:
        idem = producer._core.idempotence
        assert idem is not None
        pid, first = idem.producer_id, idem.producer_epoch
        if case == "refused-epoch":
            await producer.begin_transaction()
            fake.fail_next(ApiKey.PRODUCE, ErrorCode.INVALID_PRODUCER_EPOCH, topic="t",
                           partition=0)
            refused = await producer.send("t", b"x", partition=0)
            with pytest.raises(ProducerError):
                await refused
        else:
            await sequence_problem(fake, producer)
        if case == "bump-cancelled":
            fake.delay_responses(1.0, api_key=ApiKey.INIT_PRODUCER_ID, count=1)
            with trio.move_on_after(0.5):
                await producer.abort_transaction()
            assert producer._txn is not None and producer._txn.state == State.READY
        else:
            await producer.abort_transaction()
        assert (idem.producer_id, idem.producer_epoch) == (pid, first + 1)
        async with producer.transaction():
            await producer.send("t", b"y", partition=0)
    assert await committed_values(fake) == [b"y"]


async def test_producer_id_0_is_a_real_id(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """A fresh Kafka cluster hands out producer id 0 first: EndTxn's answer with id 0 (a
    commit, and the abort after a lost commit) is the id and epoch to go on with."""
    fake = await serve(first_producer_id=0)
    async with open_fake_producer(fake, **txn_options()) as producer:
        idem = producer._core.idempotence
        assert (idem.producer_id, idem.producer_epoch) == (0, 0)
        async with producer.transaction():
            await producer.send("t", b"a", partition=0)
        assert (idem.producer_id, idem.producer_epoch) == (0, 1)
        await producer.begin_transaction()
        await producer.send("t", b"lost", partition=0)
        fake.drop_next_request(ApiKey.END_TXN)
        with pytest.raises(TransactionAbortedError):
            await producer.commit_transaction()
        assert (idem.producer_id, idem.producer_epoch) == (0, 2)
        assert producer._txn is not None and producer._txn.aborted == 1
        async with producer.transaction():
            await producer.send("t", b"b", partition=0)
    assert await committed_values(fake) == [b"a", b"b"]


def exhaust_epoch(fake: FakeCluster) -> None:
    """The next InitProducerId gives the last epoch of the producer id: the next EndTxn
    v5 moves to a new producer id at epoch 0."""
    meta = fake.transaction(TID)
    meta.epoch = meta.last_epoch = MAX_EPOCH - 2


async def test_an_exhausted_epoch_goes_on_with_the_new_producer_id(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve()
    async with open_fake_producer(fake, **txn_options()):
        pass
    exhaust_epoch(fake)
    async with open_fake_producer(fake, **txn_options()) as producer:
        idem = producer._core.idempotence
        old = idem.producer_id
        assert idem.producer_epoch == MAX_EPOCH - 1
        async with producer.transaction():
            await producer.send("t", b"a", partition=0)
        assert idem.producer_id != old and idem.producer_epoch == 0
        async with producer.transaction():
            await producer.send("t", b"b", partition=0)
    exhaust_epoch(fake)
    async with open_fake_producer(fake, **txn_options()) as producer:
        idem = producer._core.idempotence
        old = idem.producer_id
        await producer.begin_transaction()
        await producer.send("t", b"lost", partition=0)
        fake.drop_next_request(ApiKey.END_TXN)
        with pytest.raises(TransactionAbortedError):
            await producer.commit_transaction()
        assert idem.producer_id != old and idem.producer_epoch == 0
        async with producer.transaction():
            await producer.send("t", b"c", partition=0)
    assert await committed_values(fake) == [b"a", b"b", b"c"]


async def test_a_refused_abort_after_a_lost_commit_is_not_taken_for_the_commit(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """Only INVALID_TXN_STATE says the lost commit completed; any other refusal of the
    abort is raised as it is."""
    fake = await serve()
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        await producer.send("t", b"x", partition=0)
        fake.drop_next_request(ApiKey.END_TXN)
        fake.fail_next(ApiKey.END_TXN, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        with pytest.raises(TransactionFatalError, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
            await producer.commit_transaction()
    assert fake.requests_of(ApiKey.INIT_PRODUCER_ID)[-1].request.producer_id == -1
    assert len(fake.requests_of(ApiKey.INIT_PRODUCER_ID)) == 1


# --------------------------------------------------------------- the timeout's cause


async def test_a_producer_fenced_long_after_it_opened_is_fenced_not_timed_out(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """The timeout counts from begin_transaction, not from the producer's start: a
    transaction fenced well within its timeout is reported fenced."""
    fake = await serve()
    async with open_fake_producer(fake, **txn_options(transaction_timeout=10.0)) as zombie:
        await trio.sleep(30.0)
        await zombie.begin_transaction()
        await zombie.send("t", b"zombie", partition=0)
        await zombie.flush()
        async with open_fake_producer(fake, **txn_options(transaction_timeout=10.0)):
            pass
        with pytest.raises(ProducerFencedError) as e:
            await zombie.commit_transaction()
        assert not isinstance(e.value, TransactionTimedOutError)


async def test_a_transaction_open_exactly_its_timeout_is_timed_out(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """The coordinator aborts a transaction once it has been open transaction_timeout
    (its deadline is inclusive): a commit at that instant is reported timed out."""
    fake = await serve()
    async with open_fake_producer(fake, **txn_options(transaction_timeout=10.0)) as producer:
        async with producer.transaction():  # (the topic's metadata is known from here)
            await producer.send("t", b"warm", partition=0)
        await producer.begin_transaction()
        start = trio.current_time()
        await producer.send("t", b"late", partition=0)
        await producer.flush()
        await trio.sleep_until(start + 10.0)
        with pytest.raises(TransactionTimedOutError):
            await producer.commit_transaction()
        await producer.abort_transaction()


async def test_a_commit_past_the_timeout_refused_for_another_reason_says_that_reason(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """A transaction open past its timeout is reported timed out only when the answer is
    the timeout's own (a fenced epoch; INVALID_TXN_STATE to a commit under v2): a commit
    refused for another reason (authorization) raises that, not a timeout to abort."""
    fake = await serve()
    async with open_fake_producer(fake, **txn_options(transaction_timeout=10.0)) as producer:
        async with producer.transaction():
            await producer.send("t", b"warm", partition=0)
        await producer.begin_transaction()
        await producer.send("t", b"late", partition=0)
        await producer.flush()
        await trio.sleep(11.0)
        fake.fail_next(ApiKey.END_TXN, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        with pytest.raises(TransactionFatalError, match="TRANSACTIONAL_ID_AUTHORIZATION") as e:
            await producer.commit_transaction()
        assert not isinstance(e.value, TransactionTimedOutError)


async def test_v1_a_timed_out_abort_whose_epoch_bump_is_refused_says_fenced(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """v1: the coordinator aborted a transaction past its timeout and bumped the epoch,
    so the abort's EndTxn is fenced; the KIP-360 InitProducerId that would take the
    producer on to the bumped epoch is refused too (PRODUCER_FENCED, as Kafka 4.1 does
    under transaction.version 1). The abort raises ProducerFencedError saying why and
    what to do, with the broker's code and answer chained; the producer is fatal."""
    fake = await serve(version=1)
    async with open_fake_producer(fake, **txn_options(transaction_timeout=10.0)) as producer:
        await producer.begin_transaction()
        await producer.send("t", b"late", partition=0)
        await producer.flush()
        await trio.sleep(11.0)
        fake.fail_next(ApiKey.INIT_PRODUCER_ID, ErrorCode.PRODUCER_FENCED)
        with pytest.raises(ProducerFencedError,
                           match=r"the coordinator aborted the transaction of 'rules-writer' "
                                 r"\(open longer than transaction_timeout=10\.0s\) and fenced "
                                 r"this producer's epoch, which transaction\.version 1 cannot "
                                 r"take on: close this producer and open a new one") as e:
            await producer.abort_transaction()
        assert e.value.code == ErrorCode.PRODUCER_FENCED
        assert isinstance(e.value.__cause__, ProducerFencedError)
        assert e.value.__cause__.code == ErrorCode.PRODUCER_FENCED
        ends = fake.requests_of(ApiKey.END_TXN)
        assert [r.request.committed for r in ends] == [False]
        with pytest.raises(ProducerFencedError) as again:
            await producer.begin_transaction()
        assert again.value is e.value


async def test_records_reaching_a_stage_while_an_abort_drains_fail_there_at_once(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """The abort fails what the stages hold when it starts; a record still between two
    stages then (here on its way to a broker producer, or to a partition producer) fails
    with the abort's error the moment it arrives, while the abort still waits for a
    Produce on the wire, not at its delivery_timeout and not after the abort."""
    fake = await serve()
    held_p, parked_p, wire_p = three_roles(fake)
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        for p in range(3):
            await producer.send("t", b"first", partition=p)
        await producer.flush()
        core = producer._core
        pp = core._pps[TopicPartition("t", parked_p)]
        to_pp = pp.inbox = HeldInbox(pp.inbox)  # type: ignore[assignment]
        bp = core._bps[fake.leader("t", held_p)]
        to_bp = bp.inbox = HeldInbox(bp.inbox)  # type: ignore[assignment]
        fake.delay_responses(2.0, api_key=ApiKey.PRODUCE, node_id=fake.leader("t", wire_p),
                             count=1)
        await producer.send("t", b"on the wire", partition=wire_p)
        late = [await producer.send("t", b"late", partition=p) for p in (held_p, parked_p)]
        await trio.sleep(0.1)
        assert to_pp.items and to_bp.items  # each on its way, held there
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer.abort_transaction)
            await trio.sleep(0.5)  # the abort drains: the Produce's answer is due at 1.9
            to_pp.release()
            to_bp.release()
            pp.inbox, bp.inbox = to_pp.real, to_bp.real
            released = trio.current_time()
            for d in late:
                with pytest.raises(ProducerError) as failed:
                    await d
                assert isinstance(failed.value.cause, TransactionAbortedError)
            assert trio.current_time() - released < 0.01
            assert not fake.requests_of(ApiKey.END_TXN)  # the abort still drains
        assert trio.current_time() - start >= 1.8
    assert await committed_values(fake) == []



async def test_a_producer_fenced_while_an_abort_drains_fails_later_arrivals_as_fenced(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """v1: an AddPartitionsToTxn on its way when the abort starts is answered
    PRODUCER_FENCED while the abort waits for a Produce on the wire: the producer is
    fatal, and from then on a record reaching a stage fails with that error, as every
    record of a fatal producer does (the Java client's Sender, too, fails batches with a
    fatal error before an abort's), not with the abort's; the abort raises the fence."""
    fake = await serve(version=1)
    held_p, fenced_p, wire_p = three_roles(fake)
    async with open_fake_producer(fake, **txn_options()) as producer:
        txn = producer._txn
        assert txn is not None
        await producer.begin_transaction()
        for p in (held_p, wire_p):  # (metadata, connections, both added to the transaction)
            await producer.send("t", b"first", partition=p)
        await producer.flush()
        bp = producer._core._bps[fake.leader("t", held_p)]
        to_bp = bp.inbox = HeldInbox(bp.inbox)  # type: ignore[assignment]
        fake.delay_responses(2.0, api_key=ApiKey.PRODUCE, node_id=fake.leader("t", wire_p),
                             count=1)
        await producer.send("t", b"on the wire", partition=wire_p)
        fake.delay_responses(1.0, api_key=ApiKey.ADD_PARTITIONS_TO_TXN, count=1)
        fake.fail_next(ApiKey.ADD_PARTITIONS_TO_TXN, ErrorCode.PRODUCER_FENCED)
        fake.fail_next(ApiKey.END_TXN, ErrorCode.PRODUCER_FENCED)  # (fenced: refused too)
        await producer.send("t", b"to be added", partition=fenced_p)
        late = await producer.send("t", b"late", partition=held_p)
        await trio.sleep(0.1)
        assert to_bp.items and fake.requests_of(ApiKey.ADD_PARTITIONS_TO_TXN)
        async with trio.open_nursery() as nursery:
            async def abort() -> None:
                with pytest.raises(ProducerFencedError):
                    await producer.abort_transaction()

            nursery.start_soon(abort)
            await trio.sleep(1.3)  # fenced at ~1.1; the Produce's answer is due at ~2.1
            assert txn.state == State.FATAL
            to_bp.release()
            bp.inbox = to_bp.real
            with pytest.raises(ProducerError) as failed:
                await late
            assert failed.value.cause is txn.error
            assert isinstance(failed.value.cause, ProducerFencedError)
            assert not fake.requests_of(ApiKey.END_TXN)  # the abort still drains


async def test_an_abort_fails_what_waits_for_a_request_slot_unwritten(
        nursery: trio.Nursery, autojump_clock: trio.testing.MockClock) -> None:
    """A request the broker producer took while a metadata request holds the
    connection's only slot (max_in_flight 1, one broker) is not written once the abort
    began: its record fails with TransactionAbortedError at the abort, not with the
    answer of a Produce written after it."""
    fake = FakeCluster(brokers=1, seed=4, transaction_version=2, auto_create_topics=False)
    await nursery.start(fake.run)
    fake.create_topic("t", 1)
    fake.create_topic("u", 1)
    async with open_fake_producer(fake, **txn_options(max_in_flight=1)) as producer:
        await producer.begin_transaction()
        await (await producer.send("t", b"first", partition=0))
        fake.delay_responses(2.0, api_key=ApiKey.METADATA, count=1)
        other = await producer.send("u", b"new topic", partition=0)  # (its metadata: held)
        await trio.sleep(0.25)
        held = await producer.send("t", b"held", partition=0)
        await trio.sleep(0.25)
        assert len(fake.requests_of(ApiKey.PRODUCE)) == 1  # (waiting for the slot)
        start = trio.current_time()
        async with trio.open_nursery() as aborting:
            aborting.start_soon(producer.abort_transaction)
            with pytest.raises(ProducerError) as failed:
                await held
            assert trio.current_time() - start < 0.05
            assert isinstance(failed.value.cause, TransactionAbortedError)
        # (the record of the new topic fails once its metadata came, where it arrives)
        with pytest.raises(ProducerError) as failed:
            await other
        assert isinstance(failed.value.cause, TransactionAbortedError)
        (end,) = fake.requests_of(ApiKey.END_TXN)
        assert end.request.committed is False
    assert len(fake.requests_of(ApiKey.PRODUCE)) == 1
    assert await committed_values(fake) == []
