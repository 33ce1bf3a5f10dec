"""Exactly-once consume-transform-produce on a 3-node Apache Kafka, with a worker killed.

Two transform workers (separate processes, each our group consumer and our transactional
producer) read an input topic as one group and write ``out-<value>`` for each record,
committing the input offsets in the output's transaction
(``send_offsets_to_transaction`` with the consumer's group metadata, KIP-447). Midway
one worker is killed (SIGKILL: its open transaction is left behind) and started again
with the same transactional id, which fences what it left; the group rebalances the
partitions between them. The output, read back by confluent-kafka with
``isolation.level=read_committed``, holds every input record's result exactly once, and
the group's committed offsets are the input's log end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Callable

import pytest

from pipeline.testing.kafka import KafkaCluster

from .conftest import committed_offsets, confluent_kafka, log_ends, wait_until

pytestmark = pytest.mark.kafka

PARTITIONS = 4
RECORDS = 4000

WORKER = textwrap.dedent("""
    import sys, trio
    from pipeline import open_consumer, open_producer

    bootstrap, group, source, sink, tid = sys.argv[1:6]

    async def main():
        async with open_consumer(bootstrap, group_id=group, topics=[source],
                                 auto_offset_reset="earliest", enable_auto_commit=False,
                                 isolation_level="read_committed", session_timeout=6.0,
                                 heartbeat_interval=0.5,
                                 partition_assignment_strategy="cooperative-sticky") as consumer, \\
                open_producer(bootstrap, transactional_id=tid, transaction_timeout=10.0,
                              linger=0.002) as producer:
            async for batch in consumer.batches(max_records=50):
                async with producer.transaction():
                    for r in batch:
                        await producer.send(sink, b"out-" + r.value, key=r.key)
                    await producer.flush()  # written (and invisible until the commit)
                    await trio.sleep(0.05)  # the work takes time: a kill lands in here
                    await producer.send_offsets_to_transaction(
                        {(r.topic, r.partition): r.offset + 1 for r in batch},
                        consumer.group_metadata())

    trio.run(main)
""")


def produce_input(bootstrap: str, topic: str) -> None:
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(RECORDS):
        p.produce(topic, value=b"%d" % i, key=b"k%d" % (i % 97))
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(30) == 0


def read_committed(bootstrap: str, topic: str, expected: int, timeout: float) -> list[bytes]:
    c = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
        "auto.offset.reset": "earliest", "isolation.level": "read_committed",
        "enable.auto.commit": False, "enable.partition.eof": False})
    c.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                if len(got) >= expected:
                    break  # and nothing more came for half a second
                continue
            if m.error() is None:
                got.append(m.value())
    finally:
        c.close()
    return got




def test_a_killed_transform_worker_duplicates_and_loses_nothing(
        kafka_cluster: KafkaCluster, kafka_topic: Callable[[str], str]) -> None:
    bootstrap = kafka_cluster.bootstrap
    source, sink = kafka_topic("eos-in"), kafka_topic("eos-out")
    kafka_cluster.create_topic(source, PARTITIONS, 3)
    kafka_cluster.create_topic(sink, PARTITIONS, 3)
    produce_input(bootstrap, source)
    ends = log_ends(bootstrap, source, PARTITIONS)
    assert sum(ends.values()) == RECORDS
    group = f"eos-{uuid.uuid4().hex[:8]}"

    def start(tid: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", WORKER, bootstrap, group, source,
                                 sink, tid], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    workers = {"a": start(f"{group}-a"), "b": start(f"{group}-b")}
    try:
        # Kill worker a once the output has grown a little (its transaction is open).
        wait_until(lambda: len(read_committed(bootstrap, sink, 1, 2)) > 200, 90,
                   "the workers began")
        os.kill(workers["a"].pid, signal.SIGKILL)
        workers["a"].wait(10)
        workers["a"] = start(f"{group}-a")  # the same id: fences what the dead one left
        wait_until(lambda: committed_offsets(bootstrap, group, source, PARTITIONS) == ends, 180,
                   "every input record's offset committed")
    finally:
        for w in workers.values():
            w.kill()
            w.wait(10)
    out = read_committed(bootstrap, sink, RECORDS, 60)
    counts = Counter(out)
    assert sorted(counts) == sorted(b"out-%d" % i for i in range(RECORDS))
    assert [v for v, n in counts.items() if n > 1] == []  # nothing twice
