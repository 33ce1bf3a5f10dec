"""The transactional producer on Apache Kafka 4.1, judged by confluent-kafka.

Every test writes with ``open_producer(..., transactional_id=...)`` and reads back with
librdkafka's consumer at ``isolation.level=read_committed`` (what a transaction promises)
and ``read_uncommitted`` (what reached the log), never only with our own reader. The
first tests run on both transaction protocols: ``v2`` on the session's 1-node cluster (a
fresh 4.1 cluster finalizes ``transaction.version`` 2: Produce v12 adds partitions, every
EndTxn bumps the epoch) and ``v1`` on one formatted at ``transaction.version`` 1
(AddPartitionsToTxn, AddOffsetsToTxn, the epoch kept across transactions).

* commit visible, abort invisible (aborted records are in the log, hidden by the marker);
* a zombie: a second producer of the same id fences the first, which gets
  ``ProducerFencedError`` on its next transactional call; only the new producer's
  records are visible;
* a transaction left open past ``transaction_timeout`` is aborted by the coordinator
  (the test kit's cleanup runs every second) and ``commit_transaction()`` says so
  (``TransactionTimedOutError``); the producer aborts, then goes on;
* ``send_offsets_to_transaction``: the group's committed offsets (read by
  confluent-kafka's ``committed()`` and by our consumer) move with a commit and not
  with an abort;
* a lost EndTxn(commit) answer (a FaultProxy between the producer and the broker
  closes the connection as the answer arrives): the commit happened, the retry as an
  abort is refused, and ``commit_transaction()`` returns, the records visible; an
  EndTxn(commit) cut before the broker read it: the abort goes through, and
  ``commit_transaction()`` raises ``TransactionAbortedError``, nothing visible;
* the window where a commit's markers are still being written: v2 (3 nodes, the
  markers held by shutting down the only replica of one of its partitions), the next
  transaction's Produce v12 and abort are answered CONCURRENT_TRANSACTIONS and waited
  out, not fatal; v1, an abort right after a commit waits for its AddPartitionsToTxn in
  flight and ends what it opened: no transaction is left Ongoing;
* coordinator failover (3 nodes): the transaction coordinator's node is SIGKILLed, or
  shut down, in the middle of a transaction; the producer finds the new coordinator and
  the commit makes every record visible exactly once.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from pipeline import (
    ProducerError,
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionTimedOutError,
    open_producer,
)
from pipeline.cluster import Cluster
from pipeline.consumer import topic_offsets
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.describe_transactions import DescribeTransactionsRequest
from pipeline.protocol.messages.find_coordinator import FindCoordinatorRequest
from pipeline.testing.kafka import KafkaCluster
from pipeline.testing.proxy import FaultProxy

from .conftest import confluent_kafka

pytestmark = pytest.mark.kafka

Rows = list[tuple[int, bytes]]


# --------------------------------------------------------------------------- helpers


@pytest.fixture(params=["v2", "v1"])
def txn_cluster(request: pytest.FixtureRequest) -> tuple[KafkaCluster, int]:
    """(a 1-node cluster, its finalized transaction.version): the protocol under test."""
    if request.param == "v2":
        return request.getfixturevalue("kafka_single"), 2
    return request.getfixturevalue("kafka_txn_v1"), 1


def _tid() -> str:
    return f"txn-{uuid.uuid4().hex[:10]}"


def _topic(cluster: KafkaCluster, partitions: int = 3, rf: int = 1) -> str:
    name = f"txn-{uuid.uuid4().hex[:10]}"
    cluster.create_topic(name, partitions, replication_factor=rf,
                         config={"min.insync.replicas": str(min(rf, 2))})
    return name


def _offsets(bootstrap: str, topic: str, **kw: Any) -> dict[int, tuple[int, int]]:
    return trio.run(functools.partial(topic_offsets, bootstrap, topic, **kw))


def wait_stable(bootstrap: str, topic: str, timeout: float = 30.0) -> None:
    """Until every partition's last stable offset is its high watermark: the markers
    of every ended transaction are written (they follow EndTxn's answer)."""
    deadline = time.monotonic() + timeout
    while True:
        if (_offsets(bootstrap, topic, isolation_level="read_committed")
                == _offsets(bootstrap, topic)):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic} not stable within {timeout}s")
        time.sleep(0.2)


def read(bootstrap: str, topic: str, isolation: str, *, timeout: float = 30.0) -> Rows:
    """(partition, value) of every record librdkafka reads at ``isolation``, in
    partition then offset order, from offset 0 to each partition's end (its high
    watermark; under read_committed, its last stable offset, which ``wait_stable``
    made the same)."""
    highs = _offsets(bootstrap, topic)
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"txn-judge-{time.monotonic_ns()}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "enable.partition.eof": True, "check.crcs": True, "isolation.level": isolation,
    })
    try:
        todo = {p for p, (_, high) in highs.items() if high > 0}
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in sorted(highs)])
        got: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + timeout
        while todo and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                    todo.discard(msg.partition())
                    continue
                raise AssertionError(f"consumer error: {msg.error()}")
            got.append((msg.partition(), msg.offset(), msg.value()))
        assert not todo, f"partitions {sorted(todo)} of {topic} not read to the end"
        return [(p, v) for p, _, v in sorted(got)]
    finally:
        consumer.close()


def values(rows: Rows) -> list[bytes]:
    return sorted(v for _, v in rows)


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int
                      ) -> dict[int, int]:
    """The group's committed offsets as librdkafka reads them (OffsetFetch; -1001: none)."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
        "isolation.level": "read_committed",
    })
    try:
        tps = consumer.committed(
            [confluent_kafka.TopicPartition(topic, p) for p in range(partitions)], timeout=30)
        return {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()


async def find_coordinator(bootstrap: str, transactional_id: str) -> int:
    """The node coordinating ``transactional_id`` (FindCoordinator, key type 1)."""
    async with Cluster.open(bootstrap) as cluster:
        with trio.fail_after(60):
            while True:
                conn = await cluster.any_connection()
                response = await conn.request(
                    FindCoordinatorRequest(key_type=1, coordinator_keys=(transactional_id,)),
                    version=4)
                (found,) = response.coordinators
                if found.error_code == ErrorCode.NONE:
                    return int(found.node_id)
                await trio.sleep(0.2)


async def txn_state(bootstrap: str, transactional_id: str) -> str:
    """The coordinator's state of ``transactional_id`` (DescribeTransactions)."""
    node = await find_coordinator(bootstrap, transactional_id)
    async with Cluster.open(bootstrap) as cluster:
        conn = await cluster.connection(node)
        response = await conn.request(DescribeTransactionsRequest(
            transactional_ids=(transactional_id,)))
        (state,) = response.transaction_states
        assert state.error_code == ErrorCode.NONE, state.error_code
        return str(state.transaction_state)


@asynccontextmanager
async def proxied(cluster: KafkaCluster) -> AsyncIterator[tuple[dict[int, FaultProxy], Any]]:
    """A FaultProxy in front of every node's CLIENT listener, and a connector that sends
    every connection of a client to its node's proxy: ``(proxies by node, connector)``."""
    async with trio.open_nursery() as nursery:
        proxies: dict[int, FaultProxy] = {}
        by_port: dict[int, int] = {}
        for n in cluster.nodes:
            proxy = FaultProxy("127.0.0.1", cluster.port(n), listen_port=0, seed=n)
            await nursery.start(proxy.run)
            proxies[n] = proxy
            by_port[cluster.port(n)] = proxy.port

        async def connector(host: str, port: int) -> trio.abc.Stream:
            return await trio.open_tcp_stream("127.0.0.1", by_port[port])

        try:
            yield proxies, connector
        finally:
            nursery.cancel_scope.cancel()


def txn_producer(bootstrap: str, tid: str, **options: Any) -> Any:
    options.setdefault("request_timeout", 10.0)
    return open_producer(bootstrap, transactional_id=tid, linger=0.002, **options)


# --------------------------------------------------------------------------- both versions


def test_committed_records_are_visible_and_aborted_ones_are_not(
        txn_cluster: tuple[KafkaCluster, int]) -> None:
    cluster, version = txn_cluster
    bootstrap, topic, tid = cluster.bootstrap, _topic(cluster), _tid()
    epochs: list[tuple[int, int]] = []

    async def main() -> None:
        async with txn_producer(bootstrap, tid) as producer:
            idem = producer._core.idempotence
            async with producer.transaction():
                for i in range(30):
                    await producer.send(topic, b"c1-%d" % i, key=b"k%d" % i)
            assert producer._txn.version == version
            epochs.append((idem.producer_id, idem.producer_epoch))
            await producer.begin_transaction()
            aborted = [await producer.send(topic, b"a-%d" % i, key=b"k%d" % i)
                       for i in range(30)]
            await producer.flush()  # in the log before the abort: hidden by its marker
            for d in aborted:
                await d
            await producer.abort_transaction()
            epochs.append((idem.producer_id, idem.producer_epoch))
            async with producer.transaction():
                for i in range(30):
                    await producer.send(topic, b"c2-%d" % i, key=b"k%d" % i)
            epochs.append((idem.producer_id, idem.producer_epoch))
            assert (producer._txn.committed, producer._txn.aborted) == (2, 1)

    trio.run(main)
    wait_stable(bootstrap, topic)
    committed = sorted([b"c1-%d" % i for i in range(30)] + [b"c2-%d" % i for i in range(30)])
    assert values(read(bootstrap, topic, "read_committed")) == committed
    everything = read(bootstrap, topic, "read_uncommitted")
    assert values(everything) == sorted(committed + [b"a-%d" % i for i in range(30)])
    # Each key's records, in each partition, in send order (c1, then a, then c2).
    for i in range(30):
        mine = [v for _, v in everything if v.endswith(b"-%d" % i)]
        assert mine == [b"c1-%d" % i, b"a-%d" % i, b"c2-%d" % i], mine
    pids = {pid for pid, _ in epochs}
    assert len(pids) == 1, epochs
    if version == 2:  # every EndTxn bumps the epoch
        assert [e for _, e in epochs] == [epochs[0][1], epochs[0][1] + 1, epochs[0][1] + 2]
    else:  # the epoch stays across transactions
        assert len(set(epochs)) == 1, epochs


@pytest.mark.parametrize("zombie_sends_after_the_fence", [False, True],
                         ids=["commits", "sends-then-commits"])
def test_a_zombie_is_fenced_and_only_the_new_producers_records_are_visible(
        txn_cluster: tuple[KafkaCluster, int], zombie_sends_after_the_fence: bool) -> None:
    """The zombie's transaction is open (its records written) when a new producer of the
    same id initialises: Kafka fences the zombie's epoch and aborts its transaction.

    * the zombie commits: EndTxn answers PRODUCER_FENCED: ``ProducerFencedError``;
    * the zombie sends first: Kafka answers the Produce with INVALID_PRODUCER_EPOCH,
      which cannot tell a takeover from a coordinator timeout, so the record fails at
      once and the transaction is abortable (as Java's InvalidProducerEpochException):
      the commit raises ``TransactionAbortableError``, and the abort, refused by the
      coordinator, raises ``ProducerFencedError``.

    Either way the zombie then refuses every transactional call with that error, and a
    read_committed reader sees only the new producer's records."""
    cluster, _ = txn_cluster
    bootstrap, topic, tid = cluster.bootstrap, _topic(cluster), _tid()
    raised: list[BaseException] = []

    async def main() -> None:
        async with txn_producer(bootstrap, tid) as zombie:
            await zombie.begin_transaction()
            written = [await zombie.send(topic, b"zombie-%d" % i, key=b"k%d" % i)
                       for i in range(20)]
            await zombie.flush()
            for d in written:
                await d  # in the log, in the zombie's open transaction
            async with txn_producer(bootstrap, tid) as successor:
                async with successor.transaction():
                    for i in range(20):
                        await successor.send(topic, b"new-%d" % i, key=b"k%d" % i)
                if zombie_sends_after_the_fence:
                    late = await zombie.send(topic, b"zombie-late", key=b"k0")
                    # Refused at once (not at its delivery_timeout, 120 s), as Java fails
                    # a batch answered INVALID_PRODUCER_EPOCH.
                    with trio.fail_after(30), pytest.raises(ProducerError) as failed:
                        await late
                    assert isinstance(failed.value.cause, TransactionAbortableError)
                    assert failed.value.cause.code == ErrorCode.INVALID_PRODUCER_EPOCH
                    with pytest.raises(TransactionAbortableError):
                        await zombie.commit_transaction()
                    with pytest.raises(ProducerFencedError) as fenced:
                        await zombie.abort_transaction()
                else:
                    with pytest.raises(ProducerFencedError) as fenced:
                        await zombie.commit_transaction()
                raised.append(fenced.value)
                # ... and stays fenced: every further call says the same.
                with pytest.raises(ProducerFencedError):
                    await zombie.begin_transaction()
                with pytest.raises(ProducerFencedError):
                    await zombie.send(topic, b"zombie-later", key=b"k0")
                async with successor.transaction():  # the successor goes on
                    await successor.send(topic, b"new-last", key=b"k0")

    trio.run(main)
    assert raised and raised[0].code == ErrorCode.PRODUCER_FENCED  # type: ignore[attr-defined]
    wait_stable(bootstrap, topic)
    expected = sorted([b"new-%d" % i for i in range(20)] + [b"new-last"])
    assert values(read(bootstrap, topic, "read_committed")) == expected
    everything = values(read(bootstrap, topic, "read_uncommitted"))
    assert [v for v in everything if v.startswith(b"zombie-")] == sorted(
        b"zombie-%d" % i for i in range(20))  # written, hidden by the abort
    assert b"zombie-late" not in everything and b"zombie-later" not in everything


def test_a_transaction_past_its_timeout_is_aborted_and_reported_so(
        txn_cluster: tuple[KafkaCluster, int]) -> None:
    """The coordinator aborts a transaction left open past ``transaction_timeout`` and
    bumps the producer's epoch; the block's ``commit_transaction()`` raises
    ``TransactionTimedOutError``, and the block aborts the transaction here too (an
    abortable error leaves no transaction open behind the block).

    What comes next is Kafka's choice, per protocol (pinned raw by
    ``test_kafka_after_a_coordinator_timeout``): under v2 the abort is answered as a
    retry of the coordinator's own abort, with the new epoch, and the producer goes on;
    under v1 Kafka answers both EndTxn and InitProducerId with the old epoch
    PRODUCER_FENCED, so the producer is fenced (``ProducerFencedError``, saying it was
    the timeout) and a new producer of the same id takes over."""
    cluster, version = txn_cluster
    bootstrap, topic, tid = cluster.bootstrap, _topic(cluster), _tid()
    raised: list[BaseException] = []

    async def main() -> None:
        async with txn_producer(bootstrap, tid, transaction_timeout=2.0) as producer:
            async def late() -> None:
                async with producer.transaction():
                    for i in range(10):
                        await producer.send(topic, b"late-%d" % i, key=b"k%d" % i)
                    await producer.flush()
                    # The coordinator aborts it once 2 s passed (it checks every second).
                    await trio.sleep(4.5)

            with pytest.raises(TransactionTimedOutError) as timed_out:
                await late()
            raised.append(timed_out.value)
            if version == 1:  # the block's abort was refused: the producer is fenced
                with pytest.raises(ProducerFencedError) as fenced:
                    await producer.begin_transaction()
                raised.append(fenced.value)
            else:  # the block aborted: the producer goes on
                async with producer.transaction():
                    for i in range(10):
                        await producer.send(topic, b"on-time-%d" % i, key=b"k%d" % i)
        if version == 1:  # a new producer of the id takes over
            async with txn_producer(bootstrap, tid, transaction_timeout=2.0) as producer:
                async with producer.transaction():
                    for i in range(10):
                        await producer.send(topic, b"on-time-%d" % i, key=b"k%d" % i)

    trio.run(main)
    assert "transaction_timeout=2.0s" in str(raised[0])
    if version == 1:
        assert "transaction_timeout" in str(raised[1]), raised[1]
        assert any("aborting the transaction failed too" in note
                   for note in getattr(raised[0], "__notes__", [])), raised[0]
    wait_stable(bootstrap, topic)
    assert values(read(bootstrap, topic, "read_committed")) == sorted(
        b"on-time-%d" % i for i in range(10))
    assert values(read(bootstrap, topic, "read_uncommitted")) == sorted(
        [b"late-%d" % i for i in range(10)] + [b"on-time-%d" % i for i in range(10)])


def test_offsets_sent_to_a_transaction_are_committed_with_it_and_not_with_an_abort(
        txn_cluster: tuple[KafkaCluster, int]) -> None:
    """Consume-transform-produce: our group consumer reads the source, the producer
    writes the output and the consumer's positions in one transaction, with the
    member's generation (KIP-447). The group's committed offsets follow the commits
    and ignore the abort."""
    cluster, _ = txn_cluster
    bootstrap, tid = cluster.bootstrap, _tid()
    source, sink = _topic(cluster, partitions=2), _topic(cluster)
    group = f"txn-group-{uuid.uuid4().hex[:8]}"
    for p in (0, 1):  # 10 plain records per source partition
        cluster_producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap})
        for i in range(10):
            cluster_producer.produce(source, b"in-%d-%d" % (p, i), partition=p)
        assert cluster_producer.flush(30) == 0
    seen: dict[str, Any] = {}

    async def main() -> None:
        from pipeline.consumer import open_consumer

        async with open_consumer(bootstrap, group_id=group, topics=[source],
                                 auto_offset_reset="earliest", enable_auto_commit=False,
                                 isolation_level="read_committed") as consumer, \
                txn_producer(bootstrap, tid) as producer:
            records: list[Any] = []
            with trio.fail_after(60):
                async for record in consumer:
                    records.append(record)
                    if len(records) == 20:
                        break
            first = [r for r in records if r.offset < 6]  # offsets 0-5 of each partition
            async with producer.transaction():
                for r in first:
                    await producer.send(sink, r.value.upper(), key=r.value)
                await producer.send_offsets_to_transaction(
                    {(source, 0): 6, (source, 1): 6}, consumer.group_metadata())
            seen["after_commit"] = await consumer.committed([(source, 0), (source, 1)])
            await producer.begin_transaction()
            for r in records:
                if r.offset >= 6:
                    await producer.send(sink, b"aborted-" + r.value, key=r.value)
            await producer.send_offsets_to_transaction(
                {(source, 0): 10, (source, 1): 10}, consumer.group_metadata())
            # In the log before the abort (which drops what was never sent, as Java's
            # does): read_uncommitted sees them, hidden from read_committed by the marker.
            await producer.flush()
            await producer.abort_transaction()
            seen["after_abort"] = await consumer.committed([(source, 0), (source, 1)])
            seen["generation"] = consumer.group_metadata().generation_id

    trio.run(main)
    assert seen["generation"] >= 1  # a real member's generation went with the offsets
    for key in ("after_commit", "after_abort"):
        assert {tp.partition: meta.offset for tp, meta in seen[key].items()} == {0: 6, 1: 6}
    assert committed_offsets(bootstrap, group, source, 2) == {0: 6, 1: 6}
    wait_stable(bootstrap, sink)
    assert values(read(bootstrap, sink, "read_committed")) == sorted(
        b"IN-%d-%d" % (p, i) for p in (0, 1) for i in range(6))
    assert len(read(bootstrap, sink, "read_uncommitted")) == 20


@pytest.mark.parametrize("fault", ["answer-lost", "request-cut"])
def test_a_commit_whose_answer_is_lost_is_retried_only_as_an_abort(
        txn_cluster: tuple[KafkaCluster, int], fault: str) -> None:
    """A FaultProxy between the producer and the coordinator breaks the EndTxn(commit):

    * ``answer-lost``: Kafka applied the commit, the connection closes as its answer
      arrives. The producer's abort (it never resends a commit) is refused with
      INVALID_TXN_STATE, the commit stands: ``commit_transaction()`` returns, the
      records are visible;
    * ``request-cut``: the request is cut mid-frame, Kafka never read it. The abort
      goes through: ``commit_transaction()`` raises ``TransactionAbortedError``,
      nothing is visible.

    Either way the outcome reported is the one Kafka holds, and the producer goes on."""
    cluster, _ = txn_cluster
    bootstrap, topic, tid = cluster.bootstrap, _topic(cluster), _tid()
    stats: dict[str, int] = {}

    async def main() -> None:
        async with proxied(cluster) as (proxies, connector), \
                txn_producer(bootstrap, tid, connector=connector) as producer:
            await producer.begin_transaction()
            for i in range(20):
                await producer.send(topic, b"maybe-%d" % i, key=b"k%d" % i)
            await producer.flush()  # only the EndTxn is left to send
            proxy = proxies[await find_coordinator(bootstrap, tid)]
            if fault == "answer-lost":
                proxy.lose_responses(1, api_key=ApiKey.END_TXN)
                await producer.commit_transaction()
            else:
                proxy.cut_mid_frame("request")
                with pytest.raises(TransactionAbortedError, match="aborted instead"):
                    await producer.commit_transaction()
            stats.update(lost=proxy.stats.responses_lost, cuts=proxy.stats.cuts,
                         committed=producer._txn.committed, aborted=producer._txn.aborted)
            async with producer.transaction():  # the producer goes on
                await producer.send(topic, b"after", key=b"k0")

    trio.run(main)
    wait_stable(bootstrap, topic)
    maybe = [b"maybe-%d" % i for i in range(20)]
    committed = values(read(bootstrap, topic, "read_committed"))
    if fault == "answer-lost":
        assert (stats["lost"], stats["committed"], stats["aborted"]) == (1, 1, 0), stats
        assert committed == sorted([*maybe, b"after"])
    else:
        assert (stats["cuts"], stats["committed"], stats["aborted"]) == (1, 0, 1), stats
        assert committed == [b"after"]
    assert values(read(bootstrap, topic, "read_uncommitted")) == sorted([*maybe, b"after"])


def test_kafka_after_a_coordinator_timeout(txn_cluster: tuple[KafkaCluster, int]) -> None:
    """The oracle, raw: what Kafka 4.1 answers a producer whose transaction its
    coordinator timed out (and fenced), per protocol. v2: EndTxn(commit) with the old
    epoch is INVALID_TXN_STATE, EndTxn(abort) is a retry of the coordinator's own abort
    (NONE, with the bumped epoch). v1: both are PRODUCER_FENCED, and so is KIP-360's
    InitProducerId with the old epoch: the producer cannot be taken on."""
    from pipeline.protocol.messages.add_partitions_to_txn import (
        AddPartitionsToTxnRequest,
        AddPartitionsToTxnTopic,
    )
    from pipeline.protocol.messages.end_txn import EndTxnRequest
    from pipeline.protocol.messages.init_producer_id import InitProducerIdRequest

    cluster, version = txn_cluster
    topic, tid = _topic(cluster, partitions=1), _tid()
    answers: dict[str, tuple[int, int]] = {}

    async def main() -> None:
        await find_coordinator(cluster.bootstrap, tid)  # the coordinator is loaded
        async with Cluster.open(cluster.bootstrap) as client:
            conn = await client.any_connection()
            init = await conn.request(InitProducerIdRequest(
                transactional_id=tid, transaction_timeout_ms=1000, producer_id=-1,
                producer_epoch=-1), version=5)
            pid, epoch = init.producer_id, init.producer_epoch
            added = await conn.request(AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
                v3_and_below_producer_epoch=epoch, v3_and_below_topics=(
                    AddPartitionsToTxnTopic(name=topic, partitions=(0,)),)), version=3)
            assert added.results_by_topic_v3_and_below[0].results_by_partition[
                0].partition_error_code == 0
            await trio.sleep(3.5)  # past the timeout, and the coordinator's check
            end_version = 5 if version == 2 else 4
            for name, commit in (("commit", True), ("abort", False)):
                r = await conn.request(EndTxnRequest(
                    transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                    committed=commit), version=end_version)
                answers[name] = (r.error_code, r.producer_epoch - epoch)
            r = await conn.request(InitProducerIdRequest(
                transactional_id=tid, transaction_timeout_ms=1000, producer_id=pid,
                producer_epoch=epoch), version=5)
            answers["init"] = (r.error_code, r.producer_epoch - epoch)

    trio.run(main)
    fenced = int(ErrorCode.PRODUCER_FENCED)
    if version == 2:
        assert answers["commit"][0] == ErrorCode.INVALID_TXN_STATE, answers
        assert answers["abort"] == (ErrorCode.NONE, 1), answers
    else:
        assert answers["commit"][0] == answers["abort"][0] == fenced, answers
        assert answers["init"][0] == fenced, answers


# --------------------------------------------------------------------------- 3 nodes


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_the_coordinator_fails_over_in_the_middle_of_a_transaction(
        kafka_cluster: KafkaCluster, how: str) -> None:
    """3 nodes, RF=3, ``min.insync.replicas=2``: FindCoordinator names the transaction
    coordinator's node, which is SIGKILLed (fenced by the controller after 6 s) or shut
    down (SIGTERM) while the transaction holds written records. The producer goes on
    writing (partition leaders move too), finds the new coordinator and commits: every
    record visible exactly once, nothing of the transaction lost."""
    cluster = kafka_cluster
    bootstrap, tid = cluster.bootstrap, _tid()
    topic = _topic(cluster, partitions=6, rf=3)
    seen: dict[str, int] = {}

    async def main() -> None:
        async with txn_producer(bootstrap, tid, delivery_timeout=90.0) as producer:
            async with producer.transaction():
                for i in range(30):
                    await producer.send(topic, b"before-%d" % i, key=b"k%d" % i)
            seen["old"] = old = await find_coordinator(bootstrap, tid)
            await producer.begin_transaction()
            for i in range(100):
                await producer.send(topic, b"during-%d" % i, key=b"k%d" % i)
            await producer.flush()
            await cluster.call(cluster.kill if how == "kill" else cluster.stop, old)
            for i in range(100, 200):
                await producer.send(topic, b"during-%d" % i, key=b"k%d" % i)
            with trio.fail_after(90):
                await producer.commit_transaction()
            seen["new"] = await find_coordinator(bootstrap, tid)
            async with producer.transaction():
                for i in range(30):
                    await producer.send(topic, b"after-%d" % i, key=b"k%d" % i)
        await cluster.call(cluster.start, old)

    trio.run(main)
    assert seen["new"] != seen["old"], seen
    wait_stable(bootstrap, topic)
    expected = sorted([b"before-%d" % i for i in range(30)]
                      + [b"during-%d" % i for i in range(200)]
                      + [b"after-%d" % i for i in range(30)])
    committed = values(read(bootstrap, topic, "read_committed"))
    assert committed == expected  # each once: the values are distinct
    assert values(read(bootstrap, topic, "read_uncommitted")) == expected


def test_an_abort_while_the_last_commits_markers_are_held(kafka_cluster: KafkaCluster) -> None:
    """v2, 3 nodes: a commit is answered before its markers are written; here they are
    held (the only replica of one of its partitions is shut down once its records are
    written: the transaction stays PrepareCommit until the node is back). Meanwhile the
    coordinator answers the next transaction's Produce v12 and its EndTxn(abort)
    CONCURRENT_TRANSACTIONS: the abort waits (no TransactionFatalError) and ends once
    the markers are written; the next transaction commits."""
    cluster = kafka_cluster
    bootstrap, tid = cluster.bootstrap, _tid()
    topic = _topic(cluster, partitions=3, rf=1)
    home = trio.run(find_coordinator, bootstrap, tid)
    leaders = [cluster.leader(topic, p) for p in range(3)]
    held = next(p for p in range(3) if leaders[p] != home)
    free = next(p for p in range(3) if leaders[p] != leaders[held])
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with txn_producer(bootstrap, tid) as producer:
            await producer.begin_transaction()
            await producer.send(topic, b"kept-held", partition=held)
            await producer.send(topic, b"kept-free", partition=free)
            await producer.flush()
            await cluster.call(cluster.stop, leaders[held])
            try:
                await producer.commit_transaction()  # answered; the markers wait
                seen["after commit"] = await txn_state(bootstrap, tid)
                await producer.begin_transaction()
                await producer.send(topic, b"dropped", partition=free)
                await trio.sleep(0.5)  # its Produce v12 is refused (and retried) meanwhile
                async with trio.open_nursery() as nursery:
                    async def abort() -> None:
                        await producer.abort_transaction()
                        seen["aborted"] = True

                    nursery.start_soon(abort)
                    await trio.sleep(3.0)
                    seen["aborted while held"] = seen.get("aborted", False)
                    await cluster.call(cluster.start_all)
            finally:
                await cluster.call(cluster.start_all)
            async with producer.transaction():
                await producer.send(topic, b"then", partition=free)

    trio.run(main)
    assert seen == {"after commit": "PrepareCommit", "aborted while held": False,
                    "aborted": True}
    wait_stable(bootstrap, topic)
    assert values(read(bootstrap, topic, "read_committed")) == [
        b"kept-free", b"kept-held", b"then"]


def test_v1_an_abort_right_after_a_commit_leaves_no_transaction_open(
        kafka_txn_v1: KafkaCluster) -> None:
    """v1: the next transaction's first AddPartitionsToTxn, sent while the commit's
    markers are still being written (a few milliseconds on one node), is refused
    CONCURRENT_TRANSACTIONS and retried; an abort meanwhile waits for it, then ends the
    transaction the coordinator opened with it, so none is left open (it would stay
    Ongoing until its timeout, whose abort fences the producer)."""
    cluster = kafka_txn_v1
    bootstrap, tid = cluster.bootstrap, _tid()
    topic = _topic(cluster, partitions=2)
    states: list[str] = []

    async def main() -> None:
        async with txn_producer(bootstrap, tid) as producer:
            for i in range(10):
                async with producer.transaction():
                    await producer.send(topic, b"kept-%d" % i, partition=0)
                await producer.begin_transaction()
                await producer.send(topic, b"dropped-%d" % i, partition=1)
                await trio.sleep(0.002 * (i % 5))  # its AddPartitionsToTxn goes out
                await producer.abort_transaction()
                await trio.sleep(0.2)  # an addition in flight would have landed by now
                states.append(await txn_state(bootstrap, tid))

    trio.run(main)
    assert "Ongoing" not in states, states
    wait_stable(bootstrap, topic)
    assert values(read(bootstrap, topic, "read_committed")) == sorted(
        b"kept-%d" % i for i in range(10))


@pytest.mark.parametrize("how", ["by-hand", "block"])
def test_a_cancelled_commit_leaves_a_transaction_that_can_still_end(
        txn_cluster: tuple[KafkaCluster, int], how: str) -> None:
    """The broker is blackholed (a FaultProxy holds every request), so the commit waits
    for its records; the caller cancels it before any EndTxn was sent. The transaction
    is still open, not stuck half-committed: ``by-hand``, the caller aborts it once the
    broker answers again; ``block``, the cancelled ``async with producer.transaction()``
    aborts it itself. Nothing of it is visible, and the next transaction commits."""
    cluster, _ = txn_cluster
    bootstrap, topic, tid = cluster.bootstrap, _topic(cluster), _tid()

    async def main() -> None:
        async with proxied(cluster) as (proxies, connector), \
                txn_producer(bootstrap, tid, connector=connector) as producer:
            async with producer.transaction():  # connected, the producer id in place
                await producer.send(topic, b"first", key=b"k0")
            (proxy,) = proxies.values()
            if how == "by-hand":
                await producer.begin_transaction()
                for i in range(10):
                    await producer.send(topic, b"cancelled-%d" % i, key=b"k%d" % i)
                proxy.blackhole(3.0)
                with trio.move_on_after(1.0) as waited:
                    await producer.commit_transaction()
                assert waited.cancelled_caught
                await producer.abort_transaction()
            else:
                with trio.move_on_after(1.0) as waited:
                    async with producer.transaction():
                        for i in range(10):
                            await producer.send(topic, b"cancelled-%d" % i, key=b"k%d" % i)
                        proxy.blackhole(3.0)
                assert waited.cancelled_caught
            async with producer.transaction():
                await producer.send(topic, b"next", key=b"k0")

    trio.run(main)
    wait_stable(bootstrap, topic)
    assert values(read(bootstrap, topic, "read_committed")) == [b"first", b"next"]


def test_the_sync_producers_block_aborts_when_its_commit_times_out(
        kafka_single: KafkaCluster) -> None:
    """``SyncProducer``'s ``with producer.transaction():`` as the async block: its
    commit raises ``TransactionTimedOutError`` and the block aborts, so the next block
    begins at once."""
    from pipeline import SyncProducer

    bootstrap, topic, tid = kafka_single.bootstrap, _topic(kafka_single), _tid()
    with SyncProducer(bootstrap, transactional_id=tid, transaction_timeout=2.0,
                      linger=0.002) as producer:
        def late_block() -> None:
            with producer.transaction():
                producer.send(topic, b"late", key=b"k0")
                time.sleep(4.5)

        with pytest.raises(TransactionTimedOutError):
            late_block()
        with producer.transaction():
            producer.send(topic, b"on-time", key=b"k0")
    wait_stable(bootstrap, topic)
    assert values(read(bootstrap, topic, "read_committed")) == [b"on-time"]
