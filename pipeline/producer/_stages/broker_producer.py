"""brokerProducer: one per broker; accumulates, seals batches, keeps requests in flight.

Strategy: three tasks share this object's state (one trio thread, so every
mutation between two awaits is atomic):

* ``_intake`` drains the input channel (fan-in from partition producers)
  into the per-partition queues of its ``Accumulator`` (accumulator.py:
  queues, readiness, muting, sealing). It never blocks on anything but its
  own input, so partition producers always make progress.
* ``_flusher`` waits until some partition is ready (linger, batch bytes,
  batch messages, a retried batch, or a flush) and a request slot is free,
  then has the accumulator *seal* one batch per ready partition (encoding it
  with the producer id, epoch and sequence current at that moment) and writes
  one ProduceRequest, like the Java client's drain.
* ``_responder`` handles responses strictly in request order: settles
  messages, or schedules a failed batch to go back to its partition producer.

Retry state (sarama's ``currentRetries``): once a batch of a partition fails
retriably here, the partition is *retrying*: nothing more of it is sent, and
once none of its batches is in flight any more, everything it has here goes
back to its partition producer in order: the failed batches (in sequence
order), then batches waiting to be re-sent, then loose messages. Input that
arrives later follows the same way, until the partition's ``Fin`` chaser
arrives. The partition producer sends the chaser only after hearing of the
failure (a bounce, or ``leader_changed`` when nothing went back), so when it
arrives nothing of the partition is in flight, failed or queued here: it is
returned at once, and the partition is served again.
When that bounce finds nothing to send back (all failed here), no chaser would
come: ``_gave_up`` ends the state, or has the partition producer leave with one.

Muting (``Accumulator.sendable``): at most ``max_in_flight_per_partition``
batches of one partition are in flight (1 without idempotence, so a retry can
never be overtaken, sarama #2619; up to 5 with idempotence, where sequence
numbers keep the order).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import trio

from pipeline.cluster.errors import AuthenticationError, KafkaError
from pipeline.producer._columnar.rows import RowRun, record_count, split_run_batch
from pipeline.producer._errors import BrokerResponseError, DeliveryTimeoutError
from pipeline.producer._message import PENDING, ProducerMessage
from pipeline.producer._stages.accumulator import Accumulator, PartitionQueue, fill
from pipeline.producer._stages.batches import (
    EPOCH_CODES,
    MAYBE_WRITTEN,
    REFRESH_CODES,
    TOO_LARGE,
    produce_request,
    split_batch,
    unless_duplicate_echo,
)
from pipeline.producer._stages.envelopes import (
    BrokerItem,
    Fin,
    Handoff,
    RetryItem,
    SealedBatch,
    TopicPartition,
)
from pipeline.protocol.api import ApiKey
from pipeline.protocol.errors import ErrorCode, error_code
from pipeline.protocol.messages.produce import ProduceResponse

if TYPE_CHECKING:
    from pipeline.cluster.connection import BrokerConnection
    from pipeline.producer._stages.context import StageContext
    from pipeline.producer._stages.ports import RetrySinks

log = logging.getLogger("pipeline.producer")


@dataclass(slots=True)
class _InFlight:
    pending: Any  # PendingResponse | None (acks=0)
    batches: dict[TopicPartition, SealedBatch]
    # The earliest delivery deadline among its batches not expired yet (inf
    # once all are): when ``_expire`` next looks at it.
    deadline: float
    # Batches failed at their own delivery deadline while in flight: their
    # outcome is settled, the answer only unmutes their partition. Per batch, as
    # the Java client's Sender: a batch sharing a request with an older one is
    # not failed at the older one's deadline
    # (test_the_batches_of_a_request_expire_each_at_its_own_deadline).
    expired: set[TopicPartition] = field(default_factory=set)
    # Set when writing the request failed. It is still queued behind the
    # requests before it, so its batches go back *after* theirs: a partition's
    # failed batches must return in the order they were sealed.
    error: BaseException | None = None


class BrokerProducer:
    def __init__(self, ctx: StageContext, node_id: int, sinks: RetrySinks) -> None:
        self.node_id = node_id
        self._config = config = ctx.config
        self._cluster = ctx.cluster
        self._ledger = ctx.ledger
        self._errors = ctx.retry_errors
        # The retry back-edge: the partition producer of a partition we were sent.
        self._sinks = sinks
        # Our inbox: partition producers send to ``inbox``; ``_intake`` reads ``_inbox``.
        self.inbox: trio.MemorySendChannel[BrokerItem]
        self.inbox, self._inbox = trio.open_memory_channel[BrokerItem](config.channel_capacity)
        # Per-partition queues, readiness and sealing (accumulator.py).
        self._acc = Accumulator(ctx)
        self._parts = self._acc.parts
        self._in_flight: deque[_InFlight] = deque()
        # The request the flusher is writing (drained, not in ``_in_flight`` until
        # written): on the wire for the statistics, which would miss its records.
        self._writing: _InFlight | None = None
        self._wake_flusher = trio.Event()
        # What the flusher waits until while it waits (None: busy): _poke_flusher.
        self._flusher_until: float | None = None
        # The flusher's wait for a connection or for a request slot (None: not
        # waiting). It ends at the next delivery deadline here; an arrival with an
        # earlier one moves that end (_poke_flusher), so the wait never holds a message
        # past its deadline.
        self._waiting: trio.CancelScope | None = None
        self._wake_responder = trio.Event()
        self._acks = config.acks_value
        self._timeout_ms = int(config.request_timeout * 1000)
        self._idem = ctx.idempotence
        self._txn = ctx.transactions
        self._counters = ctx.counters
        # Where the error codes of this broker's answers are counted (cluster/stats.py).
        self._broker_stats = ctx.cluster.broker_stats(node_id)
        self.requests_sent = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._intake)
            nursery.start_soon(self._flusher)
            nursery.start_soon(self._responder)
            task_status.started()

    def wake(self) -> None:
        self._wake_flusher.set()

    # -- intake ------------------------------------------------------------
    async def _intake(self) -> None:
        receive = self._inbox
        async for item in receive:
            self._accept(item)
            while True:
                try:
                    item = receive.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                self._accept(item)
            self._poke_flusher()

    def _poke_flusher(self) -> None:
        """Wake the flusher unless what arrived or was answered changes nothing
        it waits for: nothing is ready now and ``_next_wake`` is not earlier.
        (At a paced 20k msg/s two of three wake-ups found nothing to send, ~80
        us each.) A busy flusher is always woken: it looks again anyway.
        While a transaction cannot commit, what arrived or was answered fails first
        (``RetryErrors.abort``): nothing of it is sent or retried any more (records
        handed over just before the transaction failed arrive after its purge)."""
        if self._errors.abort is not None:
            self.expire_all()
        waiting = self._waiting
        if waiting is not None:
            waiting.deadline = min(waiting.deadline, self._next_wake(False))
        until = self._flusher_until
        if until is not None:
            now = trio.current_time()
            slot_free = len(self._in_flight) < self._config.max_in_flight
            paused = self._idem is not None and self._idem.paused
            if not (slot_free and self._acc.ready(now)) and (
                    self._next_wake(slot_free and not paused) >= until):
                return
        self._wake_flusher.set()

    def _accept(self, item: BrokerItem) -> None:
        part = self._acc.queue(item.tp)
        if isinstance(item, Handoff):
            self._acc.add(part, item.messages)
            if part.retrying is not None:
                self._maybe_bounce(item.tp, part)
        else:  # a Fin: the chaser
            # Sent only after the partition producer heard of the failure,
            # which we report only once nothing of the partition is in flight,
            # and we sent nothing of it since: nothing is left here for it.
            drained = not (part.in_flight or part.failed or part.msgs or part.sealed)
            assert drained, "a chaser finds its partition drained"
            part.retrying = None
            self._sinks.retry_sink(item.tp).retry([Fin(item.tp, item.level + 1)])

    # -- bouncing (the retry back-edge; never blocks) ----------------------
    def _schedule_bounce(self, part: PartitionQueue, batch: SealedBatch, cause: BaseException) -> None:
        part.retrying = cause
        batch.error = cause
        part.failed.append(batch)

    def _maybe_bounce(self, tp: TopicPartition, part: PartitionQueue) -> bool:
        """Send everything of a retrying partition back, once nothing of it is in
        flight. True when it bounced and nothing went back: all it held failed here."""
        if part.in_flight or part.retrying is None:
            return False
        cause = part.retrying
        items: list[SealedBatch | ProducerMessage] = [*part.failed, *part.sealed, *part.msgs]
        # Only a batch that was sent and failed spends a retry (``_retries``); what
        # merely waited here behind it goes back a level up without being judged:
        # with retries=0 it failed unsent, with the cause of the batch ahead of it
        # (the schedule explorer, seed 300086; Java leaves those in its accumulator).
        sent = len(part.failed)
        part.sealed.clear()
        part.failed, part.msgs, part.nbytes, part.first_at = [], [], 0, math.inf
        if not items:
            return True
        limit = self._config.retries
        now = trio.current_time()
        again: list[RetryItem] = []
        # (each batch that spent its retries fails with its own last answer)
        exhausted: dict[int, tuple[BaseException, list[ProducerMessage]]] = {}
        expired: list[ProducerMessage] = []
        unanswered: list[ProducerMessage] = []  # expired, from a batch of unknown fate
        # An authentication failure is not retried (KIP-152, as the Java client):
        # the messages fail with it now instead of retrying into delivery_timeout.
        fatal = isinstance(cause, AuthenticationError)
        for i, unit in enumerate(items):
            msgs = unit.messages if isinstance(unit, SealedBatch) else [unit]
            # Nothing here is settled: what fails while waiting here leaves the
            # queues with its unit (Accumulator.expire, restamp), and a batch
            # failed in flight (_expire, _handle_partition) is never bounced.
            assert all(m._state == PENDING for m in msgs), "a bounced unit is pending"
            tried = i < sent  # (a SealedBatch: only batches are sent)
            spent = fatal or (tried and unit._retries >= limit)  # type: ignore[union-attr]
            if spent or unit._deadline <= now:
                unknown = isinstance(unit, SealedBatch) and unit.fate_unknown
                if spent:
                    # (a batch sent back after a send always carries its answer)
                    error = cause if fatal else cast(BaseException, unit.error)  # type: ignore[union-attr]
                    exhausted.setdefault(id(error), (error, []))[1].extend(msgs)
                else:
                    (unanswered if unknown else expired).extend(msgs)
                if self._idem is not None and isinstance(unit, SealedBatch):
                    self._idem.batch_failed(
                        unit, "authentication failed" if fatal
                        else "retries or delivery_timeout ran out")
            else:
                unit._level += 1
                if tried:
                    unit._retries += 1  # type: ignore[union-attr]
                    counters = self._counters.partition(tp)
                    counters.retries += 1
                    counters.retried_messages += record_count(msgs)
                again.append(unit)
        for error, spent_msgs in exhausted.values():
            self._ledger.fail(spent_msgs, error)
        if expired:
            self._ledger.fail(expired, self._errors.delivery_timeout_error(tp, cause))
        if unanswered:
            self._ledger.fail(unanswered, self._errors.delivery_timeout_error(tp, cause, fate_unknown=True))
        if again:
            self._errors.last[tp] = cause
            self._sinks.retry_sink(tp).retry(again)
        return not again

    def _gave_up(self, tp: TopicPartition, part: PartitionQueue) -> None:
        """A failure's first bounce sent nothing back (all failed here). No chaser
        is out or would come; left retrying, the partition's next message would go
        back once (a backoff and a retry level spent for nothing)."""
        cause = part.retrying
        if isinstance(cause, BrokerResponseError) and cause.code not in REFRESH_CODES:
            # The leader itself answered (a refused record, NOT_ENOUGH_REPLICAS run
            # out): nothing moved, nothing is left to order. The Java client unmutes.
            part.retrying = None
        else:  # no answer, connection lost, NOT_LEADER...: the leader may be gone
            self._sinks.retry_sink(tp).leader_changed()

    def _settled(self, tp: TopicPartition) -> None:
        """One batch of ``tp`` left the wire: unmute, and bounce once none is left."""
        part = self._parts[tp]
        part.in_flight -= 1
        if self._idem is not None:
            self._idem.batch_done()
        if self._maybe_bounce(tp, part):
            self._gave_up(tp, part)

    # -- flushing ----------------------------------------------------------
    def _next_wake(self, slot_free: bool) -> float:
        """The next expiry, and, when a request slot is free, the next linger
        deadline. Without a free slot a response wakes the flusher: waking at a
        linger deadline already past would only spin until then. The same holds
        while sealing is paused for an epoch bump (the flusher passes False
        then; the bump's end wakes it): the explorer found that spin too."""
        wake = self._acc.next_wake(slot_free)
        for flight in self._in_flight:
            wake = min(wake, flight.deadline)
        for part in self._parts.values():
            if part.failed:
                wake = min(wake, part.failed[0]._deadline)
        return wake

    async def _flusher(self) -> None:
        max_in_flight = self._config.max_in_flight
        while True:
            now = trio.current_time()
            # (every deadline while a transaction cannot commit: what a wait cut
            # short in _send_one put back fails here instead of being sent again)
            self._expire(self._errors.expiry_horizon(now))
            slot_free = len(self._in_flight) < max_in_flight
            if slot_free and self._acc.ready(now):
                await self._send_one()
                continue
            paused = self._idem is not None and self._idem.paused
            self._flusher_until = until = self._next_wake(slot_free and not paused)
            with trio.move_on_at(until):
                await self._wake_flusher.wait()
            self._flusher_until = None
            self._wake_flusher = trio.Event()

    async def _send_one(self) -> None:
        try:
            # Connecting (reconnect backoff, then a handshake of up to
            # request_timeout) must not hold up expiry: what waits here is
            # failed at its delivery deadline, and the flusher tries again
            # (regression connect-holds-expiry), also what arrives meanwhile
            # (_waiting; regression connect-holds-a-later-arrival).
            conn: BrokerConnection | None = None
            self._waiting = scope = trio.CancelScope(deadline=self._next_wake(False))
            try:
                with scope:
                    conn = await self._cluster.connection(self.node_id)
            finally:
                self._waiting = None
            if conn is None:
                return
        except KafkaError as exc:
            # Unreachable broker: everything here goes back to its partition
            # producer, which re-resolves the leader after a backoff.
            log.info("broker %d unreachable: %s", self.node_id, exc)
            for tp, part in list(self._parts.items()):
                if (part.msgs or part.sealed) and self._acc.sendable(part, tp):
                    part.retrying = exc
                    if self._maybe_bounce(tp, part):
                        self._gave_up(tp, part)
                    self._cluster.request_refresh([tp.topic])
            return
        if self._idem is not None and self._idem.paused:
            return  # a recovery began during the wait: sealing now would use the old id
        taken = self._acc.drain()
        if not taken:
            return
        txn = self._txn
        request = produce_request(taken, self._acks, self._timeout_ms,
                                  None if txn is None else txn.transactional_id)
        flight = _InFlight(None, taken, min(b._deadline for b in taken.values()))
        version = None if txn is None else min(conn.version_for(ApiKey.PRODUCE),
                                                txn.produce_version_cap)
        self._writing = flight
        try:
            # The connection's request slots are shared (a metadata request, the
            # producer id's): the wait for one ends at the first delivery deadline of
            # what was taken, which then goes back unwritten and expires where it waits
            # (regression slot-wait-holds-expiry), as the Java client drains only for a
            # ready connection; or at the next deadline of anything else here, flights
            # and arrivals included (_waiting), which the flusher then expires
            # (regression slot-wait-holds-other-deadlines).
            self._waiting = scope = trio.CancelScope(
                deadline=min(flight.deadline, self._next_wake(False)))
            try:
                pending = await conn.send_before(request, scope, version=version,
                                                 expect_response=self._acks != 0)
            finally:
                self._waiting = None
            if pending is None:
                self._acc.unsend(taken)
                return
            self.requests_sent += 1  # (written: a send that failed wrote nothing)
            # acks=0: no response will come; being written is the outcome.
            flight.pending = pending if self._acks != 0 else None
        except KafkaError as exc:
            flight.error = exc  # handled by the responder, in request order
        finally:
            self._writing = None
        self._in_flight.append(flight)
        self._wake_responder.set()

    # -- responses ---------------------------------------------------------
    async def _responder(self) -> None:
        while True:
            while not self._in_flight:
                await self._wake_responder.wait()
                self._wake_responder = trio.Event()
            flight = self._in_flight[0]
            if flight.error is not None:
                self._in_flight.popleft()
                self._fail_flight(flight, flight.error)
            elif flight.pending is None:  # acks=0: written is all we will ever know
                self._in_flight.popleft()
                for tp, batch in flight.batches.items():
                    if tp not in flight.expired:
                        self._ledger.succeed(batch.messages, -1, -1)
                        self._delivered(tp, batch)
                    self._settled(tp)
            else:
                try:
                    response = await flight.pending.wait()
                except KafkaError as exc:
                    self._in_flight.popleft()
                    self._fail_flight(flight, exc)
                else:
                    self._in_flight.popleft()
                    self._handle_response(flight, response)
            self._poke_flusher()

    def _fail_flight(self, flight: _InFlight, exc: BaseException) -> None:
        """No answer (connection lost, timed out): the batches may have been written."""
        for tp, batch in flight.batches.items():
            batch.fate_unknown = True
            if tp not in flight.expired:
                self._schedule_bounce(self._parts[tp], batch, exc)
            self._settled(tp)
            self._cluster.request_refresh([tp.topic])

    def _handle_response(self, flight: _InFlight, response: ProduceResponse) -> None:
        results: dict[TopicPartition, Any] = {}
        for topic in response.responses:
            for p in topic.partition_responses:
                results[TopicPartition(topic.name, p.index)] = p
        for tp, batch in flight.batches.items():
            if tp not in flight.expired:
                self._handle_partition(tp, batch, results.get(tp))
            self._settled(tp)

    def _handle_partition(self, tp: TopicPartition, batch: SealedBatch, result: Any) -> None:
        part = self._parts[tp]
        ledger = self._ledger
        idem = self._idem
        if result is None:
            # Applied or not, nothing says: a copy re-stamped for a new epoch would not
            # be recognised as its duplicate (Accumulator.restamp).
            batch.fate_unknown = True
            self._schedule_bounce(part, batch, KafkaError(
                f"broker {self.node_id} left {tp.topic}[{tp.partition}] out of its response"
            ))
            return
        code = error_code(result.error_code)
        if code == ErrorCode.NONE:
            append_time = result.log_append_time_ms
            if append_time >= 0 and batch._level and batch.producer_id >= 0:
                append_time = unless_duplicate_echo(batch, append_time)
            ledger.succeed(batch.messages, result.base_offset, append_time)
            self._delivered(tp, batch)
            if idem is not None:
                # A recovery waits for the wire to drain and nothing is sealed while
                # it runs (_send_one): every answer is for the current id and epoch.
                assert (batch.producer_id, batch.producer_epoch) == (idem.producer_id, idem.producer_epoch)
                idem.confirmed.add(tp)
            last_error = self._errors.last
            if last_error:
                last_error.pop(tp, None)
            return
        cause = BrokerResponseError(code, result.error_message)
        self._broker_stats.error(code)
        if code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER and idem is not None:
            # tansu only: it answers a re-sent batch it already has with 46 and no
            # offset (Kafka answers NONE with the original offset, above). Written.
            ledger.succeed(batch.messages, -1, -1)
            self._delivered(tp, batch)
            assert (batch.producer_id, batch.producer_epoch) == (idem.producer_id, idem.producer_epoch)
            idem.confirmed.add(tp)
        elif code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and idem is not None:
            if part.retrying is not None or part.failed:
                # Explained by an earlier batch of this partition that failed:
                # the broker is waiting for that one. Retry in order.
                self._schedule_bounce(part, batch, cause)
            else:
                # Nothing explains the gap: the broker lost or skipped earlier
                # batches. This batch was not written; fail it, start a new
                # epoch, and carry on with the later ones.
                ledger.fail(batch.messages, cause)
                part.retrying = cause
                idem.request_bump(f"unexplained OUT_OF_ORDER_SEQUENCE_NUMBER on {tp}")
        elif code == ErrorCode.UNKNOWN_PRODUCER_ID and idem is not None:
            # The broker forgot this producer (restart, retention): the batch was
            # not written; it is re-sent under a new epoch.
            self._schedule_bounce(part, batch, cause)
            idem.request_bump(f"UNKNOWN_PRODUCER_ID on {tp}")
        elif code in EPOCH_CODES and idem is not None:
            # Not written. The current epoch fenced (tansu refuses an epoch the
            # producer bumped itself): recover with a new producer id; re-sent then.
            # A transactional producer's epoch is its coordinator's: the transaction
            # cannot commit any more, and the batch fails now with its error.
            fenced = idem.epoch_fenced(batch.producer_id, batch.producer_epoch, code, cause)
            if fenced is None:
                self._schedule_bounce(part, batch, cause)
            else:
                ledger.fail(batch.messages, fenced)
        elif code.retriable:
            if code in MAYBE_WRITTEN:
                batch.fate_unknown = True
            self._schedule_bounce(part, batch, cause)
            if code in REFRESH_CODES:
                self._cluster.request_refresh([tp.topic])
        elif code in TOO_LARGE and record_count(batch.messages) > 1 and not batch.fate_unknown:
            # KIP-126, as the Java client: two halves, in order, retried (a split
            # takes a retry level, spends no retry); with idempotence they share the
            # batch's sequence range, so later batches (answered OUT_OF_ORDER
            # meanwhile) follow them unchanged. A batch whose fate is unknown is never
            # split: a half of a written batch would not be recognised as its duplicate.
            log.info("%s: %s for a batch of %d records; splitting it", tp, code.name,
                     record_count(batch.messages))
            head: Any = batch.messages[0]
            if type(head) is RowRun:  # a send_batch run: its rows in two
                halves = split_run_batch(batch, self._config)
            else:
                n, first_bytes = fill(batch.messages, batch.nbytes // 2, len(batch.messages) - 1)
                halves = split_batch(batch, n, first_bytes, self._config)
            for half in halves:
                self._schedule_bounce(part, half, cause)
        else:
            ledger.fail(batch.messages, cause)
            if idem is not None:
                # Not written, but its sequences were taken: later batches of the
                # partition in flight are answered OUT_OF_ORDER (explained by
                # ``retrying``: they come back) and are re-sent in a new epoch.
                part.retrying = cause
                idem.batch_failed(batch, code.name)

    def _delivered(self, tp: TopicPartition, batch: SealedBatch) -> None:
        counters = self._counters.partition(tp)
        counters.delivered += record_count(batch.messages)
        counters.delivered_bytes += batch.nbytes

    # -- statistics ----------------------------------------------------------
    def waiting(self) -> dict[TopicPartition, list[int]]:
        """What waits here per partition, not on the wire: ``[records, bytes]``
        (loose, sealed for a re-send, failed and waiting to go back); every
        partition with a queue here, so also ``[0, 0]``."""
        out: dict[TopicPartition, list[int]] = {}
        for tp, part in self._parts.items():
            msgs = part.msgs
            # (a RowRun counts its rows; a message has no count)
            records = sum(getattr(m, "count", 1) for m in msgs) if part.has_runs else len(msgs)
            nbytes = part.nbytes
            for batch in (*part.sealed, *part.failed):
                records += record_count(batch.messages)
                nbytes += batch.nbytes
            out[tp] = [records, nbytes]
        return out

    def on_the_wire(self) -> tuple[int, dict[TopicPartition, list[int]]]:
        """Requests in flight (the one being written included), and per partition
        ``[batches, records, bytes]`` on the wire whose outcome is awaited (not failed
        at their delivery deadline)."""
        out: dict[TopicPartition, list[int]] = {}
        flights = [*self._in_flight] if self._writing is None else [*self._in_flight, self._writing]
        for flight in flights:
            for tp, batch in flight.batches.items():
                if tp in flight.expired:
                    continue  # (failed at its deadline: no longer waited for)
                entry = out.get(tp)
                if entry is None:
                    entry = out[tp] = [0, 0, 0]
                entry[0] += 1
                entry[1] += record_count(batch.messages)
                entry[2] += batch.nbytes
        return len(flights), out

    # -- delivery timeout --------------------------------------------------
    def expire_all(self) -> None:
        """Fail what waits here with no outcome yet, in flight too (an aborted
        transaction: the delivery-deadline path, with every deadline taken as
        passed; the answers of requests in flight still come back and unmute).
        Nothing of the transaction is written any more: the flusher's wait for a
        connection or a request slot ends now, and what it took for that request
        goes back unwritten, to fail where it waits (the flusher's next step)."""
        self._expire(math.inf)
        waiting = self._waiting
        if waiting is not None:
            waiting.cancel()

    def _expire(self, now: float) -> None:
        ledger = self._ledger
        timeout_error = self._errors.delivery_timeout_error
        self._acc.expire(now, timeout_error)
        for tp, part in self._parts.items():
            # A batch that failed here waits for the partition's other batches
            # in flight before it goes back (_maybe_bounce); past its deadline
            # it fails now, with the error that sent it back, not at the bounce up
            # to request_timeout later
            # (test_a_failed_batch_expires_at_its_own_deadline_before_its_partitions_flights).
            while part.failed and part.failed[0]._deadline <= now:
                batch = part.failed.pop(0)
                ledger.fail(batch.messages, timeout_error(
                    tp, part.retrying, fate_unknown=batch.fate_unknown))
                if self._idem is not None:
                    self._idem.batch_failed(batch, "delivery timeout")
        for flight in self._in_flight:
            if flight.deadline > now:
                continue
            # The request may still succeed: the outcome of a batch past its
            # deadline is unknown. Its messages fail now (nobody waits past
            # delivery_timeout); the late response only unmutes the partition.
            flight.deadline = math.inf
            for tp, batch in flight.batches.items():
                if tp in flight.expired:
                    continue
                if batch._deadline > now:
                    flight.deadline = min(flight.deadline, batch._deadline)
                    continue
                flight.expired.add(tp)
                batch.fate_unknown = True
                ledger.fail(
                    [m for m in batch.messages if m._state == PENDING],
                    timeout_error(tp, None, in_flight=True),
                )
                if self._idem is not None:
                    # Its sequence may or may not be used now: later batches
                    # of the partition would hit a gap. Start a new epoch.
                    part = self._parts[tp]
                    if part.retrying is None:
                        part.retrying = DeliveryTimeoutError("an earlier batch timed out")
                    self._idem.request_bump(f"delivery timeout of an in-flight batch on {tp}")
