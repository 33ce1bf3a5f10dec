"""The admin client and the admin messages against Apache Kafka, the oracle.

The JSON specs of DescribeConfigs, ElectLeaders, IncrementalAlterConfigs,
AlterPartitionReassignments and ListPartitionReassignments were written for this project from
the protocol guide; tests/protocol/admin_fixtures.py checks their bytes by hand, and this file
sends every version we speak to a real broker and checks what it does and answers. Effects
are read back through librdkafka's AdminClient where it can see them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio

from pipeline.cluster import Cluster
from pipeline.cluster.admin import Admin
from pipeline.cluster.admin_types import ConfigSource, NewTopic, TopicPartition
from pipeline.protocol.api import CLIENT_VERSIONS, ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import alter_partition_reassignments as apr
from pipeline.protocol.messages import describe_configs as dc
from pipeline.protocol.messages import elect_leaders as el
from pipeline.protocol.messages import incremental_alter_configs as iac
from pipeline.protocol.messages import list_partition_reassignments as lpr
from pipeline.testing.kafka import KafkaCluster

from .conftest import confluent_kafka, wait_until

Topic = Callable[..., str]
TOPIC = 2


async def eventually(check: Callable[[], Awaitable[bool]], what: str, within: float = 30.0
                     ) -> None:
    """Poll: an admin change reaches the controller at once, but each broker's view of it
    (what DescribeConfigs and Metadata answer) follows a few milliseconds later."""
    with trio.move_on_after(within):
        while not await check():  # noqa: ASYNC110 - a remote broker's state: nothing to wait on
            await trio.sleep(0.05)
        return
    raise AssertionError(f"not within {within}s: {what}")


def versions(key: ApiKey) -> range:
    lo, hi = CLIENT_VERSIONS[key]
    return range(lo, hi + 1)


def confluent_config(bootstrap: str, topic: str, name: str) -> str:
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": bootstrap})
    resource = confluent_kafka.admin.ConfigResource("topic", topic)
    return str(admin.describe_configs([resource])[resource].result(timeout=10)[name].value)


async def test_every_version_of_the_config_apis(kafka_cluster: KafkaCluster,
                                                kafka_topic: Topic) -> None:
    name = kafka_topic("configs")
    await kafka_cluster.call(kafka_cluster.create_topic, name, 1)
    async with Cluster.open(kafka_cluster.internal_bootstrap) as cluster:
        conn = await cluster.any_connection()
        for v in versions(ApiKey.INCREMENTAL_ALTER_CONFIGS):
            retention = str(3_600_000 + v)
            response = await conn.request(iac.IncrementalAlterConfigsRequest(resources=(
                iac.AlterConfigsResource(resource_type=TOPIC, resource_name=name, configs=(
                    iac.AlterableConfig(name="retention.ms", config_operation=0,
                                        value=retention),
                    iac.AlterableConfig(name="segment.ms", config_operation=1, value=None),
                )),
            )), version=v)
            assert [(r.error_code, r.resource_type, r.resource_name)
                    for r in response.responses] == [(0, TOPIC, name)]
            async def librdkafka_sees(retention: str = retention) -> bool:
                got = await trio.to_thread.run_sync(
                    confluent_config, kafka_cluster.bootstrap, name, "retention.ms")
                return got == retention

            await eventually(librdkafka_sees, f"IncrementalAlterConfigs v{v} applied")
        final = str(3_600_000 + versions(ApiKey.INCREMENTAL_ALTER_CONFIGS)[-1])

        async def this_broker_sees_it() -> bool:
            described = await conn.request(dc.DescribeConfigsRequest(resources=(
                dc.DescribeConfigsResource(resource_type=TOPIC, resource_name=name,
                                           configuration_keys=("retention.ms",)),)))
            return bool(described.results[0].configs[0].value == final)

        await eventually(this_broker_sees_it, "the connection's broker sees the change")
        for v in versions(ApiKey.DESCRIBE_CONFIGS):
            response = await conn.request(dc.DescribeConfigsRequest(
                resources=(dc.DescribeConfigsResource(
                    resource_type=TOPIC, resource_name=name,
                    configuration_keys=("retention.ms", "cleanup.policy")),),
                include_synonyms=True, include_documentation=v >= 3,
            ), version=v)
            (result,) = response.results
            assert (result.error_code, result.resource_name) == (0, name)
            configs = {c.name: c for c in result.configs}
            assert set(configs) == {"retention.ms", "cleanup.policy"}, f"DescribeConfigs v{v}"
            assert configs["retention.ms"].value == final
            assert configs["retention.ms"].config_source == ConfigSource.TOPIC
            assert configs["cleanup.policy"].value == "delete"
            assert configs["cleanup.policy"].config_source == ConfigSource.DEFAULT
            assert configs["retention.ms"].synonyms[0].name == "retention.ms"
            if v >= 3:
                assert configs["retention.ms"].config_type == 5  # LONG
                assert configs["cleanup.policy"].config_type == 7  # LIST
                assert "retention" in (configs["retention.ms"].documentation or "")


async def test_every_version_of_elect_leaders(kafka_cluster: KafkaCluster,
                                             kafka_topic: Topic) -> None:
    name = kafka_topic("elect")
    await kafka_cluster.call(kafka_cluster.create_topic, name, 2, 3)
    async with Cluster.open(kafka_cluster.internal_bootstrap) as cluster:
        conn = await cluster.any_connection()
        for v in versions(ApiKey.ELECT_LEADERS):
            response = await conn.request(el.ElectLeadersRequest(
                topic_partitions=(el.TopicPartitions(topic=name, partitions=(0, 1)),),
                timeout_ms=30_000,
            ), version=v)
            if v >= 1:
                assert response.error_code == 0
            (result,) = response.replica_election_results
            assert result.topic == name
            # Just created: the preferred replicas lead already.
            assert sorted((p.partition_id, p.error_code) for p in result.partition_result) == [
                (0, ErrorCode.ELECTION_NOT_NEEDED), (1, ErrorCode.ELECTION_NOT_NEEDED)
            ], f"ElectLeaders v{v}"


async def test_every_version_of_the_reassignment_apis(kafka_cluster: KafkaCluster,
                                                      kafka_topic: Topic) -> None:
    name = kafka_topic("reassign")
    await kafka_cluster.call(kafka_cluster.create_topic, name, 1, 3)
    async with Admin.open(kafka_cluster.internal_bootstrap, timeout=30) as admin:
        conn = await admin.cluster.any_connection()
        for v in versions(ApiKey.ALTER_PARTITION_REASSIGNMENTS):
            current = (await admin.describe_topics([name]))[name].partitions[0].replicas
            target = (*current[1:], current[0])  # rotate: same replicas, new order
            response = await conn.request(apr.AlterPartitionReassignmentsRequest(
                timeout_ms=30_000, topics=(apr.ReassignableTopic(name=name, partitions=(
                    apr.ReassignablePartition(partition_index=0, replicas=target),)),),
            ), version=v)
            assert response.error_code == 0
            if v >= 1:
                assert response.allow_replication_factor_change is True
            (topic,) = response.responses
            assert [(p.partition_index, p.error_code) for p in topic.partitions] == [(0, 0)]

            async def reordered(target: tuple[int, ...] = target) -> bool:
                desc = (await admin.describe_topics([name]))[name]
                return desc.partitions[0].replicas == target

            await eventually(reordered, f"replicas reordered to {target}")
            # null replicas (a nullable compact array) cancels; nothing is in progress
            response = await conn.request(apr.AlterPartitionReassignmentsRequest(
                timeout_ms=30_000, topics=(apr.ReassignableTopic(name=name, partitions=(
                    apr.ReassignablePartition(partition_index=0, replicas=None),)),),
            ), version=v)
            (topic,) = response.responses
            assert topic.partitions[0].error_code == ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
        for v in versions(ApiKey.LIST_PARTITION_REASSIGNMENTS):
            for topics in (None, (lpr.ListPartitionReassignmentsTopics(
                    name=name, partition_indexes=(0,)),)):
                response = await conn.request(lpr.ListPartitionReassignmentsRequest(
                    timeout_ms=30_000, topics=topics), version=v)
                assert response.error_code == 0
                assert [t.name for t in response.topics if t.name == name] == []


async def test_a_reassignment_in_progress_is_listed_and_cancelled(
    kafka_cluster: KafkaCluster, kafka_topic: Topic
) -> None:
    """Replication throttled to 1 byte/s keeps a data-moving reassignment in progress: the
    list shows its adding and removing replicas (non-empty arrays in every field), and
    cancelling it puts the old replica back."""
    name = kafka_topic("throttled")
    desc = await kafka_cluster.call(kafka_cluster.create_topic, name, 1, 1,
                                    {"leader.replication.throttled.replicas": "*",
                                     "follower.replication.throttled.replicas": "*"})
    (home,) = desc.partitions[0].replicas
    target = home % 3 + 1
    producer = confluent_kafka.Producer({"bootstrap.servers": kafka_cluster.bootstrap})
    # 3 MB: more than one replica fetch (replica.fetch.max.bytes = 1 MB) can take before the
    # throttle's quota kicks in, so the new replica cannot catch up during the test.
    for _ in range(300):
        producer.produce(name, b"x" * 10_000, partition=0)
    assert await trio.to_thread.run_sync(producer.flush, 30) == 0
    throttled = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
    async with Admin.open(kafka_cluster.internal_bootstrap, timeout=30) as admin:
        try:
            for n in kafka_cluster.nodes:
                await admin.alter_broker_config(n, dict.fromkeys(throttled, "1"))

                async def throttled_now(n: int = n) -> bool:
                    entries = await admin.describe_broker_config(n, throttled)
                    entry = entries.get("leader.replication.throttled.rate")
                    return entry is not None and entry.value == "1" and (
                        entry.source == ConfigSource.DYNAMIC_BROKER)

                await eventually(throttled_now, f"node {n} throttled")
            tp = TopicPartition(name, 0)
            assert await admin.alter_partition_reassignments({tp: [target]}) == {tp: None}
            ongoing = await admin.list_partition_reassignments([tp])
            assert set(ongoing) == {tp}
            assert ongoing[tp].adding == (target,)
            assert ongoing[tp].removing == (home,)
            assert set(ongoing[tp].replicas) == {home, target}
            assert tp in await admin.list_partition_reassignments()  # listing all
            assert await admin.alter_partition_reassignments({tp: None}) == {tp: None}
            assert await admin.list_partition_reassignments([tp]) == {}

            async def back_home() -> bool:
                desc = (await admin.describe_topics([name]))[name]
                return desc.partitions[0].replicas == (home,)

            await eventually(back_home, f"replicas back to [{home}]")
        finally:
            for n in kafka_cluster.nodes:
                await admin.alter_broker_config(n, delete=throttled)
        for n in kafka_cluster.nodes:

            async def unthrottled(n: int = n) -> bool:
                entries = await admin.describe_broker_config(n, throttled)
                return "leader.replication.throttled.rate" not in entries

            await eventually(unthrottled, f"node {n} unthrottled")


async def test_admin_topic_and_config_calls_agree_with_librdkafka(
    kafka_cluster: KafkaCluster, kafka_topic: Topic
) -> None:
    name, dry = kafka_topic("ours"), kafka_topic("dry")
    async with kafka_cluster.admin() as admin:
        created = await admin.create_topics([
            NewTopic(name, 4, 2, {"min.insync.replicas": "2"}),
            NewTopic(kafka_topic("bad"), 1, 4),  # more replicas than brokers
        ])
        assert created[name] is None
        (bad,) = [e for k, e in created.items() if k != name]
        assert bad is not None and bad.code == ErrorCode.INVALID_REPLICATION_FACTOR
        assert await admin.create_topics([NewTopic(dry, 1, 1)], validate_only=True) == {
            dry: None}
        await admin.alter_topic_config(name, {"retention.ms": "123456"})

        async def retention_set() -> bool:
            entries = await admin.describe_topic_config(name)
            return entries["retention.ms"].value == "123456"

        await eventually(retention_set, "retention.ms set")
        entries = await admin.describe_topic_config(name)
        assert entries["min.insync.replicas"].source == ConfigSource.TOPIC
        assert entries["cleanup.policy"].is_default

        def librdkafka_view() -> tuple[int, set[int], str, bool]:
            client = confluent_kafka.admin.AdminClient(
                {"bootstrap.servers": kafka_cluster.bootstrap})
            topics = client.list_topics(timeout=10).topics
            parts = topics[name].partitions if name in topics else {}
            return (len(parts), {len(p.replicas) for p in parts.values()},
                    confluent_config(kafka_cluster.bootstrap, name, "retention.ms"),
                    dry in topics)

        async def librdkafka_agrees() -> bool:  # whichever broker it asks
            return await trio.to_thread.run_sync(librdkafka_view) == (4, {2}, "123456", False)

        await eventually(librdkafka_agrees, "librdkafka sees the topic and its config")
        with pytest.raises(Exception, match="INVALID_CONFIG"):
            await admin.alter_topic_config(name, {"retention.ms": "soon"})
        await admin.alter_topic_config(name, delete=["retention.ms"])

        async def retention_default() -> bool:
            # The broker's value again: the test kit sets log.retention.ms (-1) in the
            # brokers' static config, so that is where it comes from (DEFAULT on a stock
            # broker); the value the topic had is gone.
            entry = (await admin.describe_topic_config(name, ["retention.ms"]))["retention.ms"]
            return entry.source == ConfigSource.STATIC_BROKER and entry.value == "-1"

        await eventually(retention_default, "retention.ms back to the brokers' value")
        assert await admin.delete_topics([name]) == {name: None}

        def deleted() -> bool:
            client = confluent_kafka.admin.AdminClient(
                {"bootstrap.servers": kafka_cluster.bootstrap})
            return name not in client.list_topics(timeout=10).topics

        await trio.to_thread.run_sync(wait_until, deleted, 30, "topic deleted")
