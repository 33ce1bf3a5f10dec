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

And transactions (tests/testing/txn_raw.py speaks them raw): the v2 protocol (Produce v12
adds partitions, EndTxn v5 bumps and returns the epoch, retries with the previous epoch,
empty aborts) and v1 (AddPartitionsToTxn first, INVALID_TXN_STATE / TRANSACTION_ABORTABLE
without), markers, last stable offsets and aborted lists at read_committed, fencing by a
second InitProducerId, KIP-360 re-initialisation, TxnOffsetCommit with and without
AddOffsetsToTxn (UNSTABLE_OFFSET_COMMIT, a plain commit winning), coordinator timeouts,
the window where a commit's markers are still being written (held open by stopping the
only replica of one of its partitions: CONCURRENT_TRANSACTIONS to the next transaction's
Produce v12 and EndTxn), FindCoordinator and NOT_COORDINATOR, DescribeTransactions and
ListTransactions. The
same answers come from a Kafka 4.1 formatted at transaction.version 1
(``test_kafka_on_transaction_version_1``): Kafka takes the protocol from each request's
version.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from pipeline.cluster import Cluster
from pipeline.cluster.connection import BrokerConnection
from pipeline.protocol.api import ApiKey
from pipeline.protocol.messages import describe_transactions as dtx
from pipeline.protocol.messages import find_coordinator as fc
from pipeline.protocol.messages import init_producer_id as ipi
from pipeline.protocol.messages import list_transactions as ltx
from pipeline.protocol.messages import produce as pm
from pipeline.protocol.records import BatchBuilder
from pipeline.testing.fake_cluster import CommittedOffset, FakeCluster
from pipeline.testing.kafka import KafkaCluster

from . import produce_request, txn_raw
from .txn_raw import until

T = 1_650_000_000_000
NONE, CORRUPT, UNKNOWN_TP, NOT_LEADER = 0, 2, 3, 6
TOO_LARGE, LIST_TOO_LARGE, NOT_ENOUGH = 10, 18, 19
INVALID_REQUEST, OUT_OF_ORDER, INVALID_EPOCH = 42, 45, 47
# A write to a partition Kafka has only just created may briefly be refused with these
# (the broker's metadata names the leader before its replica manager has become leader).
_NOT_YET = {UNKNOWN_TP, 5, NOT_LEADER}


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
    nodes: list[int]
    #: OffsetFetch's answer: (group error, {partition: (offset, error)})
    offsets: Callable[[str, str, list[int], bool], Awaitable[tuple[int, dict[int, Any]]]]
    #: a plain OffsetCommit of {partition: offset}
    commit: Callable[[str, str, dict[int, int]], Awaitable[None]]

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


async def log_append_time(t: Target, topic: str) -> list[Any]:
    """A LogAppendTime topic: an append is answered with the broker's time, not the
    records' own (T), a later one with a time no earlier, and a duplicate with the time
    of its original append (the cached batch's max timestamp)."""
    await t.create(topic, 1, 1, {"message.timestamp.type": "LogAppendTime"})
    conn = await t.leader_conn(topic)
    pid = await new_pid(conn)

    def b(seq: int, *values: bytes) -> bytes:
        return records(*values, producer_id=pid, producer_epoch=0, base_sequence=seq)

    first = await first_write(conn, topic, 0, b(0, b"a", b"b"))
    second = await produce(conn, topic, 0, b(2, b"c"))
    again = await produce(conn, topic, 0, b(0, b"a", b"b"))
    at = first.log_append_time_ms
    return [(first.error_code, first.base_offset, at > T + 1),
            (second.error_code, second.base_offset, second.log_append_time_ms >= at),
            (again.error_code, again.base_offset, again.log_append_time_ms == at)]


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


# -- transactions ----------------------------------------------------------------
#
# Raw transactional conversations (tests/testing/txn_raw.py). Producer ids are named P0,
# P1... by first sight and epochs are counted from the first InitProducerId (0 on both);
# each waits for Kafka's markers (written after EndTxn answers) before reading.

V1 = {ApiKey.PRODUCE: 11, ApiKey.ADD_PARTITIONS_TO_TXN: 3, ApiKey.END_TXN: 4,
      ApiKey.TXN_OFFSET_COMMIT: 4}
V2 = {ApiKey.PRODUCE: 12, ApiKey.END_TXN: 5, ApiKey.TXN_OFFSET_COMMIT: 5}
CONCURRENT, FENCED, MAPPING, TXN_STATE = 51, 90, 49, 48
ABORTABLE, UNSTABLE, NOT_COORDINATOR, NOT_ATTEMPTED = 120, 88, 16, 55


def codes(answer: dict[tuple[str, int], int], topic: str) -> dict[tuple[str, int], int]:
    """Per-partition answers with the scenario's topic called "T" (names differ by target)."""
    return {(t.replace(topic, "T"), p): c for (t, p), c in answer.items()}


def seen(r: txn_raw.Read) -> tuple[Any, ...]:
    return (r.high_watermark, r.last_stable_offset, r.aborted, r.records)


async def reads(t: Target, topic: str, partition: int, names: txn_raw.Names) -> list[Any]:
    """The partition at both isolation levels."""
    return [seen(await txn_raw.read(t.cluster, topic, partition, isolation=i, names=names))
            for i in (1, 0)]


async def txn_v2(t: Target, topic: str) -> list[Any]:
    """KIP-890: Produce v12 adds partitions, EndTxn v5 bumps the epoch (and a retry with the
    previous one is answered as before), an empty abort bumps it too."""
    await t.create(topic, 2, 1, {})
    names = txn_raw.Names()
    a = txn_raw.Txn(t.cluster, f"{topic}-a", versions=V2)
    r = await a.init_ok()
    out: list[Any] = [(r.error_code, r.producer_epoch)]
    out.append((await a.produce(topic, 0, b"a", b"b")).error_code)
    out.append((await a.produce(topic, 1, b"c")).error_code)
    out.append(seen(await txn_raw.read(t.cluster, topic, 0, isolation=1, names=names)))
    out.append([await txn_raw.latest(t.cluster, topic, 0, i) for i in (0, 1)])
    e = await a.end(True)
    out.append((e.error_code, e.producer_epoch))
    await a.completed()
    out += await reads(t, topic, 0, names)
    out.append((await a.produce(topic, 0, b"d")).error_code)  # epoch 1, sequence 0
    e = await a.end(False)
    out.append((e.error_code, e.producer_epoch))
    await a.completed()
    out += await reads(t, topic, 0, names)
    # the aborted list a read_committed fetch gets, from each offset
    for offset in range(6):
        r1 = await txn_raw.read(t.cluster, topic, 0, isolation=1, names=names, offset=offset)
        out.append((offset, r1.aborted))
    out.append((await a.produce(topic, 0, b"old", epoch=a.epoch - 1, sequence=0)).error_code)
    for commit in (False, True):  # a retry with the previous epoch
        e = await a.end(commit, epoch=a.epoch - 1)
        out.append((commit, e.error_code, e.producer_epoch))
    out.append((await a.end(True, epoch=a.epoch + 1)).error_code)  # a future epoch
    e = await a.end(True)  # nothing open: commit refused, abort bumps
    out.append((e.error_code, e.producer_epoch))
    e = await a.end(False)
    out.append((e.error_code, e.producer_epoch))
    return out


async def txn_v1(t: Target, topic: str) -> list[Any]:
    """The v1 protocol: AddPartitionsToTxn first, EndTxn keeps the epoch."""
    await t.create(topic, 2, 1, {})
    names = txn_raw.Names()
    b = txn_raw.Txn(t.cluster, f"{topic}-b", versions=V1)
    await b.init_ok()
    out: list[Any] = []
    for v in (3, 10, 11):  # a partition not in the transaction
        b.versions = {**V1, ApiKey.PRODUCE: v}
        out.append((v, (await b.produce(topic, 0, b"x")).error_code))
    b.versions = V1
    out.append(codes(await b.add_partitions({topic: [0, 7], f"{topic}-none": [0]}), topic))
    out.append(codes(await b.add_partitions({topic: [0, 1]}), topic))
    out.append(codes(await b.add_partitions({topic: [0]}), topic))  # already in: NONE
    out.append((await b.produce(topic, 0, b"a")).error_code)
    out.append((await b.produce(topic, 1, b"b", b"c")).error_code)
    e = await b.end(True)
    out.append((e.error_code, b.epoch))
    await b.completed()
    out += await reads(t, topic, 1, names)
    out.append((await b.end(True)).error_code)  # a retry of the commit
    out.append((await b.end(False)).error_code)
    await b.add_partitions({topic: [1]})
    out.append((await b.produce(topic, 1, b"d")).error_code)  # same epoch: sequences go on
    out.append((await b.end(False)).error_code)
    await b.completed()
    out += await reads(t, topic, 1, names)
    c = txn_raw.Txn(t.cluster, f"{topic}-c", versions=V1)
    await c.init_ok()
    out.append([(await c.end(commit)).error_code for commit in (True, False)])  # Empty
    return out


async def fencing(t: Target, topic: str) -> list[Any]:
    """A second InitProducerId aborts the open transaction and fences the first producer."""
    await t.create(topic, 1, 1, {})
    names = txn_raw.Names()
    zombie = txn_raw.Txn(t.cluster, f"{topic}-z", versions=V1)
    await zombie.init_ok()
    await zombie.add_partitions({topic: [0]})
    out: list[Any] = [(await zombie.produce(topic, 0, b"zombie")).error_code]
    fresh = txn_raw.Txn(t.cluster, f"{topic}-z")
    out.append((await fresh.init()).error_code)  # the open transaction is aborted first
    r = await fresh.init_ok()
    out.append((r.error_code, r.producer_epoch, fresh.producer_id == zombie.producer_id))
    out.append((await zombie.produce(topic, 0, b"late")).error_code)
    zombie.versions = {**V1, ApiKey.PRODUCE: 12}  # KIP-890's Produce: the same answer
    out.append((await zombie.produce(topic, 0, b"late")).error_code)
    for v in (1, 3):
        zombie.versions = {**V1, ApiKey.ADD_PARTITIONS_TO_TXN: v}
        out.append((v, codes(await zombie.add_partitions({topic: [0]}), topic)))
    for v in (1, 4, 5):
        zombie.versions = {**V1, ApiKey.END_TXN: v}
        out.append((v, (await zombie.end(True)).error_code))
    out.append((await zombie.end(True, producer_id=zombie.producer_id + 1)).error_code)
    await fresh.completed()
    out += await reads(t, topic, 0, names)
    return out


async def init_rules(t: Target, topic: str) -> list[Any]:
    """InitProducerId's checks (KIP-360's producer id and epoch among them)."""
    out: list[Any] = [(await txn_raw.Txn(t.cluster, "").init(conn=await t.cluster.any_connection())
                       ).error_code]
    for timeout in (0, 900_001):
        out.append((await txn_raw.Txn(t.cluster, f"{topic}-t", timeout_ms=timeout).init()
                    ).error_code)
    k = txn_raw.Txn(t.cluster, f"{topic}-k")
    await k.init_ok()
    pid, e0 = k.producer_id, k.epoch
    r = await k.init(keep=True)
    out.append((r.error_code, r.producer_epoch - e0))
    r = await k.init(keep=True)
    out.append((r.error_code, r.producer_epoch - e0))
    for epoch in (e0 + 1, e0):  # the one before the last bump is a retry; older is fenced
        for v in (3, 4, 5):
            k.versions = {ApiKey.INIT_PRODUCER_ID: v}
            k.producer_id, k.epoch = pid, epoch
            r = await k.init(keep=True)
            out.append((epoch - e0, v, r.error_code, r.producer_epoch - e0 if r.error_code == 0
                        else None))
    for v in (3, 4):
        k.versions = {ApiKey.INIT_PRODUCER_ID: v}
        k.producer_id, k.epoch = pid + 1, e0 + 2
        out.append((v, (await k.init(keep=True)).error_code))
    k.producer_id, k.epoch = pid, e0 + 2
    k.versions = {}
    for v in (0, 1, 2, 4):  # stale epoch on the other APIs
        k.versions = {ApiKey.ADD_OFFSETS_TO_TXN: v, ApiKey.ADD_PARTITIONS_TO_TXN: min(v, 3)}
        k.epoch = e0 + 1
        out.append((v, await k.add_offsets(f"{topic}-g"),
                    codes(await k.add_partitions({topic: [0]}), topic)))
    return out


async def txn_offsets(t: Target, topic: str) -> list[Any]:
    """TxnOffsetCommit: pending until the end (UNSTABLE_OFFSET_COMMIT for require_stable);
    a plain commit made meanwhile wins; an abort drops them."""
    await t.create(topic, 3, 1, {})
    group = f"{topic}-g"
    o = txn_raw.Txn(t.cluster, f"{topic}-o", versions=V1)
    await o.init_ok()

    async def commit(txn: txn_raw.Txn, offsets: dict[tuple[str, int], int]) -> Any:
        # (a new Kafka's group coordinator is not there yet, then loading)
        return codes(await txn_raw.until(lambda: txn.commit_offsets(group, offsets),
                                         lambda r: not set(r.values()) & {14, 16}), topic)

    await txn_raw.until(lambda: t.offsets(group, topic, [0], False), lambda r: r[0] == 0)
    out: list[Any] = []
    for v in (0, 3, 4):  # without AddOffsetsToTxn
        o.versions = {**V1, ApiKey.TXN_OFFSET_COMMIT: v}
        out.append((v, await commit(o, {(topic, 0): 5})))
    o.versions = V1
    out.append(await o.add_offsets(group))
    out.append(await commit(o, {(topic, 0): 5, (topic, 1): 6}))
    out.append(await t.offsets(group, topic, [0, 1, 2], True))
    out.append(await t.offsets(group, topic, [0, 1, 2], False))
    await t.commit(group, topic, {0: 1, 2: 7})  # a plain commit while the transaction is open
    out.append((await o.end(True)).error_code)
    await o.completed()
    stable = await txn_raw.until(lambda: t.offsets(group, topic, [0, 1, 2], True),
                                 lambda r: all(e != UNSTABLE for _, e in r[1].values()))
    out.append(stable)
    v2 = txn_raw.Txn(t.cluster, f"{topic}-v2", versions=V2)
    await v2.init_ok()
    out.append(await commit(v2, {(topic, 1): 60}))  # v5: no AddOffsetsToTxn needed
    out.append(await t.offsets(group, topic, [1], True))
    e = await v2.end(False)
    out.append((e.error_code, e.producer_epoch))
    await v2.completed()
    out.append(await txn_raw.until(lambda: t.offsets(group, topic, [1], True),
                                   lambda r: r[1][1][1] != UNSTABLE))
    return out


async def timeouts(t: Target, topic: str) -> list[Any]:
    """The coordinator aborts a transaction open past its timeout and fences its producer
    (epoch + 1); v2 lets the producer's own EndTxn with the old epoch abort, v1 does not."""
    await t.create(topic, 2, 1, {})
    group = f"{topic}-g"
    names = txn_raw.Names()
    out: list[Any] = []
    await txn_raw.until(lambda: t.offsets(group, topic, [0], False), lambda r: r[0] == 0)
    for protocol, versions, partition in (("v2", V2, 0), ("v1", V1, 1)):
        x = txn_raw.Txn(t.cluster, f"{topic}-{protocol}", timeout_ms=1000, versions=versions)
        await x.init_ok()
        e0 = x.epoch
        if protocol == "v1":
            await x.add_partitions({topic: [partition]})
        out.append((await x.produce(topic, partition, b"late")).error_code)
        # (the coordinator is looked up at each ask: it may move meanwhile, as Kafka's
        # leader rebalance moves it back once a test restarted its preferred node)
        _, state, epoch = await txn_raw.until(
            x.state, lambda s: (s[0], s[1]) == (NONE, "CompleteAbort"))
        out.append((state, epoch - e0))
        out.append((await x.produce(topic, partition, b"later")).error_code)
        if protocol == "v2":
            out.append(codes(await x.commit_offsets(group, {(topic, 0): 3}), topic))
        out.append((await x.end(True)).error_code)
        e = await x.end(False)
        out.append((e.error_code, e.producer_epoch - e0 if e.producer_epoch >= 0 else None))
        await x.completed()
        out += await reads(t, topic, partition, names)
    return out


async def marker_window(t: Target, topic: str) -> list[Any]:
    """While the coordinator writes the markers of a commit (PrepareCommit: held open here
    by stopping the only replica of a partition of the transaction), every EndTxn is
    answered CONCURRENT_TRANSACTIONS, an abort of the next transaction too, and so is
    v2's Produce v12 (v11: NOT_ENOUGH_REPLICAS). Once the markers are written, the abort
    bumps the epoch (v2) or is INVALID_TXN_STATE (v1: nothing is open)."""
    await t.create(topic, 3, 1, {})
    a = txn_raw.Txn(t.cluster, f"{topic}-w2", versions=V2)
    b = txn_raw.Txn(t.cluster, f"{topic}-w1", versions=V1)
    for x in (a, b):
        await x.init_ok()
    ca, cb = await a.coordinator(), await b.coordinator()
    leaders = [await t.leader(topic, p) for p in range(3)]
    # held: a partition led by neither coordinator; free: one led elsewhere
    held = next(p for p in range(3) if leaders[p] not in (ca.node_id, cb.node_id))
    free = next(p for p in range(3) if leaders[p] != leaders[held])
    out: list[Any] = [(await a.produce(topic, held, b"a")).error_code]
    out.append(list((await b.add_partitions({topic: [held]}, conn=cb)).values()))
    out.append((await b.produce(topic, held, b"b")).error_code)
    await t.stop(leaders[held])
    try:
        e = await a.end(True, conn=ca)
        out.append((e.error_code, e.producer_epoch))
        out.append((await b.end(True, conn=cb)).error_code)
        out.append([(await a.state(ca))[1], (await b.state(cb))[1]])
        # v2: the next transaction, inside the window
        out.append((await a.produce(topic, free, b"refused")).error_code)
        out.append((await a.end(False, conn=ca)).error_code)
        out.append((await a.end(True, conn=ca)).error_code)
        out.append((await a.end(False, epoch=a.epoch - 1, conn=ca)).error_code)  # a lost commit
        out.append((await a.end(False, epoch=a.epoch + 1, conn=ca)).error_code)
        out.append((await a.init(conn=ca)).error_code)
        # v1
        out.append(list((await b.add_partitions({topic: [free]}, conn=cb)).values()))
        out.append((await b.produce(topic, free, b"refused")).error_code)
        out.append((await b.end(False, conn=cb)).error_code)
        out.append((await b.end(True, conn=cb)).error_code)
        out.append((await b.end(False, epoch=b.epoch + 1, conn=cb)).error_code)
        out.append([(await a.state(ca))[1], (await b.state(cb))[1]])
    finally:
        await t.start(leaders[held])
    await a.completed(ca)
    await b.completed(cb)
    out.append([(await a.state(ca))[1], (await b.state(cb))[1]])
    e = await a.end(False, conn=ca)  # nothing open: v2 bumps the epoch
    out.append((e.error_code, e.producer_epoch))
    out.append([(await b.end(commit, conn=cb)).error_code for commit in (False, True)])
    await t.cluster.refresh([topic], force=True)
    r = await txn_raw.read(t.cluster, topic, held, isolation=1, names=txn_raw.Names())
    # (the two transactions' markers land in either order: named by their epochs)
    out.append((r.high_watermark, r.last_stable_offset, r.aborted,
                sorted(re.sub(r"\(P\d+,", "(", v) for _, v in r.records)))
    return out


async def coordinators(t: Target, topic: str) -> list[Any]:
    """FindCoordinator at every version; a transaction API on another broker."""
    await t.create(topic, 1, 1, {})
    conn = await t.cluster.any_connection()
    found: set[tuple[int, bool, int, bool]] = set()
    for v in range(7):
        for key_type in (0, 1, 2) if v else (0,):
            for key in (f"{topic}-k", ""):
                if v >= 4:
                    r = await conn.request(fc.FindCoordinatorRequest(
                        key_type=key_type, coordinator_keys=(key,)), version=v)
                    (c,) = r.coordinators
                    code, node = c.error_code, c.node_id
                else:
                    r0 = await conn.request(fc.FindCoordinatorRequest(key=key, key_type=key_type),
                                            version=v)
                    code, node = r0.error_code, r0.node_id
                found.add((key_type, key != "", code, node in t.nodes))
    # the same at every version: (key type, key not empty, error, a broker named)
    out: list[Any] = [sorted(found)]
    x = txn_raw.Txn(t.cluster, f"{topic}-x")
    await x.init_ok()
    _, home = await txn_raw.find_coordinator(t.cluster, x.transactional_id, txn_raw.TRANSACTION)
    _, group_home = await txn_raw.find_coordinator(t.cluster, f"{topic}-g", txn_raw.GROUP)
    other = await t.conn(next(n for n in t.nodes if n != home))
    other_group = await t.conn(next(n for n in t.nodes if n != group_home))
    out.append((await x.init(conn=other)).error_code)
    out.append(codes(await x.add_partitions({topic: [0]}, conn=other), topic))
    out.append(await x.add_offsets(f"{topic}-g", conn=other))
    out.append((await x.end(True, conn=other)).error_code)
    out.append(codes(await x.commit_offsets(f"{topic}-g", {(topic, 0): 1}, conn=other_group),
                     topic))
    r = await other.request(dtx.DescribeTransactionsRequest(
        transactional_ids=(x.transactional_id,)))
    out.append([s.error_code for s in r.transaction_states])
    return out


async def listings(t: Target, topic: str) -> list[Any]:
    """DescribeTransactions and ListTransactions (every broker lists its own)."""
    await t.create(topic, 1, 1, {})
    ids = [f"{topic}-{n}" for n in ("empty", "open", "done", "aborted")]
    txns = {i: txn_raw.Txn(t.cluster, i, versions=V2) for i in ids}
    for x in txns.values():
        await x.init_ok()
    for name in ids[1:]:
        await txns[name].produce(topic, 0, b"v")
    await txns[ids[2]].end(True)
    await txns[ids[3]].end(False)
    out: list[Any] = []
    for i in [*ids, f"{topic}-never"]:

        async def describe(i: str = i) -> Any:
            # (the coordinator is looked up at each ask: it may move meanwhile)
            _, node = await txn_raw.find_coordinator(t.cluster, i, txn_raw.TRANSACTION)
            conn = await t.conn(node)
            r = await conn.request(dtx.DescribeTransactionsRequest(transactional_ids=(i,)))
            (s,) = r.transaction_states
            return (s.error_code, s.transaction_state, s.producer_epoch,
                    s.transaction_start_time_ms > 0, s.transaction_timeout_ms,
                    [(d.topic == topic, d.partitions) for d in s.topics])

        # (Kafka writes the markers after EndTxn answered: PrepareCommit/Abort meanwhile)
        out.append(await txn_raw.until(describe, lambda d: not d[1].startswith("Prepare")))

    async def listed(version: int, **filters: Any) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        for node in t.nodes:
            conn = await t.conn(node)
            r = await conn.request(ltx.ListTransactionsRequest(**filters), version=version)
            assert r.error_code == 0
            found += [(s.transactional_id[len(topic) + 1:], s.transaction_state)
                      for s in r.transaction_states if s.transactional_id.startswith(topic)]
        return sorted(found)

    out.append(await listed(0, state_filters=(), producer_id_filters=()))
    out.append(await listed(0, state_filters=("Ongoing", "Nonsense"), producer_id_filters=()))
    out.append(await listed(0, producer_id_filters=(txns[ids[2]].producer_id,)))
    out.append(await listed(2, transactional_id_pattern=f"{topic}-(open|done)"))
    out.append(await listed(1, duration_filter=3_600_000))  # never started: no start time
    r = await (await t.cluster.any_connection()).request(
        ltx.ListTransactionsRequest(state_filters=("Ongoing", "Nonsense")), version=0)
    out.append(r.unknown_state_filters)
    return out


SCENARIOS: dict[str, Callable[[Target, str], Awaitable[list[Any]]]] = {
    "idempotence": idempotence,
    "log_append_time": log_append_time,
    "init_producer_id": init_producer_id,
    "unknown": unknown,
    "sizes": sizes,
    "corrupt": corrupt,
    "not_leader": not_leader,
    "not_enough_replicas": not_enough_replicas,
    "txn_v2": txn_v2,
    "txn_v1": txn_v1,
    "fencing": fencing,
    "init_rules": init_rules,
    "txn_offsets": txn_offsets,
    "timeouts": timeouts,
    "marker_window": marker_window,
    "coordinators": coordinators,
    "listings": listings,
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
    "log_append_time": [(NONE, 0, True), (NONE, 2, True), (NONE, 0, True)],
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
    # Transactions. Error codes: 3 UNKNOWN_TOPIC_OR_PARTITION, 16 NOT_COORDINATOR,
    # 42 INVALID_REQUEST, 47 INVALID_PRODUCER_EPOCH, 48 INVALID_TXN_STATE,
    # 49 INVALID_PRODUCER_ID_MAPPING, 50 INVALID_TRANSACTION_TIMEOUT,
    # 51 CONCURRENT_TRANSACTIONS, 55 OPERATION_NOT_ATTEMPTED, 88 UNSTABLE_OFFSET_COMMIT,
    # 90 PRODUCER_FENCED, 120 TRANSACTION_ABORTABLE. Reads are (high watermark, last stable
    # offset, aborted transactions (None at read_uncommitted), records), read_committed first.
    "txn_v2": [(0, 0), 0, 0, (2, 0, [], []), [2, 0], (0, 1),
     (3, 3, [], [(0, 'a'), (1, 'b'), (2, 'COMMIT(P0,1)')]),
     (3, 3, None, [(0, 'a'), (1, 'b'), (2, 'COMMIT(P0,1)')]), 0, (0, 2),
     (5, 5, [('P0', 3)],
      [(0, 'a'), (1, 'b'), (2, 'COMMIT(P0,1)'), (3, 'd'), (4, 'ABORT(P0,2)')]),
     (5, 5, None, [(0, 'a'), (1, 'b'), (2, 'COMMIT(P0,1)'), (3, 'd'), (4, 'ABORT(P0,2)')]),
     (0, [('P0', 3)]), (1, [('P0', 3)]), (2, [('P0', 3)]), (3, [('P0', 3)]),
     (4, [('P0', 3)]), (5, []), 47, (False, 0, 2), (True, 48, -1), 90, (48, -1), (0, 3)],
    "txn_v1": [(3, 48), (10, 48), (11, 120), {('T', 0): 55, ('T', 7): 3, ('T-none', 0): 3},
     {('T', 0): 0, ('T', 1): 0}, {('T', 0): 0}, 0, 0, (0, 0),
     (3, 3, [], [(0, 'b'), (1, 'c'), (2, 'COMMIT(P0,0)')]),
     (3, 3, None, [(0, 'b'), (1, 'c'), (2, 'COMMIT(P0,0)')]), 0, 48, 0, 0,
     (5, 5, [('P0', 3)],
      [(0, 'b'), (1, 'c'), (2, 'COMMIT(P0,0)'), (3, 'd'), (4, 'ABORT(P0,0)')]),
     (5, 5, None, [(0, 'b'), (1, 'c'), (2, 'COMMIT(P0,0)'), (3, 'd'), (4, 'ABORT(P0,0)')]),
     [48, 48]],
    "fencing": [0, 51, (0, 2, True), 47, 47, (1, {('T', 0): 47}), (3, {('T', 0): 90}), (1, 47), (4, 90),
     (5, 90), 49, (2, 2, [('P0', 0)], [(0, 'zombie'), (1, 'ABORT(P0,1)')]),
     (2, 2, None, [(0, 'zombie'), (1, 'ABORT(P0,1)')])],
    "init_rules": [42, 50, 50, (0, 1), (0, 2), (1, 3, 0, 2), (1, 4, 0, 2), (1, 5, 0, 2), (0, 3, 47, None),
     (0, 4, 90, None), (0, 5, 90, None), (3, 47), (4, 90), (0, 47, {('T', 0): 3}),
     (1, 47, {('T', 0): 3}), (2, 90, {('T', 0): 3}), (4, 90, {('T', 0): 3})],
    "txn_offsets": [(0, {('T', 0): 48}), (3, {('T', 0): 48}), (4, {('T', 0): 120}), 0,
     {('T', 0): 0, ('T', 1): 0}, (0, {0: (-1, 88), 1: (-1, 88), 2: (-1, 0)}),
     (0, {0: (-1, 0), 1: (-1, 0), 2: (-1, 0)}), 0, (0, {0: (1, 0), 1: (6, 0), 2: (7, 0)}),
     {('T', 1): 0}, (0, {1: (-1, 88)}), (0, 1), (0, {1: (6, 0)})],
    "timeouts": [0, ('CompleteAbort', 1), 47, {('T', 0): 47}, 48, (0, 1),
     (2, 2, [('P0', 0)], [(0, 'late'), (1, 'ABORT(P0,1)')]),
     (2, 2, None, [(0, 'late'), (1, 'ABORT(P0,1)')]), 0, ('CompleteAbort', 1), 47, 90,
     (90, None), (2, 2, [('P1', 0)], [(0, 'late'), (1, 'ABORT(P1,1)')]),
     (2, 2, None, [(0, 'late'), (1, 'ABORT(P1,1)')])],
    # the commits' markers held (PrepareCommit); the next v2 transaction's Produce v12, an
    # abort, a commit, an abort with the previous / a future epoch, InitProducerId: 51;
    # v1: AddPartitionsToTxn 51, Produce v11 19, abort / commit 51, a future epoch 90;
    # then the markers: v2's abort bumps the epoch, v1's is refused, its commit a retry
    "marker_window": [0, [0], 0, (0, 1), 0, ['PrepareCommit', 'PrepareCommit'],
     51, 51, 51, 51, 51, 51, [51], 19, 51, 51, 90,
     ['PrepareCommit', 'PrepareCommit'], ['CompleteCommit', 'CompleteCommit'], (0, 2),
     [48, 0], (4, 4, [], ['COMMIT(0)', 'COMMIT(1)', 'a', 'b'])],
    "coordinators": [[(0, False, 0, True), (0, True, 0, True), (1, False, 0, True), (1, True, 0, True),
      (2, False, 42, False), (2, True, 42, False)],
     16, {('T', 0): 16}, 16, 16, {('T', 0): 16}, [16]],
    "listings": [(0, 'Empty', 0, False, 60000, []), (0, 'Ongoing', 0, True, 60000, [(True, (0,))]),
     (0, 'CompleteCommit', 1, True, 60000, []), (0, 'CompleteAbort', 1, True, 60000, []),
     (105, '', 0, False, 0, []),
     [('aborted', 'CompleteAbort'), ('done', 'CompleteCommit'), ('empty', 'Empty'),
      ('open', 'Ongoing')],
     [('open', 'Ongoing')], [('done', 'CompleteCommit')],
     [('done', 'CompleteCommit'), ('open', 'Ongoing')], [('empty', 'Empty')],
     ('Nonsense',)],
}


# -- targets -------------------------------------------------------------------


@asynccontextmanager
async def fake_target(brokers: int = 3, transaction_version: int = 2) -> AsyncIterator[Target]:
    async with FakeCluster.serve(brokers=brokers, seed=5, auto_create_topics=False,
                                 transaction_version=transaction_version) as fake:
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
                # as Kafka's controlled shutdown: what the node led moves to another
                # replica; a partition with none is offline until the node is back
                led = [(p.topic, p.index) for tp in fake.state.topics.values()
                       for p in tp.partitions if p.leader == node]
                fake.stop_broker(node, elect=False)
                for name, index in led:
                    others = [r for r in fake.partition(name, index).replicas
                              if r != node and fake.state.brokers[r].alive]
                    if others:
                        fake.move_leader(name, index, others[0])

            async def start(node: int) -> None:
                fake.restart_broker(node)

            async def offsets(group: str, topic: str, partitions: list[int], stable: bool
                              ) -> tuple[int, dict[int, Any]]:
                await trio.lowlevel.checkpoint()
                out: dict[int, Any] = {}
                for p in partitions:
                    if stable and fake.offsets.is_pending(group, (topic, p)):
                        out[p] = (-1, 88)  # UNSTABLE_OFFSET_COMMIT
                        continue
                    c = fake.offsets.fetch(group, (topic, p))
                    out[p] = (-1 if c is None else c.offset, 0)
                return 0, out

            async def commit(group: str, topic: str, offsets: dict[int, int]) -> None:
                await trio.lowlevel.checkpoint()
                fake.offsets.commit(group, {(topic, p): CommittedOffset(o)
                                            for p, o in offsets.items()})

            yield Target("fake", cluster, create, leader, replicas, stop, start,
                         sorted(fake.state.brokers), offsets, commit)


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

        async def offsets(group: str, topic: str, partitions: list[int], stable: bool
                          ) -> tuple[int, dict[int, Any]]:
            return await txn_raw.committed(cluster, group, topic, partitions,
                                           require_stable=stable)

        async def commit(group: str, topic: str, offsets: dict[int, int]) -> None:
            codes = await txn_raw.commit_plain(cluster, group, topic, offsets)
            assert set(codes.values()) == {0}, codes

        yield Target("kafka", cluster, create, leader, replicas, stop, start, kafka.nodes,
                     offsets, commit)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_fake_answers_as_kafka_did(scenario: str, autojump_clock: trio.abc.Clock) -> None:
    async with fake_target() as target:
        assert await SCENARIOS[scenario](target, f"cmp-{scenario}") == EXPECTED[scenario]


@pytest.mark.kafka
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_kafka_still_answers_so(
    scenario: str, kafka_cluster: KafkaCluster, kafka_topic: Callable[[str], str]
) -> None:
    async with kafka_target(kafka_cluster) as target:
        assert await SCENARIOS[scenario](target, kafka_topic(scenario)) == EXPECTED[scenario]


# Kafka 4.1 takes the transactions protocol from each request's version, not from its
# finalized transaction.version: the same answers on a cluster at level 1 (one node).
ON_V1_CLUSTER = ["txn_v2", "txn_v1", "fencing", "txn_offsets", "timeouts"]


@pytest.mark.parametrize("scenario", ON_V1_CLUSTER)
async def test_fake_on_transaction_version_1(scenario: str,
                                            autojump_clock: trio.abc.Clock) -> None:
    async with fake_target(brokers=1, transaction_version=1) as target:
        assert await SCENARIOS[scenario](target, f"cmp-{scenario}") == EXPECTED[scenario]


@pytest.mark.kafka
@pytest.mark.parametrize("scenario", ON_V1_CLUSTER)
async def test_kafka_on_transaction_version_1(
    scenario: str, kafka_txn_v1: KafkaCluster, kafka_topic: Callable[[str], str]
) -> None:
    async with kafka_target(kafka_txn_v1) as target:
        assert await SCENARIOS[scenario](target, kafka_topic(scenario)) == EXPECTED[scenario]
