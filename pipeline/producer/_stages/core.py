"""ProducerCore: the composition root of the pipeline's stages.

The core owns the pipeline nursery and is the one place that builds stages.
Topic, partition and broker producers are started lazily with
``nursery.start`` the first time they are needed, and live until the
producer closes; nothing is fire-and-forget.

Stages never see the core. Each is given the shared services
(``StageContext``) and the one lookup it needs to reach its neighbours
(``ports.py``), which the core implements: a topic producer gets
``PartitionInboxes``, a partition producer ``BrokerInboxes``, a broker producer
``RetrySinks``. So every edge of the import graph points from the core to a
stage, never back.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

from pipeline.cluster.errors import (
    AuthenticationError,
    BootstrapError,
    BrokerConnectionError,
    KafkaError,
)
from pipeline.producer._config import ProducerConfig
from pipeline.producer._errors import (
    ProducerFencedError,
    TransactionAbortableError,
    TransactionError,
)
from pipeline.producer._message import ProducerMessage
from pipeline.producer._outcomes.ledger import Ledger
from pipeline.producer._stages.broker_producer import BrokerProducer
from pipeline.producer._stages.context import FlushState, RetryErrors, StageContext, retry_backoff
from pipeline.producer._stages.envelopes import TopicPartition
from pipeline.producer._stages.idempotence import Idempotence
from pipeline.producer._stages.partition_producer import PartitionProducer
from pipeline.producer._stages.topic_producer import TopicProducer
from pipeline.producer._stages.transactions import TransactionManager
from pipeline.protocol.errors import ErrorCode

if TYPE_CHECKING:
    from pipeline.cluster.pool import Cluster


class ProducerCore:
    def __init__(self, config: ProducerConfig, cluster: Cluster, ledger: Ledger) -> None:
        self.config = config
        self.cluster = cluster
        self.ledger = ledger
        self.rng = config.cluster.rng if config.cluster.rng is not None else random.Random()
        backoff = retry_backoff(config, self.rng)
        self.flush = FlushState()
        self.idempotence: Idempotence | None = (
            Idempotence(config, cluster, backoff, self._wake_broker_producers)
            if config.idempotent
            else None
        )
        self.transactions: TransactionManager | None = None
        if config.transactional_id is not None:
            assert self.idempotence is not None
            self.transactions = self._transactions(self.idempotence, backoff)
        self.context = StageContext(
            config=config,
            cluster=cluster,
            ledger=ledger,
            idempotence=self.idempotence,
            backoff=backoff,
            retry_errors=RetryErrors(config.delivery_timeout),
            flush=self.flush,
            transactions=self.transactions,
        )
        self.nursery: trio.Nursery | None = None
        self._pps: dict[TopicPartition, PartitionProducer] = {}
        self._bps: dict[int, BrokerProducer] = {}

    @property
    def last_error(self) -> dict[TopicPartition, BaseException]:
        """Each partition's last retry error, until a batch of it succeeds."""
        return self.context.retry_errors.last

    def _transactions(self, idem: Idempotence, backoff: Callable[[int], float],
                      ) -> TransactionManager:
        txn = TransactionManager(
            self.config, self.cluster, idem, backoff, purge=self.purge,
            wake=self._wake_broker_producers, records_failed=lambda: self.ledger.failed)
        idem.obtain_id = txn.obtain_id

        def recovery(reason: str) -> None:
            txn.abortable(TransactionAbortableError(
                f"the transaction lost its record order ({reason}): abort it, then go on"))

        def fenced(code: ErrorCode, reason: str, cause: BaseException | None
                   ) -> TransactionError:
            """A broker refused the epoch of a batch of the open transaction: the error
            the batch fails with, and (unless the transaction failed already) the
            transaction's, as Java's ProducerFencedException (fatal) and
            InvalidProducerEpochException (abortable)."""
            error: TransactionError
            if code == ErrorCode.PRODUCER_FENCED:
                error = ProducerFencedError(
                    f"a broker refused this producer ({reason}): another producer with "
                    f"transactional_id {txn.transactional_id!r} took over; close this one")
                txn.fatal(error)
            else:
                # The coordinator bumped the epoch: it aborted the transaction, because
                # another producer of the id took over or the transaction timed out (the
                # abort tells them apart: its EndTxn is fenced only after a takeover).
                error = TransactionAbortableError(
                    f"a broker refused this producer's epoch ({reason}): the coordinator "
                    "aborted the transaction (another producer with transactional_id "
                    f"{txn.transactional_id!r} took over, or it stayed open longer than "
                    f"transaction_timeout={self.config.transaction_timeout}s); abort it here")
                txn.abortable(error)
            error.code = code
            error.__cause__ = cause
            return error

        idem.on_recovery, idem.on_fenced = recovery, fenced
        return txn

    def purge(self, error: KafkaError | None) -> None:
        """Fail every record held in a stage with no outcome yet with ``error`` (a
        transaction that cannot commit, or is aborted), through the delivery-deadline
        path; until it is called with None, the stages fail what reaches them too."""
        self.context.retry_errors.abort = error
        if error is None:
            return
        for pp in self._pps.values():
            pp.expire_all()
        for bp in self._bps.values():
            bp.expire_all()

    async def start(self, nursery: trio.Nursery) -> None:
        """Adopt the pipeline nursery; with idempotence, obtain the first
        producer id there, failing clearly within request_timeout (a transactional
        producer: within max_block, fencing earlier producers of its id)."""
        self.nursery = nursery
        if self.idempotence is None:
            return
        if self.transactions is not None:
            await self._start_transactions(nursery, self.transactions)
            return
        timeout = self.config.request_timeout
        try:
            with trio.fail_after(timeout):
                await nursery.start(self.idempotence.run)
        except trio.TooSlowError:
            raise BrokerConnectionError(
                f"could not obtain a producer id (InitProducerId) within request_timeout="
                f"{timeout}s; the broker may not support idempotence: pass idempotent=False "
                "to produce without it"
            ) from None

    async def _start_transactions(self, nursery: trio.Nursery, txn: TransactionManager) -> None:
        assert self.idempotence is not None
        limit = self.config.max_block
        try:
            with trio.fail_after(limit):
                await nursery.start(self.idempotence.run)
        except trio.TooSlowError:
            raise BrokerConnectionError(
                f"could not initialise transactional_id {txn.transactional_id!r} (FindCoordinator,"
                f" InitProducerId) within max_block={limit}s; the cluster may not support "
                "transactions, or the transaction coordinator is unavailable") from None
        txn.initialized()
        nursery.start_soon(txn.run_adder)
        nursery.start_soon(txn.run_failer)

    # -- building stages ----------------------------------------------------
    def topic_producer(self, topic: str, partitioner: Any) -> TopicProducer:
        """A topic producer for the dispatcher, which starts it in its own nursery."""
        return TopicProducer(self.context, topic, partitioner, self)

    # -- PartitionInboxes (for topic producers) ------------------------------
    async def partition_inbox(
        self, tp: TopicPartition
    ) -> trio.MemorySendChannel[list[ProducerMessage]]:
        pp = self._pps.get(tp)
        if pp is None:
            assert self.nursery is not None
            pp = self._pps[tp] = PartitionProducer(self.context, tp, self)
            await self.nursery.start(pp.run)
        return pp.inbox

    # -- RetrySinks (for broker producers) -----------------------------------
    def retry_sink(self, tp: TopicPartition) -> PartitionProducer:
        return self._pps[tp]

    # -- BrokerInboxes (for partition producers) -----------------------------
    async def broker_producer(self, node_id: int) -> BrokerProducer:
        bp = self._bps.get(node_id)
        if bp is None:
            assert self.nursery is not None
            bp = self._bps[node_id] = BrokerProducer(self.context, node_id, self)
            await self.nursery.start(bp.run)
        return bp

    def broker_producers(self) -> list[BrokerProducer]:
        return list(self._bps.values())

    def partition_producers(self) -> list[PartitionProducer]:
        return list(self._pps.values())

    def _wake_broker_producers(self) -> None:
        for bp in self._bps.values():
            bp.wake()

    # -- flush (for the Producer) --------------------------------------------
    def start_flushing(self) -> None:
        self.flush.depth += 1
        self._wake_broker_producers()

    def stop_flushing(self) -> None:
        self.flush.depth -= 1


async def bootstrap_metadata(cluster: Cluster, bootstrap: object, limit: float) -> None:
    """Fetch cluster metadata once, so an unreachable cluster fails fast and clearly."""
    try:
        with trio.fail_after(limit):
            await cluster.refresh(force=True)
    except (AuthenticationError, BootstrapError):
        raise  # TLS or SASL refused us, or every address failed: the reason, said as is
    except (trio.TooSlowError, KafkaError) as exc:
        last = cluster.last_error
        detail = f": {exc}" if isinstance(exc, KafkaError) else (
            f" (last error: {last})" if last is not None else "")
        raise BrokerConnectionError(
            f"no bootstrap broker of {bootstrap!r} answered within request_timeout={limit}s"
            f"{detail}; check the address and that the broker is running"
        ) from exc
