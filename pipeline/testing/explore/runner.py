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

import random
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import trio

from pipeline.producer._api import Producer, open_producer
from pipeline.producer._columnar.burst import RowDelivery
from pipeline.producer._columnar.rows import RowChunk, RowRun
from pipeline.producer._errors import (
    BufferFullError,
    MessageTooLargeError,
    ProducerClosed,
    ProducerError,
)
from pipeline.producer._intake import send_path
from pipeline.producer._message import OK, PENDING, ProducerMessage, RecordMetadata
from pipeline.producer._outcomes.delivery import Delivery
from pipeline.protocol.errors import ErrorCode
from pipeline.protocol.records import batch_size_for_record, decode_record_batches
from pipeline.testing.fake_cluster import FakeCluster

from .clock import (
    HangError,
    VirtualClock,
    collect_abandoned,
    describe_exception,
    deterministic_trio,
    time_limit,
)
from .driver import PRODUCE, drive_faults
from .probes import Watch, watching
from .schedule import TOPIC, Schedule, Send
from .trace import Attempt, Flush, Message, Trace, value_of

__all__ = ["Attempt", "Flush", "HangError", "Message", "Trace", "run_schedule", "value_of"]
HEADERS = (("h", b"v"),)
# Refusals send() may raise by design; anything else escaping send() is a crash.
_REFUSALS = (MessageTooLargeError, BufferFullError, ProducerClosed)



def producer_options(schedule: Schedule) -> dict[str, Any]:
    options = dict(schedule.options)
    options.update(
        idempotent=schedule.idempotent,
        max_message_bytes=schedule.max_message_bytes,
        rng=random.Random(schedule.seed),
        timestamp_ms=lambda: 1_700_000_000_000,
    )
    return options


def bound_of(send: Send, index: int) -> int:
    key = send.key.encode() if send.key is not None else None
    headers = HEADERS if send.via == "headers" else ()
    return batch_size_for_record(key, value_of(index, send.size), headers)


def run_schedule(schedule: Schedule, *, real_time_limit: float | None = 60.0) -> Trace:
    """Run `schedule` to the end and return what happened."""
    trace = Trace(schedule)
    abandoned = False
    watch = Watch(scripted_out_of_order=any(
        e.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER for e in schedule.events))
    try:
        with deterministic_trio(schedule.seed), time_limit(real_time_limit), watching(watch), \
                _send_path(schedule.send_path):
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
        fake.create_topic(TOPIC, schedule.partitions, leaders=list(schedule.leaders),
                          configs=configs)
        producer: Producer | None = None
        try:
            async with trio.open_nursery() as users:
                try:
                    async with open_producer(
                        fake.bootstrap, connector=fake.connector, **producer_options(schedule)
                    ) as producer:
                        settled = _instrument(producer, trace, rows)
                        root.start_soon(drive_faults, fake, schedule)
                        for source in sorted({s.source for s in schedule.sends}):
                            users.start_soon(
                                _source, producer, schedule, source, accepted, inputs, trace,
                                (users, awaited), called, (rows, batches),
                            )
                        if any(s.via == "input" for s in schedule.sends):
                            users.start_soon(_drain, producer.errors, reported, 1)
                            users.start_soon(_drain, producer.successes, reported, 0)
                        for at in schedule.flushes:
                            users.start_soon(_flush, producer, schedule, at, trace)
                        await trio.sleep_until(schedule.close_at)
                        last = [(i, s) for i, s in enumerate(schedule.sends)
                                if _closing_loop(schedule, s)]
                        if last:  # no checkpoint between its last send and the close
                            looped = await _send_loop(producer, last, accepted, trace, called)
                            if last[0][1].wait and looped:
                                users.start_soon(_await_each, looped, _await_bound(schedule),
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
            trace.counted = (stats.accepted, stats.succeeded, stats.failed, stats.requests_sent)
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
                rec.reported = channel_reports.get(index)
                rec.attempts, rec.splits = watch.attempts_of(sent)
                trace.messages.append(rec)
            for index, row_id, at, call in batches:
                trace.messages.append(_batch_row(schedule, index, row_id, at, call, rows,
                                                 settled))
        trace.messages.sort(key=lambda m: m.id)
        for p in range(schedule.partitions):
            entries = fake.log(TOPIC, p)
            trace.logs[p] = [e.record.value or b"" for e in entries]
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
        trace.produce_requests = [(r.time, r.request) for r in fake.requests_of(PRODUCE)
                                  if r.request is not None]
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
    if msg._outcome is not None:
        rec.cause = f"{type(msg._outcome).__name__}: {msg._outcome}"
    rec.settled_at, rec.settled_closing = settled.get(msg_id, (None, False))
    return rec


# ledger id -> (when it was settled, whether the close had begun by then)
Settled = dict[int, tuple[float, bool]]


class Rows:
    """Where the rows of send() bursts and send_batch() calls went: per row id, the
    run that settled it and its place in that run's wire order; and the chunks
    send_batch() accepted, in order."""

    def __init__(self) -> None:
        self.runs: dict[int, tuple[RowRun, int]] = {}
        # (chunk, its rows, the task that accepted it: send_batch() runs in its caller's)
        self.chunks: list[tuple[RowChunk, int, trio.lowlevel.Task]] = []


def _instrument(producer: Producer, trace: Trace, rows: Rows) -> Settled:
    """Record when each message is settled (wrapping the ledger's two settle
    calls): by ledger id; a settled run of rows (a send() burst's or a
    send_batch() call's) settles its rows, whose ids are its chunk's first id +
    their row numbers in the chunk."""
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

    def on_succeed(msgs: Any, base_offset: int, timestamp: int) -> None:
        mark(msgs, trio.current_time())
        succeed(msgs, base_offset, timestamp)

    def on_fail(msgs: Any, cause: BaseException) -> None:
        msgs = list(msgs)
        mark(msgs, trio.current_time())
        fail(msgs, cause)

    ledger.succeed = on_succeed  # type: ignore[method-assign]
    ledger.fail = on_fail  # type: ignore[method-assign]
    ledger.accept_rows = on_accept_rows  # type: ignore[method-assign,assignment]
    return settled


Inputs = list[tuple[int, ProducerMessage, tuple[int, int, int], Attempt]]
# (index in Schedule.sends, what send() returned, when, call) per accepted message
Accepted = list[tuple[int, ProducerMessage | Delivery, float, tuple[int, int, int]]]
# Where a "wait" loop's awaiting task runs, and what it records per index
Awaiting = tuple[trio.Nursery, dict[int, str]]
# Index -> what its on_delivery callback was called with (each call)
Called = dict[int, list[str]]


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
            if s.source == source and not _closing_loop(schedule, s)]
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
            sent = await _send_loop(producer, group, accepted, trace, called)
            if send.wait and sent:
                nursery, awaited = awaiting
                nursery.start_soon(_await_each, sent, _await_bound(schedule), awaited)
            continue
        if send.via in ("many", "batch"):
            group = [(index, send)]
            while (pos + len(group) < len(mine) and mine[pos + len(group)][1].via == send.via
                   and mine[pos + len(group)][1].at == send.at):
                group.append(mine[pos + len(group)])
            pos += len(group)
            if send.via == "many":
                await _send_many(producer, group, accepted, trace, awaiting[0],
                                 _await_bound(schedule))
            else:
                await _send_batch(producer, group, trace, awaiting[0], _await_bound(schedule),
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
            delivery = await producer.send(
                TOPIC, value, key=key, partition=send.partition,
                headers=HEADERS if send.via == "headers" else None,
            )
        except _REFUSALS as exc:
            attempt.refused, attempt.detail = type(exc).__name__, str(exc)
            continue
        accepted.append((index, delivery, trio.current_time(), (start, trace.step(), 0)))


async def _send_many(
    producer: Producer,
    group: list[tuple[int, Send]],
    accepted: Accepted,
    trace: Trace,
    nursery: trio.Nursery,
    until: float,
) -> None:
    msgs = [
        ProducerMessage(TOPIC, value_of(i, s.size), s.key.encode() if s.key else None,
                        partition=s.partition)
        for i, s in group
    ]
    attempt = Attempt(tuple(i for i, _ in group), tuple(bound_of(s, i) for i, s in group), "")
    trace.attempts.append(attempt)
    start = trace.step()
    try:
        result = await producer.send_many(msgs)
    except _REFUSALS as exc:
        attempt.refused, attempt.detail = type(exc).__name__, str(exc)
    else:
        nursery.start_soon(_await_group, result, until, attempt)
    now, end = trio.current_time(), trace.step()
    for pos, ((i, _), msg) in enumerate(zip(group, msgs, strict=True)):
        if msg._id:  # accepted (a BufferFullError may come after some chunks were)
            accepted.append((i, msg, now, (start, end, pos)))


# (index in Schedule.sends, ledger id, when, call) per accepted send_batch() row
Batches = list[tuple[int, int, float, tuple[int, int, int]]]


async def _send_batch(
    producer: Producer,
    group: list[tuple[int, Send]],
    trace: Trace,
    nursery: trio.Nursery,
    until: float,
    rows: Rows,
    batches: Batches,
) -> None:
    """One send_batch() call with the group's messages as rows (lists: values, and
    keys and partitions when any is set)."""
    values = [value_of(i, s.size) for i, s in group]
    keys = [s.key.encode() if s.key else None for _, s in group]
    partitions = [s.partition for _, s in group]
    attempt = Attempt(tuple(i for i, _ in group), tuple(bound_of(s, i) for i, s in group), "",
                      rows=True)
    trace.attempts.append(attempt)
    start = trace.step()
    seen = len(rows.chunks)
    me = trio.lowlevel.current_task()
    try:
        result = await producer.send_batch(
            TOPIC, values, keys=keys if any(keys) else None,
            partitions=partitions if any(p is not None for p in partitions) else None)
    except _REFUSALS as exc:
        # The chunks accepted before it keep their outcomes (send_batch's promise).
        attempt.refused, attempt.detail = type(exc).__name__, str(exc)
    else:
        nursery.start_soon(_await_group, result, until, attempt)
    now, end = trio.current_time(), trace.step()
    # This call's chunks (accepted in this task), in order: rows first..first+n-1 each.
    row = 0
    for chunk, count, task in rows.chunks[seen:]:
        if task is not me:
            continue  # (another task's call)
        for k in range(count):
            batches.append((group[row + k][0], chunk._id + k, now, (start, end, row + k)))
        row += count


def _batch_row(schedule: Schedule, index: int, row_id: int, at: float,
               call: tuple[int, int, int], rows: Rows, settled: Settled) -> Message:
    """What became of one send_batch() row: its run's outcome, at its place in the run."""
    send = schedule.sends[index]
    run, pos = rows.runs.get(row_id, (None, 0))
    deadline = run._deadline if run is not None else at + schedule.option("delivery_timeout")
    rec = Message(index, row_id, value_of(index, send.size), at, deadline,
                  partition=run.partition if run is not None else None, call=call)
    rec.row = True
    if run is not None:
        rec.ok = run._state == OK
        rec.offset = run.offset + pos if rec.ok and run.offset >= 0 else -1
        if run._outcome is not None:
            rec.cause = f"{type(run._outcome).__name__}: {run._outcome}"
    rec.settled_at, rec.settled_closing = settled.get(row_id, (None, False))
    return rec


def _closing_loop(schedule: Schedule, send: Send) -> bool:
    """A loop the closing task sends itself, right before the close."""
    return send.via == "loop" and send.at == schedule.close_at


def _await_bound(schedule: Schedule) -> float:
    """Far beyond the close's bound (O3): only a delivery never settled gets there."""
    close_timeout: float = schedule.option("close_timeout")
    request_timeout: float = schedule.option("request_timeout")
    return schedule.close_at + 2 * (close_timeout + request_timeout)


async def _send_loop(
    producer: Producer, group: list[tuple[int, Send]], accepted: Accepted, trace: Trace,
    called: Called,
) -> list[tuple[int, Delivery]]:
    """A high-rate loop: ``await producer.send(topic, value)`` per message (a few
    with a key or partition, some with on_delivery), no
    other await in between, so the calls after the first join one burst. Once
    the dispatcher took a burst of >= COLUMNS_MIN messages, such a burst is
    columnar (burst.py: RowDelivery rows)."""
    if group[0][1].columns:
        # Force the loop's first burst columnar, as a taken burst of >= COLUMNS_MIN
        # messages would: otherwise a producer's first loop is always messages
        # (nothing was taken yet), and most schedules have a single loop. A
        # white-box switch, the one tests/scenarios/test_send_rows.py uses.
        producer._intake._columns_next = True
    sent: list[tuple[int, Delivery]] = []
    for index, send in group:
        attempt = Attempt((index,), (bound_of(send, index),), "")
        trace.attempts.append(attempt)
        start = trace.step()
        value = value_of(index, send.size)
        options: dict[str, Any] = {}
        if send.key is not None:
            options["key"] = send.key.encode()
        if send.partition is not None:
            options["partition"] = send.partition
        if send.callback and index % 3:
            calls = called[index] = []
            options["on_delivery"] = partial(_call_back, calls, value)
        try:
            delivery = await producer.send(TOPIC, value, **options)
        except _REFUSALS as exc:
            attempt.refused, attempt.detail = type(exc).__name__, str(exc)
            called.pop(index, None)
            continue
        accepted.append((index, delivery, trio.current_time(), (start, trace.step(), 0)))
        sent.append((index, delivery))
    return sent


def _call_back(calls: list[str], value: bytes, md: RecordMetadata | None,
               err: BaseException | None) -> None:
    """A send()'s on_delivery: what it was called with, in _await_each's form."""
    if err is None:
        assert md is not None
        calls.append(f"ok {md.partition} {md.offset}")
    elif not isinstance(err, ProducerError):
        calls.append(f"failed with a {type(err).__name__}, not a ProducerError: {err}")
    else:
        calls.append(f"failed {type(err.cause).__name__}: {err.cause}")
        if err.message.value != value:
            calls[-1] += f" (the error names another message: {err.message!r})"


async def _await_each(sent: list[tuple[int, Delivery]], until: float,
                      awaited: dict[int, str]) -> None:
    """A futures-style user: awaits each delivery of a loop in order, keeping
    what it got (the checker compares it with the delivery's final state)."""
    for index, delivery in sent:
        with trio.move_on_at(until):
            try:
                md = await delivery
            except ProducerError as exc:
                awaited[index] = f"failed {type(exc.cause).__name__}: {exc.cause}"
                if exc.message.value != delivery.value:
                    awaited[index] += f" (the error names another message: {exc.message!r})"
            else:
                awaited[index] = f"ok {md.partition} {md.offset}"
            continue
        awaited[index] = "never returned"


# id(message) -> (the message, [times on successes, times on errors])
Reported = dict[int, tuple[ProducerMessage, list[int]]]


async def _await_group(group: Any, until: float, attempt: Attempt) -> None:
    """A bulk caller awaits its send_many()'s group: what it says, for the checker."""
    with trio.move_on_at(until):
        result = await group
        # (a send_batch() error names a run of rows, which has no value)
        attempt.group = (result.delivered, result.failed,
                         tuple(getattr(e.message, "value", None) or b"" for e in result.errors))
        return
    attempt.group = "never returned"


async def _drain(channel: Any, reported: Reported, which: int) -> None:
    """A sarama-style user reads every outcome (else the producer backs up),
    counting each message's reports (successes: 0, errors: 1)."""
    async for item in channel:
        msg = item.message if isinstance(item, ProducerError) else item
        reported.setdefault(id(msg), (msg, [0, 0]))[1][which] += 1


async def _flush(producer: Producer, schedule: Schedule, at: float, trace: Trace) -> None:
    await trio.sleep_until(at)
    ledger = producer._ledger
    start = trio.current_time()
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
                               scope.cancelled_caught))

