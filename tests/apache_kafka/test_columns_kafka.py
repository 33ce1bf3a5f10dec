"""``batches(columns=True)`` on Apache Kafka, judged by confluent-kafka.

librdkafka writes the records (plain, gzip and zstd batches, headers, null keys, null
values, one committed and one aborted transaction); librdkafka reads them back at
read_committed; our group consumer reads them as columns at read_committed. Both reads
must agree field by field, partition by partition, and the offsets our consumer commits
after its last column batch, read back by librdkafka, must be the log end.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
import trio

from pipeline import ConsumedColumns, open_consumer
from pipeline.testing.kafka import KafkaCluster

from .conftest import committed_offsets, confluent_kafka, log_ends, read_partitions

pytestmark = pytest.mark.kafka

PARTITIONS = 3
PER_CODEC = 300


def write(bootstrap: str, topic: str) -> int:
    """The records, as librdkafka writes them; returns how many are visible at
    read_committed."""
    visible = 0
    for codec in ("none", "gzip", "zstd"):
        producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                                             "compression.type": codec})
        for i in range(PER_CODEC):
            key = None if i % 5 == 0 else f"{codec}-k{i % 11}".encode()
            value = None if i % 13 == 0 else f"{codec}-v{i}".encode() * (1 + i % 3)
            headers = [("codec", codec.encode()), ("null", None)] if i % 4 == 0 else None
            producer.produce(topic, value=value, key=key, headers=headers,
                             partition=i % PARTITIONS)
            visible += 1
        assert producer.flush(30) == 0
    txn = confluent_kafka.Producer({"bootstrap.servers": bootstrap,
                                    "transactional.id": f"columns-{uuid.uuid4().hex[:8]}"})
    txn.init_transactions(30)
    for outcome in ("commit", "abort"):
        txn.begin_transaction()
        for i in range(30):
            txn.produce(topic, value=f"{outcome}-{i}".encode(), partition=i % PARTITIONS)
        txn.flush(30)
        if outcome == "commit":
            txn.commit_transaction(30)
            visible += 30
        else:
            txn.abort_transaction(30)
    return visible




async def test_columns_read_what_librdkafka_reads_and_commit_the_log_end(
        kafka_single: KafkaCluster, kafka_topic: Callable[[str], str]) -> None:
    bootstrap = kafka_single.bootstrap
    topic = kafka_topic("columns")
    await kafka_single.call(kafka_single.create_topic, topic, PARTITIONS, 1)
    visible = await trio.to_thread.run_sync(write, bootstrap, topic)
    oracle_msgs = await trio.to_thread.run_sync(
        lambda: read_partitions(bootstrap, topic, list(range(PARTITIONS)), visible, timeout=60,
                                config={"isolation.level": "read_committed"}))
    oracle: dict[int, list[tuple[Any, ...]]] = {}
    for m in oracle_msgs:
        oracle.setdefault(m.partition(), []).append(
            (m.offset(), m.timestamp()[1], m.key(), m.value(), tuple(m.headers() or ())))
    assert sum(map(len, oracle.values())) == visible

    group = f"columns-{uuid.uuid4().hex[:8]}"
    ours: dict[int, list[tuple[Any, ...]]] = {}
    async with open_consumer(bootstrap, group_id=group, topics=[topic],
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             isolation_level="read_committed", max_poll_records=100) as consumer:
        got = 0
        with trio.fail_after(90):
            async for batch in consumer.batches(columns=True):
                assert isinstance(batch, ConsumedColumns) and batch.topic == topic
                assert len(batch) <= 100
                values = batch.values.to_pylist()
                keys = batch.keys.to_pylist()
                for i in range(len(batch)):
                    ours.setdefault(batch.partition, []).append(
                        (batch.offsets[i], batch.timestamps[i], keys[i], values[i],
                         batch.headers[i]))
                assert batch.records() == [batch.row(i) for i in range(len(batch))]
                got += len(batch)
                if got == visible:
                    break
        await consumer.commit()
    assert ours == oracle
    assert any(v is None for rows in ours.values() for _, _, _, v, _ in rows)
    assert any(k is None for rows in ours.values() for _, _, k, _, _ in rows)
    assert any(h for rows in ours.values() for *_, h in rows)
    ends = await trio.to_thread.run_sync(log_ends, bootstrap, topic, PARTITIONS)
    # the position moved over the aborted records and the markers: the log end
    assert await trio.to_thread.run_sync(committed_offsets, bootstrap, group, topic, PARTITIONS) == ends
