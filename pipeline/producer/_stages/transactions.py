"""Transactions: the transactional producer's state machine (its coordinator: ``coordinator.py``).

The Java client's ``TransactionManager``, for a pipeline whose stages already keep
per-partition order and idempotence (``idempotence.py``). What it adds:

* **Initialisation.** ``initialize()`` finds the transaction coordinator
  (FindCoordinator, key type 1) and sends InitProducerId with the
  ``transactional_id``: the coordinator fences every earlier producer of that id and
  aborts its open transaction (answering CONCURRENT_TRANSACTIONS until that is done),
  and hands out the producer id and epoch the idempotence state then seals with.
* **States.** READY -> (``begin``) IN_TRANSACTION -> (``commit`` / ``abort``)
  COMMITTING / ABORTING -> READY. An error of the open transaction moves it to
  ABORTABLE (only ``abort`` is allowed); a fenced producer (PRODUCER_FENCED, or a
  coordinator refusing its epoch) and an error no abort can undo move it to FATAL,
  where every call raises that error. Records are accepted only IN_TRANSACTION: the
  intake refuses every other time (``on_state``). Nothing of an ABORTABLE or FATAL
  transaction is sent or retried any more: its records with no outcome fail with its
  error at once (``run_failer``), as the Java client's Sender fails the batches of a
  transaction in error. A batch whose epoch a broker refuses fails at once too
  (INVALID_PRODUCER_EPOCH: abortable, PRODUCER_FENCED: fatal; ``ProducerCore``).
* **Two transaction versions**, chosen at each ``begin`` from the cluster's
  finalized ``transaction.version`` feature (ApiVersions), fixed for the transaction:
  **v2** (KIP-890, Kafka 4.x): Produce v12 adds a partition to the transaction
  itself, TxnOffsetCommit needs no AddOffsetsToTxn, and every EndTxn bumps the epoch
  (EndTxn v5 returns the id and epoch to use next). **v1**: a partition must be added
  (AddPartitionsToTxn) before a batch of it is sent: ``partition_ready`` holds its
  batches back and the adder task adds new partitions in bulk, then wakes the broker
  producers; offsets need AddOffsetsToTxn first; Produce stays at v11.
* **Ending.** ``commit`` flushes (every record of the transaction has its outcome),
  refuses to commit if one failed (abortable), then sends EndTxn. ``abort`` fails
  what has no outcome yet with ``TransactionAbortedError`` (``purge``: the stages'
  delivery-deadline path, with every deadline taken as passed), waits until no
  Produce request is in flight (a write landing after the abort marker would belong
  to no transaction, or under v1 to the next one), then sends EndTxn. EndTxn is sent
  shielded from cancellation, and bounded, after any AddPartitionsToTxn in flight is
  answered (v1: the coordinator may apply it, opening its transaction, only once the
  previous transaction's markers are written; EndTxn then ends it). While those markers
  are written the coordinator answers CONCURRENT_TRANSACTIONS (v2: to Produce v12 and
  EndTxn, the next transaction's abort too): retried, as the Java client does. A commit whose answer is lost is retried
  only as an abort (franz-go's rule): if that abort is refused because the commit
  completed, the commit stands; otherwise the transaction is aborted and the commit
  raises ``TransactionAbortedError``.
* **Epochs.** A transactional producer never bumps its epoch itself: after a sequence
  problem (``idempotence.request_bump``, which only pauses sealing here) the
  transaction becomes abortable, and the bump happens at the abort: v2's EndTxn
  returns the new epoch; under v1, InitProducerId with the current id and epoch
  (KIP-360) bumps it.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from pipeline.cluster.errors import KafkaError
from pipeline.producer._errors import (
    ProducerFencedError,
    TransactionAbortableError,
    TransactionAbortedError,
    TransactionError,
    TransactionFatalError,
    TransactionStateError,
    TransactionTimedOutError,
)
from pipeline.producer._stages.coordinator import OutcomeUnknown, TxnCoordinator
from pipeline.producer._stages.envelopes import TopicPartition
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.messages.txn_offset_commit import (
    TxnOffsetCommitRequestPartition,
)

if TYPE_CHECKING:
    from pipeline.cluster.pool import Cluster
    from pipeline.producer._config import ProducerConfig
    from pipeline.producer._stages.idempotence import Idempotence

log = logging.getLogger("pipeline.producer")

__all__ = ["GroupMetadata", "State", "TransactionManager"]

class State(enum.Enum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    ABORTABLE = "abortable"
    FATAL = "fatal"


class GroupMetadata:
    """What ``send_offsets_to_transaction`` needs of a consumer group member (Java's
    ``ConsumerGroupMetadata``): the group id, and for KIP-447's zombie fencing the
    member's generation, member id and static instance id. A consumer's
    ``group_metadata()`` gives one; a bare group id (a str) stands for a member
    outside any generation (the coordinator then checks nothing of it)."""

    __slots__ = ("generation_id", "group_id", "group_instance_id", "member_id")

    def __init__(self, group_id: str, generation_id: int = -1, member_id: str = "",
                 group_instance_id: str | None = None) -> None:
        self.group_id = group_id
        self.generation_id = generation_id
        self.member_id = member_id
        self.group_instance_id = group_instance_id

    @classmethod
    def of(cls, value: Any) -> GroupMetadata:
        if isinstance(value, GroupMetadata):
            return value
        if isinstance(value, str):
            if not value:
                raise ValueError("group metadata: the group id is empty")
            return cls(value)
        try:
            return cls(value.group_id, value.generation_id, value.member_id,
                       value.group_instance_id)
        except AttributeError:
            raise TypeError(
                f"group metadata must be a consumer's group_metadata() or a group id str, "
                f"not {type(value).__name__}") from None

    def __repr__(self) -> str:
        return (f"GroupMetadata({self.group_id!r}, generation_id={self.generation_id}, "
                f"member_id={self.member_id!r}, group_instance_id={self.group_instance_id!r})")


class TransactionManager:
    """One per transactional producer: the transaction state, the coordinator, the
    partitions and offsets of the open transaction."""

    def __init__(
        self,
        config: ProducerConfig,
        cluster: Cluster,
        idempotence: Idempotence,
        backoff: Callable[[int], float],
        *,
        purge: Callable[[KafkaError | None], None],
        wake: Callable[[], None],
        records_failed: Callable[[], int],
    ) -> None:
        assert config.transactional_id is not None
        self.transactional_id: str = config.transactional_id
        self._config = config
        self._cluster = cluster
        self._idem = idempotence
        #: Waits until every accepted record has its outcome (``Producer.flush``; set
        #: by the producer, which owns flushing).
        self.flush: Callable[[], Awaitable[None]] = _no_flush
        self._purge = purge
        self._wake = wake
        self._records_failed = records_failed
        self.state = State.UNINITIALIZED
        #: The error of an ABORTABLE or FATAL transaction (what calls then raise).
        self.error: TransactionError | None = None
        #: The transaction version of the open transaction (1 or 2), fixed at begin.
        self.version = 0
        #: Called with the new state after every change (the intake refuses records
        #: outside IN_TRANSACTION).
        self.on_state: Callable[[State], None] = lambda state: None
        self._coord = TxnCoordinator(config, cluster, backoff, config.transactional_id)
        # Partitions whose batches went to the broker in the open transaction, and
        # (v1) those added to it at the coordinator, and those waiting to be added.
        self.touched: set[TopicPartition] = set()
        self.added: set[TopicPartition] = set()
        self._to_add: set[TopicPartition] = set()
        self._add_wanted = trio.Event()
        # Set while no AddPartitionsToTxn is in flight. An EndTxn waits for it: an addition
        # the coordinator applies after the end would open a transaction there that this
        # producer never ends (it stays open until its timeout, whose abort fences it).
        self._add_idle = trio.Event()
        self._add_idle.set()
        self._offsets_groups: set[str] = set()  # v1: groups added with AddOffsetsToTxn
        self._failed_at_begin = 0
        self._began_at = 0.0
        # Set when the open transaction became abortable or the producer fatal: a
        # commit's flush stops waiting then (its records fail with the error meanwhile).
        self._failed = trio.Event()
        # Set with it: ``run_failer`` fails what of the transaction has no outcome yet.
        self._fail_wanted = trio.Event()
        # Statistics.
        self.committed = 0
        self.aborted = 0

    # -- state ---------------------------------------------------------------
    def _set(self, state: State, error: TransactionError | None = None) -> None:
        self.state = state
        self.error = error
        if state in (State.ABORTABLE, State.FATAL):
            self._failed.set()
            self._fail_wanted.set()
        self.on_state(state)

    def _require(self, *states: State, doing: str) -> None:
        if self.state in states:
            return
        if self.state in (State.FATAL, State.ABORTABLE) and self.error is not None:
            if self.state == State.ABORTABLE and doing != "begin a transaction":
                raise self.error
            if self.state == State.FATAL:
                raise self.error
        advice = {
            State.UNINITIALIZED: "the producer is not initialised yet",
            State.READY: "no transaction is open: call begin_transaction() first "
                         "(or use async with producer.transaction())",
            State.IN_TRANSACTION: "a transaction is open: commit or abort it first",
            State.COMMITTING: "the transaction is being committed",
            State.ABORTING: "the transaction is being aborted",
            State.ABORTABLE: "the transaction must be aborted first (abort_transaction())",
        }[self.state]
        raise TransactionStateError(f"cannot {doing}: {advice}")

    def refusal(self) -> TransactionError:
        """What a record sent outside an open transaction raises (``Intake.refuse``)."""
        if self.state in (State.FATAL, State.ABORTABLE) and self.error is not None:
            return self.error
        doing = {State.COMMITTING: "while the transaction commits",
                 State.ABORTING: "while the transaction aborts"}.get(
                     self.state, "with no transaction open")
        return TransactionStateError(
            f"a transactional producer sends only inside a transaction: send() {doing}; "
            "call begin_transaction() first (or use async with producer.transaction())")

    def abortable(self, error: TransactionError) -> None:
        """The open transaction cannot commit any more (called by the stages)."""
        if self.state in (State.IN_TRANSACTION, State.COMMITTING):
            log.warning("transaction of %r must be aborted: %s", self.transactional_id, error)
            self._set(State.ABORTABLE, error)

    def fatal(self, error: TransactionError) -> None:
        """This producer can do no more transactional work (called by the stages too:
        a broker fenced its epoch)."""
        if self.state != State.FATAL:
            log.error("transactional producer %r: %s", self.transactional_id, error)
            self._set(State.FATAL, error)

    # -- initialisation ----------------------------------------------------------
    async def obtain_id(self) -> tuple[int, int]:
        """InitProducerId for the transactional id (fencing earlier producers of it):
        the producer id and epoch to seal with. Used by ``Idempotence.run``."""
        return await self._coord.init_producer_id(-1, -1)

    def initialized(self) -> None:
        """The first producer id is in place (``Idempotence.run`` started)."""
        self._set(State.READY)

    # -- the transaction -----------------------------------------------------------
    def begin(self) -> None:
        self._require(State.READY, doing="begin a transaction")
        self.version = self._coord.version = self._transaction_version()
        self.touched.clear()
        self.added.clear()
        self._to_add.clear()
        self._offsets_groups.clear()
        self._failed_at_begin = self._records_failed()
        self._began_at = trio.current_time()
        self._failed = trio.Event()
        self._set(State.IN_TRANSACTION)

    def _transaction_version(self) -> int:
        """The cluster's finalized ``transaction.version`` (any live connection has it)."""
        for conn in self._cluster.open_connections():
            level = conn.handshake.finalized_features.get("transaction.version")
            if level is not None:
                return 2 if level >= 2 else 1
        return 1

    @property
    def produce_version_cap(self) -> int:
        """The highest Produce version a transactional request may use: v12 tells a
        v2 broker to add the partition itself; under v1 it must not be used."""
        return min(12, self._coord.version_cap(ApiKey.PRODUCE))

    def partition_ready(self, tp: TopicPartition) -> bool:
        """May a batch of ``tp`` be sealed now? v2: yes. v1: once it is added to the
        transaction (else its addition is requested, and the broker producers are
        woken when it is done)."""
        if self.version >= 2 or tp in self.added:
            return True
        if tp not in self._to_add:
            self._to_add.add(tp)
            self._add_wanted.set()
        return False

    def sealed(self, tp: TopicPartition) -> None:
        """A batch of ``tp`` was sealed for the open transaction."""
        self.touched.add(tp)

    async def run_adder(self) -> None:
        """v1: add the partitions the broker producers wait for, in bulk."""
        while True:
            await self._add_wanted.wait()
            self._add_wanted = trio.Event()
            # (A commit flushes: the partitions its records wait for are added then too.)
            if self.state not in (State.IN_TRANSACTION, State.COMMITTING) or not self._to_add:
                continue
            batch = sorted(self._to_add)
            self._add_idle = trio.Event()
            try:
                await self._coord.add_partitions(batch, self._idem.producer_id,
                                                 self._idem.producer_epoch)
            except TransactionError as exc:
                if isinstance(exc, ProducerFencedError | TransactionFatalError):
                    self.fatal(exc)
                else:
                    self.abortable(exc)
                continue
            else:
                self.added.update(batch)
                self.touched.update(batch)  # the coordinator's transaction is open: end it
                self._to_add.difference_update(batch)
                self._wake()
            finally:
                self._add_idle.set()

    async def run_failer(self) -> None:
        """Once the open transaction cannot commit (ABORTABLE) or the producer can do
        no more transactional work (FATAL), nothing of it is sent or retried any more:
        every record of it with no outcome yet fails now with that error, wherever it
        waits (queued, waiting for a retry or a leader, on the wire), and so does every
        record that reaches a stage later, until an abort (``purge``; as the Java
        client's Sender fails the batches of a transaction in error instead of sending
        them). Run from this task, not by ``_set``: ``_set`` is called from inside the
        stages (a broker's answer, an expiry), which must not be purged in the middle
        of their work."""
        while True:
            await self._fail_wanted.wait()
            self._fail_wanted = trio.Event()
            if self.state in (State.ABORTABLE, State.FATAL):
                assert self.error is not None
                self._purge(self.error)

    async def send_offsets(self, offsets: Mapping[Any, int], group: Any) -> None:
        """KIP-447: commit ``offsets`` ({(topic, partition): next offset to read}) for
        the group in the open transaction; they take effect only if it commits."""
        self._require(State.IN_TRANSACTION, doing="send offsets to the transaction")
        meta = GroupMetadata.of(group)
        by_topic: dict[str, list[TxnOffsetCommitRequestPartition]] = {}
        for key, offset in offsets.items():
            topic, partition = _topic_partition(key)
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"offset for {topic}[{partition}] must be an int >= 0, "
                                 f"not {offset!r}")
            by_topic.setdefault(topic, []).append(TxnOffsetCommitRequestPartition(
                partition_index=partition, committed_offset=offset))
        if not by_topic:
            return
        idem = self._idem
        try:
            if self.version < 2 and meta.group_id not in self._offsets_groups:
                await self._coord.add_offsets(meta.group_id, idem.producer_id,
                                              idem.producer_epoch)
                self._offsets_groups.add(meta.group_id)
            self.touched.add(TopicPartition("__consumer_offsets", -1))
            await self._coord.txn_offset_commit(meta, by_topic, idem.producer_id,
                                                idem.producer_epoch)
        except TransactionError as exc:
            if isinstance(exc, ProducerFencedError) and self._timed_out():
                # The coordinator's timeout abort bumped the epoch, which the
                # coordinators then refuse: the timeout is the cause, as for a record
                # refused so; the abort takes the producer on (_end_txn).
                timed_out = TransactionTimedOutError(
                    f"the coordinator aborted the transaction of {self.transactional_id!r}: "
                    f"it stayed open longer than transaction_timeout="
                    f"{self._config.transaction_timeout}s (its offsets were answered "
                    f"{exc.code.name if exc.code is not None else 'as fenced'})")
                self.abortable(timed_out)
                raise timed_out from exc
            if isinstance(exc, ProducerFencedError | TransactionFatalError):
                self.fatal(exc)
            else:
                self.abortable(exc)
            raise

    # -- ending ------------------------------------------------------------------------
    async def commit(self) -> None:
        self._require(State.IN_TRANSACTION, doing="commit the transaction")
        self._set(State.COMMITTING)
        try:
            async with trio.open_nursery() as nursery:
                async def stop_when_failed() -> None:
                    await self._failed.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(stop_when_failed)
                await self.flush()
                nursery.cancel_scope.cancel()
        except BaseException:
            if self.state == State.COMMITTING:  # no EndTxn sent: still open, may end either way
                self._set(State.IN_TRANSACTION)
            raise
        failed = self._records_failed() - self._failed_at_begin
        if self.state == State.COMMITTING and failed:
            self.abortable(TransactionAbortableError(
                f"{failed} record(s) of the transaction were not delivered (their "
                "deliveries say why): abort it, then go on"))
        if self.state != State.COMMITTING:
            assert self.error is not None
            raise self.error
        await self._end(commit=True)

    async def abort(self) -> None:
        # (A fenced producer is FATAL, never ABORTABLE: _require raises its error.)
        self._require(State.IN_TRANSACTION, State.ABORTABLE, doing="abort the transaction")
        self._set(State.ABORTING)
        await self._drain(TransactionAbortedError(
            "the transaction was aborted before this record had an outcome: it is not "
            "visible to read_committed readers"))
        await self._end(commit=False)

    async def _drain(self, error: KafkaError) -> None:
        """Fail what has no outcome yet with ``error``, and wait until nothing of the
        transaction is in flight any more (answers of requests on the wire come back;
        every record is settled by its deadline at the latest). A record still between
        two stages when the purge ran fails with ``error`` where it arrives: until the
        purge with None, every stage fails what reaches it (``RetryErrors.abort``)."""
        self._purge(error)
        try:
            with trio.move_on_after(self._config.delivery_timeout):
                await self.flush()
                await self._idem.wait_drained()
        finally:
            self._purge(None)

    async def _end(self, *, commit: bool) -> None:
        """EndTxn (when the coordinator knows of the transaction), shielded and bounded;
        then the epoch of the next transaction."""
        bound = self._config.transaction_timeout + self._config.request_timeout
        with trio.CancelScope(shield=True), trio.move_on_after(bound) as scope:
            # v1: an AddPartitionsToTxn in flight (retried while the coordinator still
            # completes the previous transaction) settles first: if it is applied, the
            # coordinator's transaction is open and EndTxn must end it
            await self._add_idle.wait()
            # That AddPartitionsToTxn may have been refused meanwhile: a fence ends the
            # producer (the abort too must say so), and a commit cannot go on once the
            # transaction turned abortable.
            if self.state == State.FATAL or (commit and self.state == State.ABORTABLE):
                assert self.error is not None
                raise self.error
            try:
                pid, epoch = await self._end_txn(commit)
            except TransactionError as exc:
                if isinstance(exc, TransactionAbortableError):
                    self._set(State.ABORTABLE, exc)
                else:
                    self.fatal(exc)
                raise
        if scope.cancelled_caught:
            error = TransactionFatalError(
                f"EndTxn ({'commit' if commit else 'abort'}) got no answer within "
                f"transaction_timeout + request_timeout = {bound}s; the coordinator aborts "
                "the transaction when its timeout passes: close this producer")
            self.fatal(error)
            raise error
        if commit:
            self.committed += 1
        else:
            self.aborted += 1
        if (pid, epoch) != (self._idem.producer_id, self._idem.producer_epoch):
            self._idem.restart(pid, epoch)
        elif self._idem.paused:  # v1: a sequence problem paused sealing: bump the epoch
            with trio.CancelScope(shield=True), trio.move_on_after(bound):
                pid, epoch = await self._coord.init_producer_id(pid, epoch)
            self._idem.restart(pid, epoch)
        self._set(State.READY)

    async def _end_txn(self, commit: bool) -> tuple[int, int]:
        idem = self._idem
        pid, epoch = idem.producer_id, idem.producer_epoch
        if not self.touched:  # the coordinator never heard of this transaction
            return pid, epoch
        try:
            try:
                response = await self._coord.end_txn(pid, epoch, commit, lost_is_unknown=commit)
            except OutcomeUnknown as exc:
                return await self._abort_after_lost_commit(pid, epoch, str(exc))
        except (ProducerFencedError, TransactionFatalError) as exc:
            timed_out = self._timed_out() and (
                isinstance(exc, ProducerFencedError)  # v1: the timeout bumped the epoch
                or (commit and exc.code == ErrorCode.INVALID_TXN_STATE))  # v2: aborted already
            if timed_out and not commit:
                # KIP-360: InitProducerId with the epoch the timeout bumped past would take
                # the producer on; Kafka 4.1 refuses it (PRODUCER_FENCED) under version 1.
                try:
                    return await self._coord.init_producer_id(pid, epoch)
                except ProducerFencedError as fenced:
                    error = ProducerFencedError(
                        f"the coordinator aborted the transaction of {self.transactional_id!r} "
                        f"(open longer than transaction_timeout="
                        f"{self._config.transaction_timeout}s) and fenced this producer's "
                        "epoch, which transaction.version 1 cannot take on: close this "
                        "producer and open a new one")
                    error.code = fenced.code
                    raise error from fenced
            if timed_out:
                raise TransactionTimedOutError(
                    f"the coordinator aborted the transaction of {self.transactional_id!r}: "
                    f"it stayed open longer than transaction_timeout="
                    f"{self._config.transaction_timeout}s") from exc
            raise
        new = (response.producer_id, response.producer_epoch)
        return new if new[0] >= 0 and new[1] >= 0 else (pid, epoch)

    async def _abort_after_lost_commit(self, pid: int, epoch: int, why: str) -> tuple[int, int]:
        """The commit's answer was lost: it may or may not have happened. Retrying it
        could commit what the caller may already be redoing, so abort instead (franz-go's
        rule). An abort refused with INVALID_TXN_STATE says the commit completed: it
        stands. Otherwise the transaction is aborted, and the commit raises."""
        log.warning("the answer to committing %r was lost (%s); aborting it instead",
                    self.transactional_id, why)
        try:
            response = await self._coord.end_txn(pid, epoch, False,
                                                 what="EndTxn (abort after a lost commit)")
        except TransactionFatalError as exc:
            if exc.code != ErrorCode.INVALID_TXN_STATE:
                raise
            # The commit completed (under v2 it bumped the epoch too): a fresh epoch
            # from the coordinator, as after any InitProducerId of this id.
            log.info("the lost commit of %r had completed", self.transactional_id)
            return await self._coord.init_producer_id(-1, -1)
        self.aborted += 1
        if response.producer_id >= 0 and response.producer_epoch >= 0:
            self._idem.restart(response.producer_id, response.producer_epoch)
        self._set(State.READY)
        raise TransactionAbortedError(
            f"the answer to committing the transaction was lost ({why}); it was aborted "
            "instead: nothing of it is visible to read_committed readers. Redo its work in "
            "a new transaction")

    def _timed_out(self) -> bool:
        """A coordinator that aborts a transaction for its timeout bumps the epoch
        (KIP-588), so this producer's next request of it is refused as fenced: when
        the transaction has been open longer than its timeout, that is the cause."""
        return trio.current_time() - self._began_at >= self._config.transaction_timeout


async def _no_flush() -> None:
    raise RuntimeError("TransactionManager.flush was not set")


def _topic_partition(key: Any) -> tuple[str, int]:
    if isinstance(key, tuple) and len(key) == 2:
        topic, partition = key
    else:
        topic, partition = getattr(key, "topic", None), getattr(key, "partition", None)
    if not isinstance(topic, str) or not isinstance(partition, int) or partition < 0:
        raise TypeError(f"offsets keys must be (topic, partition) pairs, not {key!r}")
    return topic, partition

