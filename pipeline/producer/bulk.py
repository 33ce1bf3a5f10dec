"""The intake stage, bulk side: ``send_many`` and ``send_batch`` chunking.

Both calls check everything before they accept anything (a bad message or
row raises, and nothing of the call is sent), then accept in *chunks* of at
most a quarter of ``buffer_memory``, so one call never needs the whole
buffer: each chunk reserves its bytes (waiting as ``send()`` does), is
accepted in one ledger step, and is put on the intake as one item
(``Intake.put``), which ends the open ``send()`` burst. If the call is
cancelled or the producer closes while it waits, the chunks already accepted
keep their outcomes (the call's ``DeliveryGroup`` counts only them) and the
rest was never sent.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from itertools import accumulate
from operator import attrgetter

import trio

from pipeline.producer.errors import MessageTooLargeError
from pipeline.producer.intake import CLOSED, Intake
from pipeline.producer.ledger import Ledger
from pipeline.producer.message import PENDING, DeliveryGroup, ProducerMessage
from pipeline.producer.normalize import closed_while_waiting, copied_bytes, reused_error
from pipeline.producer.rows import RowChunk, RowRun, slice_columns
from pipeline.protocol._columns import ColumnInput, HeadersInput, IntsInput
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
                raise closed_while_waiting("buffer space")
        elif intake.closing:  # closed while an earlier chunk waited to be enqueued
            ledger.release(nbytes)
            group.forget(rest)
            raise closed_while_waiting("room in the intake")

    async def send_many(self, messages: Iterable[ProducerMessage]) -> DeliveryGroup:
        await trio.lowlevel.checkpoint_if_cancelled()
        intake, ledger = self._intake, self._ledger
        intake.check_open()
        msgs = messages if isinstance(messages, list) else list(messages)
        if any(map(_id_of, msgs)):
            raise reused_error(next(m for m in msgs if m._id))
        cumulative = list(accumulate(map(intake.prepare, msgs)))
        total = len(msgs)
        group = DeliveryGroup(total)
        limit = max(1, ledger.buffer_memory // 4)
        start = 0
        while start < total:
            # Reserve in chunks so one call never needs the whole buffer: the
            # longest run from start within limit bytes, at least one message.
            before = cumulative[start - 1] if start else 0
            end = max(start + 1, bisect_right(cumulative, before + limit, start))
            chunk = msgs[start:end]
            await self._reserve_chunk(group, cumulative[end - 1] - before, total - start)
            ledger.accept_all(chunk, intake.deadline(), group)
            try:
                await intake.put(chunk)
            except BaseException as exc:
                pending = [m for m in chunk if m._state == PENDING]
                for m in pending:
                    m._sink = None
                    ledger.unaccept(m)
                # Messages the close failed meanwhile keep that outcome.
                group.forget(len(pending) + total - end)
                if isinstance(exc, CLOSED):
                    raise closed_while_waiting("room in the intake") from None
                raise
            start = end
        # A schedule point, as trio's async calls are: without it a caller
        # feeding lists would run ahead until the buffer is full, and the
        # pipeline would only ever see a full buffer. Shielded: everything is
        # accepted now, so the caller must get the group.
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
        columns = build_columns(values, keys, headers, timestamps, partitions,
                                default_timestamp=intake.current_ms())
        total = len(columns)
        bounds = record_size_bounds(columns)
        max_bytes = intake.max_message_bytes
        over = first_row_over(bounds, max_bytes)
        if over >= 0:
            raise MessageTooLargeError(
                f"send_batch row {over} is {bounds[over]} bytes (key, value, headers and batch "
                f"overhead), over max_message_bytes={max_bytes}: raise "
                "max_message_bytes (and the topic's max.message.bytes) or split that value; "
                "no row of this call was sent"
            )
        group = DeliveryGroup(total)
        limit = max(1, ledger.buffer_memory // 4)
        copied = copied_bytes(columns)
        per_chunk = max(1, int(limit * total / max(1, sum(bounds) + copied(0, total))))
        start = 0
        while start < total:
            stop = min(total, start + per_chunk)
            bound = sum(bounds[start:stop])
            while bound + copied(start, stop) > limit and stop - start > 1:  # uneven rows
                stop = start + (stop - start) // 2
                bound = sum(bounds[start:stop])
            extra = copied(start, stop)
            nbytes = bound + extra
            rows = stop - start
            await self._reserve_chunk(group, nbytes, total - start)
            # Accepted: ids start .. start + rows - 1, one ledger entry.
            chunk = RowChunk(group, rows)
            chunk.extra = extra
            ledger.accept_rows(chunk, rows)
            run = RowRun(topic, slice_columns(columns, start, stop), None, rows, bound, chunk,
                         start)
            run._deadline = intake.deadline()
            chunk.runs = [run]
            try:
                await intake.put(run)
            except BaseException as exc:
                if run._state == PENDING:  # (else the close failed it meanwhile)
                    ledger.unaccept_rows(chunk, rows, nbytes)
                    group.forget(total - start)
                else:
                    group.forget(total - stop)
                if isinstance(exc, CLOSED):
                    raise closed_while_waiting("room in the intake") from None
                raise
            start = stop
        # A schedule point (see send_many); shielded: what is accepted has its group.
        await trio.lowlevel.cancel_shielded_checkpoint()
        return group
