"""Our group consumer on Apache Kafka 4.1, sharing groups with librdkafka (confluent-kafka).

* A mixed group (two of ours, two librdkafka consumers) with ``cooperative-sticky`` and
  with ``range``, members joining and leaving mid-stream (so ours and librdkafka each
  lead some generations and read each other's subscription and assignment bytes): every
  record is processed, re-deliveries only around rebalances, and the group's committed
  offsets, read back by librdkafka, equal the log end.
* A librdkafka member that stops heartbeating (SIGSTOP) is removed by Kafka and our
  member takes its partitions; when it comes back, it gets some again.
* A static member of ours (KIP-345) restarts without a rebalance: the librdkafka member
  sees no revocation, and the generation does not change.
* The group's coordinator is killed mid-stream: nothing is skipped, commits survive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio

from pipeline import open_consumer
from pipeline.consumer import Consumer
from pipeline.testing.kafka import KafkaCluster

from .conftest import committed_offsets, confluent_kafka, log_ends

pytestmark = pytest.mark.kafka

PARTITIONS = 6
RECORDS = 6000


def produce_with_librdkafka(bootstrap: str, topic: str, count: int, start: int = 0) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                                         "enable.idempotence": True})
    for i in range(start, start + count):
        producer.produce(topic, value=f"v{i}".encode(), key=f"k{i}".encode())
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0




@dataclass
class Processed:
    """What every member processed: ``(partition, offset)`` counts, shared by threads."""

    counts: Counter[tuple[int, int]] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, partition: int, offset: int) -> None:
        with self.lock:
            self.counts[(partition, offset)] += 1

    def distinct(self) -> int:
        with self.lock:
            return len(self.counts)


def classic(strategy: str) -> dict[str, Any]:
    """librdkafka's settings for a member of a classic group assigning with ``strategy``."""
    return {"partition.assignment.strategy": strategy, "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 1000}


class LibrdkafkaMember:
    """A confluent-kafka consumer in a thread: commits after every consume() batch
    (so a rebalance, which runs inside consume(), finds everything processed committed).
    ``protocol``: its group settings (``classic(strategy)``, or KIP-848's
    ``{"group.protocol": "consumer"}``)."""

    def __init__(self, bootstrap: str, group: str, topic: str, processed: Processed,
                 protocol: dict[str, Any]) -> None:
        self.consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "client.id": "librdkafka",
            "enable.auto.commit": False, "auto.offset.reset": "earliest", **protocol,
        })
        self.consumer.subscribe([topic])
        self.processed = processed
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            msgs = self.consumer.consume(200, 0.2)
            for m in msgs:
                if m.error() is None:
                    self.processed.add(m.partition(), m.offset())
            if msgs:
                try:
                    self.consumer.commit(asynchronous=False)
                except confluent_kafka.KafkaException:
                    pass  # a rebalance took the partitions: their records go again elsewhere
        self.consumer.close()  # leaves the group

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


async def our_member(bootstrap: str, group: str, topic: str, strategy: str,
                     processed: Processed, stop: trio.Event,
                     task_status: trio.TaskStatus[Consumer] = trio.TASK_STATUS_IGNORED) -> None:
    """Ours: auto-commit, which also commits before every revocation and on close."""
    async with open_consumer(bootstrap, group_id=group, topics=[topic], client_id="pipeline",
                             auto_offset_reset="earliest", partition_assignment_strategy=strategy,
                             session_timeout=10.0, heartbeat_interval=1.0,
                             auto_commit_interval=1.0) as consumer:
        task_status.started(consumer)
        with trio.CancelScope() as scope:
            async def stopper() -> None:
                await stop.wait()
                scope.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(stopper)
                async for record in consumer:
                    processed.add(record.partition, record.offset)
                nursery.cancel_scope.cancel()


async def until(check: Callable[[], bool], within: float, what: str) -> None:
    with trio.fail_after(within):
        while not check():  # noqa: ASYNC110 - several members' threads change it
            await trio.sleep(0.2)
    assert check(), what


@pytest.mark.parametrize("strategy", ["cooperative-sticky", "range"])
@pytest.mark.parametrize("leader", ["pipeline", "librdkafka"])
async def test_mixed_group_processes_every_record_and_commits_the_log_end(
    kafka_cluster: KafkaCluster, kafka_topic: Callable[[str], str], strategy: str, leader: str,
) -> None:
    bootstrap = kafka_cluster.bootstrap
    topic = kafka_topic("mixed")
    group = f"mixed-{uuid.uuid4().hex[:8]}"
    await kafka_cluster.call(kafka_cluster.create_topic, topic, PARTITIONS, 3)
    await trio.to_thread.run_sync(produce_with_librdkafka, bootstrap, topic, RECORDS // 2)
    processed = Processed()
    libs: list[LibrdkafkaMember] = []

    def add_lib() -> None:
        libs.append(LibrdkafkaMember(bootstrap, group, topic, processed, classic(strategy)))

    async with trio.open_nursery() as nursery:
        stops = [trio.Event(), trio.Event()]
        if leader == "librdkafka":
            await trio.to_thread.run_sync(add_lib)
            await until(lambda: processed.distinct() > 0, 60, "the librdkafka leader reads")
        ours1 = await nursery.start(our_member, bootstrap, group, topic, strategy, processed,
                                    stops[0])
        await until(lambda: ours1.state == "stable", 60, "the first of ours joined")
        if leader == "pipeline":
            await trio.to_thread.run_sync(add_lib)
        ours2 = await nursery.start(our_member, bootstrap, group, topic, strategy, processed,
                                    stops[1])
        await trio.to_thread.run_sync(add_lib)
        await until(lambda: len(ours1.assignment()) > 0 and len(ours2.assignment()) > 0,
                    90, "both of ours own partitions")
        # more records while the group changes: a librdkafka member leaves mid-stream
        await trio.to_thread.run_sync(produce_with_librdkafka, bootstrap, topic, RECORDS // 2,
                                      RECORDS // 2)
        await trio.to_thread.run_sync(libs[0].close)
        await until(lambda: processed.distinct() == RECORDS, 120, "every record processed")
        await trio.sleep(3)  # a last auto-commit round
        for stop in stops:
            stop.set()
    await trio.to_thread.run_sync(libs[1].close)
    ends = await trio.to_thread.run_sync(log_ends, bootstrap, topic, PARTITIONS)
    assert sum(ends.values()) == RECORDS
    assert set(processed.counts) == {(p, o) for p, end in ends.items() for o in range(end)}
    duplicates = sum(n - 1 for n in processed.counts.values())
    assert duplicates < RECORDS // 10, f"{duplicates} re-deliveries"
    committed = await trio.to_thread.run_sync(committed_offsets, bootstrap, group, topic,
                                               PARTITIONS)
    assert committed == ends


STOPPABLE = textwrap.dedent("""
    import sys, confluent_kafka
    bootstrap, group, topic = sys.argv[1:4]
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group,
        "partition.assignment.strategy": "cooperative-sticky", "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    c.subscribe([topic])
    while True:
        for m in c.consume(100, 0.2):
            pass
""")


async def test_a_member_that_stops_heartbeating_is_removed_and_its_partitions_move(
    kafka_cluster: KafkaCluster, kafka_topic: Callable[[str], str],
) -> None:
    bootstrap = kafka_cluster.bootstrap
    topic = kafka_topic("silent")
    group = f"silent-{uuid.uuid4().hex[:8]}"
    await kafka_cluster.call(kafka_cluster.create_topic, topic, PARTITIONS, 3)
    other = subprocess.Popen(  # noqa: ASYNC220 - started once, never waited on here
        [sys.executable, "-c", STOPPABLE, bootstrap, group, topic],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with open_consumer(bootstrap, group_id=group, topics=[topic],
                                 partition_assignment_strategy="cooperative-sticky",
                                 session_timeout=10.0, heartbeat_interval=1.0) as consumer, \
                trio.open_nursery() as nursery:
            async def iterate() -> None:
                async for _ in consumer:
                    pass

            nursery.start_soon(iterate)
            await until(lambda: len(consumer.assignment()) == PARTITIONS // 2, 90,
                        "the group split the partitions")
            os.kill(other.pid, signal.SIGSTOP)  # no more heartbeats from it
            stopped_at = time.monotonic()
            await until(lambda: len(consumer.assignment()) == PARTITIONS, 60,
                        "ours took every partition")
            # not before its session expired: 6 s after its last heartbeat, which came at
            # most heartbeat.interval.ms (0.5 s) before it stopped
            assert time.monotonic() - stopped_at >= 5.5
            os.kill(other.pid, signal.SIGCONT)  # it rejoins (its partitions were lost)
            await until(lambda: len(consumer.assignment()) == PARTITIONS // 2, 90,
                        "it got some back")
            nursery.cancel_scope.cancel()
    finally:
        other.kill()
        await trio.to_thread.run_sync(other.wait, 10)


async def test_a_static_member_restarts_without_a_rebalance(
    kafka_cluster: KafkaCluster, kafka_topic: Callable[[str], str],
) -> None:
    bootstrap = kafka_cluster.bootstrap
    topic = kafka_topic("static")
    group = f"static-{uuid.uuid4().hex[:8]}"
    await kafka_cluster.call(kafka_cluster.create_topic, topic, PARTITIONS, 3)
    events: list[str] = []
    lib = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 10000,
        "partition.assignment.strategy": "range", "auto.offset.reset": "earliest"})
    lib.subscribe([topic], on_assign=lambda c, ps: events.append(f"assign {len(ps)}"),
                  on_revoke=lambda c, ps: events.append(f"revoke {len(ps)}"))
    lib_stop = threading.Event()

    def lib_loop() -> None:
        while not lib_stop.is_set():
            lib.poll(0.2)
        lib.close()

    thread = threading.Thread(target=lib_loop, daemon=True)
    thread.start()
    options: dict[str, Any] = dict(group_id=group, topics=[topic], group_instance_id="ours-1",
                                   partition_assignment_strategy="range",
                                   session_timeout=30.0, heartbeat_interval=1.0)
    async def iterate(consumer: Consumer) -> None:
        async for _ in consumer:
            pass

    try:
        async with open_consumer(bootstrap, **options) as consumer, \
                trio.open_nursery() as nursery:
            nursery.start_soon(iterate, consumer)
            await until(lambda: len(consumer.assignment()) == PARTITIONS // 2, 90,
                        "split with the librdkafka member")
            await trio.sleep(3)
            before = (consumer.group_metadata().generation_id, consumer.assignment(), len(events))
            nursery.cancel_scope.cancel()
        # closed: a static member sends no LeaveGroup; Kafka keeps its place
        async with open_consumer(bootstrap, **options) as consumer, \
                trio.open_nursery() as nursery:
            nursery.start_soon(iterate, consumer)
            await until(lambda: len(consumer.assignment()) == PARTITIONS // 2, 60, "back")
            await trio.sleep(3)
            after = (consumer.group_metadata().generation_id, consumer.assignment(), len(events))
            nursery.cancel_scope.cancel()
        assert after == before, events  # same generation, same partitions, no callback
    finally:
        lib_stop.set()
        thread.join(30)


async def test_a_killed_broker_loses_no_record_and_no_commit(
    kafka_cluster: KafkaCluster, kafka_topic: Callable[[str], str],
) -> None:
    """A group of ours and a librdkafka member consumes while the group's coordinator
    (and leader of some partitions) is killed and later restarted: every record is
    processed, and the committed offsets, read back by librdkafka, equal the log end."""
    bootstrap = kafka_cluster.bootstrap
    topic = kafka_topic("killed")
    group = f"killed-{uuid.uuid4().hex[:8]}"
    strategy = "cooperative-sticky"
    await kafka_cluster.call(kafka_cluster.create_topic, topic, PARTITIONS, 3)
    await trio.to_thread.run_sync(produce_with_librdkafka, bootstrap, topic, RECORDS // 2)
    processed = Processed()
    lib: list[LibrdkafkaMember] = []
    victim = -1
    async with trio.open_nursery() as nursery:
        stop = trio.Event()
        ours = await nursery.start(our_member, bootstrap, group, topic, strategy, processed, stop)
        lib.append(await trio.to_thread.run_sync(
            LibrdkafkaMember, bootstrap, group, topic, processed, classic(strategy)))
        await until(lambda: len(ours.assignment()) > 0 and processed.distinct() > 0, 90,
                    "the group consumes")
        victim = ours.statistics().coordinator
        await trio.to_thread.run_sync(kafka_cluster.kill, victim)
        await trio.to_thread.run_sync(produce_with_librdkafka, bootstrap, topic, RECORDS // 2,
                                      RECORDS // 2)
        await until(lambda: processed.distinct() == RECORDS, 180, "every record processed")
        # The records of our partitions flow again once their leaders move; the
        # coordinator lookup retries on its own backoff, so it may come a little later.
        await until(lambda: ours.statistics().coordinator not in (None, victim), 60,
                    "it finds the new coordinator")
        await trio.to_thread.run_sync(kafka_cluster.start, victim)
        await trio.sleep(3)  # a last auto-commit round
        stop.set()
    await trio.to_thread.run_sync(lib[0].close)
    ends = await trio.to_thread.run_sync(log_ends, bootstrap, topic, PARTITIONS)
    assert set(processed.counts) == {(p, o) for p, end in ends.items() for o in range(end)}
    committed = await trio.to_thread.run_sync(committed_offsets, bootstrap, group, topic,
                                               PARTITIONS)
    assert committed == ends
