"""Cluster state of the fake: topics, partition logs, producer state, pids.

Sans-I/O: nothing here awaits. The handlers in `produce.py` and
`handlers.py` read and mutate these objects; `cluster.py` owns them.

Theory of operation (the parts Kafka is picky about):

* A partition log is a list of stored batches. A stored batch is the exact
  bytes the producer sent, with the two fields outside the CRC that the
  leader owns rewritten: `base_offset` (bytes 0-8) and
  `partition_leader_epoch` (bytes 12-16). Fetch returns these bytes.
* Producer state is kept per partition, as Kafka's `ProducerStateManager`
  does: for each producer id, its epoch and the metadata of its last five
  batches (first/last sequence, base/last offset). A retried batch whose
  sequence range equals a cached one is answered with the cached offsets.
* The producer-id "coordinator" hands out a new id, epoch 0, for every
  InitProducerId without a transactional id, as Kafka's does; an epoch is
  only ever bumped by the producer itself (KIP-360, the Java client's way).
* The ISR of a partition is its replicas on running brokers (a stopped
  broker leaves every ISR at once, as a fenced Kafka broker does).
* Transactions, per partition as Kafka's ``ProducerStateManager`` keeps them: the first
  offset of each producer's open transaction (the last stable offset is the smallest, else
  the high watermark) and the aborted transactions with the offset of their ABORT marker,
  which Fetch lists for read_committed readers. The transaction coordinator is
  ``txn.py``.
"""

from __future__ import annotations

import bisect
import dataclasses
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pipeline.protocol.records import encode_end_txn_marker

# Record batch v2 header layout (Kafka's DefaultRecordBatch).
BATCH_HEADER_SIZE = 61
LOG_OVERHEAD = 12  # base_offset + batch_length
_HEADER = struct.Struct(">qiibIhiqqqhii")
# offsets of fields we read or rewrite
CRC_START = 21  # CRC covers attributes..end
MAX_SEQUENCE = 2**31 - 1
MAX_EPOCH = 32767
NO_PRODUCER_ID = -1
NO_EPOCH = -1
NO_SEQUENCE = -1
PRODUCER_STATE_CACHE = 5


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed 61-byte header of one v2 record batch, parsed with `struct`."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Size of the whole batch on the wire (log overhead included)."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_sequence(self) -> int:
        return increment_sequence(self.base_sequence, self.last_offset_delta)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & 0x10)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & 0x20)


def parse_batch_header(data: bytes | memoryview, pos: int = 0) -> BatchHeader:
    return BatchHeader(*_HEADER.unpack_from(data, pos))


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's `DefaultRecordBatch.incrementSequence`: wraps past 2**31-1 to 0."""
    if sequence > MAX_SEQUENCE - increment:
        return increment - (MAX_SEQUENCE - sequence) - 1
    return sequence + increment


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """Kafka's `ProducerAppendInfo.inSequence`."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == MAX_SEQUENCE)


# The fake brokers' wall clock, in ms: this epoch plus trio's (virtual) time.
CLOCK_EPOCH_MS = 1_750_000_000_000


def clock_ms(now: float) -> int:
    return CLOCK_EPOCH_MS + int(now * 1000)


def with_log_append_time(batch: bytes, append_ms: int) -> bytes:
    """A batch as a LogAppendTime topic's leader stores it (Kafka's ``LogValidator``:
    ``setMaxTimestamp(LOG_APPEND_TIME, now)``): the timestamp-type attribute set and the
    max timestamp the append time, which readers take for every record's; the CRC
    recomputed (it covers both)."""
    from pipeline.protocol.batch_format import ATTR_TIMESTAMP_TYPE
    from pipeline.protocol.crc import crc32c

    (attributes,) = struct.unpack_from(">h", batch, CRC_START)
    tail = (struct.pack(">h", attributes | ATTR_TIMESTAMP_TYPE) + batch[CRC_START + 2:35]
            + struct.pack(">q", append_ms) + batch[43:])
    return batch[:CRC_START - 4] + struct.pack(">I", crc32c(tail)) + tail


def restamp_offsets(batch: bytes, *, base_offset: int, leader_epoch: int) -> bytes:
    """Rewrite the leader-owned fields outside the CRC (base offset, leader epoch)."""
    return (
        struct.pack(">q", base_offset) + batch[8:12] + struct.pack(">i", leader_epoch) + batch[16:]
    )


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """What Kafka caches per appended batch to answer retries (`BatchMetadata`)."""

    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True)
class ProducerEntry:
    """Per partition, per producer id: Kafka's `ProducerStateEntry`."""

    producer_id: int
    epoch: int
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=PRODUCER_STATE_CACHE)
    )

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.epoch:
            return None
        for meta in self.batches:
            if meta.first_seq == first_seq and meta.last_seq == last_seq:
                return meta
        return None


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """A transaction aborted in one partition: its producer, first offset, ABORT marker."""

    producer_id: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class StoredBatch:
    base_offset: int
    last_offset: int
    data: bytes  # as written by the producer, base offset and leader epoch restamped
    max_timestamp: int
    append_time: float  # trio time of the append
    decoded: Any = None  # cache for FakeCluster.log(): a records.RecordBatch
    # Appended for a producer id this partition had state for and then forgot
    # (`reset_producer_state`): accepted at whatever sequence it carried, so it
    # may duplicate or overtake one of that producer's earlier batches.
    state_lost: bool = False


@dataclass(slots=True)
class PartitionState:
    topic: str
    index: int
    leader: int  # node id, -1 when offline
    leader_epoch: int
    replicas: tuple[int, ...]
    batches: list[StoredBatch] = field(default_factory=list)
    _last_offsets: list[int] = field(default_factory=list)
    producers: dict[int, ProducerEntry] = field(default_factory=dict)
    log_start_offset: int = 0
    forgotten: set[int] = field(default_factory=set)  # producer ids whose state was lost
    #: producer id -> first offset of its open transaction here (bounds the LSO)
    open_txns: dict[int, int] = field(default_factory=dict)
    #: aborted transactions in marker order (a read_committed Fetch lists those it overlaps)
    aborted_txns: list[AbortedTxn] = field(default_factory=list)

    @property
    def high_watermark(self) -> int:
        """Log end offset; with one in-sync copy it is also the high watermark."""
        return self.batches[-1].last_offset + 1 if self.batches else self.log_start_offset

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest open transaction, else the high watermark: a
        read_committed reader sees nothing at or beyond it."""
        return min(self.open_txns.values(), default=self.high_watermark)

    def aborted_between(self, start: int, end: int) -> list[AbortedTxn]:
        """The aborted transactions a Fetch of offsets ``[start, end)`` must list: those
        whose range (first offset to ABORT marker) overlaps it (Kafka's
        ``collectAbortedTransactions``)."""
        return [a for a in self.aborted_txns if a.last_offset >= start and a.first_offset < end]

    def append(self, batch: StoredBatch) -> None:
        self.batches.append(batch)
        self._last_offsets.append(batch.last_offset)

    def index_of_offset(self, offset: int) -> int:
        """Index of the first stored batch whose last offset is >= offset."""
        return bisect.bisect_left(self._last_offsets, offset)


@dataclass(slots=True)
class TopicState:
    name: str
    topic_id: Any  # whatever the codec uses for uuid fields
    partitions: list[PartitionState]
    configs: dict[str, str] = field(default_factory=dict)

    def config_int(self, name: str, default: int) -> int:
        """A topic config as an int (`max.message.bytes`, `segment.bytes`,
        `min.insync.replicas`), else the broker-wide default."""
        value = self.configs.get(name)
        return int(value) if value is not None else default


@dataclass(slots=True)
class ProducerIdManager:
    """Hands out producer ids: Kafka's `ProducerIdManager`, one id after the other."""

    next_id: int = 1000

    def allocate(self) -> int:
        pid = self.next_id
        self.next_id += 1
        return pid


@dataclass(slots=True)
class BrokerState:
    node_id: int
    host: str
    port: int
    alive: bool = True
    rack: str | None = None


@dataclass(slots=True)
class FakeConfig:
    max_message_bytes: int
    segment_bytes: int
    min_insync_replicas: int
    auto_create_topics: bool
    auto_create_partitions: int
    default_replication_factor: int
    strict_unknown_producer: bool
    cluster_id: str
    #: answer idempotent batches as tansu does (produce.py, "tansu")
    tansu_sequences: bool = False
    #: finalized feature levels ApiVersions lists (KIP-584), e.g. transaction.version
    features: dict[str, int] = field(default_factory=dict)
    #: transaction.max.timeout.ms: InitProducerId with a longer timeout is refused
    max_transaction_timeout_ms: int = 900_000
    #: seconds between an EndTxn (or a timeout, or a fencing InitProducerId) and its
    #: markers: meanwhile the transaction is PrepareCommit / PrepareAbort
    txn_marker_delay: float = 0.0


@dataclass(slots=True)
class FakeState:
    """Everything a handler may read or change. Owned by `FakeCluster`."""

    config: FakeConfig
    brokers: dict[int, BrokerState]
    topics: dict[str, TopicState] = field(default_factory=dict)
    pids: ProducerIdManager = field(default_factory=ProducerIdManager)

    def metadata_view(self) -> FakeState:
        """A frozen copy of what Metadata reports (live brokers, topics, leaders,
        epochs, replicas), for a broker whose metadata cache stops following the
        controller (`FakeCluster.stale_metadata`). Logs and producer state are
        not copied: Metadata never reads them."""
        return FakeState(
            config=self.config,
            brokers={n: dataclasses.replace(b) for n, b in self.brokers.items()},
            topics={
                name: TopicState(
                    name=t.name,
                    topic_id=t.topic_id,
                    partitions=[
                        PartitionState(p.topic, p.index, p.leader, p.leader_epoch, p.replicas)
                        for p in t.partitions
                    ],
                    configs=dict(t.configs),
                )
                for name, t in self.topics.items()
            },
            pids=self.pids,
        )

    def alive_brokers(self) -> list[BrokerState]:
        return [b for b in self.brokers.values() if b.alive]

    def controller_id(self) -> int:
        alive = self.alive_brokers()
        return min(b.node_id for b in alive) if alive else -1

    def isr(self, part: PartitionState) -> tuple[int, ...]:
        """The in-sync replicas: those on running brokers."""
        return tuple(r for r in part.replicas if self.brokers[r].alive)

    def partition(self, topic: str, index: int) -> PartitionState | None:
        t = self.topics.get(topic)
        if t is None or not 0 <= index < len(t.partitions):
            return None
        return t.partitions[index]


def append_marker(part: PartitionState, producer_id: int, epoch: int, *, commit: bool,
                  coordinator_epoch: int, timestamp_ms: int, now: float) -> None:
    """Append a COMMIT / ABORT marker to ``part`` and end the producer's transaction there:
    its open range closes (an aborted one is listed for read_committed fetches), and its
    producer state moves to the marker's epoch (a newer epoch starts with no sequences,
    so the producer's older epoch is fenced here too)."""
    base = part.high_watermark
    data = encode_end_txn_marker(commit=commit, producer_id=producer_id, producer_epoch=epoch,
                                 coordinator_epoch=coordinator_epoch, timestamp=timestamp_ms,
                                 base_offset=base, partition_leader_epoch=part.leader_epoch)
    part.append(StoredBatch(base_offset=base, last_offset=base, data=data,
                            max_timestamp=timestamp_ms, append_time=now))
    first = part.open_txns.pop(producer_id, None)
    if first is not None and not commit:
        part.aborted_txns.append(AbortedTxn(producer_id, first, base))
    entry = part.producers.get(producer_id)
    if entry is None or entry.epoch < epoch:
        part.producers[producer_id] = ProducerEntry(producer_id, epoch)


def open_transaction(part: PartitionState, producer_id: int, offset: int) -> None:
    """A transactional batch was appended at ``offset``: the producer's transaction is
    open here from its first batch on."""
    part.open_txns.setdefault(producer_id, offset)
