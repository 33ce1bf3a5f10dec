"""The fake cluster's transaction coordinator on virtual time: what Kafka does too fast,
too slowly or too rarely to pin in tests/testing/test_fake_vs_kafka.py (markers still
being written, timeouts to the millisecond, coordinator moves, injected coordinator
errors, epoch exhaustion), the committed-offsets store, and the project's read_committed
reader against the fake."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import trio

from pipeline.cluster import Cluster
from pipeline.consumer import read_topic, topic_offsets
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import fetch as fm
from pipeline.protocol.records import decode_record_batches, end_txn_marker_coordinator_epoch
from pipeline.testing.fake_cluster import (
    GROUP,
    TRANSACTION,
    CommittedOffset,
    FakeCluster,
    OffsetStore,
)

from . import txn_raw

V1 = {ApiKey.PRODUCE: 11, ApiKey.ADD_PARTITIONS_TO_TXN: 3, ApiKey.END_TXN: 4}
V2 = {ApiKey.PRODUCE: 12, ApiKey.END_TXN: 5, ApiKey.TXN_OFFSET_COMMIT: 5}


@pytest.fixture
async def fake() -> AsyncIterator[FakeCluster]:
    async with FakeCluster.serve(brokers=3, seed=2, txn_marker_delay=2.0) as fake:
        fake.create_topic("t", 2)
        yield fake


@pytest.fixture
async def cluster(fake: FakeCluster) -> AsyncIterator[Cluster]:
    async with Cluster.open(fake.bootstrap, connector=fake.connector) as cluster:
        yield cluster


async def open_txn(cluster: Cluster, name: str = "tx", **kw: object) -> txn_raw.Txn:
    """Initialised, with "v" written to t-0 in an open transaction (v2 protocol)."""
    x = txn_raw.Txn(cluster, name, versions=V2, **kw)  # type: ignore[arg-type]
    assert (await x.init()).error_code == 0
    assert (await x.produce("t", 0, b"v")).error_code == 0
    return x


# ----------------------------------------------------------------------------- completing


async def test_a_transaction_being_completed_answers_concurrent_transactions(
        fake: FakeCluster, cluster: Cluster,
        autojump_clock: trio.abc.Clock) -> None:
    """Between EndTxn and its markers (txn_marker_delay) the transaction is PrepareCommit:
    every transactional request for it is refused as Kafka refuses it, and the partition's
    last stable offset stays before the transaction until the COMMIT marker lands."""
    x = await open_txn(cluster)
    group = "g"
    assert (await x.commit_offsets(group, {("t", 1): 7})) == {("t", 1): 0}
    start = trio.current_time()
    e = await x.end(True)
    assert (e.error_code, e.producer_epoch) == (0, 1)
    assert fake.transaction("tx").state == "PrepareCommit"
    assert fake.last_stable_offset("t", 0) == 0
    assert fake.offsets.is_pending(group, ("t", 1))
    again = txn_raw.Txn(cluster, "tx", versions=V1)
    assert (await again.init()).error_code == ErrorCode.CONCURRENT_TRANSACTIONS
    assert (await x.end(True, epoch=0)).error_code == ErrorCode.CONCURRENT_TRANSACTIONS
    # Kafka's pending CompleteCommit transition is checked first: an abort too (the
    # next transaction's, or one after a lost commit answer) is asked to wait
    assert (await x.end(False, epoch=0)).error_code == ErrorCode.CONCURRENT_TRANSACTIONS
    assert (await x.end(False)).error_code == ErrorCode.CONCURRENT_TRANSACTIONS
    x.versions = V1
    assert (await x.add_partitions({"t": [1]})) == {("t", 1): ErrorCode.CONCURRENT_TRANSACTIONS}
    assert await x.add_offsets(group) == ErrorCode.CONCURRENT_TRANSACTIONS
    x.versions = V2
    assert (await x.commit_offsets(group, {("t", 1): 9})) == {
        ("t", 1): ErrorCode.CONCURRENT_TRANSACTIONS}
    # Produce v12 is answered CONCURRENT_TRANSACTIONS; below v12, NOT_ENOUGH_REPLICAS
    # (what Kafka translates it to for older clients)
    assert (await x.produce("t", 1, b"w")).error_code == ErrorCode.CONCURRENT_TRANSACTIONS
    x.versions = {**V2, ApiKey.PRODUCE: 11}
    assert (await x.produce("t", 1, b"w")).error_code == ErrorCode.NOT_ENOUGH_REPLICAS
    x.versions = V2
    await x.completed()
    assert trio.current_time() - start == pytest.approx(2.0, abs=0.2)
    assert fake.transaction("tx").state == "CompleteCommit"
    assert fake.last_stable_offset("t", 0) == fake.high_watermark("t", 0) == 2
    assert fake.offsets.fetch(group, ("t", 1)) == CommittedOffset(7, -1, "", position=1)
    assert (await x.produce("t", 1, b"w")).error_code == 0  # the next transaction


async def test_a_read_committed_fetch_waits_for_the_marker(
        fake: FakeCluster, cluster: Cluster,
        autojump_clock: trio.abc.Clock) -> None:
    """A read_committed Fetch waiting for data (min_bytes) is answered when the COMMIT
    marker moves the last stable offset, not before."""
    x = await open_txn(cluster)
    conn = await cluster.connection(fake.leader("t", 0))
    request = fm.FetchRequest(
        replica_id=-1, max_wait_ms=10_000, min_bytes=1, max_bytes=1 << 20, isolation_level=1,
        session_id=0, session_epoch=-1, topics=(fm.FetchTopic(topic="t", partitions=(
            fm.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20),)),))
    answered: list[float] = []

    async def fetch() -> None:
        r = await conn.request(request, version=12)
        answered.append(trio.current_time())
        (pd,) = r.responses[0].partitions
        assert (pd.high_watermark, pd.last_stable_offset) == (2, 2)
        assert [b.is_control for b in decode_record_batches(pd.records or b"")] == [False, True]

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(fetch)
        await trio.sleep(1)
        await x.end(True)  # markers 2 s later
    assert answered[0] - start == pytest.approx(3.0, abs=0.1)


# ----------------------------------------------------------------------------- timeouts


async def test_the_coordinator_aborts_a_transaction_at_its_timeout(
        autojump_clock: trio.abc.Clock) -> None:
    async with FakeCluster.serve(brokers=1) as fake:
        fake.create_topic("t", 1)
        async with Cluster.open(fake.bootstrap, connector=fake.connector) as cluster:
            x = await open_txn(cluster, timeout_ms=5000)
            begun = trio.current_time()
            await trio.sleep_until(begun + 4.99)
            assert fake.transaction("tx").state == "Ongoing"
            assert fake.last_stable_offset("t", 0) == 0
            await trio.sleep_until(begun + 5.01)
            meta = fake.transaction("tx")
            assert (meta.state, meta.epoch) == ("CompleteAbort", 1)  # fenced: epoch + 1
            assert fake.last_stable_offset("t", 0) == 2  # the ABORT marker at 1
            assert [(a.producer_id, a.first_offset, a.last_offset)
                    for a in fake.partition("t", 0).aborted_txns] == [(x.producer_id, 0, 1)]
            assert (await x.produce("t", 0, b"late")).error_code == (
                ErrorCode.INVALID_PRODUCER_EPOCH)
            # v2: the producer's own abort with the old epoch goes through
            e = await x.end(False)
            assert (e.error_code, e.producer_epoch) == (0, 1)


# ----------------------------------------------------------------------------- coordinators


async def test_find_coordinator_and_a_coordinator_move(fake: FakeCluster,
                                                       cluster: Cluster, autojump_clock: trio.abc.Clock) -> None:
    x = await open_txn(cluster)
    old = fake.coordinator("tx")
    assert await txn_raw.find_coordinator(cluster, "tx", TRANSACTION) == (0, old)
    assert await txn_raw.find_coordinator(cluster, "g", GROUP) == (0, fake.coordinator("g", GROUP))
    new = fake.move_coordinator("tx")
    assert new != old and fake.coordinator("tx") == new
    stale = await cluster.connection(old)
    assert (await x.end(True, conn=stale)).error_code == ErrorCode.NOT_COORDINATOR
    assert await txn_raw.find_coordinator(cluster, "tx", TRANSACTION) == (0, new)
    e = await x.end(True)  # the state moved with the coordinator
    assert (e.error_code, e.producer_epoch) == (0, 1)
    await x.completed()
    (marker,) = [b for b in decode_record_batches(
        b"".join(s.data for s in fake.partition("t", 0).batches)) if b.is_control]
    assert end_txn_marker_coordinator_epoch(marker.records[0]) == 1  # one move


async def test_a_stopped_coordinator_moves(fake: FakeCluster, cluster: Cluster,
        autojump_clock: trio.abc.Clock) -> None:
    old = fake.coordinator("tx")
    fake.stop_broker(old)
    assert fake.coordinator("tx") not in (old, -1)
    await cluster.refresh(force=True)
    code, node = await txn_raw.find_coordinator(cluster, "tx", TRANSACTION)
    assert (code, node) == (0, fake.coordinator("tx"))


async def test_injected_coordinator_errors(fake: FakeCluster, cluster: Cluster,
        autojump_clock: trio.abc.Clock) -> None:
    """NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS through the fault API: answered
    instead of handling (nothing applied), then the request goes through."""
    x = await open_txn(cluster)
    fake.fail_next(ApiKey.END_TXN, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    e = await x.end(True)
    assert (e.error_code, e.producer_epoch) == (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, -1)
    assert fake.transaction("tx").state == "Ongoing"
    fake.fail_next(ApiKey.FIND_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    conn = await cluster.any_connection()
    from pipeline.protocol.messages import find_coordinator as fc

    r = await conn.request(fc.FindCoordinatorRequest(key_type=1, coordinator_keys=("tx",)),
                           version=6)
    assert [(c.error_code, c.node_id) for c in r.coordinators] == [
        (ErrorCode.COORDINATOR_NOT_AVAILABLE, -1)]
    x.versions = V1
    fake.fail_next(ApiKey.ADD_PARTITIONS_TO_TXN, ErrorCode.NOT_COORDINATOR, topic="t",
                   partition=1)
    assert await x.add_partitions({"t": [0, 1]}) == {("t", 0): 0,
                                                    ("t", 1): ErrorCode.NOT_COORDINATOR}
    fake.fail_next(ApiKey.INIT_PRODUCER_ID, ErrorCode.NOT_COORDINATOR)
    assert (await txn_raw.Txn(cluster, "other").init()).error_code == ErrorCode.NOT_COORDINATOR
    x.versions = V2
    assert (await x.end(True)).error_code == 0


async def test_an_exhausted_epoch_takes_a_new_producer_id(fake: FakeCluster,
                                                          cluster: Cluster, autojump_clock: trio.abc.Clock) -> None:
    x = txn_raw.Txn(cluster, "tx")
    await x.init()
    first = x.producer_id
    fake.transaction("tx").epoch = 32766
    r = await x.init()
    assert (r.error_code, r.producer_epoch) == (0, 0)
    assert r.producer_id != first


async def test_a_new_producer_leaves_no_epoch_to_retry_into(
        fake: FakeCluster, cluster: Cluster, autojump_clock: trio.abc.Clock) -> None:
    """KIP-360's retry rule (an InitProducerId with the epoch before the last bump gets
    the current epoch) holds only for the producer's own bumps: a new producer's
    InitProducerId (no id and epoch) leaves no earlier epoch to retry (Kafka sets
    lastProducerEpoch to -1), so the fenced producer cannot share the new one's epoch."""
    old = txn_raw.Txn(cluster, "tx")
    await old.init_ok()
    kept = await old.init(keep=True)  # its own bump: its previous epoch may be retried
    assert kept.error_code == 0
    new = txn_raw.Txn(cluster, "tx")
    await new.init_ok()
    assert new.epoch == old.epoch + 1
    old.epoch -= 1  # the epoch before its own last bump, as a lost answer's retry sends it
    assert (await old.init(keep=True)).error_code == ErrorCode.PRODUCER_FENCED
    old.epoch += 1  # the epoch it has, now fenced too
    assert (await old.init(keep=True)).error_code == ErrorCode.PRODUCER_FENCED
    assert fake.transaction("tx").epoch == new.epoch


# ----------------------------------------------------------------------------- the reader


async def test_the_read_committed_reader_on_the_fake(fake: FakeCluster, cluster: Cluster,
        autojump_clock: trio.abc.Clock) -> None:
    """pipeline.consumer at read_committed: committed and plain records only, up to the
    last stable offset; read_uncommitted sees every data record."""
    a = await open_txn(cluster, "a")  # "v" at t-0 offset 0
    await a.end(True)
    await a.completed()
    b = await open_txn(cluster, "b")  # "v" at offset 2, aborted
    assert (await b.produce("t", 0, b"aborted")).error_code == 0
    await b.end(False)
    await b.completed()
    c = await open_txn(cluster, "c")  # open: the LSO stays at its first offset
    lso = fake.last_stable_offset("t", 0)

    async def read(isolation: str) -> list[tuple[int, bytes | None]]:
        return [(r.offset, r.value) async for r in read_topic(
            fake.bootstrap, "t", partitions=[0], stop_at_end=True, isolation_level=isolation,
            connector=fake.connector)]  # type: ignore[arg-type]

    assert await read("read_committed") == [(0, b"v")]
    assert lso == 5
    assert await read("read_uncommitted") == [(0, b"v"), (2, b"v"), (3, b"aborted"), (5, b"v")]
    ends = await topic_offsets(fake.bootstrap, "t", isolation_level="read_committed",
                               connector=fake.connector)
    assert ends[0] == (0, 5)
    await c.end(True)
    await c.completed()
    assert await read("read_committed") == [(0, b"v"), (5, b"v")]


# ----------------------------------------------------------------------------- offsets


def test_offset_store_rules() -> None:
    store = OffsetStore()
    tp = ("t", 0)
    store.commit("g", {tp: CommittedOffset(5)})
    assert store.fetch("g", tp) is not None and store.fetch("g", tp).offset == 5  # type: ignore[union-attr]
    store.stage("g", 1000, {tp: CommittedOffset(9), ("t", 1): CommittedOffset(3)})
    assert store.is_pending("g", tp) and store.is_pending("g", ("t", 1))
    assert store.fetch("g", tp).offset == 5  # type: ignore[union-attr]
    assert store.pending("g", 1000)[tp].offset == 9
    store.commit("g", {("t", 1): CommittedOffset(4)})  # a later record than the staged 3
    store.end_transaction(1000, commit=True, groups=["g"])
    assert {k: v.offset for k, v in store.committed("g").items()} == {tp: 9, ("t", 1): 4}
    assert not store.is_pending("g", tp)
    store.stage("g", 1001, {tp: CommittedOffset(20)})
    store.end_transaction(1001, commit=False)
    assert store.fetch("g", tp).offset == 9  # type: ignore[union-attr]
    store.delete("g", [tp])
    assert store.fetch("g", tp) is None
    assert store.groups() == ["g"]
    store.delete("g")
    assert store.groups() == []


# ----------------------------------------------------------------------------- librdkafka


@pytest.mark.integration
async def test_librdkafka_reads_the_fakes_transactions() -> None:
    """An independent reader (confluent-kafka) of the fake's markers, last stable offsets
    and aborted lists, over TCP: read_committed sees the committed records only and stops
    before the open transaction; read_uncommitted sees every data record."""
    confluent_kafka = pytest.importorskip("confluent_kafka")
    async with FakeCluster.serve(brokers=1, tcp=True) as fake:
        fake.create_topic("t", 1)
        async with Cluster.open(fake.bootstrap) as cluster:
            for name, value, commit in (("a", b"c1", True), ("b", b"a1", False),
                                        ("c", b"c2", True), ("d", b"open", None)):
                x = txn_raw.Txn(cluster, name, versions=V2)
                assert (await x.init()).error_code == 0
                assert (await x.produce("t", 0, value)).error_code == 0
                if commit is not None:
                    assert (await x.end(commit)).error_code == 0

        def consume(isolation: str, expected: int) -> list[bytes]:
            consumer = confluent_kafka.Consumer({
                "bootstrap.servers": fake.bootstrap, "group.id": "fake-rc",
                "enable.auto.commit": False, "isolation.level": isolation,
                "enable.partition.eof": True})
            try:
                consumer.assign([confluent_kafka.TopicPartition("t", 0, 0)])
                got: list[bytes] = []
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    msg = consumer.poll(0.2)
                    if msg is None:
                        continue
                    if msg.error() is not None:
                        if msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                            if len(got) >= expected:
                                return got
                            continue
                        raise AssertionError(msg.error())
                    got.append(msg.value())
                return got
            finally:
                consumer.close()

        assert await trio.to_thread.run_sync(consume, "read_committed", 2) == [b"c1", b"c2"]
        assert await trio.to_thread.run_sync(consume, "read_uncommitted", 4) == [
            b"c1", b"a1", b"c2", b"open"]


@pytest.mark.parametrize(("level", "listed"), [(2, {"transaction.version": 2}),
                                               (1, {"transaction.version": 1}), (0, {})])
async def test_api_versions_lists_the_finalized_transaction_version(
        level: int, listed: dict[str, int], autojump_clock: trio.abc.Clock) -> None:
    async with FakeCluster.serve(brokers=1, transaction_version=level) as fake:
        async with Cluster.open(fake.bootstrap, connector=fake.connector) as cluster:
            conn = await cluster.any_connection()
            assert dict(conn.handshake.finalized_features) == listed
            assert conn.handshake.broker_versions[ApiKey.PRODUCE] == (3, 12)
            assert conn.handshake.broker_versions[ApiKey.END_TXN] == (0, 5)
