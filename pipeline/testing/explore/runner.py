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
  header, or ``send_many()``), recording refusals;
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
from dataclasses import dataclass, field
from typing import Any

import trio

from pipeline.producer.api import Producer, open_producer
from pipeline.producer.errors import BufferFullError, MessageTooLargeError, ProducerClosed
from pipeline.producer.message import OK, PENDING, ProducerMessage
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
from .schedule import TOPIC, Schedule, Send

__all__ = ["HangError", "Message", "Trace", "run_schedule", "value_of"]
HEADERS = (("h", b"v"),)
# Refusals send() may raise by design; anything else escaping send() is a crash.
_REFUSALS = (MessageTooLargeError, BufferFullError, ProducerClosed)


@dataclass(slots=True)
class Message:
    """One accepted message and its outcome."""

    index: int  # position in Schedule.sends
    id: int  # ledger id: acceptance order
    value: bytes
    accepted_at: float
    deadline: float
    # The send()/send_many() call that accepted it: when it started and returned
    # (a global step counter) and the message's place in it. Calls that overlap
    # (two sources at once) have no order between them; a call that returned
    # before another started comes first.
    call: tuple[int, int, int] = (0, 0, 0)
    partition: int | None = None
    ok: bool = False
    offset: int = -1
    cause: str = ""
    settled_at: float | None = None


@dataclass(slots=True)
class Attempt:
    """One send()/send_many() call, for the size-limit check."""

    indexes: tuple[int, ...]
    bounds: tuple[int, ...]  # batch_size_for_record of each message
    refused: str  # exception type name, "" if accepted
    detail: str = ""


@dataclass(slots=True)
class Flush:
    start: float
    end: float
    last_id: int  # the last id accepted when flush() was called
    unsettled: tuple[int, ...]  # ids <= last_id still unsettled when it returned
    cut: bool  # the explorer gave up waiting (the checker reports how late it was)


@dataclass
class Trace:
    schedule: Schedule
    messages: list[Message] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    logs: dict[int, list[bytes]] = field(default_factory=dict)
    # Values of every record some Produce request carried (filled only when a
    # message accepted after healing failed: L1 asks whether it was ever sent).
    sent: set[bytes] = field(default_factory=set)
    # (partition, bytes) of every batch a Produce request carried over max_message_bytes
    oversized: list[tuple[int, int]] = field(default_factory=list)
    # {partition: offsets of records the broker appended after it had forgotten
    # the producer's state (Kafka accepts any sequence then)}
    state_lost: dict[int, set[int]] = field(default_factory=dict)
    flushes: list[Flush] = field(default_factory=list)
    close_start: float = -1.0
    close_end: float = -1.0
    double_settles: int = 0
    outstanding_after_close: int = 0
    buffered_after_close: int = 0
    crash: str = ""
    end_time: float = 0.0
    steps: int = 0  # the call step counter

    def step(self) -> int:
        self.steps += 1
        return self.steps

    def fingerprint(self) -> tuple[Any, ...]:
        """Everything observable, to check that a replay is identical."""
        return (
            tuple((m.id, m.index, m.partition, m.ok, m.offset, m.cause, m.settled_at)
                  for m in self.messages),
            tuple((a.indexes, a.refused) for a in self.attempts),
            tuple(sorted(self.logs.items())),
            tuple((f.start, f.end, f.unsettled) for f in self.flushes),
            self.close_start, self.close_end, self.crash, self.end_time,
        )


def value_of(index: int, size: int) -> bytes:
    """A unique value of at least `size` bytes: the log tells messages apart by it."""
    head = b"%d|" % index
    return head + b"." * max(0, size - len(head))


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
    try:
        with deterministic_trio(schedule.seed), time_limit(real_time_limit):
            clock = VirtualClock()
            trio.run(_main, schedule, trace, clock=clock, instruments=[clock])
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
    return trace


async def _main(schedule: Schedule, trace: Trace) -> None:
    fake = FakeCluster(
        brokers=schedule.brokers,
        seed=schedule.seed,
        max_message_bytes=schedule.max_message_bytes,
        auto_create_topics=False,
    )
    accepted: list[tuple[int, ProducerMessage, float, tuple[int, int, int]]] = []
    inputs: Inputs = []
    async with trio.open_nursery() as root:
        await root.start(fake.run)
        fake.create_topic(TOPIC, schedule.partitions, leaders=list(schedule.leaders))
        producer: Producer | None = None
        try:
            async with trio.open_nursery() as users:
                async with open_producer(
                    fake.bootstrap, connector=fake.connector, **producer_options(schedule)
                ) as producer:
                    settled = _instrument(producer)
                    root.start_soon(drive_faults, fake, schedule)
                    for source in sorted({s.source for s in schedule.sends}):
                        users.start_soon(
                            _source, producer, schedule, source, accepted, inputs, trace
                        )
                    if any(s.via == "input" for s in schedule.sends):
                        users.start_soon(_drain, producer.errors)
                        users.start_soon(_drain, producer.successes)
                    for at in schedule.flushes:
                        users.start_soon(_flush, producer, schedule, at, trace)
                    await trio.sleep_until(schedule.close_at)
                    trace.close_start = trio.current_time()
                trace.close_end = trio.current_time()
        except Exception as exc:
            trace.crash = describe_exception(exc)
        if producer is not None:
            stats = producer.statistics()
            trace.double_settles = stats.double_settles
            trace.outstanding_after_close = stats.outstanding
            trace.buffered_after_close = stats.buffered_bytes
            delivery_timeout = schedule.option("delivery_timeout")
            for index, msg, call, attempt in inputs:
                if not msg._id:
                    attempt.refused = "ProducerClosed"  # closed before the dispatcher took it
                    continue
                if isinstance(msg._outcome, (MessageTooLargeError, ProducerClosed)):
                    # refused the sarama way: accepted, then failed at once
                    attempt.refused = type(msg._outcome).__name__
                accepted.append((index, msg, msg._deadline - delivery_timeout, call))
            for index, msg, at, call in accepted:
                rec = _record(index, msg, at, settled)
                rec.call = call
                trace.messages.append(rec)
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
        trace.end_time = trio.current_time()
        root.cancel_scope.cancel()


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


def _record(index: int, msg: ProducerMessage, at: float, settled: dict[int, float]) -> Message:
    rec = Message(index, msg._id, msg.value or b"", at, msg._deadline, partition=msg.partition)
    rec.ok = msg._state == OK
    rec.offset = msg.offset
    if msg._outcome is not None:
        rec.cause = f"{type(msg._outcome).__name__}: {msg._outcome}"
    rec.settled_at = settled.get(msg._id)
    return rec


def _instrument(producer: Producer) -> dict[int, float]:
    """Record when each message is settled (wrapping the ledger's two settle calls)."""
    ledger = producer._ledger
    settled: dict[int, float] = {}
    succeed, fail = ledger.succeed, ledger.fail

    def on_succeed(msgs: Any, base_offset: int, timestamp: int) -> None:
        now = trio.current_time()
        for m in msgs:
            if m._state == PENDING:
                settled[m._id] = now
        succeed(msgs, base_offset, timestamp)

    def on_fail(msgs: Any, cause: BaseException) -> None:
        now = trio.current_time()
        msgs = list(msgs)
        for m in msgs:
            if m._state == PENDING:
                settled[m._id] = now
        fail(msgs, cause)

    ledger.succeed = on_succeed  # type: ignore[method-assign]
    ledger.fail = on_fail  # type: ignore[method-assign]
    return settled


Inputs = list[tuple[int, ProducerMessage, tuple[int, int, int], Attempt]]


async def _source(
    producer: Producer,
    schedule: Schedule,
    source: int,
    accepted: list[tuple[int, ProducerMessage, float, tuple[int, int, int]]],
    inputs: Inputs,
    trace: Trace,
) -> None:
    mine = [(i, s) for i, s in enumerate(schedule.sends) if s.source == source]
    pos = 0
    while pos < len(mine):
        index, send = mine[pos]
        await trio.sleep_until(send.at)
        if send.via == "many":
            group = [(index, send)]
            while (pos + len(group) < len(mine) and mine[pos + len(group)][1].via == "many"
                   and mine[pos + len(group)][1].at == send.at):
                group.append(mine[pos + len(group)])
            pos += len(group)
            await _send_many(producer, group, accepted, trace)
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
            msg = await producer.send(
                TOPIC, value, key=key, partition=send.partition,
                headers=HEADERS if send.via == "headers" else None,
            )
        except _REFUSALS as exc:
            attempt.refused, attempt.detail = type(exc).__name__, str(exc)
            continue
        accepted.append((index, msg, trio.current_time(), (start, trace.step(), 0)))


async def _send_many(
    producer: Producer,
    group: list[tuple[int, Send]],
    accepted: list[tuple[int, ProducerMessage, float, tuple[int, int, int]]],
    trace: Trace,
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
        await producer.send_many(msgs)
    except _REFUSALS as exc:
        attempt.refused, attempt.detail = type(exc).__name__, str(exc)
    now, end = trio.current_time(), trace.step()
    for pos, ((i, _), msg) in enumerate(zip(group, msgs, strict=True)):
        if msg._id:  # accepted (a BufferFullError may come after some chunks were)
            accepted.append((i, msg, now, (start, end, pos)))


async def _drain(channel: Any) -> None:
    """A sarama-style user reads every outcome (else the producer backs up)."""
    async for _ in channel:
        pass


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

