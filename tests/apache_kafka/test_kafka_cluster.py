"""KafkaCluster's names, one test each, on the session's 3-node cluster.

Each effect is checked from outside our own code where it can be: librdkafka's metadata
(confluent-kafka's AdminClient) for brokers and leaders, its producer for the enforced topic
config, /proc for processes.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest
import trio
import trio.lowlevel

from pipeline.cluster.admin_types import AdminError
from pipeline.protocol.errors import ErrorCode
from pipeline.testing.kafka import KafkaCluster, KafkaClusterError

from .conftest import confluent_kafka, confluent_leaders, pid_alive, read_partitions, wait_until

Topic = Callable[..., str]


def produce_confluent(bootstrap: str, topic: str, values: list[bytes], partition: int = 0
                      ) -> list[object]:
    """Produce with librdkafka (acks=all); returns each delivery's error (None = ok)."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                         "linger.ms": 0, "message.timeout.ms": 30000})
    errors: list[object] = []
    for value in values:
        producer.produce(topic, value, partition=partition,
                         on_delivery=lambda err, msg: errors.append(err))
        producer.flush(30)  # one message per request: each is judged on its own
    assert len(errors) == len(values)
    return errors


def test_bootstrap_and_nodes(kafka_cluster: KafkaCluster) -> None:
    assert kafka_cluster.nodes == [1, 2, 3]
    addresses = kafka_cluster.bootstrap.split(",")
    assert len(addresses) == 3
    for address in addresses:
        host, port = address.split(":")
        assert host == "127.0.0.1"
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    brokers = admin.list_topics(timeout=10).brokers
    assert {b.id: f"{b.host}:{b.port}" for b in brokers.values()} == dict(
        zip([1, 2, 3], addresses, strict=True)
    )
    assert len(kafka_cluster.pids()) == 3
    assert all(pid_alive(p) for p in kafka_cluster.pids())


def test_create_topic_with_config(kafka_cluster: KafkaCluster, kafka_topic: Topic) -> None:
    name = kafka_topic("sized")
    desc = kafka_cluster.create_topic(name, partitions=6, replication_factor=3,
                                      config={"max.message.bytes": "100000"})
    assert [p.partition for p in desc.partitions] == list(range(6))
    assert all(sorted(p.replicas) == [1, 2, 3] and set(p.isr) == {1, 2, 3}
               for p in desc.partitions)
    # librdkafka sees the same topic ...
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    meta = admin.list_topics(name, timeout=10).topics[name]
    assert sorted(meta.partitions) == list(range(6))
    assert all(sorted(p.replicas) == [1, 2, 3] for p in meta.partitions.values())
    resource = confluent_kafka.admin.ConfigResource("topic", name)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["max.message.bytes"].value == "100000"
    # ... and the broker enforces the limit (librdkafka's own limit is 1 MB: it sends both).
    small, big = produce_confluent(kafka_cluster.bootstrap, name, [b"s" * 50_000, b"b" * 150_000])
    assert small is None
    assert big is not None and big.code() == confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE
    with pytest.raises(AdminError) as info:
        kafka_cluster.create_topic(name, partitions=1)
    assert info.value.code == ErrorCode.TOPIC_ALREADY_EXISTS


def test_leader(kafka_cluster: KafkaCluster, kafka_topic: Topic) -> None:
    name = kafka_topic("leaders")
    desc = kafka_cluster.create_topic(name, partitions=3)
    assert all(len(p.replicas) == 3 for p in desc.partitions)  # default: min(nodes, 3)
    leaders = {p: kafka_cluster.leader(name, p) for p in range(3)}
    assert leaders == confluent_leaders(kafka_cluster.bootstrap, name)
    assert all(leaders[p.partition] == p.leader for p in desc.partitions)
    with pytest.raises(ValueError, match="no partition 3"):
        kafka_cluster.leader(name, 3)
    with pytest.raises(KafkaClusterError, match="does not exist"):
        kafka_cluster.leader(kafka_topic("missing"), 0)


def test_kill_then_start(kafka_cluster: KafkaCluster, kafka_topic: Topic) -> None:
    name = kafka_topic("kill")
    kafka_cluster.create_topic(name, partitions=1, replication_factor=3)
    victim = kafka_cluster.leader(name, 0)
    old_pid = kafka_cluster.pid(victim)
    assert old_pid is not None
    kafka_cluster.kill(victim)
    assert not kafka_cluster.running(victim)
    assert not pid_alive(old_pid)  # SIGKILLed and reaped when kill() returns
    assert "killed (SIGKILL)" in kafka_cluster.log_tail(victim, 5)
    # The controller fences it (broker.session.timeout.ms = 6 s) and elects another leader.
    wait_until(lambda: kafka_cluster.leader(name, 0) != victim, 30, "a new leader")
    survivors = [n for n in kafka_cluster.nodes if n != victim]
    assert confluent_leaders(kafka_cluster.bootstrap, name)[0] in survivors
    assert produce_confluent(kafka_cluster.bootstrap, name, [b"while-down"]) == [None]
    with pytest.raises(KafkaClusterError, match=f"node {victim} is not running"):
        kafka_cluster.move_leader(name, 0, to_node=victim)

    kafka_cluster.start(victim)
    # start(n) returns once n is registered and back in the ISR of all its partitions.
    assert kafka_cluster.running(victim)
    assert kafka_cluster.pid(victim) not in (None, old_pid)
    desc = kafka_cluster.describe_topic(name)
    assert victim in desc.partitions[0].isr
    probe = kafka_cluster.describe_topic("pipeline-ready-probe")
    assert victim in probe.partitions[0].isr
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    assert victim in admin.list_topics(timeout=10).brokers
    got = read_partitions(kafka_cluster.bootstrap, name, [0], 1)
    assert [m.value() for m in got] == [b"while-down"]
    with pytest.raises(RuntimeError, match="already running"):
        kafka_cluster.start(victim)


def test_stop_moves_leaders_first(kafka_cluster: KafkaCluster, kafka_topic: Topic) -> None:
    name = kafka_topic("stop")
    kafka_cluster.create_topic(name, partitions=6, replication_factor=3)
    node = kafka_cluster.leader(name, 0)
    old_pid = kafka_cluster.pid(node)
    assert old_pid is not None
    kafka_cluster.stop(node)
    stopped_at = time.monotonic()
    assert not kafka_cluster.running(node)
    assert not pid_alive(old_pid)
    assert "stopped (SIGTERM)" in kafka_cluster.log_tail(node, 5)
    # Controlled shutdown handed its leaderships over before it exited, so the survivors'
    # metadata shows other leaders well before a crash would be noticed (6 s session).
    wait_until(
        lambda: node not in confluent_leaders(kafka_cluster.bootstrap, name).values(),
        3, f"no partition led by stopped node {node}",
    )
    assert time.monotonic() - stopped_at < 6.0
    kafka_cluster.start(node)
    assert all(node in p.isr for p in kafka_cluster.describe_topic(name).partitions)


def test_move_leader(kafka_cluster: KafkaCluster, kafka_topic: Topic) -> None:
    name = kafka_topic("move")
    kafka_cluster.create_topic(name, partitions=2, replication_factor=3)
    assert produce_confluent(kafka_cluster.bootstrap, name, [b"a", b"b"]) == [None, None]
    for target in (2, 3, 1, 1):
        kafka_cluster.move_leader(name, 0, to_node=target)
        assert kafka_cluster.leader(name, 0) == target
        desc = kafka_cluster.describe_topic(name)
        assert desc.partitions[0].replicas[0] == target  # the preferred replica now
        assert sorted(desc.partitions[0].replicas) == [1, 2, 3]
        for n in kafka_cluster.nodes:  # every broker says so, as librdkafka reads it
            assert confluent_leaders(f"127.0.0.1:{kafka_cluster.port(n)}", name)[0] == target
    assert [m.value() for m in read_partitions(kafka_cluster.bootstrap, name, [0], 2)] == [
        b"a", b"b"]


def test_move_leader_to_a_node_without_a_replica(kafka_cluster: KafkaCluster,
                                                 kafka_topic: Topic) -> None:
    name = kafka_topic("move-rf1")
    desc = kafka_cluster.create_topic(name, partitions=1, replication_factor=1)
    (home,) = desc.partitions[0].replicas
    target = home % 3 + 1
    assert produce_confluent(kafka_cluster.bootstrap, name, [b"kept"]) == [None]
    kafka_cluster.move_leader(name, 0, to_node=target)
    assert kafka_cluster.describe_topic(name).partitions[0].replicas == (target,)
    assert confluent_leaders(kafka_cluster.bootstrap, name) == {0: target}
    assert [m.value() for m in read_partitions(kafka_cluster.bootstrap, name, [0], 1)] == [
        b"kept"]


def test_bad_node_ids(kafka_cluster: KafkaCluster) -> None:
    for method in (kafka_cluster.kill, kafka_cluster.stop, kafka_cluster.start,
                   kafka_cluster.running, kafka_cluster.port):
        with pytest.raises(ValueError, match=r"no node 9; the nodes are \[1, 2, 3\]"):
            method(9)


async def test_from_trio(kafka_cluster: KafkaCluster, kafka_topic: Topic) -> None:
    name = kafka_topic("trio")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.005)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.lowlevel.checkpoint()
        before = ticks
        desc = await kafka_cluster.call(kafka_cluster.create_topic, name, 2)
        during = ticks - before
        nursery.cancel_scope.cancel()
    assert desc.fully_replicated
    assert during >= 3, "call() must leave the trio loop running"
    async with kafka_cluster.admin() as admin:
        assert (await admin.describe_topics([name]))[name].fully_replicated
    # The blocking form works from trio code too (it runs its own loop in a thread).
    assert kafka_cluster.leader(name, 1) in kafka_cluster.nodes
