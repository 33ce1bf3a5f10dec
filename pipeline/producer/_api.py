"""The public producer: ``open_producer`` and ``Producer`` (a facade).

``Producer`` delegates to the intake stage: ``Intake`` (``intake.py``:
``send()``'s hot path, bursts, acceptance), ``Bulk`` (``bulk.py``:
``send_many`` / ``send_batch``), ``InputAcceptance`` (``input_acceptance.py``:
``producer.input``), the dispatcher and ``InputChannel`` (``async_producer.py``);
the stages behind it are built by ``core.py``; the report task (``Reporter``,
``ledger.py``) feeds ``producer.successes`` / ``errors``. It owns the lifecycle: ``open_producer``
connects, starts the pipeline in a nursery, closes it (``_shut_down``) when the block ends.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio

from pipeline.cluster.errors import KafkaError
from pipeline.cluster.pool import Cluster
from pipeline.cluster.stats import report_statistics
from pipeline.producer._config import ProducerConfig, make_config
from pipeline.producer._errors import ProducerClosed, ProducerError, TransactionStateError
from pipeline.producer._intake import send_path
from pipeline.producer._intake.bulk import Bulk
from pipeline.producer._intake.hooks import SendHooks, rows_as_messages
from pipeline.producer._intake.input import InputAcceptance, InputChannel
from pipeline.producer._intake.intake import Intake
from pipeline.producer._message import DeliveryCallback, Headers, ProducerMessage, RecordMetadata
from pipeline.producer._outcomes.delivery import Delivery, DeliveryGroup
from pipeline.producer._outcomes.ledger import Ledger, Reporter
from pipeline.producer._outcomes.unobserved import Unobserved
from pipeline.producer._stages.core import ProducerCore, bootstrap_metadata
from pipeline.producer._stages.dispatcher import Dispatcher
from pipeline.producer._stages.partitioner import make_partitioner
from pipeline.producer._stages.transactions import State, TransactionManager
from pipeline.producer._statistics import ProducerStatistics, snapshot
from pipeline.protocol._columns import ColumnInput, HeadersInput, IntsInput
from pipeline.util.groups import unwrap_single_errors

log = logging.getLogger("pipeline.producer")

#: Seconds a failure may stay unread before it is logged (unobserved.py).
UNOBSERVED_WINDOW = 5.0


class Producer:
    """A running producer. Get one from ``open_producer``."""

    def __init__(self, core: ProducerCore) -> None:
        self._core = core
        self._config = config = core.config
        self._ledger = ledger = core.ledger
        ledger.return_successes = config.return_successes
        self._unobserved = ledger.unobserved = Unobserved(UNOBSERVED_WINDOW)
        self._unread: ExceptionGroup[ProducerError] | None = None
        partitioner = make_partitioner(config.partitioner, core.rng)
        self._dispatcher = Dispatcher(
            partial(core.topic_producer, partitioner=partitioner), config.channel_capacity)
        self._intake = intake = Intake(config, ledger, self._dispatcher.inbox)
        # The hot path: no wrapper call per message (the methods below say the same).
        self.send = send_path.entry(intake)  # type: ignore[method-assign]
        self.send_nowait = intake.send_nowait  # type: ignore[method-assign]
        self._hooks = hooks = SendHooks.of(config)
        if hooks is not None:  # serializers or interceptors: their steps around each call
            self.send = hooks.wrap_send(self.send)  # type: ignore[method-assign,assignment]
            self.send_nowait = hooks.wrap_send_nowait(intake.send_nowait)  # type: ignore[method-assign]
        self._nursery: trio.Nursery | None = None
        self._bulk = Bulk(intake, ledger)
        self._inputs = InputAcceptance(intake, ledger)
        self._reporter = reporter = Reporter(ledger, config.channel_capacity)
        #: sarama-style input: put ``ProducerMessage`` objects here; their outcomes
        #: arrive on ``successes`` (when ``return_successes``) and ``errors``.
        self.input = InputChannel(self._inputs, intake, intake.sender())
        self.successes: trio.MemoryReceiveChannel[ProducerMessage] = reporter.successes
        self.errors: trio.MemoryReceiveChannel[ProducerError] = reporter.errors
        self._started_at = trio.current_time()
        self._txn = txn = core.transactions
        if txn is not None:  # records are accepted only inside a transaction
            txn.flush = self.flush
            txn.on_state = lambda state: intake.refuse(
                None if state == State.IN_TRANSACTION else txn.refusal)
            txn.on_state(txn.state)

    # -- sending -------------------------------------------------------------
    async def send(
        self,
        topic: str,
        value: Any,
        *,
        key: Any = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        metadata: Any = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> Delivery:
        """Queue one message; return once it is accepted (backpressure).

        ``value`` and ``key`` are bytes, str (UTF-8) or None, or any object the
        ``value_serializer`` / ``key_serializer`` option turns into bytes.

        Returns a ``Delivery``: ``await`` it for ``RecordMetadata`` (or a
        ``ProducerError``). ``on_delivery(metadata, error)``, if given, is
        called exactly once when the message settles (in the pipeline's task:
        keep it short; an exception from it is logged and counted in
        ``statistics().callback_errors``). Raises, without accepting the
        message, on bad input, ``BufferFullError`` after ``max_block``, or
        ``ProducerClosed``.
        """
        return await self._intake.send(
            topic, value, key=key, headers=headers, partition=partition,
            timestamp=timestamp, metadata=metadata, on_delivery=on_delivery)

    def send_nowait(
        self,
        topic: str,
        value: Any,
        *,
        key: Any = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp: int | None = None,
        metadata: Any = None,
        on_delivery: DeliveryCallback | None = None,
    ) -> Delivery:
        """Like ``send`` but never waits: raises ``BufferFullError`` instead."""
        return self._intake.send_nowait(
            topic, value, key=key, headers=headers, partition=partition,
            timestamp=timestamp, metadata=metadata, on_delivery=on_delivery)

    async def send_and_wait(self, topic: str, value: Any, **kw: Any) -> RecordMetadata:
        """``send`` then wait for the outcome."""
        delivery = await self.send(topic, value, **kw)
        return await delivery

    async def send_many(self, messages: Iterable[ProducerMessage]) -> DeliveryGroup:
        """Queue many messages at once; the bulk path for callers like the Spark stage.

        Every message is validated before any is accepted: a bad one raises
        and none of the call's messages are sent. Returns a ``DeliveryGroup``
        whose ``await`` gives counts and the first errors; each message gets
        its own outcome (``partition``, ``offset``, ``timestamp``, ``done()``;
        a failed one is in the errors as ``ProducerError(message, cause)``).
        A call of 64 or more plain messages to one topic travels as columnar
        rows, encoded without a Python object per record (docs/architecture.md,
        "``send_many``'s messages as rows"); its messages' outcomes are written
        onto them when their batches settle.
        """
        hooks = self._hooks
        if hooks is None:
            return await self._bulk.send_many(messages)
        msgs = hooks.messages(messages)
        group = await self._bulk.send_many(msgs)
        if hooks.acknowledges:
            assert self._nursery is not None
            self._nursery.start_soon(hooks.acknowledge_group, group, msgs)
        return group

    async def send_batch(
        self,
        topic: str,
        values: ColumnInput,
        keys: ColumnInput | None = None,
        headers: HeadersInput | None = None,
        partitions: IntsInput | None = None,
        timestamps: IntsInput | None = None,
    ) -> DeliveryGroup:
        """Queue many rows given as columns: the columnar bulk path.

        Each column is an Arrow array (borrowed, not copied), a Python list,
        or a numpy array (``protocol/_columnar_input.py`` lists every form);
        ``headers`` per row, ``partitions`` (None/null: the partitioner
        decides; keyed rows go on Java's murmur2 partition) and
        ``timestamps`` (ms; None/null: now) are optional. The rows move
        through the same stages as ``send()``'s messages, as runs of rows
        (``producer/rows.py``), and are encoded without a Python object per
        record. Returns a ``DeliveryGroup``: ``await`` it for the counts
        (delivered, failed, first errors), one outcome per row.

        Every row is checked before any is accepted: bad input (lengths that
        differ, a wrong type, a row over ``max_message_bytes``) raises
        ``TypeError``/``ValueError``/``MessageTooLargeError`` naming the
        column and row, and nothing of the call is sent. Rows are accepted in
        chunks of at most a quarter of ``buffer_memory``, waiting for space
        as ``send()`` does; if the call is cancelled or fails while waiting,
        the chunks already accepted keep their outcomes (the group counts only
        them) and the rest was never sent.
        """
        hooks = self._hooks
        if hooks is not None:
            if hooks.intercepts:  # each row must pass on_send: as messages
                return await self.send_many(
                    rows_as_messages(topic, values, keys, headers, partitions, timestamps))
            values = hooks.column(values, "values", topic)
            keys = hooks.column(keys, "keys", topic)
        return await self._bulk.send_batch(topic, values, keys, headers, partitions, timestamps)

    # -- transactions (transactional_id=...; docs/transactions.md) ---------------
    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Producer]:
        """Begin a transaction; commit it when the block ends normally, abort it when
        the block raises or is cancelled, or its commit fails while the transaction can
        still be aborted (the exception then propagates)."""
        await self.begin_transaction()
        try:
            yield self
        except BaseException as exc:
            await self._abort_for(exc)
            raise
        try:
            await self.commit_transaction()
        except BaseException as exc:
            if self._transactions().state in (State.IN_TRANSACTION, State.ABORTABLE):
                await self._abort_for(exc)
            raise

    async def _abort_for(self, exc: BaseException) -> None:
        """Abort the open transaction because of ``exc`` (shielded, bounded by
        close_timeout); the block's own error is what propagates."""
        with trio.CancelScope(shield=True), trio.move_on_after(self._config.close_timeout):
            try:
                await self._transactions().abort()
            except KafkaError as abort_error:
                exc.add_note(f"(aborting the transaction failed too: {abort_error!r})")

    async def begin_transaction(self) -> None:
        """Open a transaction: ``send()`` and the bulk calls are accepted until it ends."""
        await trio.lowlevel.checkpoint()
        self._transactions().begin()

    async def commit_transaction(self) -> None:
        """Flush, then commit: every record of the transaction becomes visible to
        ``read_committed`` readers at once. Raises ``TransactionAbortableError`` (abort,
        then go on), ``ProducerFencedError`` or ``TransactionFatalError`` (close)."""
        await self._transactions().commit()

    async def abort_transaction(self) -> None:
        """Abort: records without an outcome fail with ``TransactionAbortedError``, and
        none of the transaction is visible to ``read_committed`` readers."""
        await self._transactions().abort()

    async def send_offsets_to_transaction(self, offsets: Mapping[Any, int], group_metadata: Any,
                                          ) -> None:
        """Commit a consumer group's ``offsets`` ({(topic, partition): next offset}) in
        the open transaction (KIP-447): they take effect only if it commits.
        ``group_metadata``: the consumer's ``group_metadata()``, or a group id."""
        await self._transactions().send_offsets(offsets, group_metadata)

    def _transactions(self) -> TransactionManager:
        if self._txn is None:
            raise TransactionStateError(
                "this producer is not transactional: open it with transactional_id=...")
        return self._txn

    # -- flushing, statistics, closing -----------------------------------------
    async def flush(self) -> None:
        """Wait until every message accepted before this call has its outcome,
        including messages already put on ``producer.input``."""
        self._core.start_flushing()
        try:
            await self._intake.reach_flush_mark()
            await self._ledger.wait_settled_through(self._ledger.last_accepted_id)
        finally:
            self._core.stop_flushing()

    def statistics(self) -> ProducerStatistics:
        """The producer's statistics now, per client, broker, topic and partition
        (docs/observability.md); ``.to_dict()`` / ``.to_json()`` for their plain forms."""
        hooks = self._hooks
        return snapshot(self._core, self._started_at, 0 if hooks is None else hooks.errors)

    @classmethod
    @asynccontextmanager
    async def _running(cls, bootstrap: str | Sequence[str], cfg: ProducerConfig
                       ) -> AsyncIterator[Producer]:
        """Connect, run the pipeline while the block runs, then shut down."""
        ledger = Ledger(cfg.buffer_memory, cfg.max_block)
        async with Cluster.open(bootstrap, cfg.cluster) as cluster:
            await bootstrap_metadata(cluster, bootstrap, cfg.request_timeout)
            core = ProducerCore(cfg, cluster, ledger)
            producer = cls(core)
            async with trio.open_nursery() as outer:
                pipeline_scope = trio.CancelScope()
                stopped = trio.Event()  # the pipeline's tasks have all ended

                async def run_pipeline(*, task_status: trio.TaskStatus[None]) -> None:
                    try:
                        with pipeline_scope:
                            async with trio.open_nursery() as nursery:
                                await core.start(nursery)  # (idempotence: the first id)
                                await producer._run(nursery)
                                task_status.started()
                    finally:
                        stopped.set()

                await outer.start(run_pipeline)
                graceful = False
                try:
                    yield producer
                    graceful = True
                finally:
                    await producer._shut_down(pipeline_scope, stopped, graceful=graceful)
        if producer._unread is not None:  # (outside the nurseries: raised as it is)
            raise producer._unread

    async def _run(self, nursery: trio.Nursery) -> None:
        """Start the dispatcher (it starts the topic producers) and the report task."""
        self._nursery = nursery
        await nursery.start(self._dispatcher.run, self._intake, self._inputs)
        nursery.start_soon(self._reporter.run)
        nursery.start_soon(self._unobserved.run)
        cfg = self._config
        if cfg.on_statistics is not None:
            nursery.start_soon(report_statistics, cfg.statistics_interval, self.statistics,
                               cfg.on_statistics, log)

    async def _shut_down(self, scope: trio.CancelScope, stopped: trio.Event, *, graceful: bool) -> None:
        """Close: refuse new messages, flush (``graceful``: up to close_timeout), let
        idempotent requests on the wire come back, stop the pipeline and, once its last
        steps ended, fail the rest (regression abort-close-after-a-response-was-read)."""
        self._intake.stop_accepting()
        cfg = self._config
        with trio.CancelScope(shield=True):
            txn = self._txn
            if txn is not None and txn.state in (State.IN_TRANSACTION, State.ABORTABLE):
                with trio.move_on_after(cfg.close_timeout):  # (an open transaction: abort)
                    try:
                        await txn.abort()
                    except KafkaError as exc:
                        log.warning("closing: the open transaction could not be aborted (%s); "
                                    "the coordinator aborts it after transaction_timeout", exc)
            if graceful:
                with trio.move_on_after(cfg.close_timeout):
                    await self.flush()
            idem = self._core.idempotence
            if idem is not None and idem.in_flight:
                # Never abandon an idempotent request on the wire (franz-go #930):
                # seal nothing new, and wait (bounded) for the answers to come back.
                idem.paused = True
                with trio.move_on_after(cfg.request_timeout):
                    await idem.wait_drained()
            scope.cancel()
            with trio.move_on_after(cfg.request_timeout):
                await stopped.wait()
            self._inputs.shut_down(self._dispatcher.leftovers())
            left = self._ledger.fail_all_outstanding(
                ProducerClosed.unsettled(cfg.close_timeout if graceful else None))
            if left:
                log.warning("producer closed with %d undelivered messages", left)
            self._reporter.close()
            self.input.close()
            self._intake.close()
        unread = self._unobserved.close()
        if unread and graceful and cfg.raise_on_unobserved_failure:
            self._unread = ExceptionGroup(  # raised once the pipeline's nursery is done
                f"{sum(f.records for f in unread)} record(s) failed and nobody read their "
                "outcome (raise_on_unobserved_failure=True)",
                [ProducerError(f.holder if isinstance(f.holder, ProducerMessage) else
                               ProducerMessage(f.topic, None, partition=f.partition), f.cause)
                 for f in unread[:100]])


@asynccontextmanager
async def open_producer(
    bootstrap: str | Sequence[str],
    config: ProducerConfig | None = None,
    *,
    connector: Any = None,
    **options: Any,
) -> AsyncIterator[Producer]:
    """Run a producer for the duration of an ``async with`` block.

    Args:
        bootstrap: ``"host:port"``, a comma-separated list, or a sequence of them.
        config: a ``ProducerConfig``; keyword ``options`` override its fields.
        connector: the transport seam (tests pass a fake cluster's connector);
            the same as the ``connector`` option.

    Leaving the block normally flushes (up to ``close_timeout``) and closes;
    whatever is still undelivered then fails with ``ProducerClosed``. Leaving
    it by cancellation or an error closes without waiting.

    Raises:
        ConfigError: an invalid option, before anything connects.
        KafkaError: no bootstrap broker answered within ``request_timeout``.
    """
    if connector is not None:
        options["connector"] = connector
    cfg = make_config(config, options)
    # Nurseries wrap errors in groups; at the public boundary one error is
    # raised as itself (`except BrokerConnectionError:` works, a user's own
    # exception comes out unchanged), several stay a group (pipeline.util.groups).
    with unwrap_single_errors():
        async with Producer._running(bootstrap, cfg) as producer:
            yield producer
