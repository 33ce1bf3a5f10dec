"""The ledger: accepted messages, buffer memory, and settling outcomes.

Strategy: every accepted message is entered here when ``send()`` (or the
dispatcher, for ``producer.input``) accepts it, and leaves when it is
*settled*: success or failure, exactly once. Stages never hold the only
reference to a message's fate: when the producer is torn down, whatever is
still in ``outstanding`` is failed with ``ProducerClosed``, so no message can
be lost in a channel buffer or a cancelled task.

Buffer memory is the producer's single global bound (like Java's
``buffer.memory``): bytes are reserved before a message is accepted and
released when its outcome has been handed to the user. Internal queues,
including the retry back-edge, only ever hold accepted messages, so they are
all bounded by it in bytes.

Messages put on ``producer.input`` report their outcome on two channels (the
sarama API): failures always on ``errors``, successes on ``successes`` when
``return_successes``. The ledger queues those outcomes (``reports``) when it
settles such a message, and the ``Reporter`` task hands them over, blocking
on the user if they do not read: their bytes stay reserved until the user
has taken the outcome, so a user who never reads gets backpressure, not
unbounded memory. The ``Reporter`` owns the send sides of both channels.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import islice
from operator import attrgetter
from typing import TYPE_CHECKING

import trio

from pipeline.producer._columnar.messages import settle
from pipeline.producer._columnar.rows import RowChunk, RowRun, RowsError
from pipeline.producer._errors import BufferFullError, ProducerError
from pipeline.producer._message import (
    FAILED,
    OK,
    PENDING,
    TO_CHANNELS,
    DeliveryCallback,
    ProducerMessage,
    RecordMetadata,
)
from pipeline.producer._outcomes.delivery import DeliveryGroup, OnDelivery
from pipeline.producer._outcomes.unobserved import Unobserved
from pipeline.producer._speedups import fields
from pipeline.producer._speedups.fields import slots

if TYPE_CHECKING:
    from pipeline.producer._columnar.burst import RowOutcomes

log = logging.getLogger("pipeline.producer")
_new_metadata = tuple.__new__
_size_of = attrgetter("_size")


class Ledger:
    # The fields send()'s row branch in C reads and writes (_send.c, at these
    # slots' offsets); everything else lives in the instance dict (tests and the
    # explorer replace methods on an instance).
    __slots__ = slots(fields.SEND_LEDGER, ("__dict__",))

    def __init__(self, buffer_memory: int, max_block: float) -> None:
        self.buffer_memory = buffer_memory
        self.max_block = max_block
        # {message id: message}, insertion ordered: the oldest unsettled
        # message is first, which is what flush() waits on.
        # A send_batch chunk is one entry (a RowChunk, under its first id).
        #: Where failures nobody reads are kept until reported (set by the producer).
        self.unobserved: Unobserved | None = None
        self.outstanding: dict[int, ProducerMessage | RowChunk] = {}
        self.buffered_bytes = 0
        self._next_id = 1
        self._space_freed: trio.Event | None = None  # exists only while someone waits
        self._progress: trio.Event | None = None  # exists only while flush() waits
        # Outcomes of channel-mode messages waiting for the results task; their
        # bytes stay reserved until the user has received them (backpressure).
        self.reports: deque[ProducerMessage] = deque()
        self.reports_ready = trio.Event()
        self.return_successes = False
        # Counters (statistics(); tests assert on them).
        self._unaccepted = 0  # ids handed out to messages that were then not accepted
        self.succeeded = 0
        self.failed = 0
        self.double_settles = 0
        self.callback_errors = 0  # on_delivery callbacks that raised
        # Records failed per (topic, partition); -1: failed before a partition was
        # chosen (an unknown topic, a close). Counted per run of one partition.
        self.failed_by_partition: dict[tuple[str, int], int] = {}

    # -- memory ------------------------------------------------------------
    def try_reserve(self, size: int) -> bool:
        if self.buffered_bytes + size > self.buffer_memory and self.buffered_bytes > 0:
            return False
        self.buffered_bytes += size
        return True

    def reserve_over(self, size: int) -> None:
        """Count ``size`` bytes now, even over ``buffer_memory`` (a message the
        dispatcher must accept without waiting; see InputAcceptance.accept)."""
        self.buffered_bytes += size

    async def reserve(self, size: int) -> None:
        """Wait up to ``max_block`` for ``size`` bytes of buffer memory."""
        if self.try_reserve(size):
            return
        with trio.move_on_after(self.max_block) as scope:
            while not self.try_reserve(size):
                if self._space_freed is None:
                    self._space_freed = trio.Event()
                await self._space_freed.wait()
        if scope.cancelled_caught:
            raise BufferFullError(
                f"buffer_memory ({self.buffer_memory} bytes) stayed full for max_block="
                f"{self.max_block}s: brokers are not keeping up or unreachable; "
                "raise buffer_memory or max_block, or slow down"
            )

    def release(self, size: int) -> None:
        self.buffered_bytes -= size
        if self._space_freed is not None:
            self._space_freed.set()
            self._space_freed = None

    def buffer_full_error(self, size: int) -> BufferFullError:
        return BufferFullError(
            f"buffer_memory is full ({self.buffered_bytes} of {self.buffer_memory} bytes used, "
            f"message needs {size}): use await send() to wait for space, or raise buffer_memory"
        )

    # -- accepting ---------------------------------------------------------
    def accept(self, msg: ProducerMessage, deadline: float) -> None:
        msg._id = self._next_id
        self._next_id += 1
        msg._deadline = deadline
        self.outstanding[msg._id] = msg

    def admit(self, msg: ProducerMessage, size: int, deadline: float) -> bool:
        """``send()``'s one ledger call per message: reserve ``size`` bytes if
        they fit now and ``accept`` the message. False: no room (nothing done;
        the caller waits with ``reserve`` and then calls ``accept``)."""
        used = self.buffered_bytes
        if used + size > self.buffer_memory and used:
            return False
        self.buffered_bytes = used + size
        msg_id = msg._id = self._next_id
        self._next_id = msg_id + 1
        msg._deadline = deadline
        self.outstanding[msg_id] = msg
        return True

    def admit_row(self, size: int) -> bool:
        """``send()``'s ledger call for a row of the open columnar burst (its
        chunk is ``outstanding`` already, under its first id): reserve ``size``
        bytes if they fit now and hand out the row's id. False: no room."""
        used = self.buffered_bytes
        if used + size > self.buffer_memory and used:
            return False
        self.buffered_bytes = used + size
        self._next_id += 1
        return True

    def accept_all(self, msgs: list[ProducerMessage], deadline: float, sink: DeliveryGroup) -> None:
        """``accept`` for a ``send_many`` chunk: consecutive ids, one deadline,
        every message reporting to the call's group."""
        first_id = self._next_id
        for msg_id, m in enumerate(msgs, first_id):
            m._id = msg_id
            m._deadline = deadline
            m._sink = sink
        self._next_id = first_id + len(msgs)
        self.outstanding.update(zip(range(first_id, self._next_id), msgs, strict=True))

    def accept_rows(self, chunk: RowChunk, rows: int) -> None:
        """Accept a ``send_batch`` chunk of ``rows`` rows: ids ``chunk._id`` ..
        ``chunk._id + rows - 1``, one ``outstanding`` entry (its first id)."""
        chunk._id = self._next_id
        self._next_id += rows
        self.outstanding[chunk._id] = chunk

    def unaccept_rows(self, chunk: RowChunk, rows: int, nbytes: int) -> None:
        """Undo ``accept_rows`` (the chunk never reached the intake) and give
        back the ``nbytes`` it reserved."""
        del self.outstanding[chunk._id]
        self._unaccepted += rows
        self.release(nbytes)

    def unaccept(self, msg: ProducerMessage) -> None:
        """Undo ``accept`` for a message that never reached the intake (its
        enqueue was cancelled): it was never accepted, so it gets no outcome."""
        del self.outstanding[msg._id]
        msg._id = 0
        self._unaccepted += 1
        self.release(msg._size)

    @property
    def accepted(self) -> int:
        """Messages accepted so far (ids are handed out in acceptance order)."""
        return self._next_id - 1 - self._unaccepted

    @property
    def last_accepted_id(self) -> int:
        return self._next_id - 1

    # -- settling ----------------------------------------------------------
    def succeed(self, msgs: Sequence[ProducerMessage], base_offset: int, timestamp: int) -> None:
        """Settle ``msgs`` (one batch, in order) as written at ``base_offset + i``.

        ``base_offset`` < 0 means the broker gave no offset (acks=0, duplicate).
        ``timestamp`` >= 0 is the broker's LogAppendTime.
        """
        offset = base_offset
        step = 1 if base_offset >= 0 else 0
        outstanding = self.outstanding
        # Every byte is released here at once, except those of messages that
        # release their own (_finish) or were settled before (a bug, counted).
        released = sum(map(_size_of, msgs))
        count = len(msgs)
        repeats: set[int] | None = None  # ids settled before (a bug): left as they are
        for msg in msgs:
            if msg._state:  # not PENDING
                self._double_settle(msg)
                count -= 1
                released -= msg._size
                offset += step  # the others keep their own positions in the batch
                if repeats is None:
                    repeats = set()
                repeats.add(id(msg))
                continue
            msg._state = OK
            msg.offset = offset
            offset += step
            sink = msg._sink
            if sink is None:
                del outstanding[msg._id]  # the common case of _finish, inlined
            elif type(sink) is DeliveryGroup:
                del outstanding[msg._id]  # _finish + DeliveryGroup.count, inlined
                sink.delivered += 1
                sink.pending -= 1
                if not sink.pending:
                    sink.wake()  # waiters run after this loop, timestamps set
            elif callable(sink):  # on_delivery: _finish + _call_back, inlined (per message)
                del outstanding[msg._id]
                if timestamp >= 0:
                    msg.timestamp = timestamp  # before anyone hears of the outcome
                try:
                    sink(_new_metadata(RecordMetadata, (
                        msg.topic, msg.partition, msg.offset, msg.timestamp, step == 1)), None)
                except Exception:
                    self._callback_failed(sink, msg)
            elif type(sink) is OnDelivery:  # the same, and someone awaits the delivery
                del outstanding[msg._id]
                if timestamp >= 0:
                    msg.timestamp = timestamp
                try:
                    sink.fn(_new_metadata(RecordMetadata, (
                        msg.topic, msg.partition, msg.offset, msg.timestamp, step == 1)), None)
                except Exception:
                    self._callback_failed(sink.fn, msg)
                assert sink.event is not None, "made only by Delivery._park, with its event"
                sink.event.set()
            elif type(sink) is RowChunk:
                count += msg.count - 1  # type: ignore[attr-defined]  # a RowRun: its rows
                if timestamp >= 0:
                    msg.timestamp = timestamp  # before its rows' callbacks hear of it
                self._rows_settled(msg, sink)  # (its bytes: released below with the rest)
            else:  # TO_CHANNELS or a waiter's event: both hear of it after this loop
                released -= msg._size
                self._finish(msg)
        if timestamp >= 0:
            for msg in msgs:
                if msg._state == OK and (repeats is None or id(msg) not in repeats):
                    msg.timestamp = timestamp
        self.succeeded += count
        if released:
            self.release(released)
        self._signal_progress()

    def _double_settle(self, msg: ProducerMessage) -> None:
        self.double_settles += 1
        log.error("message settled twice (bug): %r", msg)

    def fail(self, msgs: Iterable[ProducerMessage], cause: BaseException, *,
             reported: bool = False) -> None:
        """Settle ``msgs`` failed with ``cause``. ``reported``: the caller tells the user
        itself (a close), so the failures are not also unobserved ones."""
        unobserved = None if reported else self.unobserved
        by_partition = self.failed_by_partition
        where = ("", -2)  # (no partition is -2)
        run = 0  # records failed in a row for ``where``
        for msg in msgs:
            if msg._state != PENDING:
                self._double_settle(msg)
                continue
            msg._state = FAILED
            msg._outcome = cause
            partition = msg.partition
            if partition is None:
                partition = -1
            if partition != where[1] or msg.topic != where[0]:
                if run:
                    by_partition[where] = by_partition.get(where, 0) + run
                where = (msg.topic, partition)
                run = 0
            sink = msg._sink
            if type(sink) is RowChunk:
                n: int = msg.count  # type: ignore[attr-defined]
                run += n
                self.failed += n
                if unobserved is not None:
                    if sink.group is not None:
                        unobserved.add(sink.group, msg.topic, msg.partition, n, cause)
                    elif unheard := sink.outcomes.unheard(msg):  # (rows with no on_delivery)
                        unobserved.add(unheard, msg.topic, msg.partition, len(unheard.rows),
                                       cause)
                self._rows_settled(msg, sink)
                self.release(msg._size)
                continue
            run += 1
            self.failed += 1
            if unobserved is not None and (sink is None or type(sink) is DeliveryGroup):
                unobserved.add(msg if sink is None else sink, msg.topic, msg.partition, 1,
                               cause)
            self._finish(msg)
        if run:
            by_partition[where] = by_partition.get(where, 0) + run
        self._signal_progress()

    def _finish(self, msg: ProducerMessage) -> None:
        del self.outstanding[msg._id]
        sink = msg._sink
        if sink is TO_CHANNELS:
            if msg._state == FAILED or self.return_successes:
                self.reports.append(msg)
                self.reports_ready.set()
                return  # its bytes stay reserved until the user takes the outcome
        elif type(sink) is DeliveryGroup:
            sink.count(msg)
        elif type(sink) is OnDelivery or callable(sink):
            self._call_back(msg, sink)
        elif sink is not None:
            sink.set()  # type: ignore[attr-defined]  # a trio.Event: someone awaits it
        self.release(msg._size)

    def _rows_settled(self, run: ProducerMessage, chunk: RowChunk) -> None:
        """A run of a ``send_batch`` chunk settled (``_state`` set): count its
        rows into the call's group; the chunk leaves ``outstanding`` (flush
        waits on it) with its last row."""
        n: int = run.count  # type: ignore[attr-defined]
        group = chunk.group
        if group is None:  # a send() burst: its rows' deliveries read the outcome
            outcomes = chunk.outcomes
            outcomes.record(run)
            if outcomes.on_delivery is not None:
                self._call_back_rows(outcomes, run)
        elif (msgs := chunk.messages) is not None:  # send_many's messages (messages.py)
            settle(msgs, run)  # each row's outcome onto its message, as succeed/fail write it
            if run._state == OK:
                group.delivered += n
            else:
                group.failed += n
                room = group.MAX_ERRORS_KEPT - len(group.errors)
                if room > 0:
                    rows = range(n) if run.rows is None else run.rows  # type: ignore[attr-defined]
                    cause = run._outcome
                    assert cause is not None
                    group.errors.extend(ProducerError(msgs[row], cause)
                                        for row in islice(rows, room))
        elif run._state == OK:
            group.delivered += n
        else:
            group.failed += n
            if len(group.errors) < group.MAX_ERRORS_KEPT:
                assert run._outcome is not None
                group.errors.append(RowsError(run, run._outcome))
        if group is not None:
            group.pending -= n
            if not group.pending:
                group.wake()
        chunk.pending -= n
        if not chunk.pending:
            del self.outstanding[chunk._id]
            # Runs point at their chunk (_sink) and it at them: break the cycle now,
            # or the chunk's columns wait for the cyclic GC (found measuring peak RSS:
            # seven calls' columns alive at once instead of the two in flight).
            runs: list[RowRun] = chunk.runs
            chunk.runs = []
            chunk.messages = None  # (each has its outcome: the caller's again)
            if chunk.outcomes is not None:  # a send() burst
                # Every row heard its callback: drop them (a callback may refer to
                # its own delivery) and the outcomes (its runs point at the chunk).
                chunk.outcomes.on_delivery = chunk.outcomes.metadata = None
                chunk.outcomes = None
                # Kept deliveries reach the runs (outcomes.runs) for their offsets, never
                # the packed columns, which nothing reads once every row settled:
                # freed now, not with the last delivery (measured: a loop keeping
                # 1M deliveries held all 1M rows' packed copy, ~110 MB, and ran
                # 2.3x the collections of one that kept none).
                for each in runs:
                    each.columns = None  # type: ignore[assignment]  # (settled: never read)
            if chunk.extra:
                self.release(chunk.extra)  # the chunk's copied columns

    def _call_back(self, msg: ProducerMessage, sink: OnDelivery | DeliveryCallback) -> None:
        """Run a failed message's ``on_delivery`` callback, once (``succeed``
        runs a delivered message's callback itself, inlined). An exception from
        it is the user's bug: logged with its traceback and counted
        (``statistics().callback_errors``), never allowed into the stage that
        settled the message (it would stop the pipeline)."""
        assert msg._state == FAILED
        assert msg._outcome is not None
        fn: DeliveryCallback = sink.fn if isinstance(sink, OnDelivery) else sink
        try:
            fn(None, ProducerError(msg, msg._outcome))
        except Exception:
            self._callback_failed(fn, msg)
        if type(sink) is OnDelivery:
            assert sink.event is not None, "made only by Delivery._park, with its event"
            sink.event.set()

    def _call_back_rows(self, outcomes: RowOutcomes, run: ProducerMessage) -> None:
        """The ``on_delivery`` callback of each row of a settled run of a
        columnar ``send()`` burst, once per row, in row order; an exception is
        logged and counted (as ``_call_back``), and the next row still hears."""
        outcomes.call_back(run, self._callback_failed)  # type: ignore[arg-type]

    def _callback_failed(self, fn: DeliveryCallback, msg: object) -> None:
        """(called from an ``except`` block: logs the exception in flight)"""
        self.callback_errors += 1
        log.exception("on_delivery callback %r raised for %r", fn, msg)

    def _signal_progress(self) -> None:
        if self._progress is not None:
            self._progress.set()
            self._progress = None

    # -- reports (channel-mode outcomes, for the report task) -----------------
    async def wait_reports(self) -> None:
        """Wait until ``reports`` may have gained an outcome since the last wait."""
        await self.reports_ready.wait()
        self.reports_ready = trio.Event()

    # -- flushing ----------------------------------------------------------
    def settled_through(self, last_id: int) -> bool:
        """True when every message accepted up to ``last_id`` is settled."""
        for oldest in self.outstanding:
            return oldest > last_id
        return True

    async def wait_settled_through(self, last_id: int) -> None:
        while not self.settled_through(last_id):
            if self._progress is None:
                self._progress = trio.Event()
            await self._progress.wait()

    def fail_all_outstanding(self, cause: BaseException) -> int:
        """Fail everything not settled yet; returns how many messages (rows) that was."""
        msgs: list[ProducerMessage] = []
        rows = 0
        for entry in list(self.outstanding.values()):
            if type(entry) is RowChunk:
                if entry.burst is not None:
                    # A send() burst the dispatcher never took (it may sit in the
                    # intake, or in the cancelled dispatcher's hands): sealed now,
                    # so its run counts its rows.
                    entry.burst.seal()
                    entry.burst = None
                pending = [r for r in entry.runs if r._state == PENDING]
                rows += entry.pending
                msgs.extend(pending)  # type: ignore[arg-type]  # RowRuns settle as messages
            else:
                msgs.append(entry)  # type: ignore[arg-type]
                rows += 1
        self.fail(msgs, cause, reported=True)
        return rows

    def error_for(self, msg: ProducerMessage) -> ProducerError:
        assert msg._state == FAILED
        assert msg._outcome is not None
        return ProducerError(msg, msg._outcome)


class Reporter:
    def __init__(self, ledger: Ledger, channel_capacity: int) -> None:
        self._ledger = ledger
        self._successes, self.successes = trio.open_memory_channel[ProducerMessage](
            channel_capacity
        )
        self._errors, self.errors = trio.open_memory_channel[ProducerError](channel_capacity)
        self._closed = False  # close() ran: nobody hands reports over any more

    async def run(self) -> None:
        """Hand outcomes over as the ledger queues them (until cancelled)."""
        ledger = self._ledger
        while True:
            await ledger.wait_reports()
            while ledger.reports:
                # Popped before the send: trio's send() hands the item over and
                # then yields, and shutdown's close() must not see it again.
                msg = ledger.reports.popleft()
                try:
                    if msg._state == OK:
                        await self._successes.send(msg)
                    else:
                        await self._errors.send(ledger.error_for(msg))
                except BaseException:
                    # A failed trio send() delivered nothing. If close() ran between
                    # the cancel and this task seeing it, nobody hands reports over
                    # any more: the outcome is lost, and its bytes are released
                    # here; otherwise it goes back to the queue, for close().
                    if self._closed:
                        ledger.release(msg._size)
                        _log_lost(1)
                    else:
                        ledger.reports.appendleft(msg)
                    raise
                ledger.release(msg._size)

    def close(self) -> None:
        """At shutdown (``run`` is cancelled): hand over what fits without
        waiting, count the rest as lost (logged), release every byte, and
        close both channels (readers see the end)."""
        self._closed = True
        ledger = self._ledger
        lost = 0
        while ledger.reports:
            msg = ledger.reports.popleft()
            try:
                if msg._state == OK:
                    self._successes.send_nowait(msg)
                else:
                    self._errors.send_nowait(ledger.error_for(msg))
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                lost += 1
            ledger.release(msg._size)
        if lost:
            _log_lost(lost)
        self._successes.close()
        self._errors.close()


def _log_lost(n: int) -> None:
    log.warning(
        "%d outcomes could not be handed over: producer.successes/errors were not drained", n
    )
