"""Raw transactional conversations through the project's cluster layer (``Cluster`` /
``BrokerConnection``), for the fake and for Apache Kafka alike: no producer exists below
the producer layer, so the transaction protocol is spoken request by request here.

``Txn`` is one transactional id's client side: it finds its coordinator, initialises,
adds partitions / offsets, writes transactional batches and ends transactions, each call
answering what the broker said. ``read`` fetches a partition at an isolation level and
returns it in a form two clusters can be compared in (producer ids named by order of
appearance).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from pipeline.cluster import Cluster
from pipeline.cluster.connection import BrokerConnection
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import add_offsets_to_txn as aot
from pipeline.protocol.messages import add_partitions_to_txn as apt
from pipeline.protocol.messages import describe_transactions as dtx
from pipeline.protocol.messages import end_txn as et
from pipeline.protocol.messages import fetch as fm
from pipeline.protocol.messages import find_coordinator as fc
from pipeline.protocol.messages import init_producer_id as ipi
from pipeline.protocol.messages import list_offsets as lo
from pipeline.protocol.messages import offset_commit as oc
from pipeline.protocol.messages import offset_fetch as of
from pipeline.protocol.messages import produce as pm
from pipeline.protocol.messages import txn_offset_commit as toc
from pipeline.protocol.records import (
    BatchBuilder,
    control_record_type,
    decode_record_batches,
)

X = TypeVar("X")
#: a write to a partition Kafka has only just created may be refused with these
_NOT_YET = {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.LEADER_NOT_AVAILABLE,
            ErrorCode.NOT_LEADER_OR_FOLLOWER}
GROUP, TRANSACTION = 0, 1
T0 = 1_650_000_000_000


async def until(ask: Callable[[], Awaitable[X]], done: Callable[[X], bool],
                within: float = 30.0) -> X:
    """Ask until the answer is ``done`` (a fresh Kafka loads its coordinators lazily).
    Bounded by ``within`` seconds; past it, the error names the last answer, so a run
    that gives up says what Kafka was still answering."""
    answers: list[X] = []
    try:
        with trio.fail_after(within):
            while True:
                value = await ask()
                if done(value):
                    return value
                answers[:] = [value]
                await trio.sleep(0.1)
    except trio.TooSlowError:
        last = f"the last answer was {answers[0]!r}" if answers else "no answer came"
        raise AssertionError(f"not done within {within} s: {last}") from None


def records(*values: bytes, producer_id: int, producer_epoch: int, base_sequence: int,
            transactional: bool = True, ts: int = T0) -> bytes:
    builder = BatchBuilder()
    for i, value in enumerate(values):
        builder.append(ts + i, None, value)
    return builder.build(producer_id=producer_id, producer_epoch=producer_epoch,
                         base_sequence=base_sequence, is_transactional=transactional)


async def find_coordinator(cluster: Cluster, key: str, key_type: int,
                           version: int | None = None) -> tuple[int, int]:
    """(error code, node id) of ``key``'s coordinator, asked until it is not loading."""
    conn = await cluster.any_connection()
    v = conn.version_for(ApiKey.FIND_COORDINATOR) if version is None else version

    async def ask() -> tuple[int, int]:
        if v >= 4:
            r = await conn.request(fc.FindCoordinatorRequest(key_type=key_type,
                                                             coordinator_keys=(key,)), version=v)
            (c,) = r.coordinators
            return c.error_code, c.node_id
        r0 = await conn.request(fc.FindCoordinatorRequest(key=key, key_type=key_type), version=v)
        return r0.error_code, r0.node_id

    return await until(ask, lambda a: a[0] not in (ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                                   ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))


@dataclass
class Txn:
    """One transactional id, spoken raw. ``versions`` pins API versions (else the
    negotiated ones): e.g. Produce 11 and EndTxn 4 speak the v1 protocol."""

    cluster: Cluster
    transactional_id: str
    timeout_ms: int = 60000
    versions: Mapping[ApiKey, int] = field(default_factory=dict)
    producer_id: int = -1
    epoch: int = -1
    sequences: dict[tuple[str, int], int] = field(default_factory=dict)

    def version(self, conn: BrokerConnection, key: ApiKey) -> int:
        return self.versions.get(key, conn.version_for(key))

    async def coordinator(self) -> BrokerConnection:
        code, node = await find_coordinator(self.cluster, self.transactional_id, TRANSACTION)
        assert code == ErrorCode.NONE, code
        return await self.cluster.connection(node)

    async def group_coordinator(self, group: str) -> BrokerConnection:
        code, node = await find_coordinator(self.cluster, group, GROUP)
        assert code == ErrorCode.NONE, code
        return await self.cluster.connection(node)

    async def init(self, *, keep: bool = False, conn: BrokerConnection | None = None,
                   timeout_ms: int | None = None) -> ipi.InitProducerIdResponse:
        """InitProducerId with the transactional id (and, ``keep``, the current id and
        epoch, KIP-360); on success the new id and epoch are this Txn's."""
        conn = conn or await self.coordinator()
        request = ipi.InitProducerIdRequest(
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self.timeout_ms if timeout_ms is None else timeout_ms,
            producer_id=self.producer_id if keep else -1,
            producer_epoch=self.epoch if keep else -1)
        r = await conn.request(request, version=self.version(conn, ApiKey.INIT_PRODUCER_ID))
        if r.error_code == ErrorCode.NONE:
            if r.producer_id != self.producer_id or r.producer_epoch != self.epoch:
                self.sequences.clear()
            self.producer_id, self.epoch = r.producer_id, r.producer_epoch
        return r

    async def init_ok(self) -> ipi.InitProducerIdResponse:
        """init() until it succeeds (a fresh coordinator loads; a pending end completes)."""
        return await until(self.init, lambda r: r.error_code not in (
            ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.CONCURRENT_TRANSACTIONS,
            ErrorCode.NOT_COORDINATOR))

    async def add_partitions(self, partitions: Mapping[str, Sequence[int]], *,
                             conn: BrokerConnection | None = None) -> dict[tuple[str, int], int]:
        conn = conn or await self.coordinator()
        request = apt.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=self.transactional_id,
            v3_and_below_producer_id=self.producer_id,
            v3_and_below_producer_epoch=self.epoch,
            v3_and_below_topics=tuple(apt.AddPartitionsToTxnTopic(name=t, partitions=tuple(ps))
                                      for t, ps in partitions.items()))
        r = await conn.request(request, version=self.version(conn, ApiKey.ADD_PARTITIONS_TO_TXN))
        if r.error_code:
            return {("*", -1): r.error_code}
        return {(t.name, p.partition_index): p.partition_error_code
                for t in r.results_by_topic_v3_and_below for p in t.results_by_partition}

    async def produce(self, topic: str, partition: int, *values: bytes,
                      epoch: int | None = None, sequence: int | None = None,
                      transactional: bool = True) -> pm.PartitionProduceResponse:
        """One transactional batch to the partition's leader (sequences kept per
        partition; an accepted batch advances them). A partition Kafka has only just
        created may refuse writes for a moment (nothing is appended then): asked again."""
        return await until(
            lambda: self._produce(topic, partition, values, epoch, sequence, transactional),
            lambda r: r.error_code not in _NOT_YET)

    async def _produce(self, topic: str, partition: int, values: tuple[bytes, ...],
                       epoch: int | None, sequence: int | None, transactional: bool
                       ) -> pm.PartitionProduceResponse:
        leader = await self.cluster.leader_for(topic, partition)
        conn = await self.cluster.connection(leader)
        seq = self.sequences.get((topic, partition), 0) if sequence is None else sequence
        data = records(*values, producer_id=self.producer_id,
                       producer_epoch=self.epoch if epoch is None else epoch,
                       base_sequence=seq, transactional=transactional)
        request = pm.ProduceRequest(
            transactional_id=self.transactional_id if transactional else None,
            acks=-1, timeout_ms=10000,
            topic_data=(pm.TopicProduceData(name=topic, partition_data=(
                pm.PartitionProduceData(index=partition, records=data),)),))
        r = await conn.request(request, version=self.version(conn, ApiKey.PRODUCE))
        (part,) = r.responses[0].partition_responses
        if part.error_code in _NOT_YET:
            await self.cluster.refresh([topic], force=True)
        if part.error_code == ErrorCode.NONE and sequence is None:
            self.sequences[(topic, partition)] = seq + len(values)
        return part

    async def add_offsets(self, group: str, *, conn: BrokerConnection | None = None) -> int:
        conn = conn or await self.coordinator()
        r = await conn.request(aot.AddOffsetsToTxnRequest(
            transactional_id=self.transactional_id, producer_id=self.producer_id,
            producer_epoch=self.epoch, group_id=group),
            version=self.version(conn, ApiKey.ADD_OFFSETS_TO_TXN))
        return r.error_code

    async def commit_offsets(self, group: str, offsets: Mapping[tuple[str, int], int], *,
                             conn: BrokerConnection | None = None) -> dict[tuple[str, int], int]:
        conn = conn or await self.group_coordinator(group)
        by_topic: dict[str, list[toc.TxnOffsetCommitRequestPartition]] = {}
        for (t, p), offset in sorted(offsets.items()):
            by_topic.setdefault(t, []).append(toc.TxnOffsetCommitRequestPartition(
                partition_index=p, committed_offset=offset, committed_metadata=""))
        r = await conn.request(toc.TxnOffsetCommitRequest(
            transactional_id=self.transactional_id, group_id=group,
            producer_id=self.producer_id, producer_epoch=self.epoch,
            topics=tuple(toc.TxnOffsetCommitRequestTopic(name=t, partitions=tuple(ps))
                         for t, ps in by_topic.items())),
            version=self.version(conn, ApiKey.TXN_OFFSET_COMMIT))
        return {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}

    async def state(self, conn: BrokerConnection | None = None) -> tuple[int, str, int]:
        """DescribeTransactions: (error, state, epoch)."""
        conn = conn or await self.coordinator()
        r = await conn.request(dtx.DescribeTransactionsRequest(
            transactional_ids=(self.transactional_id,)))
        (s,) = r.transaction_states
        return s.error_code, s.transaction_state, s.producer_epoch

    async def completed(self, conn: BrokerConnection | None = None) -> None:
        """Until the transaction left PrepareCommit/PrepareAbort: Kafka answers EndTxn
        before its markers are written and the transaction is complete."""
        await until(lambda: self.state(conn), lambda s: not s[1].startswith("Prepare"))

    async def end(self, commit: bool, *, epoch: int | None = None,
                  producer_id: int | None = None,
                  conn: BrokerConnection | None = None) -> et.EndTxnResponse:
        """EndTxn; a v5 answer's producer id and epoch (KIP-890: bumped) become this
        Txn's (its sequences restart)."""
        conn = conn or await self.coordinator()
        version = self.version(conn, ApiKey.END_TXN)
        r = await conn.request(et.EndTxnRequest(
            transactional_id=self.transactional_id,
            producer_id=self.producer_id if producer_id is None else producer_id,
            producer_epoch=self.epoch if epoch is None else epoch, committed=commit),
            version=version)
        if r.error_code == ErrorCode.NONE and version >= 5 and r.producer_epoch >= 0:
            if (r.producer_id, r.producer_epoch) != (self.producer_id, self.epoch):
                self.sequences.clear()
            self.producer_id, self.epoch = r.producer_id, r.producer_epoch
        return r


@dataclass
class Read:
    """A partition as one Fetch returned it, producer ids named P0, P1... by first sight."""

    high_watermark: int
    last_stable_offset: int
    aborted: list[tuple[str, int]] | None
    records: list[tuple[int, str]]  # (offset, value) ; markers as "COMMIT(P0,e)"/"ABORT(...)"


class Names:
    """Producer ids -> P0, P1, ... in order of first sight (per comparison)."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}

    def __call__(self, pid: int) -> str:
        if pid < 0:
            return "-"
        return self.names.setdefault(pid, f"P{len(self.names)}")


async def read(cluster: Cluster, topic: str, partition: int, *, isolation: int,
               names: Names, offset: int = 0) -> Read:
    """Fetch from ``offset`` to the end (the LSO under read_committed, else the high
    watermark) as a consumer does, one Fetch after the other: Kafka may answer a Fetch
    with fewer batches than it could."""
    leader = await cluster.leader_for(topic, partition)
    conn = await cluster.connection(leader)
    version = min(conn.version_for(ApiKey.FETCH), 12)
    out: list[tuple[int, str]] = []
    aborted: set[tuple[str, int]] | None = None
    position = offset
    while True:
        r = await conn.request(fm.FetchRequest(
            replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=1 << 20,
            isolation_level=isolation, session_id=0, session_epoch=-1,
            topics=(fm.FetchTopic(topic=topic, partitions=(fm.FetchPartition(
                partition=partition, fetch_offset=position, partition_max_bytes=1 << 20),)),)),
            version=version)
        (pd,) = r.responses[0].partitions
        assert pd.error_code == ErrorCode.NONE, pd.error_code
        if pd.aborted_transactions is not None:
            aborted = (aborted or set()) | {(names(a.producer_id), a.first_offset)
                                            for a in pd.aborted_transactions}
        elif isolation == 1:
            raise AssertionError("a read_committed Fetch answered a null aborted list")
        batches = decode_record_batches(pd.records or b"")
        for batch in batches:
            for rec in batch.records:
                at = batch.base_offset + rec.offset_delta
                if at < position:
                    continue
                if batch.is_control:
                    kind = "COMMIT" if control_record_type(rec) == 1 else "ABORT"
                    out.append((at, f"{kind}({names(batch.producer_id)},{batch.producer_epoch})"))
                else:
                    out.append((at, (rec.value or b"").decode()))
            position = max(position, batch.last_offset + 1)
        end = pd.last_stable_offset if isolation == 1 else pd.high_watermark
        if not batches or position >= end:
            return Read(pd.high_watermark, pd.last_stable_offset,
                        None if aborted is None else sorted(aborted), out)


async def settled(cluster: Cluster, topic: str, partitions: Sequence[int]) -> None:
    """Until every partition's LSO reached its high watermark: Kafka writes transaction
    markers after EndTxn answered."""
    for p in partitions:
        await until(lambda p=p: _stable(cluster, topic, p), lambda ok: ok)


async def _stable(cluster: Cluster, topic: str, partition: int) -> bool:
    return await latest(cluster, topic, partition, 1) == await latest(cluster, topic, partition, 0)


async def latest(cluster: Cluster, topic: str, partition: int, isolation: int) -> int:
    """ListOffsets LATEST at ``isolation`` (the LSO under read_committed)."""
    leader = await cluster.leader_for(topic, partition)
    conn = await cluster.connection(leader)
    r = await conn.request(lo.ListOffsetsRequest(
        replica_id=-1, isolation_level=isolation, topics=(lo.ListOffsetsTopic(
            name=topic, partitions=(lo.ListOffsetsPartition(partition_index=partition,
                                                            timestamp=-1),)),)))
    (p,) = r.topics[0].partitions
    assert p.error_code == ErrorCode.NONE, p.error_code
    return p.offset


async def committed(cluster: Cluster, group: str, topic: str, partitions: Sequence[int], *,
                    require_stable: bool) -> tuple[int, dict[int, tuple[int, int]]]:
    """OffsetFetch: (group error, {partition: (offset, error)})."""
    code, node = await find_coordinator(cluster, group, GROUP)
    assert code == ErrorCode.NONE
    conn = await cluster.connection(node)
    version = conn.version_for(ApiKey.OFFSET_FETCH)
    request = of.OffsetFetchRequest(groups=(of.OffsetFetchRequestGroup(
        group_id=group, topics=(of.OffsetFetchRequestTopics(
            name=topic, partition_indexes=tuple(partitions)),)),), require_stable=require_stable)
    r = await conn.request(request, version=version)
    (g,) = r.groups
    return g.error_code, {p.partition_index: (p.committed_offset, p.error_code)
                          for t in g.topics for p in t.partitions}


async def commit_plain(cluster: Cluster, group: str, topic: str, offsets: Mapping[int, int]
                       ) -> dict[int, int]:
    """A plain (non-transactional) OffsetCommit by an admin (generation -1)."""
    code, node = await find_coordinator(cluster, group, GROUP)
    assert code == ErrorCode.NONE
    conn = await cluster.connection(node)
    r = await conn.request(oc.OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=-1, member_id="",
        topics=(oc.OffsetCommitRequestTopic(name=topic, partitions=tuple(
            oc.OffsetCommitRequestPartition(partition_index=p, committed_offset=o,
                                            committed_metadata="")
            for p, o in offsets.items())),)))
    return {p.partition_index: p.error_code for p in r.topics[0].partitions}


__all__ = [
    "GROUP",
    "TRANSACTION",
    "Names",
    "Read",
    "Txn",
    "commit_plain",
    "committed",
    "find_coordinator",
    "latest",
    "read",
    "records",
    "settled",
    "until",
]
