"""The intake stage, bulk side: ``send_many`` and ``send_batch`` chunking.

Both calls check everything before they accept anything (a bad message or
row raises, and nothing of the call is sent), then accept in *chunks* of at
most a quarter of ``buffer_memory``, so one call never needs the whole
buffer: each chunk reserves its bytes (waiting as ``send()`` does), is
accepted in one ledger step, and is put on the intake as one item
(``Intake.put``), which ends the open ``send()`` burst. ``send_batch`` of
Python lists packs each chunk's rows on its own (see "chunk planning" below),
so the copies alive are the ones reserved. If the call is
cancelled or the producer closes while it waits, the chunks already accepted
keep their outcomes (the call's ``DeliveryGroup`` counts only them) and the
rest was never sent. A chunk waiting for room in the intake at the close gets
in (``Intake.put``) and is failed with the rest of what is outstanding; the
call then raises ``ProducerClosed`` for what it had not accepted yet.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator
from itertools import accumulate
from operator import attrgetter
from typing import Any

import trio

from pipeline.producer._columnar.burst import COLUMNS_MIN
from pipeline.producer._columnar.messages import MessageRows, accept, take, unaccept
from pipeline.producer._columnar.rows import RowChunk, RowRun, slice_columns
from pipeline.producer._errors import MessageTooLargeError
from pipeline.producer._intake.intake import Intake
from pipeline.producer._intake.normalize import copied_bytes, not_a_message_error, reused_error
from pipeline.producer._message import ProducerMessage
from pipeline.producer._outcomes.delivery import DeliveryGroup
from pipeline.producer._outcomes.ledger import Ledger
from pipeline.protocol._columns import ColumnInput, Columns, HeadersInput, IntsInput
from pipeline.protocol.columnar import build_columns, first_row_over, record_size_bounds

_id_of = attrgetter("_id")


class Bulk:
    """``send_many`` and ``send_batch`` (the facade's methods delegate here)."""

    def __init__(self, intake: Intake, ledger: Ledger) -> None:
        self._intake = intake
        self._ledger = ledger

    async def _reserve_chunk(self, group: DeliveryGroup, nbytes: int, rest: int) -> None:
        """Reserve a chunk's ``nbytes``; ``rest``: the call's messages from this
        chunk on, forgotten by ``group`` if this raises (never accepted)."""
        ledger, intake = self._ledger, self._intake
        if not ledger.try_reserve(nbytes):
            try:
                await ledger.reserve(nbytes)
            except BaseException:
                group.forget(rest)  # accepted chunks keep their outcome
                raise
            if intake.closing:
                ledger.release(nbytes)
                group.forget(rest)
                raise intake.refused_while_waiting("buffer space")
        elif intake.closing:  # closed while an earlier chunk waited to be enqueued
            ledger.release(nbytes)
            group.forget(rest)
            raise intake.refused_while_waiting("room in the intake")

    async def send_many(self, messages: Iterable[ProducerMessage]) -> DeliveryGroup:
        await trio.lowlevel.checkpoint_if_cancelled()
        intake, ledger = self._intake, self._ledger
        intake.check_open()
        msgs = messages if isinstance(messages, list) else list(messages)
        for kind in set(map(type, msgs)):
            if not issubclass(kind, ProducerMessage):
                raise not_a_message_error("send_many", next(m for m in msgs if type(m) is kind))
        if any(map(_id_of, msgs)):
            raise reused_error(next(m for m in msgs if m._id))
        if len(msgs) >= COLUMNS_MIN:
            rows = take(msgs, intake.current_ms(), intake.max_message_bytes)
            if rows is not None:
                return await self._send_rows(msgs, rows)
        cumulative = list(accumulate(map(intake.prepare, msgs)))
        total = len(msgs)
        group = DeliveryGroup(total)
        for start, end, nbytes in _chunks(cumulative, ledger.buffer_memory // 4):
            chunk = msgs[start:end]
            await self._reserve_chunk(group, nbytes, total - start)
            intake.end_burst()  # (accepted behind the open burst: it takes no more sends)
            ledger.accept_all(chunk, intake.deadline(), group)
            try:
                await intake.put(chunk)
            except BaseException:  # cancelled: the chunk never reached the channel
                for m in chunk:
                    m._sink = None  # as before the call: no tie to a group that forgot it
                    ledger.unaccept(m)
                group.forget(total - start)
                raise
        # A schedule point, as trio's async calls are: without it a caller
        # feeding lists would run ahead until the buffer is full, and the
        # pipeline would only ever see a full buffer. Shielded: everything is
        # accepted now, so the caller must get the group.
        await trio.lowlevel.cancel_shielded_checkpoint()
        return group

    async def _send_rows(self, msgs: list[ProducerMessage], rows: MessageRows) -> DeliveryGroup:
        """``send_many`` of plain messages (``messages.take``): each chunk one
        ``RowChunk`` holding its messages, its rows one run (``_columnar/messages.py``).
        Chunks as the per-message path cuts them, within half the per-message limit:
        a chunk also reserves its packed copy (about its rows' bytes again) and what
        its messages hold beyond their rows' bytes (``MessageRows.held``)."""
        intake, ledger = self._intake, self._ledger
        cumulative = rows.cumulative()
        total = len(msgs)
        group = DeliveryGroup(total)
        # Cut as if each message's held bytes were part of its bound (their call-wide
        # share): a chunk is then about an eighth of the buffer in memory, held included.
        wire = cumulative[-1]
        limit = ledger.buffer_memory // 8 * wire // (wire + rows.held(0, total))
        for start, end, bound in _chunks(cumulative, limit):
            count = end - start
            columns, extra = rows.pack(start, end)
            extra += rows.held(start, end)
            nbytes = bound + extra
            await self._reserve_chunk(group, nbytes, total - start)
            chunk = RowChunk(group, count)
            chunk.extra = extra
            chunk.messages = part = msgs if count == total else msgs[start:end]
            intake.end_burst()  # (accepted behind the open burst: it takes no more sends)
            ledger.accept_rows(chunk, count)
            run = RowRun(rows.topic, columns, None, count, bound, chunk, start)
            run._deadline = intake.deadline()
            accept(part, chunk._id, run._deadline)
            chunk.runs = [run]
            try:
                await intake.put(run)
            except BaseException:  # cancelled: the chunk never reached the channel
                ledger.unaccept_rows(chunk, count, nbytes)
                unaccept(part)
                group.forget(total - start)
                raise
        # A schedule point (see send_many); shielded: what is accepted has its group.
        await trio.lowlevel.cancel_shielded_checkpoint()
        return group

    async def send_batch(
        self,
        topic: str,
        values: ColumnInput,
        keys: ColumnInput | None,
        headers: HeadersInput | None,
        partitions: IntsInput | None,
        timestamps: IntsInput | None,
    ) -> DeliveryGroup:
        await trio.lowlevel.checkpoint_if_cancelled()
        intake, ledger = self._intake, self._ledger
        intake.check_open()
        if type(topic) is not str or not topic:
            raise TypeError(f"topic must be a non-empty str, not {topic!r}")
        now_ms = intake.current_ms()
        limit = max(1, ledger.buffer_memory // 4)
        inputs: _Inputs = (values, keys, headers, timestamps, partitions)
        columns: Columns | None = None
        if _packable(inputs):
            inputs = _snapshot(inputs)  # the rows checked are the rows sent
            total, plan, columns = _plan_packed(inputs, now_ms, limit, intake.max_message_bytes)
        else:
            columns = build_columns(values, keys, headers, timestamps, partitions,
                                    default_timestamp=now_ms)
            total = len(columns)
            bounds = record_size_bounds(columns)
            _check_sizes(bounds, intake.max_message_bytes, 0)
            plan = list(_cut(bounds, copied_bytes(columns), limit, 0))
        group = DeliveryGroup(total)
        for start, stop, bound, extra in plan:
            nbytes = bound + extra
            rows = stop - start
            await self._reserve_chunk(group, nbytes, total - start)
            # Accepted: ids start .. start + rows - 1, one ledger entry.
            chunk = RowChunk(group, rows)
            chunk.extra = extra
            intake.end_burst()  # (accepted behind the open burst: it takes no more sends)
            ledger.accept_rows(chunk, rows)
            if columns is None:
                part = _pack_rows(inputs, start, stop, now_ms)
            else:
                part = slice_columns(columns, start, stop)
            run = RowRun(topic, part, None, rows, bound, chunk, start)
            run._deadline = intake.deadline()
            chunk.runs = [run]
            try:
                await intake.put(run)
            except BaseException:  # cancelled: the chunk never reached the channel
                ledger.unaccept_rows(chunk, rows, nbytes)
                group.forget(total - start)
                raise
        # A schedule point (see send_many); shielded: what is accepted has its group.
        await trio.lowlevel.cancel_shielded_checkpoint()
        return group


# -------------------------------------------------------------- chunk planning
#
# Invariant: the packed copies alive are the ones reserved. Chunks cut from one
# packing of a call share its buffers, which then live until the call's last
# row settles while the buffer has moved on to later calls: the bench's
# 100k-row lists kept five calls' copies (50 MB) beside a 32 MB buffer. So a
# call of Python sequences is checked and measured a window at a time (each
# window packed, measured, dropped), and each chunk packs its own rows again
# when it is accepted: its copy is then its own, counted in what it reserved,
# and freed when its rows settle. A call that fits in one chunk is packed
# once. Arrow and numpy buffers are borrowed, not copied: sliced as before.

_Inputs = tuple[Any, Any, Any, Any, Any]  # values, keys, headers, timestamps, partitions
_Chunk = tuple[int, int, int, int]  # start, stop, size bound, bytes copied
_SAMPLE = 1024  # rows packed first to estimate a window's rows


def _packable(inputs: _Inputs) -> bool:
    """Lists or tuples only, no headers (their copies are counted per row), and
    every column as long as the values (else the whole-call path says which)."""
    values, _keys, headers, _ts, _parts = inputs
    if headers is not None or type(values) not in (list, tuple):
        return False
    return all(x is None or (type(x) in (list, tuple) and len(x) == len(values))
               for x in inputs)


def _check_sizes(bounds: memoryview, max_bytes: int, offset: int) -> None:
    over = first_row_over(bounds, max_bytes)
    if over >= 0:
        raise MessageTooLargeError(
            f"send_batch row {offset + over} is {bounds[over]} bytes (key, value, headers and "
            f"batch overhead), over max_message_bytes={max_bytes}: raise max_message_bytes "
            "(and the topic's max.message.bytes) or split that value; no row of this call "
            "was sent"
        )


def _cut(bounds: memoryview, copied: Any, limit: int, offset: int) -> Iterator[_Chunk]:
    """Consecutive chunks of ``bounds``' rows, each within ``limit`` bytes (size
    bound + copies) unless it is one row; row numbers shifted by ``offset``."""
    total = len(bounds)
    whole = sum(bounds) + copied(0, total)
    per_chunk = max(1, int(limit * total / max(1, whole)))
    start = 0
    while start < total:
        stop = min(total, start + per_chunk)
        bound = sum(bounds[start:stop])
        while bound + copied(start, stop) > limit and stop - start > 1:  # uneven rows
            stop = start + (stop - start) // 2
            bound = sum(bounds[start:stop])
        yield offset + start, offset + stop, bound, copied(start, stop)
        start = stop


def _plan_packed(inputs: _Inputs, now_ms: int, limit: int, max_bytes: int
                 ) -> tuple[int, list[_Chunk], Columns | None]:
    """Check and measure a call of sequences a window at a time: (rows, chunks,
    the columns when the whole call is one chunk, else None)."""
    total = len(inputs[0])
    plan: list[_Chunk] = []
    start, window = 0, total
    if total > _SAMPLE:  # a sample's size per row sets the window
        sample, bounds = _checked(inputs, 0, _SAMPLE, now_ms, max_bytes)
        per_row = (sum(bounds) + copied_bytes(sample)(0, _SAMPLE)) / _SAMPLE
        window = max(1, int(limit / max(1.0, per_row)))
    while start < total:
        stop = min(total, start + window)
        cols, bounds = _checked(inputs, start, stop, now_ms, max_bytes)
        plan.extend(_cut(bounds, copied_bytes(cols), limit, start))
        if stop == total and start == 0 and len(plan) == 1:
            return total, plan, cols  # one chunk: packed once
        start = stop
    return total, plan, None


def _checked(inputs: _Inputs, start: int, stop: int, now_ms: int, max_bytes: int
             ) -> tuple[Columns, memoryview]:
    """Rows ``start .. stop - 1`` packed and checked, with their size bounds; an
    error names the call's row."""
    try:
        cols = _pack_rows(inputs, start, stop, now_ms)
    except (TypeError, ValueError):
        if start == 0 and stop == len(inputs[0]):
            raise
        _pack_rows(inputs, 0, len(inputs[0]), now_ms)  # raises with the call's row numbers
        raise  # pragma: no cover - the same rows fail the same way
    bounds = record_size_bounds(cols)
    _check_sizes(bounds, max_bytes, start)
    return cols, bounds


def _snapshot(inputs: _Inputs) -> _Inputs:
    values, keys, headers, timestamps, partitions = (
        None if x is None else list(x) for x in inputs
    )
    return values, keys, headers, timestamps, partitions


def _pack_rows(inputs: _Inputs, start: int, stop: int, now_ms: int) -> Columns:
    """Rows ``start .. stop - 1`` of a call's sequences, packed into their own buffers."""
    values, keys, headers, timestamps, partitions = (
        None if x is None else x[start:stop] for x in inputs
    )
    return build_columns(values, keys, headers, timestamps, partitions,
                         default_timestamp=now_ms)


def _chunks(cumulative: list[int], limit: int) -> Iterator[tuple[int, int, int]]:
    """Cut a call into chunks so that one call never needs the whole buffer: from each
    start, the longest run within ``limit`` bytes (at least one message). Yields
    ``(start, end, bytes)`` over ``cumulative`` (the running byte totals)."""
    start, total = 0, len(cumulative)
    while start < total:
        before = cumulative[start - 1] if start else 0
        end = max(start + 1, bisect_right(cumulative, before + limit, start))
        yield start, end, cumulative[end - 1] - before
        start = end
