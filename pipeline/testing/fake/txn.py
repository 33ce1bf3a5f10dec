"""The fake cluster's transaction coordinator, as Apache Kafka 4.1 answers (checked by
tests/testing/test_fake_vs_kafka.py, pinned from Kafka's own answers).

One ``TransactionMetadata`` per transactional id: producer id, epoch, the epoch before
the last bump, the state (Empty, Ongoing, PrepareCommit/Abort, CompleteCommit/Abort),
the partitions and groups of the open transaction, its timeout and start. The rules:

InitProducerId with a transactional id
  empty id -> INVALID_REQUEST; a timeout <= 0 or over ``transaction.max.timeout.ms``
  -> INVALID_TRANSACTION_TIMEOUT; a new id gets a new producer id at epoch 0. Given a
  producer id and epoch (v3+, KIP-360): another producer id is fenced, the epoch must be
  the current one (bumped) or the one before the last bump (a retry: answered with the
  current epoch, nothing bumped); else fenced. An InitProducerId without them (a new
  producer) forgets the epoch before its bump, so no retry can take its epoch. Otherwise the epoch goes up by one (a new
  producer id at epoch 0 once it would pass 32766). A transaction being completed ->
  CONCURRENT_TRANSACTIONS; an open one is aborted first (its producer fenced by an epoch
  bump, the ABORT markers written) and the answer is CONCURRENT_TRANSACTIONS: the
  client's retry then bumps the epoch once more.

Fenced answers are PRODUCER_FENCED, or INVALID_PRODUCER_EPOCH where the request version
predates it (InitProducerId < v4, AddPartitionsToTxn / AddOffsetsToTxn / EndTxn < v2);
an unknown transactional id or another producer id is INVALID_PRODUCER_ID_MAPPING.

The two protocols are chosen per request, by version, as Kafka 4.1 does (whatever its
finalized ``transaction.version``, which clients read to choose):

* v1: AddPartitionsToTxn (v0-3) before the first batch to a partition, else the batch is
  refused (INVALID_TXN_STATE; TRANSACTION_ABORTABLE from Produce v11);
  AddOffsetsToTxn before TxnOffsetCommit (else INVALID_TXN_STATE; TRANSACTION_ABORTABLE
  from TxnOffsetCommit v4); EndTxn (< v5) keeps the epoch.
* v2 (KIP-890): Produce v12+ and TxnOffsetCommit v5 add their partition / group to the
  transaction; EndTxn v5 bumps the epoch (markers carry the new one) and answers it; a
  retry with the previous epoch is answered as the first was; an abort with no open
  transaction bumps the epoch too; a commit with none is INVALID_TXN_STATE.

EndTxn then writes a COMMIT or ABORT marker to every partition of the transaction (after
``txn_marker_delay`` seconds; an offline partition's marker waits until it has a leader)
and ends its offsets in the ``OffsetStore``. Meanwhile it is PrepareCommit/PrepareAbort
(Kafka holds a pending CompleteCommit/CompleteAbort transition): every EndTxn is answered
CONCURRENT_TRANSACTIONS, the next transaction's abort or commit too (v2: before any other
check; v1: after the producer id and epoch's), and so are InitProducerId,
AddPartitionsToTxn / AddOffsetsToTxn (before their producer checks) and Produce v12
(v11 and below: NOT_ENOUGH_REPLICAS, as Kafka translates it for older clients). A transaction open longer than its timeout is aborted by the
coordinator with an epoch bump: its producer's next request is fenced, except its own
EndTxn v5 (abort: NONE with the new epoch; commit: INVALID_TXN_STATE).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import trio

from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages import add_offsets_to_txn as aot
from pipeline.protocol.messages import add_partitions_to_txn as apt
from pipeline.protocol.messages import end_txn as et
from pipeline.protocol.messages import init_producer_id as ipi
from pipeline.protocol.messages import txn_offset_commit as toc

from .coordinators import GROUP, TRANSACTION, Coordinators
from .offsets import CommittedOffset, OffsetStore
from .state import MAX_EPOCH, FakeState, append_marker

__all__ = [
    "COMPLETE_ABORT",
    "COMPLETE_COMMIT",
    "EMPTY",
    "ONGOING",
    "PREPARE_ABORT",
    "PREPARE_COMMIT",
    "STATES",
    "TransactionCoordinator",
    "TransactionMetadata",
    "now_ms",
]

EMPTY, ONGOING = "Empty", "Ongoing"
PREPARE_COMMIT, PREPARE_ABORT = "PrepareCommit", "PrepareAbort"
COMPLETE_COMMIT, COMPLETE_ABORT = "CompleteCommit", "CompleteAbort"
STATES = (EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT, COMPLETE_ABORT)
_PREPARING = (PREPARE_COMMIT, PREPARE_ABORT)
_COMPLETE = (COMPLETE_COMMIT, COMPLETE_ABORT)
#: an epoch this high is exhausted: the next bump takes a new producer id
_EXHAUSTED = MAX_EPOCH - 1
#: DescribeTransactions' start times are milliseconds since the epoch; the fake's clock
#: (trio's) starts near 0, so it is counted from here
_CLOCK_BASE_MS = 1_600_000_000_000

Inject = Callable[[str | None, int | None], int | None]
TopicPartition = tuple[str, int]


def now_ms() -> int:
    return _CLOCK_BASE_MS + int(trio.current_time() * 1000)


@dataclass(slots=True)
class TransactionMetadata:
    """One transactional id's coordinator state (Kafka's ``TransactionMetadata``)."""

    transactional_id: str
    producer_id: int
    timeout_ms: int
    epoch: int = -1
    #: the epoch before the latest bump: a request carrying it is a retry of that bump
    last_epoch: int = -1
    previous_producer_id: int = -1
    state: str = EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    #: when the current (or last) transaction began, ms (DescribeTransactions); -1: never
    start_time_ms: int = -1
    #: trio time the open transaction began (its timeout counts from here)
    started_at: float = 0.0
    #: the open (or last) transaction speaks the v2 protocol (KIP-890): its EndTxn
    #: retries are recognised by the previous epoch
    client_v2: bool = False
    #: when a PrepareCommit/PrepareAbort's markers land, and the producer id and epoch
    #: they carry (the transaction's id, its epoch after the bump that ended it)
    completes_at: float = 0.0
    marker_producer_id: int = -1
    marker_epoch: int = -1

    def bump(self, allocate: Callable[[], int]) -> None:
        """The next epoch, or a new producer id at epoch 0 once the epoch is exhausted."""
        self.last_epoch = self.epoch
        if self.epoch >= _EXHAUSTED:
            self.previous_producer_id = self.producer_id
            self.producer_id = allocate()
            self.epoch = 0
        else:
            self.epoch += 1


def _fenced(version: int, first_version: int) -> int:
    """PRODUCER_FENCED, or INVALID_PRODUCER_EPOCH for request versions before it."""
    return int(ErrorCode.PRODUCER_FENCED if version >= first_version
               else ErrorCode.INVALID_PRODUCER_EPOCH)


class TransactionCoordinator:
    """Every transactional id of one fake cluster (all brokers share it; a broker only
    answers for the ids it coordinates, see ``Coordinators``)."""

    def __init__(self, state: FakeState, coordinators: Coordinators, offsets: OffsetStore,
                 on_append: Callable[[], None]) -> None:
        self._state = state
        self._coordinators = coordinators
        self._offsets = offsets
        self._on_append = on_append  # a log grew: wake waiting fetches
        self.transactions: dict[str, TransactionMetadata] = {}
        self._wake = trio.Event()

    # ------------------------------------------------------------------ background

    async def run(self) -> None:
        """Write delayed markers and abort timed-out transactions, on trio's clock."""
        while True:
            self._wake = trio.Event()
            now = trio.current_time()
            for meta in list(self.transactions.values()):
                if meta.state in _PREPARING and meta.completes_at <= now:
                    self._write_markers(meta)
                elif meta.state == ONGOING and self._deadline(meta) <= now:
                    self._abort_timed_out(meta)
            wake_at = min((self._next_event(m) for m in self.transactions.values()),
                          default=float("inf"))
            with trio.move_on_at(wake_at):
                await self._wake.wait()

    def _deadline(self, meta: TransactionMetadata) -> float:
        return meta.started_at + meta.timeout_ms / 1000

    def _next_event(self, meta: TransactionMetadata) -> float:
        if meta.state in _PREPARING:
            # past it, a marker still to write waits for its partition's leader
            # (``leaders_changed``)
            return meta.completes_at if meta.completes_at > trio.current_time() else float("inf")
        if meta.state == ONGOING:
            return self._deadline(meta)
        return float("inf")

    def _changed(self) -> None:
        self._wake.set()

    def leaders_changed(self) -> None:
        """A partition got a leader (a broker restarted, a leadership moved): markers
        held for an offline partition can be written now."""
        self._changed()

    # ------------------------------------------------------------------ transitions

    def _begin(self, meta: TransactionMetadata, *, v2: bool) -> None:
        """The first partition or group of a transaction was added."""
        if meta.state != ONGOING:
            meta.state = ONGOING
            meta.partitions.clear()
            meta.groups.clear()
            meta.start_time_ms = now_ms()
            meta.started_at = trio.current_time()
            meta.client_v2 = v2
            self._changed()

    def _prepare(self, meta: TransactionMetadata, commit: bool, producer_id: int,
                 epoch: int) -> None:
        """PrepareCommit/PrepareAbort; the markers (``producer_id``, ``epoch``) follow
        after ``txn_marker_delay``."""
        meta.state = PREPARE_COMMIT if commit else PREPARE_ABORT
        meta.marker_producer_id, meta.marker_epoch = producer_id, epoch
        delay = self._state.config.txn_marker_delay
        meta.completes_at = trio.current_time() + delay
        if delay <= 0:
            self._write_markers(meta)
        else:
            self._changed()

    def _write_markers(self, meta: TransactionMetadata) -> None:
        """Write the markers of a PrepareCommit/PrepareAbort; once every partition has
        its marker, end the offsets: CompleteCommit/CompleteAbort. An offline partition
        (no leader) keeps its marker, and the transaction stays in PrepareCommit /
        PrepareAbort, until it has a leader again (Kafka's marker channel queues it
        for an unknown leader and retries)."""
        commit = meta.state == PREPARE_COMMIT
        coordinator_epoch = self._coordinators.epoch(TRANSACTION, meta.transactional_id)
        for topic, index in sorted(meta.partitions):
            part = self._state.partition(topic, index)
            if part is not None and part.leader < 0:
                continue
            if part is not None:
                append_marker(part, meta.marker_producer_id, meta.marker_epoch, commit=commit,
                              coordinator_epoch=coordinator_epoch, timestamp_ms=now_ms(),
                              now=trio.current_time())
            meta.partitions.discard((topic, index))
        if meta.partitions:
            self._on_append()
            return
        self._offsets.end_transaction(meta.marker_producer_id, commit=commit,
                                      groups=meta.groups)
        meta.state = COMPLETE_COMMIT if commit else COMPLETE_ABORT
        meta.partitions.clear()
        meta.groups.clear()
        self._on_append()
        self._changed()

    def _abort_timed_out(self, meta: TransactionMetadata) -> None:
        """Kafka's ``abortTimedOutTransactions``: fence the producer (epoch + 1), abort."""
        self._fence_and_abort(meta)

    def _fence_and_abort(self, meta: TransactionMetadata) -> None:
        """Bump the epoch of an open transaction's producer (its requests are fenced from
        now on) and abort the transaction under the new epoch."""
        meta.last_epoch = meta.epoch
        meta.epoch = min(meta.epoch + 1, MAX_EPOCH)
        self._prepare(meta, False, meta.producer_id, meta.epoch)

    # ------------------------------------------------------------------ lookups

    def not_coordinator(self, node_id: int, transactional_id: str) -> bool:
        return not self._coordinators.is_coordinator(node_id, TRANSACTION, transactional_id)

    def get(self, transactional_id: str) -> TransactionMetadata | None:
        return self.transactions.get(transactional_id)

    def _check_producer(self, meta: TransactionMetadata | None, producer_id: int, epoch: int,
                        version: int, fenced_from: int) -> int | None:
        """AddPartitionsToTxn / AddOffsetsToTxn's checks before anything is added: a
        transaction being completed first (Kafka's pending transition), then the
        producer id and epoch."""
        if meta is None:
            return int(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        if meta.state in _PREPARING:
            return int(ErrorCode.CONCURRENT_TRANSACTIONS)
        if meta.producer_id != producer_id:
            return int(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        if meta.epoch != epoch:
            return _fenced(version, fenced_from)
        return None

    # ------------------------------------------------------------------ InitProducerId

    def init_producer_id(self, node_id: int, version: int, request: ipi.InitProducerIdRequest,
                         allocate: Callable[[], int]) -> ipi.InitProducerIdResponse:
        def fail(code: int) -> ipi.InitProducerIdResponse:
            return ipi.InitProducerIdResponse(error_code=int(code), producer_id=-1,
                                              producer_epoch=-1)

        tid = request.transactional_id
        assert tid is not None
        if tid == "":
            return fail(ErrorCode.INVALID_REQUEST)
        if not 0 < request.transaction_timeout_ms <= self._state.config.max_transaction_timeout_ms:
            return fail(ErrorCode.INVALID_TRANSACTION_TIMEOUT)
        if self.not_coordinator(node_id, tid):
            return fail(ErrorCode.NOT_COORDINATOR)
        meta = self.transactions.get(tid)
        if meta is None:
            meta = TransactionMetadata(tid, allocate(), request.transaction_timeout_ms)
            self.transactions[tid] = meta
        expected = request.producer_id if version >= 3 and request.producer_id >= 0 else None
        if expected is not None and meta.epoch >= 0 and expected != meta.producer_id and not (
                expected == meta.previous_producer_id
                and request.producer_epoch >= _EXHAUSTED):
            return fail(_fenced(version, 4))
        if meta.state in _PREPARING:
            return fail(ErrorCode.CONCURRENT_TRANSACTIONS)
        if meta.state == ONGOING:
            # fence the open transaction's producer and abort it; the client retries
            self._fence_and_abort(meta)
            return fail(ErrorCode.CONCURRENT_TRANSACTIONS)
        if expected is not None and meta.epoch >= 0 and request.producer_epoch != meta.epoch:
            if request.producer_epoch == meta.last_epoch and meta.last_epoch >= 0:
                # a retry of the bump that gave the current epoch
                return ipi.InitProducerIdResponse(producer_id=meta.producer_id,
                                                  producer_epoch=meta.epoch)
            return fail(_fenced(version, 4))
        meta.bump(allocate)
        if expected is None:
            # A new producer took the id over: no earlier epoch may be retried into the
            # current one (Kafka sets lastProducerEpoch to -1), or a fenced producer's
            # KIP-360 InitProducerId would share the new producer's epoch.
            meta.last_epoch = -1
        meta.timeout_ms = request.transaction_timeout_ms
        meta.state = EMPTY
        meta.start_time_ms = -1
        self._changed()
        return ipi.InitProducerIdResponse(producer_id=meta.producer_id, producer_epoch=meta.epoch)

    # ------------------------------------------------------------------ AddPartitionsToTxn

    def add_partitions(self, node_id: int, version: int, request: apt.AddPartitionsToTxnRequest,
                       inject: Inject) -> apt.AddPartitionsToTxnResponse:
        """v0-3 (the client's form): one transactional id, errors per partition."""
        tid = request.v3_and_below_transactional_id
        wanted = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
        codes: dict[TopicPartition, int] = {}
        for tp in wanted:
            injected = inject(*tp)
            if injected is not None:
                codes[tp] = injected
        rest = [tp for tp in wanted if tp not in codes]  # handled as Kafka would
        unknown = [tp for tp in rest if self._state.partition(*tp) is None]
        if unknown:
            codes |= {tp: int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown
                              else ErrorCode.OPERATION_NOT_ATTEMPTED) for tp in rest}
        elif rest:
            code = self._add_partitions(node_id, version, tid, request.v3_and_below_producer_id,
                                        request.v3_and_below_producer_epoch, rest)
            codes |= dict.fromkeys(rest, code)
        by_topic: dict[str, list[apt.AddPartitionsToTxnPartitionResult]] = {}
        for (topic, p) in wanted:
            by_topic.setdefault(topic, []).append(apt.AddPartitionsToTxnPartitionResult(
                partition_index=p, partition_error_code=codes[(topic, p)]))
        return apt.AddPartitionsToTxnResponse(results_by_topic_v3_and_below=tuple(
            apt.AddPartitionsToTxnTopicResult(name=t, results_by_partition=tuple(rs))
            for t, rs in by_topic.items()))

    def _add_partitions(self, node_id: int, version: int, tid: str, producer_id: int,
                        epoch: int, partitions: Iterable[TopicPartition]) -> int:
        if tid == "":
            return int(ErrorCode.INVALID_REQUEST)
        if self.not_coordinator(node_id, tid):
            return int(ErrorCode.NOT_COORDINATOR)
        meta = self.transactions.get(tid)
        code = self._check_producer(meta, producer_id, epoch, version, fenced_from=2)
        if code is not None:
            return code
        assert meta is not None
        self._begin(meta, v2=False)
        meta.partitions.update(partitions)
        return 0

    # ------------------------------------------------------------------ AddOffsetsToTxn

    def add_offsets(self, node_id: int, version: int, request: aot.AddOffsetsToTxnRequest,
                    injected: int | None) -> aot.AddOffsetsToTxnResponse:
        def answer(code: int) -> aot.AddOffsetsToTxnResponse:
            return aot.AddOffsetsToTxnResponse(error_code=int(code))

        if injected is not None:
            return answer(injected)
        tid = request.transactional_id
        if tid == "":
            return answer(ErrorCode.INVALID_REQUEST)
        if self.not_coordinator(node_id, tid):
            return answer(ErrorCode.NOT_COORDINATOR)
        meta = self.transactions.get(tid)
        code = self._check_producer(meta, request.producer_id, request.producer_epoch, version,
                                    fenced_from=2)
        if code is not None:
            return answer(code)
        assert meta is not None
        self._begin(meta, v2=False)
        meta.groups.add(request.group_id)
        return answer(0)

    # ------------------------------------------------------------------ TxnOffsetCommit

    def txn_offset_commit(self, node_id: int, version: int, request: toc.TxnOffsetCommitRequest,
                          inject: Inject) -> toc.TxnOffsetCommitResponse:
        """At the group coordinator: the offsets are pending until the transaction ends."""
        code = self._txn_offset_commit_error(node_id, version, request)
        staged: dict[TopicPartition, CommittedOffset] = {}
        topics = []
        for t in request.topics:
            parts = []
            for p in t.partitions:
                injected = inject(t.name, p.partition_index)
                c = injected if injected is not None else code
                if c == 0:
                    staged[(t.name, p.partition_index)] = CommittedOffset(
                        p.committed_offset, p.committed_leader_epoch, p.committed_metadata)
                parts.append(toc.TxnOffsetCommitResponsePartition(
                    partition_index=p.partition_index, error_code=c))
            topics.append(toc.TxnOffsetCommitResponseTopic(name=t.name, partitions=tuple(parts)))
        if staged:
            self._offsets.stage(request.group_id, request.producer_id, staged)
        return toc.TxnOffsetCommitResponse(topics=tuple(topics))

    def _txn_offset_commit_error(self, node_id: int, version: int,
                                 request: toc.TxnOffsetCommitRequest) -> int:
        if not self._coordinators.is_coordinator(node_id, GROUP, request.group_id):
            return int(ErrorCode.NOT_COORDINATOR)
        meta = self.transactions.get(request.transactional_id)
        if meta is None or meta.producer_id != request.producer_id:
            return int(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        if meta.epoch != request.producer_epoch:
            return int(ErrorCode.INVALID_PRODUCER_EPOCH)
        if meta.state in _PREPARING:
            return int(ErrorCode.CONCURRENT_TRANSACTIONS)
        if version >= 5:  # KIP-890: the group joins the transaction implicitly
            self._begin(meta, v2=True)
            meta.groups.add(request.group_id)
            return 0
        if meta.state != ONGOING or request.group_id not in meta.groups:
            return int(ErrorCode.TRANSACTION_ABORTABLE if version >= 4
                       else ErrorCode.INVALID_TXN_STATE)
        return 0

    # ------------------------------------------------------------------ Produce

    def verify_produce(self, version: int, transactional_id: str | None, producer_id: int,
                       epoch: int, topic: str, partition: int) -> int | None:
        """A transactional batch's check with the coordinator before it is appended
        (KIP-890): v12+ adds the partition to the transaction, older versions need it
        added already. None: go on and append."""
        if transactional_id is None:
            return None
        meta = self.transactions.get(transactional_id)
        if meta is not None and meta.state in _PREPARING and version >= 12:
            # v12 adds the partition (AddPartitionsToTxn's checks: a transaction being
            # completed first) and answers CONCURRENT_TRANSACTIONS as it is (Kafka's
            # broker first retries it for up to 100 ms)
            return int(ErrorCode.CONCURRENT_TRANSACTIONS)
        if meta is None or meta.producer_id != producer_id:
            return int(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        if meta.epoch != epoch:
            return int(ErrorCode.INVALID_PRODUCER_EPOCH)
        if meta.state in _PREPARING:
            # what Kafka makes of CONCURRENT_TRANSACTIONS for Produce below v12 (older
            # clients retry it)
            return int(ErrorCode.NOT_ENOUGH_REPLICAS)
        if version >= 12:
            self._begin(meta, v2=True)
            meta.partitions.add((topic, partition))
            return None
        if meta.state != ONGOING or (topic, partition) not in meta.partitions:
            return int(ErrorCode.TRANSACTION_ABORTABLE if version >= 11
                       else ErrorCode.INVALID_TXN_STATE)
        return None

    # ------------------------------------------------------------------ EndTxn

    def end_txn(self, node_id: int, version: int, request: et.EndTxnRequest,
                injected: int | None, allocate: Callable[[], int]) -> et.EndTxnResponse:
        def fail(code: int) -> et.EndTxnResponse:
            return et.EndTxnResponse(error_code=int(code), producer_id=-1, producer_epoch=-1)

        if injected is not None:
            return fail(injected)
        tid = request.transactional_id
        if tid == "":
            return fail(ErrorCode.INVALID_REQUEST)
        if self.not_coordinator(node_id, tid):
            return fail(ErrorCode.NOT_COORDINATOR)
        meta = self.transactions.get(tid)
        if meta is None:
            return fail(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        epoch, commit, v2 = request.producer_epoch, request.committed, version >= 5
        if v2 and meta.state in _PREPARING:
            # Kafka holds a pending CompleteCommit/CompleteAbort transition while it
            # writes the markers: v2 answers it before any other check, whatever the
            # end asked (an abort of the next transaction too); v1 after the epoch's
            return fail(ErrorCode.CONCURRENT_TRANSACTIONS)
        if meta.producer_id != request.producer_id:
            return fail(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
        current = epoch == meta.epoch
        retry = meta.client_v2 and epoch == meta.last_epoch >= 0 and not current
        if meta.state in (ONGOING, EMPTY, *_PREPARING):
            valid = current
        elif meta.client_v2:
            valid = current or retry
        else:
            valid = current
        if not valid:
            return fail(_fenced(version, 2))

        def ok() -> et.EndTxnResponse:
            return et.EndTxnResponse(producer_id=meta.producer_id, producer_epoch=meta.epoch)

        done = COMPLETE_COMMIT if commit else COMPLETE_ABORT
        if meta.state == ONGOING:
            meta.client_v2 = v2
            producer_id, marker_epoch = meta.producer_id, meta.epoch
            if v2:  # KIP-890: every end bumps the epoch; the markers carry the new one
                marker_epoch = min(meta.epoch + 1, MAX_EPOCH)
                meta.bump(allocate)
            self._prepare(meta, commit, producer_id, marker_epoch)
            return ok()
        if meta.state in _PREPARING:
            return fail(ErrorCode.CONCURRENT_TRANSACTIONS)
        if meta.state in _COMPLETE and (retry or (current and not v2)):
            return ok() if meta.state == done else fail(ErrorCode.INVALID_TXN_STATE)
        # a v2 end with the current epoch and no open transaction (Empty, or completed)
        if v2 and not commit:
            meta.bump(allocate)
            meta.client_v2 = True
            meta.state = COMPLETE_ABORT
            self._changed()
            return ok()
        return fail(ErrorCode.INVALID_TXN_STATE)
