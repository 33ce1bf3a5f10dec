"""The fake cluster answers raw requests the way Apache Kafka 4.1 does.

Each scenario sends the same raw requests, through the project's own connection
(``Cluster`` / ``BrokerConnection``: handshake, negotiated versions), to a target and
returns the answers normalised (producer ids, node ids and ports differ by nature). The
answers Kafka gave are pinned in ``EXPECTED``:

* ``test_fake_answers_as_kafka_did`` runs every scenario on the fake (no Kafka needed: it
  is part of the fast suite);
* ``test_kafka_still_answers_so`` (marked ``kafka``) runs it on the session's 3-node
  Kafka cluster, so a pinned answer that Kafka stops giving fails here, not silently.

The scenarios cover what the producer's Kafka paths rely on: idempotence (duplicates
answered NONE with the original offset and the cached max timestamp, out-of-order
sequences, a client-side epoch bump, a fenced lower epoch, unknown producers),
InitProducerId without a transactional id (always a new id), unknown topics and
partitions, size limits (MESSAGE_TOO_LARGE vs RECORD_LIST_TOO_LARGE), a bad CRC,
NOT_LEADER_OR_FOLLOWER with the KIP-951 leader hint, and NOT_ENOUGH_REPLICAS.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import trio

from pipeline.cluster import Cluster
from pipeline.cluster.connection import BrokerConnection
from pipeline.protocol.api import ApiKey
from pipeline.protocol.messages import init_producer_id as ipi
from pipeline.protocol.messages import produce as pm
from pipeline.protocol.records import BatchBuilder
from pipeline.testing.fake_cluster import FakeCluster
from pipeline.testing.kafka import KafkaCluster

from . import produce_request

T = 1_650_000_000_000
NONE, CORRUPT, UNKNOWN_TP, NOT_LEADER = 0, 2, 3, 6
TOO_LARGE, LIST_TOO_LARGE, NOT_ENOUGH = 10, 18, 19
INVALID_REQUEST, OUT_OF_ORDER, INVALID_EPOCH = 42, 45, 47
# A write to a partition Kafka has only just created may briefly be refused with these
# (the broker's metadata names the leader before its replica manager has become leader).
_NOT_YET = {UNKNOWN_TP, 5, NOT_LEADER}


X = TypeVar("X")


async def until(ask: Callable[[], Awaitable[X]], done: Callable[[X], bool]) -> X:
    """Ask until the answer is ``done`` (bounded: 30 s)."""
    with trio.fail_after(30):
        while True:
            value = await ask()
            if done(value):
                return value
            await trio.sleep(0.1)


def records(*values: bytes, producer_id: int = -1, producer_epoch: int = -1,
            base_sequence: int = -1, ts: int = T) -> bytes:
    builder = BatchBuilder()
    for i, value in enumerate(values):
        builder.append(ts + i, None, value)
    return builder.build(producer_id=producer_id, producer_epoch=producer_epoch,
                         base_sequence=base_sequence)


@dataclass
class Target:
    """One cluster to ask: the fake or Kafka, behind the same operations."""

    name: str
    cluster: Cluster
    create: Callable[[str, int, int, dict[str, str]], Awaitable[None]]
    leader: Callable[[str, int], Awaitable[int]]
    replicas: Callable[[str, int], Awaitable[list[int]]]
    stop: Callable[[int], Awaitable[None]]
    start: Callable[[int], Awaitable[None]]

    async def conn(self, node: int) -> BrokerConnection:
        return await self.cluster.connection(node)

    async def leader_conn(self, topic: str, partition: int = 0) -> BrokerConnection:
        return await self.conn(await self.leader(topic, partition))


async def produce(conn: BrokerConnection, topic: str, partition: int, data: bytes,
                  *, acks: int = -1) -> pm.PartitionProduceResponse:
    response = await conn.request(produce_request(topic, partition, data, acks=acks),
                                  version=conn.version_for(ApiKey.PRODUCE))
    (part,) = response.responses[0].partition_responses
    return part


async def first_write(conn: BrokerConnection, topic: str, partition: int, data: bytes
                      ) -> pm.PartitionProduceResponse:
    """The first write to a new partition, retried while Kafka is still making it
    writable (nothing is appended by such a refusal)."""
    return await until(lambda: produce(conn, topic, partition, data),
                       lambda r: r.error_code not in _NOT_YET)


def answer(r: pm.PartitionProduceResponse) -> tuple[int, int, int]:
    return r.error_code, r.base_offset, r.log_append_time_ms


async def init_pid(conn: BrokerConnection, pid: int = -1, epoch: int = -1
                   ) -> ipi.InitProducerIdResponse:
    return await conn.request(
        ipi.InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=60000,
                                  producer_id=pid, producer_epoch=epoch),
        version=conn.version_for(ApiKey.INIT_PRODUCER_ID))


async def new_pid(conn: BrokerConnection) -> int:
    # a freshly started Kafka answers COORDINATOR_LOAD_IN_PROGRESS for a while
    r = await until(lambda: init_pid(conn), lambda r: r.error_code == NONE)
    return r.producer_id


# -- scenarios -----------------------------------------------------------------


async def idempotence(t: Target, topic: str) -> list[Any]:
    await t.create(topic, 2, 1, {})
    conn = await t.leader_conn(topic)
    pid = await new_pid(conn)

    def b(seq: int, *values: bytes, epoch: int = 0, ts: int = T, p: int = pid) -> bytes:
        return records(*values, producer_id=p, producer_epoch=epoch, base_sequence=seq, ts=ts)

    out: list[Any] = [answer(await first_write(conn, topic, 0, b(0, b"a", b"b", ts=T)))]
    steps = [
        b(2, b"c", ts=T + 10),  # next in sequence
        b(0, b"a", b"b", ts=T),  # duplicate of the first: its offset and max timestamp
        b(2, b"c", ts=T + 10),  # duplicate of the second
        b(1, b"x"),  # overlaps the first: out of order, not a duplicate
        b(10, b"x"),  # a gap
        b(0, b"d", epoch=1),  # the producer's own epoch bump, sequence 0
        b(1, b"e", epoch=1),
        b(3, b"old", epoch=0),  # the old epoch is fenced now
        b(5, b"f", epoch=2),  # a new epoch not starting at 0
    ]
    for data in steps:
        out.append(answer(await produce(conn, topic, 0, data)))
    # partition 1, a producer id no broker handed out: any first sequence is accepted
    stranger = pid + 100_000
    conn1 = await t.leader_conn(topic, 1)
    out.append(answer(await first_write(conn1, topic, 1, b(42, b"u", p=stranger))))
    out.append(answer(await produce(conn1, topic, 1, b(43, b"v", p=stranger))))
    out.append(answer(await produce(conn1, topic, 1, b(42, b"u", p=stranger))))
    return out


async def init_producer_id(t: Target, topic: str) -> list[Any]:
    conn = await t.cluster.any_connection()
    first = await new_pid(conn)
    seen = {first}
    out: list[Any] = []
    for pid, epoch in ((first, 0), (first, 5), (first + 7, 32766), (-1, 0), (first, -1)):
        r = await init_pid(conn, pid, epoch)
        fresh = r.producer_id >= 0 and r.producer_id not in seen
        seen.add(r.producer_id)
        out.append((r.error_code, fresh, r.producer_epoch))
    return out


async def unknown(t: Target, topic: str) -> list[Any]:
    await t.create(topic, 2, 1, {})
    conn = await t.leader_conn(topic)
    await first_write(conn, topic, 0, records(b"ok"))
    missing = await produce(conn, f"{topic}-never-created", 0, records(b"x"))
    beyond = await produce(conn, topic, 7, records(b"x"))
    return [missing.error_code, beyond.error_code]


async def sizes(t: Target, topic: str) -> list[Any]:
    small, seg = f"{topic}-small", f"{topic}-seg"
    await t.create(small, 1, 1, {"max.message.bytes": "1000"})
    await t.create(seg, 1, 1, {"segment.bytes": "1048576", "max.message.bytes": "3000000"})
    conn = await t.leader_conn(small)
    pid = await new_pid(conn)
    out = [
        answer(await first_write(conn, small, 0, records(b"s"))),
        answer(await produce(conn, small, 0, records(*[b"y" * 100] * 20))),  # batch too large
        answer(await produce(conn, small, 0, records(b"y" * 2000))),  # one record too large
        answer(await produce(conn, small, 0, records(b"s", producer_id=pid, producer_epoch=0,
                                                     base_sequence=0))),
        answer(await produce(conn, small, 0, records(b"y" * 2000, producer_id=pid,
                                                     producer_epoch=0, base_sequence=1))),
        # the refused batch's sequence was not used: 1 is still next, 2 would be a gap
        answer(await produce(conn, small, 0, records(b"t", producer_id=pid, producer_epoch=0,
                                                     base_sequence=2))),
        answer(await produce(conn, small, 0, records(b"t", producer_id=pid, producer_epoch=0,
                                                     base_sequence=1))),
    ]
    conn = await t.leader_conn(seg)
    await first_write(conn, seg, 0, records(b"s"))
    big = [bytes(range(256)) * 40] * 120  # ~1.2 MB: over segment.bytes, under max.message.bytes
    out.append(answer(await produce(conn, seg, 0, records(*big))))
    return out


async def corrupt(t: Target, topic: str) -> list[Any]:
    await t.create(topic, 1, 1, {})
    conn = await t.leader_conn(topic)
    await first_write(conn, topic, 0, records(b"ok"))
    data = bytearray(records(b"v-0", b"v-1"))
    data[data.index(b"v-0")] ^= 0x20  # the framing is intact, the CRC wrong
    bad = await produce(conn, topic, 0, bytes(data))
    good = await produce(conn, topic, 0, records(b"next"))
    return [answer(bad), answer(good)]


async def not_leader(t: Target, topic: str) -> list[Any]:
    await t.create(topic, 1, 3, {})
    leader = await t.leader(topic, 0)
    await first_write(await t.conn(leader), topic, 0, records(b"ok"))
    follower = next(n for n in await t.replicas(topic, 0) if n != leader)
    conn = await t.conn(follower)
    response = await conn.request(produce_request(topic, 0, records(b"x")),
                                  version=conn.version_for(ApiKey.PRODUCE))
    (part,) = response.responses[0].partition_responses
    hint = part.current_leader
    return [part.error_code, conn.version_for(ApiKey.PRODUCE) >= 10,
            hint is not None and hint.leader_id == leader,
            [e.node_id for e in response.node_endpoints] == [leader]]


async def not_enough_replicas(t: Target, topic: str) -> list[Any]:
    await t.create(topic, 1, 3, {"min.insync.replicas": "3"})
    leader = await t.leader(topic, 0)
    conn = await t.conn(leader)
    out: list[Any] = [(await first_write(conn, topic, 0, records(b"whole"))).error_code]
    follower = next(n for n in await t.replicas(topic, 0) if n != leader)
    await t.stop(follower)
    try:
        # until the leader sees the ISR shrink (at once on Kafka: a controlled shutdown)
        short = await until(lambda: produce(conn, topic, 0, records(b"short")),
                            lambda r: r.error_code != NONE)
        out.append(short.error_code)
        out.append((await produce(conn, topic, 0, records(b"acks1"), acks=1)).error_code)
    finally:
        await t.start(follower)
    again = await until(lambda: produce(conn, topic, 0, records(b"again")),
                        lambda r: r.error_code == NONE)
    out.append(again.error_code)
    return out


SCENARIOS: dict[str, Callable[[Target, str], Awaitable[list[Any]]]] = {
    "idempotence": idempotence,
    "init_producer_id": init_producer_id,
    "unknown": unknown,
    "sizes": sizes,
    "corrupt": corrupt,
    "not_leader": not_leader,
    "not_enough_replicas": not_enough_replicas,
}

# What Apache Kafka 4.1.2 answered (test_kafka_still_answers_so checks it on every run).
EXPECTED: dict[str, list[Any]] = {
    "idempotence": [
        (NONE, 0, -1), (NONE, 2, -1),
        (NONE, 0, T + 1),  # a duplicate: NONE, the ORIGINAL offset, the cached max timestamp
        (NONE, 2, T + 10),
        (OUT_OF_ORDER, -1, -1), (OUT_OF_ORDER, -1, -1),
        (NONE, 3, -1), (NONE, 4, -1),  # the client-side bump is accepted
        (INVALID_EPOCH, -1, -1),  # a lower epoch is fenced
        (OUT_OF_ORDER, -1, -1),
        (NONE, 0, -1), (NONE, 1, -1), (NONE, 0, T),
    ],
    # always a new id with epoch 0, whatever id/epoch is sent; half an id is refused
    "init_producer_id": [(NONE, True, 0), (NONE, True, 0), (NONE, True, 0),
                         (INVALID_REQUEST, False, -1), (INVALID_REQUEST, False, -1)],
    "unknown": [UNKNOWN_TP, UNKNOWN_TP],
    "sizes": [
        (NONE, 0, -1), (TOO_LARGE, -1, -1), (TOO_LARGE, -1, -1),
        (NONE, 1, -1), (TOO_LARGE, -1, -1), (OUT_OF_ORDER, -1, -1), (NONE, 2, -1),
        (LIST_TOO_LARGE, -1, -1),
    ],
    "corrupt": [(CORRUPT, -1, -1), (NONE, 1, -1)],
    "not_leader": [NOT_LEADER, True, True, True],  # with the KIP-951 leader hint
    "not_enough_replicas": [NONE, NOT_ENOUGH, NONE, NONE],
}


# -- targets -------------------------------------------------------------------


@asynccontextmanager
async def fake_target() -> AsyncIterator[Target]:
    async with FakeCluster.serve(brokers=3, seed=5, auto_create_topics=False) as fake:
        async with Cluster.open(fake.bootstrap, connector=fake.connector) as cluster:

            async def create(name: str, partitions: int, rf: int, configs: dict[str, str]
                             ) -> None:
                fake.create_topic(name, partitions, replication_factor=rf, configs=configs)
                await cluster.refresh([name], force=True)

            async def leader(topic: str, partition: int) -> int:
                return fake.leader(topic, partition)

            async def replicas(topic: str, partition: int) -> list[int]:
                return list(fake.partition(topic, partition).replicas)

            async def stop(node: int) -> None:
                fake.stop_broker(node)

            async def start(node: int) -> None:
                fake.restart_broker(node)

            yield Target("fake", cluster, create, leader, replicas, stop, start)


@asynccontextmanager
async def kafka_target(kafka: KafkaCluster) -> AsyncIterator[Target]:
    async with Cluster.open(kafka.bootstrap) as cluster:

        async def create(name: str, partitions: int, rf: int, configs: dict[str, str]) -> None:
            await kafka.call(kafka.create_topic, name, partitions, rf, configs)
            await cluster.refresh([name], force=True)

        async def leader(topic: str, partition: int) -> int:
            return await kafka.call(kafka.leader, topic, partition)

        async def replicas(topic: str, partition: int) -> list[int]:
            described = await kafka.call(kafka.describe_topic, topic)
            return list(described.partitions[partition].replicas)

        async def stop(node: int) -> None:
            await kafka.call(kafka.stop, node)

        async def start(node: int) -> None:
            await kafka.call(kafka.start, node)

        yield Target("kafka", cluster, create, leader, replicas, stop, start)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_fake_answers_as_kafka_did(scenario: str) -> None:
    async with fake_target() as target:
        assert await SCENARIOS[scenario](target, f"cmp-{scenario}") == EXPECTED[scenario]


@pytest.mark.kafka
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_kafka_still_answers_so(
    scenario: str, kafka_cluster: KafkaCluster, kafka_topic: Callable[[str], str]
) -> None:
    async with kafka_target(kafka_cluster) as target:
        assert await SCENARIOS[scenario](target, kafka_topic(scenario)) == EXPECTED[scenario]
