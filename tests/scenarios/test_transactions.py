"""The transactional producer on the fake cluster's virtual time.

Each test pins one rule of ``pipeline/producer/_stages/transactions.py`` with the
schedule that needs it: what a read_committed reader sees after a commit and an abort,
the two transaction versions' requests, fencing, abortable errors, coordinator moves,
a transaction the coordinator times out, a lost EndTxn answer, cancellation and close.
The fake's transaction coordinator answers as Kafka 4.1 does
(``tests/testing/test_fake_vs_kafka.py`` pins it against Apache Kafka).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from pipeline import (
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionStateError,
    TransactionTimedOutError,
)
from pipeline.consumer import read_topic
from pipeline.producer._errors import BrokerResponseError, ProducerError
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.testing.fake_cluster import FakeCluster
from tests.scenarios.conftest import open_fake_producer

TID = "orders-writer"


def txn_options(**overrides: Any) -> dict[str, Any]:
    return {"transactional_id": TID, "idempotent": True, **overrides}


@pytest.fixture(params=[2, 1], ids=["v2", "v1"])
def version(request: pytest.FixtureRequest) -> int:
    """The cluster's finalized transaction.version (the producer follows it)."""
    return int(request.param)


@pytest.fixture
async def fake(version: int) -> AsyncIterator[FakeCluster]:
    async with FakeCluster.serve(brokers=3, seed=4, transaction_version=version,
                                 auto_create_topics=False) as fake:
        fake.create_topic("t", 3)
        yield fake


async def committed_values(fake: FakeCluster, topic: str = "t") -> list[bytes | None]:
    """Everything a read_committed reader finds, in partition then offset order."""
    out = []
    async for rec in read_topic(fake.bootstrap, topic, stop_at_end=True,
                                isolation_level="read_committed", connector=fake.connector):
        out.append((rec.partition, rec.offset, rec.value))
    return [v for _, _, v in sorted(out)]


async def all_values(fake: FakeCluster, topic: str = "t") -> list[bytes | None]:
    out = []
    async for rec in read_topic(fake.bootstrap, topic, stop_at_end=True,
                                connector=fake.connector):
        out.append((rec.partition, rec.offset, rec.value))
    return [v for _, _, v in sorted(out)]


# ------------------------------------------------------------------------- the basics


async def test_committed_records_are_visible_and_aborted_ones_are_not(
        fake: FakeCluster, version: int, autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, **txn_options()) as producer:
        async with producer.transaction():
            for i in range(6):
                await producer.send("t", b"c%d" % i, key=b"k%d" % i)
        await producer.begin_transaction()
        aborted = [await producer.send("t", b"a%d" % i, key=b"k%d" % i) for i in range(6)]
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send("t", b"after", key=b"k0")
        assert producer._txn.committed == 2 and producer._txn.aborted == 1
    for d in aborted:  # each had an outcome: written (and hidden by the abort) or failed
        assert d.done()
    got = await committed_values(fake)
    assert sorted(got) == sorted([b"c%d" % i for i in range(6)] + [b"after"])
    assert fake.transaction(TID).state == "CompleteCommit"


async def test_send_outside_a_transaction_is_refused_and_accepts_nothing(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, **txn_options()) as producer:
        with pytest.raises(TransactionStateError, match="begin_transaction"):
            await producer.send("t", b"x")
        with pytest.raises(TransactionStateError):
            producer.send_nowait("t", b"x")
        with pytest.raises(TransactionStateError):
            await producer.send_batch("t", [b"x", b"y"])
        with pytest.raises(TransactionStateError, match="no transaction is open"):
            await producer.commit_transaction()
        await producer.begin_transaction()
        with pytest.raises(TransactionStateError, match="a transaction is open"):
            await producer.begin_transaction()
        await producer.abort_transaction()
        assert producer.statistics().accepted == 0
    assert fake.requests_of(ApiKey.PRODUCE) == []


async def test_a_plain_producer_has_no_transactions(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, idempotent=True) as producer:
        with pytest.raises(TransactionStateError, match="not transactional"):
            await producer.begin_transaction()


async def test_the_protocol_follows_the_clusters_transaction_version(
        fake: FakeCluster, version: int, autojump_clock: trio.testing.MockClock) -> None:
    """v2: Produce v12 adds each partition itself and EndTxn v5 bumps the epoch; v1:
    AddPartitionsToTxn first, Produce at most v11, EndTxn below v5, the same epoch."""
    async with open_fake_producer(fake, **txn_options()) as producer:
        idem = producer._core.idempotence
        first = idem.producer_epoch
        async with producer.transaction():
            for p in range(3):
                await producer.send("t", b"v", partition=p)
        assert producer._txn.version == version
        produce_versions = {r.api_version for r in fake.requests_of(ApiKey.PRODUCE)}
        end_versions = {r.api_version for r in fake.requests_of(ApiKey.END_TXN)}
        adds = fake.requests_of(ApiKey.ADD_PARTITIONS_TO_TXN)
        if version == 2:
            assert produce_versions == {12} and end_versions == {5} and adds == []
            assert idem.producer_epoch == first + 1
        else:
            assert max(produce_versions) <= 11 and max(end_versions) <= 4
            added = {(t.name, p) for r in adds for t in r.request.v3_and_below_topics
                     for p in t.partitions}
            assert added == {("t", 0), ("t", 1), ("t", 2)}
            assert idem.producer_epoch == first
    assert sorted(await committed_values(fake)) == [b"v"] * 3


# --------------------------------------------------------------------------- errors


@asynccontextmanager
async def zombie_and_successor(fake: FakeCluster) -> AsyncIterator[Any]:
    """A producer (the zombie, yielded) with a transaction open and a record of it
    written, then a successor with the same transactional id that fences it and commits
    ``b"fresh"``; the successor stays open while the caller uses the zombie."""
    async with open_fake_producer(fake, **txn_options()) as zombie:
        await zombie.begin_transaction()
        await zombie.send("t", b"zombie", partition=0)
        await zombie.flush()
        async with open_fake_producer(fake, **txn_options()) as fresh:
            async with fresh.transaction():
                await fresh.send("t", b"fresh", partition=0)
            yield zombie


async def test_a_second_producer_with_the_same_id_fences_the_first(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    """The zombie's open transaction is aborted by the new producer's initialisation,
    its commit raises ProducerFencedError, and later calls raise it too."""
    async with zombie_and_successor(fake) as zombie:
        with pytest.raises(ProducerFencedError):
            await zombie.commit_transaction()
        with pytest.raises(ProducerFencedError):
            await zombie.begin_transaction()
    assert await committed_values(fake) == [b"fresh"]


async def test_a_zombies_record_refused_for_its_epoch_fails_at_once(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    """A zombie sends after its successor took over: the broker refuses the record's
    epoch (INVALID_PRODUCER_EPOCH, as Kafka does: ``test_fake_vs_kafka.py``, "fencing"),
    which cannot tell a takeover from a coordinator timeout. The record fails at once,
    not at its delivery_timeout (120 s), with TransactionAbortableError naming the
    broker's answer (Java's InvalidProducerEpochException); new sends and the commit
    raise the same error; the abort, refused by the coordinator, says fenced."""
    async with zombie_and_successor(fake) as zombie:
        late = await zombie.send("t", b"late", partition=0)
        start = trio.current_time()
        with trio.fail_after(1.0), pytest.raises(ProducerError) as failed:
            await late
        assert trio.current_time() - start < 0.1
        error = failed.value.cause
        assert isinstance(error, TransactionAbortableError)
        assert error.code == ErrorCode.INVALID_PRODUCER_EPOCH
        assert "INVALID_PRODUCER_EPOCH" in str(error)
        assert isinstance(error.__cause__, BrokerResponseError)
        assert error.__cause__.code == ErrorCode.INVALID_PRODUCER_EPOCH
        with pytest.raises(TransactionAbortableError) as refused:
            await zombie.send("t", b"later", partition=0)
        assert refused.value is error
        with pytest.raises(TransactionAbortableError) as commit:
            await zombie.commit_transaction()
        assert commit.value is error
        with pytest.raises(ProducerFencedError):
            await zombie.abort_transaction()
        with pytest.raises(ProducerFencedError):
            await zombie.begin_transaction()
    assert await committed_values(fake) == [b"fresh"]


async def test_a_failed_record_makes_the_transaction_abortable(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    """A record the broker refuses for good: commit raises TransactionAbortableError and
    writes nothing; after the abort the producer goes on."""
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        ok = await producer.send("t", b"ok", partition=1)
        fake.fail_next(ApiKey.PRODUCE, ErrorCode.TOPIC_AUTHORIZATION_FAILED, topic="t", partition=0)
        bad = await producer.send("t", b"bad", partition=0)
        start = trio.current_time()
        with pytest.raises(TransactionAbortableError):
            await producer.commit_transaction()
        assert trio.current_time() - start < 1.0  # no wait for delivery_timeout
        with pytest.raises(ProducerError):
            await bad
        with pytest.raises(TransactionAbortableError):
            await producer.send("t", b"refused")
        await producer.abort_transaction()
        assert ok.done()
        async with producer.transaction():
            await producer.send("t", b"next", partition=0)
    assert await committed_values(fake) == [b"next"]


async def test_the_coordinator_moving_mid_transaction_is_found_again(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        await producer.send("t", b"before", partition=0)
        await producer.flush()
        old = fake.coordinator(TID)
        new = fake.move_coordinator(TID)
        assert new != old
        await producer.send("t", b"after", partition=1)
        await producer.commit_transaction()
    finds = [r for r in fake.requests_of(ApiKey.FIND_COORDINATOR)]
    assert len(finds) >= 2
    assert fake.requests_of(ApiKey.END_TXN)[-1].node_id == new
    assert sorted(await committed_values(fake)) == [b"after", b"before"]


async def test_a_transaction_past_its_timeout_is_reported_timed_out(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    """The coordinator aborts a transaction open longer than transaction_timeout; the
    commit says so, and the next transaction works."""
    async with open_fake_producer(fake, **txn_options(transaction_timeout=10.0)) as producer:
        await producer.begin_transaction()
        await producer.send("t", b"late", partition=0)
        await producer.flush()
        await trio.sleep(11.0)
        with pytest.raises(TransactionTimedOutError, match=r"transaction_timeout=10\.0"):
            await producer.commit_transaction()
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send("t", b"in time", partition=0)
    assert await committed_values(fake) == [b"in time"]


async def test_a_lost_commit_answer_is_retried_only_as_an_abort(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    """The EndTxn(commit) was applied, its answer lost: the abort that follows is
    refused (the commit completed), so the commit stands and raises nothing."""
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        await producer.send("t", b"kept", partition=0)
        fake.drop_response_after_apply(ApiKey.END_TXN)
        await producer.commit_transaction()
        async with producer.transaction():
            await producer.send("t", b"then", partition=0)
    commits = [r.request.committed for r in fake.requests_of(ApiKey.END_TXN)]
    assert commits[:2] == [True, False]
    assert await committed_values(fake) == [b"kept", b"then"]


async def test_a_commit_lost_before_it_arrived_is_aborted_and_said_so(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        await producer.send("t", b"gone", partition=0)
        fake.drop_next_request(ApiKey.END_TXN)
        with pytest.raises(TransactionAbortedError, match=r"aborted\s+instead"):
            await producer.commit_transaction()
        async with producer.transaction():
            await producer.send("t", b"redone", partition=0)
    assert await committed_values(fake) == [b"redone"]


# ----------------------------------------------------------------- cancellation, close


async def test_an_exception_in_the_block_aborts_and_propagates(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, **txn_options()) as producer:
        async def fails() -> None:
            async with producer.transaction():
                await producer.send("t", b"x", partition=0)
                await producer.flush()  # written: the abort must hide it
                1 / 0  # noqa: B018

        with pytest.raises(ZeroDivisionError):
            await fails()
        assert [r.request.committed for r in fake.requests_of(ApiKey.END_TXN)] == [False]
        async with producer.transaction():
            await producer.send("t", b"y", partition=0)
    assert await committed_values(fake) == [b"y"]


async def test_a_cancelled_block_aborts_its_transaction(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, **txn_options()) as producer:
        with trio.move_on_after(1.0):
            async with producer.transaction():
                await producer.send("t", b"x", partition=0)
                await trio.sleep_forever()
        assert producer._txn.state.value == "ready"
        assert [r.request.committed for r in fake.requests_of(ApiKey.END_TXN)] == [False]
    assert await committed_values(fake) == []


async def test_closing_with_an_open_transaction_aborts_it(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    start = trio.current_time()
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        await producer.send("t", b"open", partition=0)
        await producer.flush()  # written: the abort must hide it
    assert trio.current_time() - start < 10.0  # close_timeout
    assert fake.transaction(TID).state == "CompleteAbort"
    assert await committed_values(fake) == []


# --------------------------------------------------------------------------- offsets


async def test_offsets_sent_to_a_transaction_count_only_if_it_commits(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, **txn_options()) as producer:
        await producer.begin_transaction()
        await producer.send("t", b"x", partition=0)
        await producer.send_offsets_to_transaction({("in", 0): 5}, "billing")
        await producer.abort_transaction()
        assert fake.offsets.fetch("billing", ("in", 0)) is None
        async with producer.transaction():
            await producer.send("t", b"y", partition=0)
            await producer.send_offsets_to_transaction({("in", 0): 7, ("in", 1): 3}, "billing")
    assert fake.offsets.fetch("billing", ("in", 0)).offset == 7  # type: ignore[union-attr]
    assert fake.offsets.fetch("billing", ("in", 1)).offset == 3  # type: ignore[union-attr]


async def test_bad_offsets_are_refused_before_anything_is_sent(
        fake: FakeCluster, autojump_clock: trio.testing.MockClock) -> None:
    async with open_fake_producer(fake, **txn_options()) as producer:
        async with producer.transaction():
            with pytest.raises(ValueError, match="int >= 0"):
                await producer.send_offsets_to_transaction({("in", 0): -1}, "g")
            with pytest.raises(TypeError, match="group metadata"):
                await producer.send_offsets_to_transaction({("in", 0): 1}, 42)
    assert fake.requests_of(ApiKey.TXN_OFFSET_COMMIT) == []



async def test_a_partition_added_but_never_written_still_ends_the_transaction(
        fake: FakeCluster, version: int, autojump_clock: trio.testing.MockClock) -> None:
    """v1: once AddPartitionsToTxn succeeded the coordinator has an open transaction,
    even if no batch was sealed yet (a long linger): the abort must end it with EndTxn,
    or it would stay open until its timeout and hold back read_committed readers."""
    if version != 1:
        pytest.skip("v2 adds partitions with the first Produce")
    async with open_fake_producer(fake, **txn_options(linger=5.0)) as producer:
        await producer.begin_transaction()
        await producer.send("t", b"lingering", partition=0)
        await trio.sleep(1.0)
        assert fake.requests_of(ApiKey.ADD_PARTITIONS_TO_TXN)
        assert fake.requests_of(ApiKey.PRODUCE) == []
        await producer.abort_transaction()
        assert fake.transaction(TID).state == "CompleteAbort"


def test_the_sync_producer_runs_transactions_too() -> None:
    """SyncProducer's transaction block on a fake cluster served over TCP."""
    import threading

    from pipeline import SyncProducer

    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def serve() -> None:
        async with FakeCluster.serve(brokers=1, tcp=True, auto_create_topics=False) as fake:
            fake.create_topic("t", 1)
            holder["fake"] = fake
            holder["token"] = trio.lowlevel.current_trio_token()
            holder["stop"] = trio.Event()
            ready.set()
            await holder["stop"].wait()

    thread = threading.Thread(target=trio.run, args=(serve,), daemon=True)
    thread.start()
    ready.wait(10)
    fake = holder["fake"]
    try:
        with SyncProducer(fake.bootstrap, transactional_id=TID) as producer:
            with producer.transaction():
                producer.send("t", b"sync")
            def fails() -> None:
                with producer.transaction():
                    producer.send("t", b"aborted")
                    raise KeyError("x")

            with pytest.raises(KeyError):
                fails()
            outside = producer.send("t", b"outside")
            with pytest.raises(TransactionStateError):
                outside.get(timeout=10)  # the refusal is the record's outcome
        written = [p.record.value for p in fake.log("t", 0) if not p.batch.is_control]
        assert written[0] == b"sync" and b"outside" not in written
        if b"aborted" in written:  # written before the abort (else purged unwritten)
            assert fake.transaction(TID).state == "CompleteAbort"
    finally:
        trio.from_thread.run_sync(holder["stop"].set, trio_token=holder["token"])
        thread.join(10)


# ----------------------------------------------------------------- the markers' window


async def test_an_abort_while_the_last_commits_markers_are_written(
        version: int, autojump_clock: trio.testing.MockClock) -> None:
    """EndTxn is answered before the coordinator has written the transaction's markers;
    until they are written (PrepareCommit) it answers the next transaction's requests
    CONCURRENT_TRANSACTIONS (v2: its Produce v12 and its EndTxn; v1: AddPartitionsToTxn).
    An abort there waits them out, as the Java client retries, and ends the transaction:
    v2's EndTxn is not fatal; v1's waits for the addition in flight, which the
    coordinator applies once the markers are written, so no transaction is left open
    there. (The explorer's transactions workload, schedule 5, shrunk to its core.)"""
    async with FakeCluster.serve(brokers=3, seed=4, transaction_version=version,
                                 auto_create_topics=False, txn_marker_delay=0.3) as fake:
        fake.create_topic("t", 3)
        async with open_fake_producer(fake, **txn_options()) as producer:
            async with producer.transaction():
                await producer.send("t", b"kept", partition=0)
            committed = trio.current_time()
            assert fake.transaction(TID).state == "PrepareCommit"
            await producer.begin_transaction()
            await producer.send("t", b"dropped", partition=1)
            await trio.sleep(0.1)  # its requests are refused meanwhile
            await producer.abort_transaction()
            aborted = trio.current_time()
            await trio.sleep(1.0)
            assert fake.transaction(TID).state in ("CompleteCommit", "CompleteAbort")
            async with producer.transaction():
                await producer.send("t", b"then", partition=1)
        await trio.sleep(1.0)  # its markers
        assert await committed_values(fake) == [b"kept", b"then"]
    assert aborted - committed >= 0.3  # the abort waited for the markers
    aborts = [r for r in fake.requests_of(ApiKey.END_TXN) if not r.request.committed]
    if version == 2:  # refused until the markers are written, then the abort bumps the epoch
        assert len(aborts) > 1
    else:  # the partition's addition, refused until then, applied: the abort ends it
        assert len(fake.requests_of(ApiKey.ADD_PARTITIONS_TO_TXN)) > 2
        assert len(aborts) == 1
