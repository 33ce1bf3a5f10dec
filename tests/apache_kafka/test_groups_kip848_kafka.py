"""KIP-848 (``group_protocol="consumer"``): the broker assigns, on Apache Kafka 4.1.

A group of ours and librdkafka consumers (``group.protocol=consumer``), members joining
and one leaving mid-stream: every record is processed, and the committed offsets, read
back by librdkafka, equal the log end. And a member of ours that stops iterating leaves
after max_poll_interval, says so, and rejoins.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
import trio

from pipeline import open_consumer
from pipeline.consumer import Consumer, MaxPollIntervalExceededError
from pipeline.testing.kafka import KafkaCluster

from .conftest import committed_offsets, log_ends
from .test_groups_kafka import (
    PARTITIONS,
    RECORDS,
    LibrdkafkaMember,
    Processed,
    produce_with_librdkafka,
    until,
)

pytestmark = pytest.mark.kafka


KIP848 = {"group.protocol": "consumer"}  # librdkafka as a member of a KIP-848 group


async def ours848(bootstrap: str, group: str, topic: str, processed: Processed, stop: trio.Event,
                  task_status: trio.TaskStatus[Consumer] = trio.TASK_STATUS_IGNORED) -> None:
    async with open_consumer(bootstrap, group_id=group, topics=[topic], client_id="pipeline",
                             group_protocol="consumer", auto_offset_reset="earliest",
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


async def describe_members(bootstrap: str, group: str, consumer: Consumer) -> dict[str, int]:
    """{member id: member type} from ConsumerGroupDescribe (v1: 0 classic, 1 consumer)."""
    from pipeline.cluster import Cluster
    from pipeline.protocol.api import ApiKey
    from pipeline.protocol.messages import consumer_group_describe as cgd

    node = consumer.statistics().coordinator
    async with Cluster.open(bootstrap) as cluster:
        conn = await cluster.connection(node)
        r = await conn.request(cgd.ConsumerGroupDescribeRequest(group_ids=(group,)),
                               version=conn.version_for(ApiKey.CONSUMER_GROUP_DESCRIBE))
    (described,) = r.groups
    assert described.error_code == 0, described
    return {m.member_id: m.member_type for m in described.members}


async def test_a_kip848_group_of_ours_and_librdkafka(
    kafka_cluster: KafkaCluster, kafka_topic: Callable[[str], str],
) -> None:
    bootstrap = kafka_cluster.bootstrap
    topic = kafka_topic("kip848")
    group = f"kip848-{uuid.uuid4().hex[:8]}"
    await kafka_cluster.call(kafka_cluster.create_topic, topic, PARTITIONS, 3)
    await trio.to_thread.run_sync(produce_with_librdkafka, bootstrap, topic, RECORDS // 2)
    processed = Processed()
    libs: list[LibrdkafkaMember] = []
    async with trio.open_nursery() as nursery:
        stops = [trio.Event(), trio.Event()]
        first = await nursery.start(ours848, bootstrap, group, topic, processed, stops[0])
        await until(lambda: first.state == "stable" and len(first.assignment()) == PARTITIONS,
                    90, "the first member owns everything")
        libs.append(await trio.to_thread.run_sync(LibrdkafkaMember, bootstrap, group, topic,
                                                   processed, KIP848))
        second = await nursery.start(ours848, bootstrap, group, topic, processed, stops[1])
        libs.append(await trio.to_thread.run_sync(LibrdkafkaMember, bootstrap, group, topic,
                                                   processed, KIP848))
        await until(lambda: len(first.assignment()) > 0 and len(second.assignment()) > 0
                    and len(first.assignment()) < PARTITIONS, 90, "the broker split the partitions")
        assert first.group_metadata().generation_id > 1  # the member epoch moved on
        members = await describe_members(bootstrap, group, first)
        # ours speak the consumer protocol (member type 1), not the classic one (0)
        assert members[first.group_metadata().member_id] == 1
        assert members[second.group_metadata().member_id] == 1
        await trio.to_thread.run_sync(produce_with_librdkafka, bootstrap, topic, RECORDS // 2,
                                      RECORDS // 2)
        await trio.to_thread.run_sync(libs[0].close)
        await until(lambda: processed.distinct() == RECORDS, 120, "every record processed")
        await trio.sleep(3)
        for stop in stops:
            stop.set()
    await trio.to_thread.run_sync(libs[1].close)
    ends = await trio.to_thread.run_sync(log_ends, bootstrap, topic, PARTITIONS)
    assert set(processed.counts) == {(p, o) for p, end in ends.items() for o in range(end)}
    duplicates = sum(n - 1 for n in processed.counts.values())
    assert duplicates < RECORDS // 10, f"{duplicates} re-deliveries"
    committed = await trio.to_thread.run_sync(committed_offsets, bootstrap, group, topic,
                                               PARTITIONS)
    assert committed == ends


async def test_a_kip848_member_that_stops_iterating_leaves_and_says_so(
    kafka_cluster: KafkaCluster, kafka_topic: Callable[[str], str],
) -> None:
    bootstrap = kafka_cluster.bootstrap
    topic = kafka_topic("kip848-poll")
    await kafka_cluster.call(kafka_cluster.create_topic, topic, 2, 3)
    await trio.to_thread.run_sync(produce_with_librdkafka, bootstrap, topic, 10)
    async with open_consumer(bootstrap, group_id=f"poll-{uuid.uuid4().hex[:8]}", topics=[topic],
                             group_protocol="consumer", auto_offset_reset="earliest",
                             max_poll_interval=5.0) as consumer:
        with trio.fail_after(60):
            await consumer.__anext__()
        await trio.sleep(8)
        assert consumer.state == "unjoined"
        with pytest.raises(MaxPollIntervalExceededError, match=r"max_poll_interval=5\.0"):
            await consumer.__anext__()
        with trio.fail_after(60):
            record = await consumer.__anext__()
        assert record.topic == topic and consumer.state == "stable"
