"""The transaction coordinator's rules (``pipeline/producer/_stages/coordinator.py``), one
each, on the fake cluster's virtual time: which answers are retried and after how long
(the retry backoff, growing per attempt; 20 ms for CONCURRENT_TRANSACTIONS), when the
coordinator is looked up again, how FindCoordinator is asked at each version, and which
error class a refusal becomes.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from pipeline import (
    ProducerError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
)
from pipeline.cluster.errors import BrokerProtocolError
from pipeline.producer._errors import TransactionFatalError
from pipeline.producer._stages.coordinator import TxnCoordinator
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.add_partitions_to_txn import (
    AddPartitionsToTxnPartitionResult,
    AddPartitionsToTxnResponse,
    AddPartitionsToTxnTopicResult,
)
from pipeline.protocol.messages.api_versions import ApiVersionsResponse
from pipeline.protocol.messages.txn_offset_commit import (
    TxnOffsetCommitResponse,
    TxnOffsetCommitResponsePartition,
    TxnOffsetCommitResponseTopic,
)
from pipeline.testing.fake.cluster import SUPPORTED_VERSIONS
from pipeline.testing.fake.coordinators import GROUP
from pipeline.testing.fake.faults import ControlContext
from pipeline.testing.fake_cluster import FakeCluster
from tests.scenarios.conftest import open_fake_producer
from tests.scenarios.test_transaction_rules import TID, Serve, serve, txn_options

__all__ = ["serve"]  # the fixture, shared with test_transaction_rules

#: The retry backoff doubles per attempt here: 0.125, 0.25, 0.5 ...
GROWING = {"retry_backoff": 0.125, "retry_backoff_max": 1.0}


async def timed(call: Any) -> float:
    start = trio.current_time()
    await call()
    return trio.current_time() - start


def finds(fake: FakeCluster, key_type: int) -> int:
    """FindCoordinator requests sent for a key type (0: group, 1: transaction)."""
    count = 0
    for r in fake.requests_of(ApiKey.FIND_COORDINATOR):
        req = r.request
        if req.key_type == key_type:
            count += 1
    return count


async def open_transaction(producer: Any) -> None:
    await producer.begin_transaction()
    await producer.send("t", b"x", partition=0)
    await producer.flush()


# ------------------------------------------------------------------- the call loop


async def test_a_retriable_end_txn_answer_waits_the_growing_backoff(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve()
    async with open_fake_producer(fake, **txn_options(**GROWING)) as producer:
        await open_transaction(producer)
        fake.fail_next(ApiKey.END_TXN, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, count=2)
        assert await timed(producer.commit_transaction) == pytest.approx(0.125 + 0.25)
        await open_transaction(producer)
        fake.fail_next(ApiKey.END_TXN, ErrorCode.CONCURRENT_TRANSACTIONS, count=2)
        assert await timed(producer.commit_transaction) == pytest.approx(0.04)
    assert len(fake.requests_of(ApiKey.END_TXN)) == 6


async def test_a_lost_abort_is_sent_again_to_a_coordinator_found_again(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """An abort may be repeated (unlike a commit): a connection lost under it finds the
    coordinator again and sends it after the backoff."""
    fake = await serve()
    async with open_fake_producer(fake, **txn_options(**GROWING)) as producer:
        await open_transaction(producer)
        before = finds(fake, 1)
        fake.drop_next_request(ApiKey.END_TXN)
        assert await timed(producer.abort_transaction) >= 0.125
        assert finds(fake, 1) == before + 1
        assert fake.transaction(TID).state == "CompleteAbort"


async def test_a_coordinator_not_found_yet_is_asked_again(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve()
    async with open_fake_producer(fake, **txn_options(**GROWING)) as producer:
        await open_transaction(producer)
        fake.fail_next(ApiKey.END_TXN, ErrorCode.NOT_COORDINATOR)
        fake.fail_next(ApiKey.FIND_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        before = finds(fake, 1)
        await producer.commit_transaction()
        assert finds(fake, 1) == before + 2
        assert fake.transaction(TID).state == "CompleteCommit"


async def test_a_stopped_coordinator_is_found_again(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve()
    async with open_fake_producer(fake, **txn_options(**GROWING)) as producer:
        await open_transaction(producer)
        old = fake.coordinator(TID)
        fake.stop_broker(old)
        new = fake.coordinator(TID)
        assert new != old
        with trio.fail_after(30):
            assert await timed(producer.commit_transaction) >= 0.125
        assert fake.requests_of(ApiKey.END_TXN)[-1].node_id == new
        assert fake.transaction(TID).state == "CompleteCommit"


async def test_a_coordinator_refusing_the_id_is_fatal(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve()
    async with open_fake_producer(fake, **txn_options()) as producer:
        await open_transaction(producer)
        fake.fail_next(ApiKey.END_TXN, ErrorCode.NOT_COORDINATOR)
        fake.fail_next(ApiKey.FIND_COORDINATOR, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        with pytest.raises(TransactionFatalError,
                           match="FindCoordinator for transactional_id 'rules-writer': "
                                 "TRANSACTIONAL_ID_AUTHORIZATION_FAILED") as e:
            await producer.commit_transaction()
        assert "transaction_timeout" not in str(e.value)  # (that advice is for its own code)


async def test_a_coordinator_not_found_at_the_first_request_is_asked_again(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve()
    fake.fail_next(ApiKey.FIND_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    async with open_fake_producer(fake, **txn_options()) as producer:
        async with producer.transaction():
            await producer.send("t", b"x", partition=0)
    assert finds(fake, 1) == 2


async def test_a_coordinator_refusing_the_connect_is_looked_up_again(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """A connect to the coordinator that fails for any reason, not only a lost connection
    (here its ApiVersions is refused: a ``BrokerProtocolError``, raised to the caller as a
    ``TransactionFatalError``),
    forgets the coordinator: the next request finds it again (the refusal may come from a
    broker that is not the coordinator any more) instead of going back to that broker."""
    fake = await serve()
    async with open_fake_producer(fake, **txn_options()) as producer:
        core = producer._core
        coord = TxnCoordinator(core.config, core.cluster, lambda attempt: 0.1, "refused-writer")
        await coord.init_producer_id(-1, -1)
        old = fake.coordinator("refused-writer")
        refuse = fake.control(
            ApiKey.API_VERSIONS,
            lambda ctx: ApiVersionsResponse(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
            sticky=True, node_id=old)
        fake.drop_connections(old)
        with pytest.raises(TransactionFatalError, match="cannot be used") as refused:
            await coord.init_producer_id(-1, -1)
        assert isinstance(refused.value.__cause__, BrokerProtocolError)
        assert "CLUSTER_AUTHORIZATION_FAILED" in str(refused.value)
        refuse.remove()
        new = fake.move_coordinator("refused-writer")
        before, sent = finds(fake, 1), len(fake.requests_of(ApiKey.INIT_PRODUCER_ID))
        await coord.init_producer_id(-1, -1)
        assert finds(fake, 1) == before + 1
        assert [r.node_id for r in fake.requests_of(ApiKey.INIT_PRODUCER_ID)[sent:]] == [new]


@pytest.mark.parametrize("version", [1, 2])
async def test_a_coordinator_that_cannot_be_used_makes_the_producer_fatal_not_dead(
        serve: Serve, autojump_clock: trio.testing.MockClock, version: int) -> None:
    """A coordinator whose connection is refused for a reason no retry changes (its
    ApiVersions answered CLUSTER_AUTHORIZATION_FAILED) makes the transaction fatal, as
    the Java client makes authorization and unsupported-version errors: under v1 the
    partition adder meets it (the producer's task must not die), under v2 the commit;
    the transaction never commits, every later transactional call raises the same error,
    and the producer closes."""
    fake = await serve(version=version)
    async with open_fake_producer(fake, **txn_options()) as producer:
        await open_transaction(producer)
        await producer.commit_transaction()
        await producer.begin_transaction()
        coordinator = fake.coordinator(TID)
        fake.control(
            ApiKey.API_VERSIONS,
            lambda ctx: ApiVersionsResponse(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
            sticky=True, node_id=coordinator)
        fake.drop_connections(coordinator)
        late = await producer.send("t", b"y", partition=1)
        with pytest.raises(TransactionFatalError, match="cannot be used") as fatal:
            await producer.commit_transaction()
        assert "CLUSTER_AUTHORIZATION_FAILED" in str(fatal.value)
        if version == 1:  # its partition could not be added: never written
            with pytest.raises(ProducerError):
                await late
        else:  # written (v2 adds it with the Produce), in a transaction never committed
            assert (await late).partition == 1
        with pytest.raises(TransactionFatalError):
            await producer.begin_transaction()
        with pytest.raises(TransactionFatalError):
            await producer.abort_transaction()


async def test_an_unknown_server_error_on_commit_is_a_lost_answer(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """UNKNOWN_SERVER_ERROR says nothing of whether the commit happened: it is handled
    as a lost answer (aborted instead, and said so)."""
    fake = await serve()
    async with open_fake_producer(fake, **txn_options()) as producer:
        await open_transaction(producer)
        fake.fail_next(ApiKey.END_TXN, ErrorCode.UNKNOWN_SERVER_ERROR)
        with pytest.raises(TransactionAbortedError, match=r"UNKNOWN_SERVER_ERROR"):
            await producer.commit_transaction()
    assert [r.request.committed for r in fake.requests_of(ApiKey.END_TXN)] == [True, False]


async def test_a_transaction_timeout_over_the_brokers_limit_says_to_lower_it(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve(max_transaction_timeout_ms=10_000)
    with pytest.raises(TransactionFatalError,
                       match=r"INVALID_TRANSACTION_TIMEOUT .*; transaction_timeout=20\.0s is "
                             r"more than the broker allows \(transaction\.max\.timeout\.ms\): "
                             r"lower it"):
        async with open_fake_producer(fake, **txn_options(transaction_timeout=20.0)):
            pass
    (init,) = fake.requests_of(ApiKey.INIT_PRODUCER_ID)
    assert init.request.transaction_timeout_ms == 20_000


# ---------------------------------------------------------------- versions


@pytest.mark.parametrize("find_max", [3, 4])
async def test_find_coordinator_is_asked_in_each_versions_form(
        serve: Serve, find_max: int, autojump_clock: trio.testing.MockClock) -> None:
    """v4+ batch the keys (coordinator_keys), older versions ask one key: both the
    transaction's and the group's coordinator are found either way, and the requests go
    to the brokers named (each once: no NOT_COORDINATOR detour)."""
    versions = {**SUPPORTED_VERSIONS, ApiKey.FIND_COORDINATOR: (0, find_max)}
    fake = await serve(api_versions=versions)
    # Coordinated by neither node 0 (an answer read in the wrong version's form says
    # node 0: the fields it lacks decode as 0) nor the transaction's coordinator.
    group = next(g for g in (f"g{i}" for i in range(100))
                 if fake.coordinator(g, GROUP) not in (0, fake.coordinator(TID)))
    async with open_fake_producer(fake, **txn_options()) as producer:
        with trio.fail_after(30):
            async with producer.transaction():
                await producer.send("t", b"x", partition=0)
                await producer.send_offsets_to_transaction({("in", 0): 3}, group)
    asked = fake.requests_of(ApiKey.FIND_COORDINATOR)
    assert {r.api_version for r in asked} == {find_max}
    keys = {(r.request.key_type, r.request.coordinator_keys if find_max >= 4 else r.request.key)
            for r in asked}
    assert keys == ({(1, (TID,)), (0, (group,))} if find_max >= 4 else {(1, TID), (0, group)})
    assert [r.node_id for r in fake.requests_of(ApiKey.END_TXN)] == [fake.coordinator(TID)]
    assert [r.node_id for r in fake.requests_of(ApiKey.TXN_OFFSET_COMMIT)] == [
        fake.coordinator(group, GROUP)]
    assert fake.offsets.fetch(group, ("in", 0)).offset == 3  # type: ignore[union-attr]


async def test_v1_uses_the_newest_request_versions_below_v2s(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve(version=1)
    async with open_fake_producer(fake, **txn_options()) as producer:
        async with producer.transaction():
            await producer.send("t", b"x", partition=0)
            await producer.send_offsets_to_transaction({("in", 0): 3}, "g")
    assert {r.api_version for r in fake.requests_of(ApiKey.PRODUCE)} == {11}
    assert {r.api_version for r in fake.requests_of(ApiKey.END_TXN)} == {4}
    assert {r.api_version for r in fake.requests_of(ApiKey.TXN_OFFSET_COMMIT)} == {4}


async def test_v1_bumps_the_epoch_with_its_id_from_init_producer_id_v3(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """KIP-360: InitProducerId v3+ carries the current producer id and epoch (a bump);
    older versions cannot."""
    versions = {**SUPPORTED_VERSIONS, ApiKey.INIT_PRODUCER_ID: (0, 3)}
    fake = await serve(version=1, api_versions=versions)
    async with open_fake_producer(fake, **txn_options()) as producer:
        idem = producer._core.idempotence
        pid, epoch = idem.producer_id, idem.producer_epoch
        await producer.begin_transaction()
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, topic="t")
        await producer.send("t", b"x", partition=0)
        with pytest.raises(TransactionAbortableError):
            await producer.commit_transaction()
        await producer.abort_transaction()
    first, bump = fake.requests_of(ApiKey.INIT_PRODUCER_ID)
    assert (first.request.producer_id, first.request.producer_epoch) == (-1, -1)
    assert (bump.api_version, bump.request.producer_id, bump.request.producer_epoch) == (
        3, pid, epoch)


async def test_init_producer_id_below_v3_sends_no_id(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    """InitProducerId v0-2 has no producer id or epoch fields (the encoder refuses any
    but -1): the first id and the bump after a sequence problem both go without them."""
    versions = {**SUPPORTED_VERSIONS, ApiKey.INIT_PRODUCER_ID: (0, 2)}
    fake = await serve(version=1, api_versions=versions)
    async with open_fake_producer(fake, **txn_options()) as producer:
        idem = producer._core.idempotence
        epoch = idem.producer_epoch
        await producer.begin_transaction()
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, topic="t")
        await producer.send("t", b"x", partition=0)
        with pytest.raises(TransactionAbortableError):
            await producer.commit_transaction()
        await producer.abort_transaction()
        assert idem.producer_epoch == epoch + 1
    assert [(r.api_version, r.request.producer_id, r.request.producer_epoch)
            for r in fake.requests_of(ApiKey.INIT_PRODUCER_ID)] == [(2, -1, -1)] * 2


# ---------------------------------------------------------- TxnOffsetCommit


async def test_txn_offset_commit_retries_and_finds_the_group_coordinator_again(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve()
    async with open_fake_producer(fake, **txn_options(**GROWING)) as producer:
        async with producer.transaction():
            offsets = {("in", 0): 1}
            fake.fail_next(ApiKey.TXN_OFFSET_COMMIT, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                           count=2)
            before = finds(fake, 0)
            took = await timed(lambda: producer.send_offsets_to_transaction(offsets, "g"))
            assert took == pytest.approx(0.125 + 0.25)
            assert finds(fake, 0) == before + 1  # the same coordinator, asked three times
            fake.fail_next(ApiKey.TXN_OFFSET_COMMIT, ErrorCode.CONCURRENT_TRANSACTIONS,
                           count=2)
            took = await timed(lambda: producer.send_offsets_to_transaction(offsets, "g"))
            assert took == pytest.approx(0.04)
            before = finds(fake, 0)
            fake.fail_next(ApiKey.TXN_OFFSET_COMMIT, ErrorCode.NOT_COORDINATOR)
            await producer.send_offsets_to_transaction(offsets, "g")
            assert finds(fake, 0) == before + 2
            before = finds(fake, 0)
            fake.drop_next_request(ApiKey.TXN_OFFSET_COMMIT)
            took = await timed(lambda: producer.send_offsets_to_transaction(offsets, "g"))
            assert took >= 0.125 and finds(fake, 0) == before + 2
            before = finds(fake, 0)
            fake.fail_next(ApiKey.FIND_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            took = await timed(lambda: producer.send_offsets_to_transaction(offsets, "g"))
            assert took >= 0.125 and finds(fake, 0) == before + 2
    assert fake.offsets.fetch("g", ("in", 0)).offset == 1  # type: ignore[union-attr]


async def test_txn_offset_commit_retries_a_partitions_retriable_error_and_raises_a_final_one(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve()
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        fake.fail_next(ApiKey.TXN_OFFSET_COMMIT, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                       topic="in", partition=0)
        fake.fail_next(ApiKey.TXN_OFFSET_COMMIT, ErrorCode.GROUP_AUTHORIZATION_FAILED,
                       topic="in", partition=1)
        with pytest.raises(TransactionAbortableError,
                           match="TxnOffsetCommit for transactional_id 'rules-writer': "
                                 "GROUP_AUTHORIZATION_FAILED"):
            await producer.send_offsets_to_transaction({("in", 0): 1, ("in", 1): 1}, "g")
        await producer.abort_transaction()
    assert len(fake.requests_of(ApiKey.TXN_OFFSET_COMMIT)) == 2


async def test_a_group_coordinator_lookup_refused_for_good_is_raised(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve()
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        fake.fail_next(ApiKey.FIND_COORDINATOR, ErrorCode.GROUP_AUTHORIZATION_FAILED)
        with pytest.raises(TransactionAbortableError, match=r"FindCoordinator \(group\)"):
            await producer.send_offsets_to_transaction({("in", 0): 1}, "g")
        await producer.abort_transaction()
    assert fake.requests_of(ApiKey.TXN_OFFSET_COMMIT) == []


async def test_a_fenced_txn_offset_commit_is_fenced(
        serve: Serve, autojump_clock: trio.testing.MockClock) -> None:
    fake = await serve()
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        fake.fail_next(ApiKey.TXN_OFFSET_COMMIT, ErrorCode.INVALID_PRODUCER_EPOCH)
        with pytest.raises(ProducerFencedError, match="took over"):
            await producer.send_offsets_to_transaction({("in", 0): 1}, "g")


# ------------------------------------------ several partition errors in one answer


def answer_by_topic(kind: str, codes: dict[str, ErrorCode]) -> Any:
    """A ``control`` hook answering an AddPartitionsToTxn (``kind="add"``) or a
    TxnOffsetCommit (``"offsets"``) that names exactly the topics of ``codes`` with each
    topic's code for all of its partitions, the topics in ``codes``' order (one a client
    must not depend on); any other request falls through to the fake's own answer."""
    def hook(ctx: ControlContext) -> Any:
        if kind == "add":
            asked = {t.name: list(t.partitions) for t in ctx.request.v3_and_below_topics}
        else:
            asked = {t.name: [p.partition_index for p in t.partitions]
                     for t in ctx.request.topics}
        if set(asked) != set(codes):
            return None
        if kind == "add":
            return AddPartitionsToTxnResponse(results_by_topic_v3_and_below=tuple(
                AddPartitionsToTxnTopicResult(name=t, results_by_partition=tuple(
                    AddPartitionsToTxnPartitionResult(partition_index=p,
                                                      partition_error_code=int(code))
                    for p in asked[t]))
                for t, code in codes.items()))
        return TxnOffsetCommitResponse(topics=tuple(
            TxnOffsetCommitResponseTopic(name=t, partitions=tuple(
                TxnOffsetCommitResponsePartition(partition_index=p, error_code=int(code))
                for p in asked[t]))
            for t, code in codes.items()))
    return hook


def in_order(first: str, codes: dict[str, ErrorCode]) -> dict[str, ErrorCode]:
    return {first: codes[first], **codes}


@pytest.mark.parametrize("first", ["t", "u"])
async def test_add_partitions_retries_an_unknown_topic_beside_partitions_not_attempted(
        serve: Serve, first: str, autojump_clock: trio.testing.MockClock) -> None:
    """Kafka answers an AddPartitionsToTxn naming a topic it does not know (yet) with
    UNKNOWN_TOPIC_OR_PARTITION for it and OPERATION_NOT_ATTEMPTED for every other
    partition (Kafka 4.1 and the fake agree: test_fake_vs_kafka's ``txn_v1``): nothing
    was added, OPERATION_NOT_ATTEMPTED is no error of its own, so the request is retried
    whole (in either order of the answer's topics) and the commit goes through."""
    fake = await serve(version=1)
    fake.create_topic("u", 3)
    hook = fake.control(ApiKey.ADD_PARTITIONS_TO_TXN, answer_by_topic("add", in_order(first, {
        "t": ErrorCode.OPERATION_NOT_ATTEMPTED, "u": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})))
    async with open_fake_producer(fake, **txn_options()) as producer:
        async with producer.transaction():
            await producer.send("t", b"x", partition=0)
            await producer.send("u", b"y", partition=0)
    assert hook.fired == 1
    assert len(fake.requests_of(ApiKey.ADD_PARTITIONS_TO_TXN)) == 2
    assert fake.transaction(TID).state == "CompleteCommit"


@pytest.mark.parametrize("first", ["t", "u"])
async def test_add_partitions_takes_a_final_error_over_a_retriable_one(
        serve: Serve, first: str, autojump_clock: trio.testing.MockClock) -> None:
    """One answer may hold different partitions' errors: Kafka answers a topic the
    producer may not write TOPIC_AUTHORIZATION_FAILED and, in the same answer, a topic it
    does not know UNKNOWN_TOPIC_OR_PARTITION. The final error wins, whatever the order of
    the answer's topics: the transaction becomes abortable at once (a retry would be
    refused for the same topic again), not after a retry."""
    fake = await serve(version=1)
    fake.create_topic("u", 3)
    hook = fake.control(ApiKey.ADD_PARTITIONS_TO_TXN, answer_by_topic("add", in_order(first, {
        "t": ErrorCode.TOPIC_AUTHORIZATION_FAILED, "u": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})))
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        await producer.send("t", b"x", partition=0)
        await producer.send("u", b"y", partition=0)
        with pytest.raises(TransactionAbortableError,
                           match="AddPartitionsToTxn for transactional_id 'rules-writer': "
                                 "TOPIC_AUTHORIZATION_FAILED"):
            await producer.commit_transaction()
        await producer.abort_transaction()
    assert hook.fired == 1
    assert len(fake.requests_of(ApiKey.ADD_PARTITIONS_TO_TXN)) == 1


@pytest.mark.parametrize("first", ["in", "gone"])
async def test_txn_offset_commit_takes_a_final_error_over_a_retriable_one(
        serve: Serve, first: str, autojump_clock: trio.testing.MockClock) -> None:
    """Kafka answers a TxnOffsetCommit per partition: UNKNOWN_TOPIC_OR_PARTITION for a
    topic it does not know, the group coordinator's answer for the others (here
    ILLEGAL_GENERATION: the consumer's generation is stale). As the Java client does, the
    final error wins whatever the order of the answer's topics: abortable at once, no
    retry."""
    fake = await serve()
    hook = fake.control(ApiKey.TXN_OFFSET_COMMIT, answer_by_topic("offsets", in_order(first, {
        "in": ErrorCode.ILLEGAL_GENERATION, "gone": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})))
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        with pytest.raises(TransactionAbortableError,
                           match="TxnOffsetCommit for transactional_id 'rules-writer': "
                                 "ILLEGAL_GENERATION"):
            await producer.send_offsets_to_transaction({("in", 0): 1, ("gone", 0): 1}, "g")
        await producer.abort_transaction()
    assert hook.fired == 1
    assert len(fake.requests_of(ApiKey.TXN_OFFSET_COMMIT)) == 1
