"""The broker producer's accumulator: per-partition queues, readiness, sealing.

One ``Accumulator`` per broker producer (the Java client's RecordAccumulator,
per broker). It holds, per partition, the retried batches to re-send first,
then the loose messages in order, and decides what is ready to go and what
the next request carries. It never awaits: the broker producer's tasks call
it between their awaits, so each call sees (and leaves) a consistent state.

Sealing encodes one batch with the producer id, epoch and base sequence
current at that moment (a sequence is taken only here, for a live leader, so
a message that fails earlier consumes none, sarama #1661). A retried batch is
re-sent byte for byte, re-stamped only after an epoch bump and only if it was
certainly not written (``restamp``).

Muting (``sendable``): at most ``max_in_flight_per_partition`` batches of one
partition in flight (1 without idempotence, so a retry can never be overtaken,
sarama #2619; with idempotence, 1 until a batch of the current epoch was
acknowledged on the partition, then up to 5, sequence numbers keeping the
order), and nothing of a partition that is retrying.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate, islice
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import trio

from pipeline.cluster.errors import KafkaError
from pipeline.producer._columnar.rows import RowRun, encode_messages, record_count, take_until_run
from pipeline.producer._message import PENDING, ProducerMessage
from pipeline.producer._stages.envelopes import SealedBatch, TopicPartition
from pipeline.protocol.records import BatchBuilder, batch_size_for_record, restamp_batch

if TYPE_CHECKING:
    from pipeline.producer._stages.context import StageContext

_SystemClock: type | None  # trio's real clock (a virtual one, MockClock or the explorer's, is not it)
try:
    from trio._core._run import SystemClock as _SystemClock
except ImportError:  # pragma: no cover - a trio without it: no slack anywhere
    _SystemClock = None

#: Half the run loop's timer resolution where that resolution is 1 ms (epoll on
#: Linux, IOCP on Windows): CPython rounds a poll timeout *up* to whole ms, so
#: a timed wake-up ends 0 to ~1.15 ms late (measured on this project's Linux
#: machines: 0.6 ms at the median, alone in its run loop). kqueue (macOS, BSD)
#: takes a timespec, so it gets none.
TIMER_SLACK = 0.0005 if sys.platform.startswith(("linux", "win32")) else 0.0


def timer_slack() -> float:
    """How much earlier than its linger a batch is due (``Accumulator``):
    ``TIMER_SLACK`` on trio's real clock, so that a linger's end, rounded to the
    timer's resolution, is rounded to the nearest ms instead of up (a 5 ms
    linger sealed at 4.5-5.65 ms, not at 5-6.15; the Java client's whole-ms
    clock rounds both ways too). 0 on any other clock: virtual time is exact,
    and the deterministic tests see every linger end exactly on time."""
    if _SystemClock is None or not isinstance(trio.lowlevel.current_clock(), _SystemClock):
        return 0.0
    return TIMER_SLACK


_size_of = attrgetter("_size")
# Every accepted message counts at least this many bytes (an empty record's
# worst-case batch share), so a batch of ``cap`` bytes holds at most
# ``cap // MIN_RECORD_BYTES`` of them: fill never scans a long backlog.
MIN_RECORD_BYTES = batch_size_for_record(None, None)


def fill(msgs: list[ProducerMessage], cap: int, max_messages: int) -> tuple[int, int]:
    """How many messages from the front of ``msgs`` make the next batch, and
    their bytes: the longest run within ``cap`` bytes and ``max_messages``, at
    least one (an oversized message goes alone). Prefix sums and a bisection
    over a bounded window: no per-message Python loop on the flush path."""
    window = min(max_messages, len(msgs), max(cap, 0) // MIN_RECORD_BYTES + 1)
    cumulative = list(accumulate(map(_size_of, islice(msgs, window))))
    n = bisect_right(cumulative, cap) or 1
    return n, cumulative[n - 1]


@dataclass(slots=True)
class PartitionQueue:
    sealed: deque[SealedBatch] = field(default_factory=deque)  # retried batches, sent first
    msgs: list[ProducerMessage] = field(default_factory=list)  # loose, in order
    nbytes: int = 0
    first_at: float = math.inf  # when the oldest loose message was accepted (linger)
    in_flight: int = 0  # batches of this partition on the wire (muting)
    # Set when a batch of this partition failed retriably here: nothing more
    # of it is sent, and everything goes back, until its Fin arrives.
    retrying: BaseException | None = None
    failed: list[SealedBatch] = field(default_factory=list)  # to bounce once in_flight == 0
    # True once a send_batch RowRun joined ``msgs`` (until a take finds none left):
    # a run is sealed alone, so a take must not run past one.
    has_runs: bool = False


class Accumulator:
    def __init__(self, ctx: StageContext) -> None:
        config = self._config = ctx.config
        self._ledger = ctx.ledger
        self._idem = ctx.idempotence
        self._txn = ctx.transactions
        self._flush = ctx.flush
        self._counters = ctx.counters
        self.parts: dict[TopicPartition, PartitionQueue] = {}
        self._per_partition = config.max_in_flight_per_partition
        # The largest batch sealed: batch_bytes, but never above max_message_bytes,
        # the limit the broker applies to a whole batch (sarama caps its batches
        # at MaxMessageBytes too). A batch of batch_bytes > max_message_bytes would
        # be refused with MESSAGE_TOO_LARGE, failing every message in it although
        # each one fits (test_batches_never_exceed_max_message_bytes). The sizes
        # summed here are upper bounds, so the encoded batch is never larger.
        self._batch_cap = min(config.batch_bytes, config.max_message_bytes)
        # When a partition's loose messages are due, after the first one's
        # acceptance: linger, less the timer's slack (``timer_slack``). ready()
        # and next_wake() both use it, so the flusher's timed wake and its
        # readiness check agree (a wake before it would find nothing due and
        # sleep again, up to a whole ms).
        self._linger_due = max(0.0, config.linger - timer_slack())

    def _linger_from(self, msg: ProducerMessage) -> float:
        """When the linger of a batch that ``msg`` opens started: when ``send()``
        accepted ``msg`` (its delivery deadline minus ``delivery_timeout``), as
        librdkafka counts ``linger.ms`` from ``produce()`` and the Java client
        from the append its ``send()`` does. The hops from the intake to here
        (and a wait for a leader) are then absorbed by the linger instead of
        added to it: measured at a paced 20k msg/s, the hops took 0.8 ms at the
        median. A message accepted within the last microsecond counts from now,
        exactly: the subtraction's rounding must not move a virtual time."""
        now = trio.current_time()
        accepted = msg._deadline - self._config.delivery_timeout
        return now if accepted > now - 1e-6 else accepted

    def queue(self, tp: TopicPartition) -> PartitionQueue:
        part = self.parts.get(tp)
        if part is None:
            part = self.parts[tp] = PartitionQueue()
        return part

    def add(self, part: PartitionQueue, items: list[ProducerMessage | SealedBatch]) -> None:
        """One partition producer hand-over: sealed (retried) batches first, then
        loose messages, all in order."""
        if isinstance(items[0], SealedBatch):
            n = 0
            while n < len(items) and isinstance(items[n], SealedBatch):
                n += 1
            part.sealed.extend(items[:n])  # type: ignore[arg-type]
            items = items[n:]
        if items:
            if not part.msgs:
                part.first_at = self._linger_from(items[0])  # type: ignore[arg-type]
            part.msgs.extend(items)  # type: ignore[arg-type]
            part.nbytes += sum(map(_size_of, items))
            if not part.has_runs and RowRun in set(map(type, items)):
                part.has_runs = True

    # -- readiness -----------------------------------------------------------
    def sendable(self, part: PartitionQueue, tp: TopicPartition) -> bool:
        if part.retrying is not None:
            return False
        if self._txn is not None and not self._txn.partition_ready(tp):
            return False  # transaction version 1: not added to the transaction yet
        if self._idem is not None and tp not in self._idem.confirmed:
            return part.in_flight == 0
        return part.in_flight < self._per_partition

    def ready(self, now: float) -> bool:
        if self._idem is not None and self._idem.paused:
            return False
        config = self._config
        flushing = self._flush.depth > 0
        for tp, part in self.parts.items():
            if not self.sendable(part, tp):
                continue
            if part.sealed:
                return True
            if part.msgs and (
                flushing
                or part.nbytes >= self._batch_cap
                or len(part.msgs) >= config.max_batch_messages
                or now >= part.first_at + self._linger_due
            ):
                return True
        return False

    def next_wake(self, slot_free: bool) -> float:
        """The next delivery deadline of anything queued, and, when a request
        slot is free, the next linger deadline (see ``BrokerProducer._next_wake``)."""
        linger = self._linger_due
        wake = math.inf
        for tp, part in self.parts.items():
            if part.msgs:
                wake = min(wake, part.msgs[0]._deadline)
                if slot_free and self.sendable(part, tp):
                    wake = min(wake, part.first_at + linger)
            if part.sealed:
                wake = min(wake, part.sealed[0]._deadline)
        return wake

    # -- sealing -------------------------------------------------------------
    def drain(self) -> dict[TopicPartition, SealedBatch]:
        """What the next request carries: one batch per sendable partition (a
        retried one first), within ``max_request_bytes``. Counts them in flight.

        A partition whose next batch (a retried one, or its first loose
        message) does not fit what is left of the budget ends the request, as
        in the Java client's ``RecordAccumulator.drain``: it goes first in a
        later one, unless the request is still empty (an oversized batch goes
        alone). Each partition taken here is muted up to its in-flight limit,
        so the partitions before it cannot keep it waiting for long."""
        budget = self._config.max_request_bytes
        taken: dict[TopicPartition, SealedBatch] = {}
        for tp, part in self.parts.items():
            if not self.sendable(part, tp):
                continue
            batch: SealedBatch | None = None
            while part.sealed and batch is None:
                if taken and part.sealed[0].nbytes > budget:
                    return taken
                candidate = part.sealed.popleft()
                if self.restamp(tp, candidate):
                    batch = candidate
            if batch is None:
                if not part.msgs:
                    continue
                if taken and part.msgs[0]._size > budget:
                    return taken
                msgs, size = self._take_loose(part, budget)
                batch = self._seal(tp, msgs, size)
            taken[tp] = batch
            part.in_flight += 1
            if self._idem is not None:
                self._idem.batch_sent()
            budget -= batch.nbytes
        return taken

    def unsend(self, taken: dict[TopicPartition, SealedBatch]) -> None:
        """Undo ``drain``: ``taken`` was never written. Each batch goes back to the front
        of its partition's queue, sealed (its sequences kept), and out of the in-flight
        counts."""
        for tp, batch in taken.items():
            part = self.parts[tp]
            part.sealed.appendleft(batch)
            part.in_flight -= 1
            if self._idem is not None:
                self._idem.batch_done()

    def _take_loose(self, part: PartitionQueue, budget: int) -> tuple[list[ProducerMessage], int]:
        config = self._config
        msgs = part.msgs
        if part.has_runs:
            taken = take_until_run(msgs)
            if taken is not None:
                if type(taken[0]) is RowRun:
                    size = taken[0]._size
                else:  # the messages before a run, as below
                    n, size = fill(taken, min(self._batch_cap, budget),
                                   config.max_batch_messages)
                    taken = taken[:n]
                del msgs[:len(taken)]
                part.nbytes -= size
                part.first_at = self._linger_from(msgs[0]) if msgs else math.inf
                return taken, size
            part.has_runs = False
        if (
            part.nbytes <= self._batch_cap
            and part.nbytes <= budget
            and len(msgs) <= config.max_batch_messages
        ):
            size = part.nbytes  # the common case: the whole accumulator is one batch
            part.msgs = []
            part.nbytes = 0
            part.first_at = math.inf
            return msgs, size
        n, size = fill(msgs, min(self._batch_cap, budget), config.max_batch_messages)
        taken = msgs[:n]
        del msgs[:n]
        part.nbytes -= size
        part.first_at = self._linger_from(msgs[0]) if msgs else math.inf
        return taken, size

    def _seal(self, tp: TopicPartition, msgs: list[ProducerMessage], nbytes: int) -> SealedBatch:
        config = self._config
        idem = self._idem
        first: Any = msgs[0]
        count = first.count if type(first) is RowRun else len(msgs)
        ids: dict[str, int] = {}
        if idem is not None:
            ids = {"producer_id": idem.producer_id, "producer_epoch": idem.producer_epoch,
                   "base_sequence": idem.take_sequence(tp, count)}
            if self._txn is not None:
                ids["is_transactional"] = True
                self._txn.sealed(tp)
        codec, level = config.compression_codec, config.compression_level
        records: bytes | None
        if type(first) is RowRun:  # a send_batch run: encoded from its columns
            records = first.encode(compression=codec, compression_level=level, **ids)
        else:  # the columnar kernel when built, else the Python builder
            records = encode_messages(msgs, compression=codec, compression_level=level, **ids)
            if records is None:
                builder = BatchBuilder(compression=codec, compression_level=level)
                builder.extend(msgs)
                records = builder.build(**ids)  # type: ignore[arg-type]
        self._counters.sealed(tp, count, nbytes)
        return SealedBatch(tp, msgs, records, ids.get("producer_id", -1),
                           ids.get("producer_epoch", -1), ids.get("base_sequence", -1), nbytes)

    def restamp(self, tp: TopicPartition, batch: SealedBatch) -> bool:
        """Bring a retried batch to the current epoch; False if it must not be re-sent."""
        idem = self._idem
        if idem is None or (batch.producer_id, batch.producer_epoch) == (
            idem.producer_id, idem.producer_epoch
        ):
            return True
        pending = [m for m in batch.messages if m._state == PENDING]
        if (batch.fate_unknown and not idem.never_written(batch)) or len(pending) != len(
            batch.messages
        ):
            # It may have been written under the old epoch: a re-stamped copy
            # would be a duplicate. Its outcome stays unknown.
            self._ledger.fail(pending, KafkaError(
                f"batch for {tp.topic}[{tp.partition}] may or may not have been written "
                "before the producer epoch was bumped; not re-sent, to avoid a duplicate"
            ))
            return False
        seq = idem.take_sequence(tp, record_count(batch.messages))
        batch.records = restamp_batch(
            batch.records,
            producer_id=idem.producer_id,
            producer_epoch=idem.producer_epoch,
            base_sequence=seq,
        )
        batch.producer_id, batch.producer_epoch, batch.base_sequence = (
            idem.producer_id, idem.producer_epoch, seq,
        )
        return True

    # -- delivery timeout ----------------------------------------------------
    def expire(
        self, now: float, timeout_error: Callable[[TopicPartition, None], KafkaError]
    ) -> None:
        """Fail what waits here past its delivery deadline (a sealed batch that
        expires starts a new epoch: its sequences would be a gap)."""
        ledger = self._ledger
        for tp, part in self.parts.items():
            if part.msgs and part.msgs[0]._deadline <= now:
                alive = [m for m in part.msgs if m._deadline > now]
                dead = [m for m in part.msgs if m._deadline <= now]
                part.msgs = alive
                part.nbytes = sum(map(_size_of, alive))
                if not alive:
                    part.first_at = math.inf
                ledger.fail(dead, timeout_error(tp, None))
            while part.sealed and part.sealed[0]._deadline <= now:
                batch = part.sealed.popleft()
                ledger.fail(
                    [m for m in batch.messages if m._state == PENDING], timeout_error(tp, None)
                )
                if self._idem is not None:
                    self._idem.batch_failed(batch, "delivery timeout")
