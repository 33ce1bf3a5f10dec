"""Run one `Schedule` against a FakeCluster on virtual time, deterministically.

The run happens in its own ``trio.run`` on a virtual clock (`clock.py`) that
jumps ahead whenever every task is blocked, so seconds of faults and timeouts
cost milliseconds. Everything that could differ between two runs of one schedule
is pinned: the fake's and the producer's ``random.Random`` are seeded from the
schedule, timestamps are a fixed clock, and trio's own scheduler (which
shuffles the tasks it wakes in one batch) is put in its deterministic mode
(the one trio uses under Hypothesis) with its shuffle seeded from the
schedule. So one seed is one interleaving, replayable exactly.

What happens in a run:

* the producer opens against the fake; one task per message *source* sends
  that source's messages at their times (``send()``, ``send()`` with a
  header, ``send_many()``, ``producer.input``, or a tight loop of ``send()``
  calls whose bursts become columnar: ``RowDelivery`` rows, ``burst.py``),
  recording refusals;
* the fault driver (`driver.py`) applies the schedule's events at their
  times and heals the cluster at ``heal_at``;
* flush tasks call ``flush()`` at their times;
* at ``close_at`` the producer's ``async with`` block ends (close), faults
  or not.

The `Trace` records every accepted message's outcome and settle time, the
partition logs, flushes and the close, for `checker.check`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import trio

from pipeline.producer._api import Producer, open_producer
from pipeline.producer._columnar.burst import RowDelivery
from pipeline.producer._columnar.rows import RowChunk, RowRun
from pipeline.producer._errors import (
    MessageTooLargeError,
    ProducerClosed,
)
from pipeline.producer._intake import send_path
from pipeline.producer._message import OK, PENDING, ProducerMessage
from pipeline.producer._outcomes.delivery import Delivery
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.records import LOG_APPEND_TIME, decode_record_batches
from pipeline.testing.fake_cluster import FakeCluster

from . import (  # noqa: F401 (they register)
    probes_broker,
    probes_buffer,
    probes_counts,
    probes_idempotence,
    probes_partition,
)
from .calls import (
    HEADERS,
    REFUSALS,
    Accepted,
    Awaiting,
    Batches,
    Called,
    Inputs,
    Reported,
    Rows,
    Settled,
    await_bound,
    await_each,
    batch_row,
    bound_of,
    closing_loop,
    drain,
    raises,
    send_batch,
    send_loop,
    send_many,
)
from .clock import (
    HangError,
    VirtualClock,
    collect_abandoned,
    describe_exception,
    deterministic_trio,
    time_limit,
)
from .driver import INIT_PRODUCER_ID, PRODUCE, drive_faults
from .probes import Watch, watching
from .probes_idempotence import counting_recovery_warnings
from .routing import ExplorerPartitioner
from .schedule import TOPIC, Schedule
from .trace import Attempt, Flush, Gauges, Message, Trace, value_of

__all__ = ["Attempt", "Flush", "HangError", "Message", "Trace", "run_schedule", "value_of"]
def producer_options(schedule: Schedule) -> dict[str, Any]:
    options = dict(schedule.options)
    options.update(
        idempotent=schedule.idempotent,
        max_message_bytes=schedule.max_message_bytes,
        rng=random.Random(schedule.seed),
        # a create time per record, one millisecond apart: what a record reports is
        # its own (A3), never a batch-mate's (Kafka's answer to a duplicate carries the
        # cached batch's max timestamp, even on a CreateTime topic)
        timestamp_ms=itertools.count(1_700_000_000_000).__next__,
    )
    if schedule.partitioner == "custom":
        options["partitioner"] = ExplorerPartitioner()  # (stateful: one per run)
    elif schedule.partitioner == "murmur2":
        options["partitioner"] = "murmur2"
    if schedule.topic_at:  # (its metadata is awaited until it exists, not refused)
        options["allow_auto_topic_creation"] = True
    return options


def run_schedule(schedule: Schedule, *, real_time_limit: float | None = 60.0) -> Trace:
    """Run `schedule` to the end and return what happened."""
    trace = Trace(schedule)
    abandoned = False
    watch = Watch(scripted_out_of_order=any(
        e.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER for e in schedule.events))
    try:
        with deterministic_trio(schedule.seed), time_limit(real_time_limit), watching(watch), \
                _send_path(schedule.send_path), counting_recovery_warnings(watch):
            clock = VirtualClock()
            workload = WORKLOADS[schedule.workload]
            trio.run(workload, schedule, trace, watch, clock=clock, instruments=[clock])
    except trio.TrioInternalError as exc:
        # Raised out of trio's run loop (Deadlock, Spin, HangError): the run's
        # tasks are abandoned; collect them quietly.
        cause = exc.__cause__ or exc
        trace.crash = f"{type(cause).__name__}: {cause}"
        abandoned = True
        del cause  # its traceback holds the abandoned tasks' frames: let them go
    except BaseException as exc:  # a crash anywhere is a finding, reported as such
        if isinstance(exc, KeyboardInterrupt):
            raise
        trace.crash = describe_exception(exc)
    if abandoned:
        collect_abandoned()
    trace.reached = watch.reached
    trace.guard_violations = watch.violations
    trace.epochs_started = (watch.recoveries[0], watch.recoveries[1])
    trace.produce_written, trace.lost_reports = watch.produce_written, watch.lost_reports
    trace.connections_failed = watch.connections_failed
    trace.recovery_warnings = watch.recovery_warnings
    return trace


Workload = Callable[[Schedule, Trace, Watch], Awaitable[None]]
# What a run drives, by `Schedule.workload`: it starts the fake cluster and the
# fault driver, runs its client against them and records the trace. A new state
# machine (a transactional producer, a group consumer) brings its own, with its
# invariants (checker.invariant) and guards (probes.probe, guards.GUARDS):
# docs/testing.md, "Built to grow".
WORKLOADS: dict[str, Workload] = {}


def workload(name: str) -> Callable[[Workload], Workload]:
    def register(fn: Workload) -> Workload:
        WORKLOADS[name] = fn
        return fn
    return register


@workload("producer")
async def _main(schedule: Schedule, trace: Trace, watch: Watch) -> None:
    fake = FakeCluster(
        brokers=schedule.brokers,
        seed=schedule.seed,
        max_message_bytes=schedule.max_message_bytes,
        auto_create_topics=False,
        strict_unknown_producer=schedule.strict_unknown_producer,
        min_insync_replicas=schedule.min_insync_replicas,
        tansu_sequences=schedule.tansu_sequences,
        first_producer_id=schedule.first_producer_id,
    )
    accepted: Accepted = []
    inputs: Inputs = []
    awaited: dict[int, str] = {}
    called: Called = {}
    reported: Reported = {}
    rows = Rows()
    batches: Batches = []
    async with trio.open_nursery() as root:
        await root.start(fake.run)
        configs = ({"max.message.bytes": str(schedule.topic_max_message_bytes)}
                   if schedule.topic_max_message_bytes else {})
        if schedule.log_append_time:
            configs["message.timestamp.type"] = "LogAppendTime"

        async def create_topic() -> None:
            await trio.sleep_until(schedule.topic_at)
            fake.create_topic(TOPIC, schedule.partitions, leaders=list(schedule.leaders),
                              configs=configs)

        if schedule.topic_at:
            root.start_soon(create_topic)
        else:
            await create_topic()
        producer: Producer | None = None
        try:
            async with trio.open_nursery() as users:
                try:
                    async with open_producer(
                        fake.bootstrap, connector=fake.connector, **producer_options(schedule)
                    ) as producer:
                        settled = _instrument(producer, trace, rows, schedule.resettle)
                        root.start_soon(drive_faults, fake, schedule)
                        for source in sorted({s.source for s in schedule.sends}):
                            users.start_soon(
                                _source, producer, schedule, source, accepted, inputs, trace,
                                (users, awaited), called, (rows, batches),
                            )
                        if any(s.via == "input" for s in schedule.sends):
                            users.start_soon(drain, producer.errors, reported, 1)
                            users.start_soon(drain, producer.successes, reported, 0)
                        for at in schedule.flushes:
                            users.start_soon(_flush, producer, schedule, at, trace)
                        users.start_soon(_sample_gauges, producer, schedule, trace)
                        await trio.sleep_until(schedule.close_at)
                        last = [(i, s) for i, s in enumerate(schedule.sends)
                                if closing_loop(schedule, s)]
                        if last:  # no checkpoint between its last send and the close
                            looped = await send_loop(producer, last, accepted, trace, called)
                            if last[0][1].wait and looped:
                                users.start_soon(await_each, looped, await_bound(schedule),
                                                 awaited)
                        trace.close_start = trio.current_time()
                        if schedule.abort:
                            raise _Abort  # the block ends by an error: a close without flush
                except* _Abort:
                    pass
                trace.close_end = trio.current_time()
        except Exception as exc:
            trace.crash = describe_exception(exc)
        if producer is not None:
            stats = producer.statistics()
            trace.double_settles = stats.double_settles
            trace.outstanding_after_close = stats.outstanding
            trace.buffered_after_close = stats.buffered_bytes
            trace.unfreed = _unfreed(rows)
            trace.counted = (stats.accepted, stats.succeeded, stats.failed, stats.requests_sent)
            trace.callback_errors = stats.callback_errors
            topic = stats.topics.get(TOPIC)
            trace.partition_counts = {} if topic is None else {
                p: (ps.failed_messages, ps.delivered_messages)
                for p, ps in topic.partitions.items()}
            trace.wire_counts = {} if topic is None else {
                p: (ps.batches, ps.retries, ps.retried_messages, ps.delivered_bytes)
                for p, ps in topic.partitions.items() if p >= 0}
            trace.unobserved_reported = producer._unobserved.reported
            idem = producer._core.idempotence
            if idem is not None:
                trace.idem_counts = (idem.bumps, idem.new_ids)
            delivery_timeout = schedule.option("delivery_timeout")
            channel_reports: dict[int, tuple[int, int]] = {}
            for index, msg, call, attempt in inputs:
                if not msg._id:
                    attempt.refused = "ProducerClosed"  # closed before the dispatcher took it
                    continue
                if isinstance(msg._outcome, (MessageTooLargeError, ProducerClosed)):
                    # refused the sarama way: accepted, then failed at once
                    attempt.refused = type(msg._outcome).__name__
                accepted.append((index, msg, msg._deadline - delivery_timeout, call))
                counts = reported.get(id(msg), (msg, [0, 0]))[1]
                channel_reports[index] = (counts[0], counts[1])
            for index, sent, at, call in accepted:
                rec = _record(index, sent, at, settled)
                rec.call = call
                rec.awaited = awaited.get(index, "")
                if index in called:
                    rec.called = "; ".join(called[index]) or "never called"
                    if raises(index):
                        trace.callbacks_raised += len(called[index])
                rec.reported = channel_reports.get(index)
                rec.attempts, rec.splits = watch.attempts_of(sent)
                if index in trace.columnar:  # (sent as a row of its run: a row's count)
                    rec.attempts, rec.splits = -1, 0
                trace.messages.append(rec)
            for index, row_id, at, call in batches:
                trace.messages.append(batch_row(schedule, index, row_id, at, call, rows,
                                                 settled))
        trace.messages.sort(key=lambda m: m.id)
        for p in range(schedule.partitions):
            entries = fake.log(TOPIC, p)
            trace.logs[p] = [e.record.value or b"" for e in entries]
            trace.log_times[p] = [
                e.batch.max_timestamp if e.batch.timestamp_type == LOG_APPEND_TIME
                else e.batch.base_timestamp + e.record.timestamp_delta for e in entries]
            trace.state_lost[p] = {
                offset
                for stored in fake.partition(TOPIC, p).batches if stored.state_lost
                for offset in range(stored.base_offset, stored.last_offset + 1)
            }
        window = (schedule.heal_at + schedule.option("delivery_timeout")
                  + schedule.option("request_timeout"),
                  schedule.close_at - schedule.option("delivery_timeout"))
        if any(not m.ok and window[0] <= m.accepted_at <= window[1] for m in trace.messages):
            trace.sent = _sent_values(fake)
        trace.oversized = _oversized(fake, schedule.max_message_bytes)
        if any(m.cause.startswith("BrokerResponseError") for m in trace.messages):
            trace.answered = _answered(fake)
        trace.produce_requests = [(r.time, r.request) for r in fake.requests_of(PRODUCE)
                                  if r.request is not None]
        trace.init_requests = [(r.time, r.request) for r in fake.requests_of(INIT_PRODUCER_ID)
                               if r.request is not None]
        trace.init_answers = [(at, response.error_code)
                              for at, _, response in fake.answers_of(INIT_PRODUCER_ID)]
        trace.end_time = trio.current_time()
        root.cancel_scope.cancel()


@contextmanager
def _send_path(kind: str) -> Iterator[None]:
    """Producers opened in the block use ``kind``'s send() ("": the default)."""
    if not kind:
        yield
        return
    before = send_path.SEND_PATH
    send_path.use(kind)
    try:
        yield
    finally:
        send_path.use(before)


class _Abort(Exception):
    """Raised in the producer's block at ``close_at`` when ``Schedule.abort``."""


def _sent_values(fake: FakeCluster) -> set[bytes]:
    sent: set[bytes] = set()
    for r in fake.requests_of(PRODUCE):
        if r.request is None:
            continue
        for topic in r.request.topic_data:
            for part in topic.partition_data:
                for batch in decode_record_batches(bytes(part.records or b"")):
                    sent.update(rec.value or b"" for rec in batch.records)
    return sent


def _answered(fake: FakeCluster) -> dict[bytes, list[int]]:
    """Each record value's error codes in the Produce answers written for it."""
    answered: dict[bytes, list[int]] = {}
    for _, request, response in fake.answers_of(PRODUCE):
        codes = {(t.name, p.index): p.error_code
                 for t in response.responses for p in t.partition_responses}
        for topic in request.topic_data:
            for part in topic.partition_data:
                code = codes.get((topic.name, part.index))
                if code is None:
                    continue
                for batch in decode_record_batches(bytes(part.records or b"")):
                    for rec in batch.records:
                        answered.setdefault(rec.value or b"", []).append(code)
    return answered


def _oversized(fake: FakeCluster, limit: int) -> list[tuple[int, int]]:
    return [
        (part.index, len(part.records))
        for r in fake.requests_of(PRODUCE) if r.request is not None
        for topic in r.request.topic_data
        for part in topic.partition_data
        if part.records is not None and len(part.records) > limit
    ]


def _record(index: int, msg: ProducerMessage | Delivery, at: float,
            settled: Settled) -> Message:
    """What became of one accepted message, read as its sender can read it."""
    if type(msg) is RowDelivery:
        # A row of a columnar send() burst: no _id of its own; the rows of a
        # burst hold the consecutive ids from its chunk's first, in send order.
        burst = msg._rows
        msg_id, deadline = burst.chunk._id + msg._row, burst.deadline
    else:
        msg_id, deadline = msg._id, msg._deadline  # type: ignore[union-attr]
    rec = Message(index, msg_id, msg.value or b"", at, deadline, partition=msg.partition)
    rec.row = type(msg) is RowDelivery
    rec.ok = msg._state == OK
    rec.pending = msg._state == PENDING
    rec.offset = msg.offset
    rec.timestamp = msg.timestamp if rec.ok and msg.timestamp is not None else -1
    if msg._outcome is not None:
        rec.cause = f"{type(msg._outcome).__name__}: {msg._outcome}"
    rec.settled_at, rec.settled_closing = settled.get(msg_id, (None, False))
    return rec


def _unfreed(rows: Rows) -> int:
    """Settled runs of rows whose chunk had its last row settled but still holds what
    only unsettled rows need: the runs (they and the chunk point at each other), a
    send() burst's outcomes and callbacks and its runs' packed columns (a copy;
    a send_batch's are the caller's own lists), send_many's messages."""
    runs = {id(run): run for run, _ in rows.runs.values()}
    n = 0
    for run in runs.values():
        chunk = run._sink
        if type(chunk) is RowChunk and not chunk.pending and (
                chunk.runs or chunk.outcomes is not None or chunk.messages is not None
                or (chunk.group is None and run.columns is not None)):
            n += 1
    return n


def _instrument(producer: Producer, trace: Trace, rows: Rows,
                resettle: bool = False) -> Settled:
    """Record when each message is settled (wrapping the ledger's two settle
    calls): by ledger id; a settled run of rows (a send() burst's or a
    send_batch() call's) settles its rows, whose ids are its chunk's first id +
    their row numbers in the chunk. ``resettle``: settle the first half of every
    batch of two or more first, with the same answer (Schedule.resettle)."""
    ledger, intake = producer._ledger, producer._intake
    settled: Settled = {}
    succeed, fail, accept_rows = ledger.succeed, ledger.fail, ledger.accept_rows

    def mark(msgs: Any, time: float) -> None:
        now = (time, intake.closing)
        for m in msgs:
            if m._state != PENDING:
                continue  # (the ledger counts it as settled twice)
            if type(m) is RowRun and type(m._sink) is RowChunk:
                first = m._sink._id
                for pos, row in enumerate(range(m.count) if m.rows is None else m.rows):
                    if first + row in settled:  # in two runs: the ledger cannot see it
                        trace.rows_settled_twice += 1
                    settled[first + row] = now
                    rows.runs[first + int(row)] = (m, pos)
            else:
                settled[m._id] = now

    def on_accept_rows(chunk: RowChunk, n: int) -> None:
        accept_rows(chunk, n)
        rows.chunks.append((chunk, n, trio.lowlevel.current_task()))

    def first_half(msgs: list[Any]) -> list[Any]:
        half = msgs[:len(msgs) // 2] if resettle else []
        trace.resettled += sum(m._state == PENDING for m in half)
        return half

    def on_succeed(msgs: Any, base_offset: int, timestamp: int) -> None:
        mark(msgs, trio.current_time())
        if half := first_half(msgs):
            succeed(half, base_offset, timestamp)
        succeed(msgs, base_offset, timestamp)

    def on_fail(msgs: Any, cause: BaseException, *, reported: bool = False) -> None:
        msgs = list(msgs)
        mark(msgs, trio.current_time())
        if half := first_half(msgs):
            fail(half, cause, reported=reported)
        fail(msgs, cause, reported=reported)

    fail_all = ledger.fail_all_outstanding

    def on_fail_all(cause: BaseException) -> int:
        before = len(settled)
        reported = fail_all(cause)
        trace.close_failed = (reported, len(settled) - before)
        return reported

    ledger.succeed = on_succeed  # type: ignore[method-assign]
    ledger.fail = on_fail  # type: ignore[method-assign]
    ledger.fail_all_outstanding = on_fail_all  # type: ignore[method-assign]
    ledger.accept_rows = on_accept_rows  # type: ignore[method-assign,assignment]
    return settled


async def _source(
    producer: Producer,
    schedule: Schedule,
    source: int,
    accepted: Accepted,
    inputs: Inputs,
    trace: Trace,
    awaiting: Awaiting,
    called: Called,
    bulk: tuple[Rows, Batches],
) -> None:
    mine = [(i, s) for i, s in enumerate(schedule.sends)
            if s.source == source and not closing_loop(schedule, s)]
    pos = 0
    while pos < len(mine):
        index, send = mine[pos]
        await trio.sleep_until(send.at)  # (a scheduler pass even when it is due already)
        if send.via == "loop":
            group = [(index, send)]
            while (pos + len(group) < len(mine) and mine[pos + len(group)][1].via == "loop"
                   and mine[pos + len(group)][1].at == send.at):
                group.append(mine[pos + len(group)])
            pos += len(group)
            sent = await send_loop(producer, group, accepted, trace, called)
            if send.wait and sent:
                nursery, awaited = awaiting
                nursery.start_soon(await_each, sent, await_bound(schedule), awaited)
            continue
        if send.via in ("many", "batch"):
            group = [(index, send)]
            while (pos + len(group) < len(mine) and mine[pos + len(group)][1].via == send.via
                   and mine[pos + len(group)][1].at == send.at):
                group.append(mine[pos + len(group)])
            pos += len(group)
            if send.via == "many":
                await send_many(producer, group, accepted, trace, awaiting[0],
                                 await_bound(schedule))
            else:
                await send_batch(producer, group, trace, awaiting[0], await_bound(schedule),
                                  *bulk)
            continue
        pos += 1
        key = send.key.encode() if send.key is not None else None
        value = value_of(index, send.size)
        attempt = Attempt((index,), (bound_of(send, index),), "")
        trace.attempts.append(attempt)
        start = trace.step()
        if send.via == "input":
            # sarama-style: accepted by the dispatcher later; an invalid message is
            # accepted and then failed (its outcome goes to producer.errors)
            msg = ProducerMessage(TOPIC, value, key, partition=send.partition)
            try:
                await producer.input.send(msg)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                attempt.refused = "ProducerClosed"
                continue
            inputs.append((index, msg, (start, trace.step(), 0), attempt))
            continue
        try:
            delivery: Delivery | None = None
            if send.via == "nowait":
                delivery = producer.send_nowait(TOPIC, value, key=key, partition=send.partition)
            else:
                # "timed": a user's timeout around the call; cancelled, it was not accepted
                with trio.move_on_after(send.within if send.via == "timed" else math.inf):
                    delivery = await producer.send(
                        TOPIC, value, key=key, partition=send.partition,
                        headers=HEADERS if send.via == "headers" else None,
                    )
            if delivery is None:
                attempt.refused = "Cancelled"
                continue
        except REFUSALS as exc:
            attempt.refused, attempt.detail = type(exc).__name__, str(exc)
            continue
        accepted.append((index, delivery, trio.current_time(), (start, trace.step(), 0)))


async def _sample_gauges(producer: Producer, schedule: Schedule, trace: Trace) -> None:
    """Read statistics() just after each send, fault and flush instant before the
    close (at most ``GAUGE_SAMPLES``), when records wait and fly (checker O9)."""
    instants = sorted({round(t + GAUGE_DELAY, 6) for t in (
        *(s.at for s in schedule.sends), *(e.at for e in schedule.events), *schedule.flushes)
        if t + GAUGE_DELAY < schedule.close_at})
    for at in instants[:GAUGE_SAMPLES]:
        await trio.sleep_until(at)
        stats = producer.statistics()
        topic = stats.topics.get(TOPIC)
        parts = {} if topic is None else {
            p: (ps.queued_messages, ps.queued_bytes, ps.in_flight_batches,
                ps.in_flight_messages, ps.in_flight_bytes)
            for p, ps in topic.partitions.items()}
        requests = max((bp.on_the_wire()[0] for bp in producer._core.broker_producers()),
                       default=0)
        held = producer._ledger.outstanding.values()
        # (the ledger's own sizes of what it waits for; a row chunk's are its rows')
        sizes = [-1 if isinstance(m, RowChunk) else m._size for m in held]
        outstanding = -1 if -1 in sizes else sum(sizes)
        trace.gauges.append(Gauges(at, stats.accepted - stats.succeeded - stats.failed, parts,
                                   _at_rest(producer), requests, outstanding))


GAUGE_DELAY, GAUGE_SAMPLES = 0.0005, 100


def _at_rest(producer: Producer) -> bool:
    """Nothing between the stages: the dispatcher, every topic producer and every
    broker producer wait for their empty inboxes (holding nothing they took), and the
    partition producers' inboxes are empty, so every record not settled is one the
    partition and broker stages count."""
    core = producer._core
    dispatcher = producer._dispatcher
    waiting_empty = [dispatcher._inbox.statistics(),
                     *(c.statistics() for c in dispatcher._topics.values()),
                     *(bp._inbox.statistics() for bp in core.broker_producers())]
    empty = [pp._inbox.statistics() for pp in core.partition_producers()]
    return (all(st.current_buffer_used == 0 and st.tasks_waiting_receive for st in waiting_empty)
            and all(st.current_buffer_used == 0 for st in empty))


async def _flush(producer: Producer, schedule: Schedule, at: float, trace: Trace) -> None:
    await trio.sleep_until(at)
    ledger = producer._ledger
    start = trio.current_time()
    step = trace.step()  # every send() call that returned before this one is covered
    last_id = ledger.last_accepted_id
    # Far beyond any bound the checker applies: only a stuck flush gets here.
    limit = 3 * (schedule.option("delivery_timeout") + schedule.option("request_timeout")
                 + schedule.option("close_timeout"))
    with trio.move_on_after(limit) as scope:
        try:
            await producer.flush()
        except ProducerClosed:
            pass
    unsettled = tuple(i for i in ledger.outstanding if i <= last_id)
    trace.flushes.append(Flush(start, trio.current_time(), last_id, unsettled,
                               scope.cancelled_caught, step))

