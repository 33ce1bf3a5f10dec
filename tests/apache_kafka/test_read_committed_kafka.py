"""read_committed on Apache Kafka: transactions written by an independent client
(confluent-kafka's transactional producer) read back by our reader and CLI, judged
against confluent-kafka's own read_committed consumer."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio

from pipeline.cli import main
from pipeline.consumer import consume, topic_offsets
from pipeline.testing.kafka import KafkaCluster

from .conftest import confluent_kafka, wait_until

pytestmark = pytest.mark.kafka


def _offsets(bootstrap: str, topic: str, **kw: Any) -> dict[int, tuple[int, int]]:
    return trio.run(functools.partial(topic_offsets, bootstrap, topic, **kw))


def _producer(bootstrap: str, **extra: Any) -> Any:
    return confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, **extra})


def _confluent_records(bootstrap: str, topic: str, partitions: int, isolation: str,
                       expected: int) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of what confluent-kafka reads at ``isolation``."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"rc-{time.monotonic_ns()}",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
        "isolation.level": isolation,
    })
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        got: list[tuple[int, int, bytes]] = []
        deadline = time.monotonic() + 30
        while len(got) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.partition(), msg.offset(), msg.value()))
        time.sleep(0.5)  # nothing beyond the expected
        msg = consumer.poll(0.5)
        assert msg is None or msg.error() is not None, msg.value()
        return sorted(got)
    finally:
        consumer.close()


def _records(records: list[Any]) -> list[tuple[int, int, bytes]]:
    return sorted((r.partition, r.offset, r.value) for r in records)


def _values(records: list[Any]) -> list[tuple[int, bytes]]:
    return [(r.partition, r.value) for r in records]


@pytest.fixture
def transactions(kafka_single: KafkaCluster, kafka_topic: Callable[[str], str]) -> Any:
    """A 2-partition topic holding, in this order: committed, aborted, plain,
    committed transactions, then one left open on partition 1 (aborted at teardown)."""
    topic = kafka_topic("rc")
    kafka_single.create_topic(topic, 2, replication_factor=1)
    bootstrap = kafka_single.bootstrap
    txn = _producer(bootstrap, **{"transactional.id": f"{topic}-w"})
    txn.init_transactions(30)

    def commit(*writes: tuple[int, bytes], abort: bool = False) -> None:
        txn.begin_transaction()
        for p, v in writes:
            txn.produce(topic, v, partition=p)
        if abort:
            assert txn.flush(30) == 0  # in the log before the abort (else it is purged)
            txn.abort_transaction(30)
        else:
            txn.commit_transaction(30)

    commit((0, b"c1"), (0, b"c2"), (1, b"c3"))
    commit((0, b"a1"), (1, b"a2"), abort=True)
    plain = _producer(bootstrap)
    plain.produce(topic, b"n1", partition=0)
    assert plain.flush(30) == 0
    commit((0, b"c4"))
    txn.begin_transaction()
    txn.produce(topic, b"o1", partition=1)
    assert txn.flush(30) == 0  # written, not committed: partition 1's LSO stays before it
    # the markers are written after EndTxn returns: wait until partition 0 is stable
    wait_until(lambda: _offsets(bootstrap, topic, isolation_level="read_committed")[0]
               == _offsets(bootstrap, topic)[0], 30, "partition 0's markers written")
    yield bootstrap, topic, txn
    txn.abort_transaction(30)


def test_read_committed_reads_committed_records_up_to_the_lso(transactions: Any) -> None:
    bootstrap, topic, _ = transactions
    committed = [(0, b"c1"), (0, b"c2"), (0, b"n1"), (0, b"c4"), (1, b"c3")]
    theirs = _confluent_records(bootstrap, topic, 2, "read_committed", 5)
    assert sorted((p, v) for p, _, v in theirs) == sorted(committed)
    got = consume(bootstrap, topic, isolation_level="read_committed", stop_at_end=True,
                  timeout=60)
    assert _records(got) == theirs  # the same records at the same offsets
    assert sorted(_values(got), key=lambda x: x[0]) == committed  # in offset order
    # partition 1 ends at its LSO, the open transaction's first offset: c3, its COMMIT
    # marker, a2, its ABORT marker, then o1 at 4
    (o1,) = [o for p, o, v in _confluent_records(bootstrap, topic, 2, "read_uncommitted", 8)
             if v == b"o1"]
    assert o1 == 4
    assert _offsets(bootstrap, topic, isolation_level="read_committed")[1] == (0, o1)
    assert _offsets(bootstrap, topic)[1] == (0, o1 + 1)


def test_read_uncommitted_is_the_default_and_reads_everything_but_markers(
        transactions: Any) -> None:
    bootstrap, topic, _ = transactions
    everything = [(0, b"c1"), (0, b"c2"), (0, b"a1"), (0, b"n1"), (0, b"c4"),
                  (1, b"c3"), (1, b"a2"), (1, b"o1")]
    got = consume(bootstrap, topic, stop_at_end=True, timeout=60)
    assert sorted(_values(got), key=lambda x: x[0]) == everything
    assert _records(got) == _confluent_records(bootstrap, topic, 2, "read_uncommitted", 8)


def test_start_at_end_under_read_committed_is_the_lso(transactions: Any) -> None:
    bootstrap, topic, _ = transactions
    got = consume(bootstrap, topic, partitions=[1], start=-1,
                  isolation_level="read_committed", stop_at_end=True, timeout=60)
    # the last record before the LSO (offset 4) is the ABORT marker at 3: none is yielded
    assert _values(got) == []
    got = consume(bootstrap, topic, partitions=[1], start=-4,
                  isolation_level="read_committed", stop_at_end=True, timeout=60)
    assert _values(got) == [(1, b"c3")]


def test_once_the_open_transaction_aborts_the_partition_reads_to_its_end(
        transactions: Any) -> None:
    bootstrap, topic, txn = transactions
    txn.abort_transaction(30)
    txn.begin_transaction()  # (the fixture aborts this one)
    # o1 at 4, its ABORT marker at 5 (once written): the LSO reaches the high watermark
    wait_until(lambda: _offsets(bootstrap, topic, isolation_level="read_committed")[1]
               == (0, 6), 30, "partition 1 stable")
    got = consume(bootstrap, topic, partitions=[1], isolation_level="read_committed",
                  stop_at_end=True, timeout=60)
    assert _values(got) == [(1, b"c3")]


def test_cli_isolation(transactions: Any, capsys: pytest.CaptureFixture[str]) -> None:
    bootstrap, topic, _ = transactions
    assert main(["consume", "-b", bootstrap, "-t", topic, "-e", "-J", "-q",
                 "--isolation", "read_committed"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert sorted((x["partition"], x["payload"]) for x in lines) == [
        (0, "c1"), (0, "c2"), (0, "c4"), (0, "n1"), (1, "c3")]
    assert main(["consume", "-b", bootstrap, "-t", topic, "-e", "-J", "-q"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 8


def test_bad_isolation_level_is_a_clear_error(kafka_single: KafkaCluster) -> None:
    with pytest.raises(ValueError, match="'read_uncommitted' or 'read_committed'"):
        consume(kafka_single.bootstrap, "any", isolation_level="committed")  # type: ignore[arg-type]


@pytest.mark.parametrize("protocol", ["v1", "v2"])
async def test_transactions_spoken_raw_are_read_by_librdkafka(
        protocol: str, kafka_cluster: KafkaCluster, kafka_topic: Callable[[str], str]) -> None:
    """The other direction: transactions written request by request with our codec
    (transactional batches, AddPartitionsToTxn or Produce v12, EndTxn v4 or v5), on the
    3-node cluster; confluent-kafka's read_committed consumer sees the committed ones."""
    from pipeline.cluster import Cluster
    from pipeline.protocol.api import ApiKey
    from tests.testing import txn_raw

    topic = kafka_topic(f"raw-{protocol}")
    await kafka_cluster.call(kafka_cluster.create_topic, topic, 2, 3)
    versions = ({ApiKey.PRODUCE: 11, ApiKey.ADD_PARTITIONS_TO_TXN: 3, ApiKey.END_TXN: 4}
                if protocol == "v1" else {ApiKey.PRODUCE: 12, ApiKey.END_TXN: 5})
    async with Cluster.open(kafka_cluster.bootstrap) as cluster:
        x = txn_raw.Txn(cluster, topic, versions=versions)
        await x.init_ok()
        for values, commit in (([b"c1", b"c2"], True), ([b"a1"], False), ([b"c3"], True)):
            if protocol == "v1":
                assert await x.add_partitions({topic: [0, 1]}) == {(topic, 0): 0, (topic, 1): 0}
            for i, value in enumerate(values):
                assert (await x.produce(topic, i % 2, value)).error_code == 0
            assert (await x.end(commit)).error_code == 0
            await x.completed()
    got = await trio.to_thread.run_sync(
        _confluent_records, kafka_cluster.bootstrap, topic, 2, "read_committed", 3)
    assert sorted(v for _, _, v in got) == [b"c1", b"c2", b"c3"]
    everything = await trio.to_thread.run_sync(
        _confluent_records, kafka_cluster.bootstrap, topic, 2, "read_uncommitted", 4)
    assert sorted(v for _, _, v in everything) == [b"a1", b"c1", b"c2", b"c3"]
