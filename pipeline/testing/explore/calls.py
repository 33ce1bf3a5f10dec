"""How the producer workload's sources call the producer, and what each call records.

One source is one task (``runner._source``); its sends at one instant by one
path are one call: ``send()`` one by one, a high-rate loop of ``send()``
(columnar bursts), ``send_many()``, ``send_batch()``, ``producer.input``. Each
call records its ``Attempt`` (for the size rule) and what it accepted, with the
call's start and end steps (calls that overlap have no order between them);
helpers here await what the caller got back (deliveries, groups) and read the
outcome channels, so the checker can hold each to what the messages report.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import trio

from pipeline.producer._api import Producer
from pipeline.producer._columnar.rows import RowChunk, RowRun
from pipeline.producer._errors import (
    BufferFullError,
    MessageTooLargeError,
    ProducerClosed,
    ProducerError,
)
from pipeline.producer._message import OK, ProducerMessage, RecordMetadata
from pipeline.producer._outcomes.delivery import Delivery
from pipeline.protocol.records import batch_size_for_record

from .schedule import TOPIC, Schedule, Send
from .trace import Attempt, Message, Trace, value_of

HEADERS = (("h", b"v"),)
# Refusals send() may raise by design; anything else escaping send() is a crash.
REFUSALS = (MessageTooLargeError, BufferFullError, ProducerClosed)



def bound_of(send: Send, index: int) -> int:
    key = send.key.encode() if send.key is not None else None
    headers = HEADERS if send.via == "headers" else ()
    return batch_size_for_record(key, value_of(index, send.size), headers)


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


Inputs = list[tuple[int, ProducerMessage, tuple[int, int, int], Attempt]]
# (index in Schedule.sends, what send() returned, when, call) per accepted message
Accepted = list[tuple[int, ProducerMessage | Delivery, float, tuple[int, int, int]]]
# Where a "wait" loop's awaiting task runs, and what it records per index
Awaiting = tuple[trio.Nursery, dict[int, str]]
# Index -> what its on_delivery callback was called with (each call)
Called = dict[int, list[str]]


async def send_many(
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
    except REFUSALS as exc:
        attempt.refused, attempt.detail = type(exc).__name__, str(exc)
    else:
        nursery.start_soon(await_group, result, until, attempt)
    now, end = trio.current_time(), trace.step()
    for pos, ((i, _), msg) in enumerate(zip(group, msgs, strict=True)):
        if msg._id:  # accepted (a BufferFullError may come after some chunks were)
            accepted.append((i, msg, now, (start, end, pos)))
            if msg._sink is None:  # (the per-message path's messages report to the group)
                trace.columnar.add(i)


# (index in Schedule.sends, ledger id, when, call) per accepted send_batch() row
Batches = list[tuple[int, int, float, tuple[int, int, int]]]


async def send_batch(
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
    except REFUSALS as exc:
        # The chunks accepted before it keep their outcomes (send_batch's promise).
        attempt.refused, attempt.detail = type(exc).__name__, str(exc)
    else:
        nursery.start_soon(await_group, result, until, attempt)
    now, end = trio.current_time(), trace.step()
    # This call's chunks (accepted in this task), in order: rows first..first+n-1 each.
    row = 0
    for chunk, count, task in rows.chunks[seen:]:
        if task is not me:
            continue  # (another task's call)
        for k in range(count):
            batches.append((group[row + k][0], chunk._id + k, now, (start, end, row + k)))
        row += count


def batch_row(schedule: Schedule, index: int, row_id: int, at: float,
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
        rec.timestamp = run.timestamp if rec.ok else -1
        if run._outcome is not None:
            rec.cause = f"{type(run._outcome).__name__}: {run._outcome}"
    rec.settled_at, rec.settled_closing = settled.get(row_id, (None, False))
    return rec


def closing_loop(schedule: Schedule, send: Send) -> bool:
    """A loop the closing task sends itself, right before the close."""
    return send.via == "loop" and send.at == schedule.close_at


def await_bound(schedule: Schedule) -> float:
    """Far beyond the close's bound (O3): only a delivery never settled gets there."""
    close_timeout: float = schedule.option("close_timeout")
    request_timeout: float = schedule.option("request_timeout")
    return schedule.close_at + 2 * (close_timeout + request_timeout)


async def send_loop(
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
            options["on_delivery"] = partial(call_back, calls, value, raises(index))
        try:
            delivery = await producer.send(TOPIC, value, **options)
        except REFUSALS as exc:
            attempt.refused, attempt.detail = type(exc).__name__, str(exc)
            called.pop(index, None)
            continue
        accepted.append((index, delivery, trio.current_time(), (start, trace.step(), 0)))
        sent.append((index, delivery))
    return sent


def raises(index: int) -> bool:
    """Whether send ``index``'s ``on_delivery`` raises once it has recorded its call
    (a user's bug: the producer counts it, ``statistics().callback_errors``, O4)."""
    return index % 4 == 0


class CallbackBug(Exception):
    """What a raising ``on_delivery`` raises."""


def metadata(md: RecordMetadata) -> str:
    """An acknowledged delivery's metadata, as the checker writes it (O1)."""
    return (f"ok {md.partition} {md.offset}" + ("" if md.offset_known else " offset unknown")
            + f" at {md.timestamp}")


def call_back(calls: list[str], value: bytes, raising: bool, md: RecordMetadata | None,
              err: BaseException | None) -> None:
    """A send()'s on_delivery: what it was called with, in await_each's form."""
    if err is None:
        assert md is not None
        calls.append(metadata(md))
    elif not isinstance(err, ProducerError):
        calls.append(f"failed with a {type(err).__name__}, not a ProducerError: {err}")
    else:
        calls.append(f"failed {type(err.cause).__name__}: {err.cause}")
        if err.message.value != value:
            calls[-1] += f" (the error names another message: {err.message!r})"
    if raising:
        raise CallbackBug("an on_delivery that raises (the explorer's)")


async def await_each(sent: list[tuple[int, Delivery]], until: float,
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
                awaited[index] = metadata(md)
            continue
        awaited[index] = "never returned"


# id(message) -> (the message, [times on successes, times on errors])
Reported = dict[int, tuple[ProducerMessage, list[int]]]


async def await_group(group: Any, until: float, attempt: Attempt) -> None:
    """A bulk caller awaits its send_many()'s group: what it says, for the checker."""
    with trio.move_on_at(until):
        result = await group
        # (a send_batch() error names a run of rows, which has no value)
        attempt.group = (result.delivered, result.failed,
                         tuple(getattr(e.message, "value", None) or b"" for e in result.errors))
        return
    attempt.group = "never returned"


async def drain(channel: Any, reported: Reported, which: int) -> None:
    """A sarama-style user reads every outcome (else the producer backs up),
    counting each message's reports (successes: 0, errors: 1)."""
    async for item in channel:
        msg = item.message if isinstance(item, ProducerError) else item
        reported.setdefault(id(msg), (msg, [0, 0]))[1][which] += 1
